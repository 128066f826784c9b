"""What a rank publishes of its progress, and what counts as progress: the parent's watchdog reads it.

Every rank owns one slot of :data:`PROGRESS_BYTES` in memory its parent can read: its position as text
("epoch 0, batch 4/13", for the hang report and the live display), a counter that every step of progress
adds one to, and whether it is waiting for its peers (inside a collective, or at ddpcheck's final
barrier). The slot lives in a shared array for forked ranks and simulated ones, and in a small file both
sides map for a training script's ranks, which are fresh interpreters (:func:`attach_file`).

Progress is a batch (ddpcheck's own recording calls :func:`report_progress` per batch; a DataLoader that
user code iterates counts too), an epoch boundary, a collective that completed, an optimizer step
(:func:`install_beats`). ``--timeout`` is "no progress for S seconds on a rank", as torch elastic's and
NCCL's watchdogs mean it: a rank that keeps yielding, however slowly in all, is never hung. Writing the
slot costs a memory store; nothing here takes a lock or makes a system call.
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
import struct
from collections.abc import Callable, Iterator
from typing import Any

from ddpcheck.wire.files import PROGRESS_BYTES  # one rank's slot, laid out here

TEXT_BYTES = 224  # its position text, NUL-padded: at most TEXT_BYTES - 1 bytes are kept
_STATE_AT = 224  # one byte: WORKING, WAITING for peers, or FINISHED (its result written, it exits)
_BEATS_AT = 232  # the progress counter, 8 bytes little-endian
_COUNTER = struct.Struct("<Q")
WORKING, WAITING, FINISHED = 0, 1, 2
PROGRESS_FILE_ENV = "DDPCHECK_PROGRESS_FILE"  # a script launch's slots, a file its launcher maps too
PROGRESS_SLOT_ENV = "DDPCHECK_PROGRESS_SLOT"  # which slot of it is this rank's

_buffer: Any = None
_view: memoryview | None = None  # the same shared bytes; ctypes slicing costs ~10 us a call
_start = 0
_beats = 0


def attach(buffer: Any, slot: int) -> None:
    """This process publishes its progress in ``buffer``'s slot ``slot`` from now on."""
    global _buffer, _view, _start
    _buffer, _start = buffer, slot * PROGRESS_BYTES
    _view = memoryview(buffer).cast("B")


def attach_file() -> bool:
    """A script rank under ``ddpcheck run``: publish into the file its launcher named (False: none)."""
    path = os.environ.get(PROGRESS_FILE_ENV, "")
    slot = os.environ.get(PROGRESS_SLOT_ENV, "")
    if not path or not slot.isdigit():
        return False
    try:
        with open(path, "r+b") as handle:
            mapped = mmap.mmap(handle.fileno(), 0)
    except (OSError, ValueError):
        return False
    if len(mapped) < (int(slot) + 1) * PROGRESS_BYTES:
        return False
    attach(mapped, int(slot))
    return True


def report_progress(text: str) -> None:
    """Publish where this rank is ("epoch 0, batch 4") and count one step of progress; no-op outside
    ranks."""
    view = _view
    if view is None:
        return
    raw = text.encode("utf-8", "replace")[: TEXT_BYTES - 1]
    view[_start : _start + TEXT_BYTES] = raw.ljust(TEXT_BYTES, b"\0")
    beat()


def beat() -> None:
    """Count one step of progress (a batch, a collective, an optimizer step) without changing the text."""
    global _beats
    view = _view
    if view is None:
        return
    _beats += 1
    _COUNTER.pack_into(view, _start + _BEATS_AT, _beats)


@contextlib.contextmanager
def waiting() -> Iterator[None]:
    """Within the block this rank waits for its peers (a collective): a watchdog that finds it silent
    looks for the peer that keeps it waiting. Progress is counted on the way out."""
    view = _view
    if view is None:
        yield
        return
    at = _start + _STATE_AT
    before = view[at]
    view[at] = WAITING
    try:
        yield
    finally:
        view[at] = before
        beat()


def finished() -> None:
    """This rank's work is done and its result written: what remains is its exit, never a hang."""
    view = _view
    if view is not None:
        view[_start + _STATE_AT] = FINISHED
        beat()


def read_progress(buffer: Any, slot: int) -> str:
    start = slot * PROGRESS_BYTES
    raw = bytes(buffer[start : start + TEXT_BYTES])
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def read_beat(buffer: Any, slot: int) -> tuple[int, int]:
    """(the slot's progress counter, its state now: WORKING, WAITING or FINISHED)."""
    start = slot * PROGRESS_BYTES
    raw = bytes(buffer[start + _STATE_AT : start + PROGRESS_BYTES])
    return _COUNTER.unpack_from(raw, _BEATS_AT - _STATE_AT)[0], raw[0]


COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "all_to_all",
    "all_to_all_single", "barrier", "monitored_barrier", "broadcast", "broadcast_object_list",
    "reduce", "reduce_scatter", "reduce_scatter_tensor", "gather", "gather_object", "scatter",
    "scatter_object_list", "send", "recv", "isend", "irecv",
)  # fmt: skip

_installed = False


def install_beats() -> None:
    """In a rank: a DataLoader batch, a collective that returns and an optimizer step count as progress,
    whoever calls them (a test body, a training script, the user's loader). A collective marks the rank
    as waiting while it runs. Once per process; kept to its end."""
    global _installed
    if _installed:
        return
    _installed = True
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.utils.data import dataloader

    for module in (dist, distributed_c10d):
        for name in COLLECTIVES:
            original = getattr(module, name, None)
            if callable(original) and not getattr(original, "__ddpcheck_beats__", False):
                setattr(module, name, _collective(original, torch.compiler.is_compiling))
    register_optimizer_step_post_hook(lambda optimizer, args, kwargs: beat())
    base: Any = dataloader._BaseDataLoaderIter
    base.__next__ = _batch(base.__next__)


def _collective(original: Callable[..., Any], compiling: Callable[[], bool]) -> Callable[..., Any]:
    @functools.wraps(original)
    def collective(*args: Any, **kwargs: Any) -> Any:
        if compiling():  # traced by torch.compile: the graph must see torch's own function
            return original(*args, **kwargs)
        with waiting():
            return original(*args, **kwargs)

    collective.__ddpcheck_beats__ = True  # type: ignore[attr-defined]
    return collective


def _batch(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    @functools.wraps(original)
    def __next__(self: Any) -> Any:
        value = original(self)
        beat()
        return value

    return __next__
