"""Random streams on the rank side: fingerprints of generator states, and what each fetch consumed.

A fingerprint is 64 bits of a hash of a generator's whole state: two draws from equal states give equal
numbers, so equal fingerprints on two data-parallel ranks mean the ranks draw the same. Loading draws
(a dataset's ``__getitem__``, a collate function, augmentation) happen in DataLoader workers, which are
other processes: the DataLoader's ``worker_init_fn`` is wrapped (a picklable object, so the spawn start
method works too) to watch the worker's fetches, and each worker appends one line per fetch to its own
file in a per-rank folder. The main process knows, for each batch it delivers, which worker built it and
under which task number, and joins the two. Without workers the main process watches its own fetches.

Private torch API (``_MultiProcessingDataLoaderIter._get_data``/``_process_data``/``_reset``,
``_SingleProcessDataLoaderIter._next_data``, the worker loop's fetcher): stable since torch 1.x; where a
loader's iterator is not torch's, its fetches are simply not watched (``EpochTrace.draws`` stays None).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import random
import shutil
import sys
import tempfile
from array import array
from collections import deque
from collections.abc import Callable
from typing import Any

from ddpcheck.checker import patching
from ddpcheck.trace import Draw, FetchDraws

STREAMS = ("torch", "numpy", "random")
FETCH_LIMIT = 16  # fetches watched per worker and epoch (and per epoch in the main process): enough to
# see which streams a loader consumes and whether ranks and workers start alike, at no cost after
_SINK_ATTR = "_ddpcheck_fetch_sink"
_DELIVERED = "_ddpcheck_delivered_tasks"


def fold(data: bytes) -> int:
    """A 64-bit signed fingerprint of some bytes (the same in every process)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True)


def torch_state() -> bytes:
    import torch

    return bytes(torch.get_rng_state().numpy().tobytes())


def numpy_state() -> bytes | None:
    """The legacy global numpy state (its Mersenne Twister's key and position), or None where numpy was
    never imported. Read through the bit generator's C state (6 us) rather than ``np.random.get_state``
    (40 us, which copies it into new objects): a fetch takes two of these."""
    np = sys.modules.get("numpy")
    if np is None:
        return None
    try:
        generator = np.random.mtrand._rand._bit_generator
        if _NUMPY_STATE[0] is not generator:
            _NUMPY_STATE[:] = [generator, generator.ctypes.state_address]
        return ctypes.string_at(_NUMPY_STATE[1], _MT_BYTES)
    except Exception:  # another numpy layout: the public, slower way
        _, keys, pos, has_gauss, cached = np.random.get_state()
        return bytes(keys.tobytes()) + f"|{pos}|{has_gauss}|{cached!r}".encode()


_NUMPY_STATE: list[Any] = [None, 0]  # the global bit generator, and the address of its C state
_MT_BYTES = 624 * 4 + 4  # mt19937_state: uint32_t key[624]; int pos


def random_state() -> bytes:
    version, internal, gauss = random.getstate()
    return array("I", internal).tobytes() + f"|{version}|{gauss!r}".encode()


def generator_state(generator: Any) -> bytes:
    """A ``torch.Generator``'s state (CPU or CUDA)."""
    return bytes(generator.get_state().numpy().tobytes())


def cuda_state(device: Any = None) -> bytes:
    import torch

    index = torch.device(device).index if device is not None else None
    return bytes(torch.cuda.get_rng_state(index if index is not None else "cuda").numpy().tobytes())


READERS: dict[str, Callable[[], bytes | None]] = {
    "torch": torch_state,
    "numpy": numpy_state,
    "random": random_state,
}


def snapshot() -> dict[str, bytes | None]:
    """The raw state of the three global streams."""
    return {name: read() for name, read in READERS.items()}


def consumed(before: dict[str, bytes | None], after: dict[str, bytes | None]) -> tuple[Draw, ...]:
    """One :class:`Draw` per stream whose state changed, with its fingerprint before."""
    out = []
    for name in STREAMS:
        state = before.get(name)
        if state is not None and state != after.get(name):
            out.append(Draw(stream=name, state=fold(state)))
    return tuple(out)


# --- inside a worker -----------------------------------------------------------------------------------


class WatchedWorkerInit:
    """Wraps a DataLoader's ``worker_init_fn``: watch this worker's fetches, then run the user's own.

    Picklable (module-level class, plain fields), so it travels to spawned workers."""

    def __init__(self, inner: Callable[[int], Any] | None, folder: str, serial: int) -> None:
        self.inner, self.folder, self.serial = inner, folder, serial

    def __call__(self, worker_id: int) -> Any:
        watch_worker(self.folder, self.serial, worker_id)
        if self.inner is not None:
            return self.inner(worker_id)
        return None


class _WorkerChannel:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.generation = -1  # the worker's fetcher: a persistent worker makes one per epoch
        self.count = 0  # fetches of this generation (the task number where the worker loop hides it)

    def write(self, task: int, before: dict[str, bytes | None], after: dict[str, bytes | None]) -> None:
        fields = [str(self.generation), str(task)]
        for name in STREAMS:
            state = before.get(name)
            used = state is not None and state != after.get(name)
            fields.append(str(fold(state)) if used and state is not None else "x")  # hashed only when used
        os.write(self.fd, (" ".join(fields) + "\n").encode())


_CHANNEL: _WorkerChannel | None = None


def watch_worker(folder: str, serial: int, worker_id: int) -> None:
    """In a DataLoader worker: record each fetch's random streams to ``folder/s<serial>-w<worker>``."""
    global _CHANNEL
    from torch.utils.data import _DatasetKind
    from torch.utils.data._utils import fetch

    _CHANNEL = _WorkerChannel(os.path.join(folder, f"s{serial}-w{worker_id}"))
    for cls in (fetch._MapDatasetFetcher, fetch._IterableDatasetFetcher):
        original = cls.__dict__["fetch"]
        if not getattr(original, "_ddpcheck_watched", False):
            cls.fetch = _watched_fetch(original)  # type: ignore[method-assign]
    creator = _DatasetKind.__dict__["create_fetcher"]
    if not getattr(creator.__func__, "_ddpcheck_watched", False):

        def create_fetcher(*args: Any, **kwargs: Any) -> Any:
            if _CHANNEL is not None:
                _CHANNEL.generation += 1
                _CHANNEL.count = 0
            return creator.__func__(*args, **kwargs)

        create_fetcher._ddpcheck_watched = True  # type: ignore[attr-defined]
        _DatasetKind.create_fetcher = staticmethod(create_fetcher)  # type: ignore[method-assign,assignment]


def _watched_fetch(original: Callable[..., Any]) -> Callable[..., Any]:
    def fetch(self: Any, possibly_batched_index: Any) -> Any:
        channel = _CHANNEL
        if channel is None:
            return original(self, possibly_batched_index)
        if channel.count >= FETCH_LIMIT:  # enough of this epoch's fetches seen: the rest cost nothing
            channel.count += 1
            return original(self, possibly_batched_index)
        caller = sys._getframe(1)
        task = caller.f_locals.get("idx") if caller.f_code.co_name == "_worker_loop" else None
        if not isinstance(task, int):
            task = -1 - channel.count  # unknown: the fetch's order instead (negative, never a task)
        channel.count += 1
        before = snapshot()
        try:
            return original(self, possibly_batched_index)
        finally:
            channel.write(task, before, snapshot())

    fetch._ddpcheck_watched = True  # type: ignore[attr-defined]
    return fetch


# --- in the rank's main process --------------------------------------------------------------------------


class FetchWatch:
    """Watches every torch DataLoader iterator of this process; :meth:`take` hands a loader's fetches
    out in delivery order. ``on_main_fetch`` is told the states after each fetch the main process made
    itself while ``wants_states()`` (the loop's random-draw guard counts them as explained). The first
    :data:`FETCH_LIMIT` fetches of each worker and epoch are watched. The workers' files go to a folder
    made under ``under`` (the launch's trace folder, so a killed rank leaves nothing elsewhere), removed
    by :meth:`close`."""

    def __init__(
        self,
        on_main_fetch: Callable[[dict[str, bytes | None]], None] | None = None,
        under: str = "",
        wants_states: Callable[[], bool] | None = None,
    ) -> None:
        if under:
            os.makedirs(under, exist_ok=True)
        self.folder = tempfile.mkdtemp(prefix=f"fetch-{os.getpid()}-", dir=under or None)
        self.on_main_fetch = on_main_fetch
        self.wants_states = wants_states  # the states after every main-process fetch are wanted now
        self.serial = 0
        self.offsets: dict[str, int] = {}
        self.records: dict[tuple[int, int, int, int], tuple[Draw, ...]] = {}
        self.active = True

    def sink(self, loader: Any) -> deque[Any]:
        found = getattr(loader, _SINK_ATTR, None)
        if found is None:
            found = deque()
            try:
                object.__setattr__(loader, _SINK_ATTR, found)
            except (AttributeError, TypeError):
                pass
        return found

    def take(self, loader: Any) -> tuple[FetchDraws, ...] | None:
        """The fetches of the batches ``loader`` delivered since the last call, positions from 0."""
        pending = getattr(loader, _SINK_ATTR, None)
        if not pending:
            return None
        self._read()
        out = []
        position = 0
        while pending:
            entry = pending.popleft()
            if entry is not None and entry[0] == "task":  # (serial, worker, generation, task) in a worker
                draws = self.records.pop(entry[1:], None)
                if draws is not None:
                    out.append(FetchDraws(batch=position, worker=entry[2], draws=draws))
            elif entry is not None:  # built in this process
                out.append(FetchDraws(batch=position, worker=None, draws=entry[1]))
            position += 1
        return tuple(out)

    def _read(self) -> None:
        try:
            names = os.listdir(self.folder)
        except OSError:
            return
        for name in names:
            serial_text, _, worker_text = name[1:].partition("-w")
            path = os.path.join(self.folder, name)
            try:
                with open(path, "rb") as handle:
                    handle.seek(self.offsets.get(name, 0))
                    data = handle.read()
            except OSError:
                continue
            complete = data[: data.rfind(b"\n") + 1]
            self.offsets[name] = self.offsets.get(name, 0) + len(complete)
            for line in complete.decode().splitlines():
                self._parse(int(serial_text), int(worker_text), line.split())

    def _parse(self, serial: int, worker: int, fields: list[str]) -> None:
        if len(fields) != 2 + len(STREAMS):
            return
        pairs = zip(STREAMS, fields[2:], strict=True)
        draws = [Draw(stream=name, state=int(state)) for name, state in pairs if state != "x"]
        self.records[(serial, worker, int(fields[0]), int(fields[1]))] = tuple(draws)

    def close(self) -> None:
        self.active = False
        shutil.rmtree(self.folder, ignore_errors=True)


WATCH: FetchWatch | None = None
_installed = False


def install_fetch_watch(watch: FetchWatch) -> None:
    """Make ``watch`` the process's fetch watch (torch's iterator classes are patched once)."""
    global WATCH
    WATCH = watch
    _install()


def _install() -> None:
    global _installed
    if _installed:
        return
    for owner, name, value in (*_multi_process_patches(), *_single_process_patches()):
        patching.replace(owner, name, value)
    _installed = True


Patch = tuple[Any, str, Callable[..., Any]]  # (class, method name, replacement)


def _multi_process_patches() -> list[Patch]:
    """A worker-process iterator: each worker's initialiser is wrapped (its random state read), and
    which task each worker served, in which generation of the iterator, goes to the loader's sink."""
    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter as Multi

    multi_init, multi_reset = Multi.__init__, Multi._reset
    multi_get, multi_process = Multi._get_data, Multi._process_data

    def init_multi(self: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
        watch = WATCH
        if watch is None or not watch.active:
            multi_init(self, loader, *args, **kwargs)
            return
        watch.serial += 1
        self._ddpcheck_serial, self._ddpcheck_generation = watch.serial, -1
        self._ddpcheck_tasks = {}
        object.__setattr__(self, _SINK_ATTR, watch.sink(loader))
        inner = loader.worker_init_fn
        try:
            object.__setattr__(loader, "worker_init_fn", WatchedWorkerInit(inner, watch.folder, watch.serial))
        except (AttributeError, TypeError):
            multi_init(self, loader, *args, **kwargs)
            return
        try:
            multi_init(self, loader, *args, **kwargs)
        finally:
            object.__setattr__(loader, "worker_init_fn", inner)

    def reset(self: Any, *args: Any, **kwargs: Any) -> Any:
        if hasattr(self, "_ddpcheck_generation"):
            self._ddpcheck_generation += 1
            self._ddpcheck_tasks = {}
        return multi_reset(self, *args, **kwargs)

    def get_data(self: Any, *args: Any, **kwargs: Any) -> Any:
        got = multi_get(self, *args, **kwargs)
        tasks = getattr(self, "_ddpcheck_tasks", None)
        if tasks is not None and isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], int):
            tasks[id(got[1])] = got[0]
        return got

    def process_data(self: Any, data: Any, worker: Any, *args: Any, **kwargs: Any) -> Any:
        result = multi_process(self, data, worker, *args, **kwargs)
        tasks = getattr(self, "_ddpcheck_tasks", None)
        sink = getattr(self, _SINK_ATTR, None)
        if tasks is not None and sink is not None:
            task = tasks.pop(id(data), self._rcvd_idx - 1)
            sink.append(("task", self._ddpcheck_serial, int(worker), self._ddpcheck_generation, task))
        return result

    return [
        (Multi, "__init__", init_multi),
        (Multi, "_reset", reset),
        (Multi, "_get_data", get_data),
        (Multi, "_process_data", process_data),
    ]


def _single_process_patches() -> list[Patch]:
    """A main-process iterator: what each of its first ``FETCH_LIMIT`` fetches drew from the global
    random state goes to the loader's sink."""
    from torch.utils.data.dataloader import _SingleProcessDataLoaderIter as Single

    single_init, single_next = Single.__init__, Single._next_data

    def init_single(self: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
        single_init(self, loader, *args, **kwargs)
        watch = WATCH
        if watch is not None and watch.active:
            object.__setattr__(self, _SINK_ATTR, watch.sink(loader))
            object.__setattr__(self, "_next_index", _after_index(self._next_index, self))

    def next_single(self: Any, *args: Any, **kwargs: Any) -> Any:
        sink = getattr(self, _SINK_ATTR, None)
        watch = WATCH
        if sink is None or watch is None or not watch.active:
            return single_next(self, *args, **kwargs)
        self._ddpcheck_fetches = count = getattr(self, "_ddpcheck_fetches", 0) + 1
        wanted = watch.wants_states is not None and watch.wants_states()
        if count > FETCH_LIMIT and not wanted:
            data = single_next(self, *args, **kwargs)
            sink.append(None)
            return data
        self._ddpcheck_before = before = snapshot()
        data = single_next(self, *args, **kwargs)
        after = snapshot()
        before = self.__dict__.pop("_ddpcheck_before", before)  # as the sampler left it (below)
        sink.append(("main", consumed(before, after)) if count <= FETCH_LIMIT else None)
        if wanted and watch.on_main_fetch is not None:
            watch.on_main_fetch(after)
        return data

    return [(Single, "__init__", init_single), (Single, "_next_data", next_single)]


def _after_index(next_index: Callable[[], Any], iterator: Any) -> Callable[[], Any]:
    """The iterator's ``_next_index`` that restarts the fetch's watch once the sampler has drawn: a
    shuffling sampler seeds itself from the global stream on its first index, and that draw is the order
    (judged by coverage and overlap), not loading (a rank-blind shuffle of each rank's own shard is
    correct). A sampler that ends the epoch raises before the watch restarts."""

    def watched() -> Any:
        index = next_index()
        if "_ddpcheck_before" in iterator.__dict__:
            iterator._ddpcheck_before = snapshot()
        return index

    return watched


def forget_install() -> None:
    """After :func:`ddpcheck.checker.patching.undo`: the next watch installs again."""
    global _installed, WATCH
    _installed, WATCH = False, None
