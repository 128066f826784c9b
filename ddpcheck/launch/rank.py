"""The rank side: set up one process of a group, run the job, send back plain data, exit.

A rank makes itself safe to kill before anything else runs: its own process group (so a Ctrl-C in
the terminal reaches only the parent, and the parent can kill the rank together with its DataLoader
workers), a parent-death signal (so it dies with a SIGKILLed parent), and a stack dump on SIGUSR1
(so a hang is reported with the rank's stack). It ends with ``os._exit`` so that no inherited object
(the parent's store server, pytest's state) runs a destructor in the wrong process.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import pickle
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ddpcheck.launch.target import TargetRef

STACK_SIGNAL = signal.SIGUSR1
PROGRESS_BYTES = 240
_PR_SET_PDEATHSIG = 1

JOINING = "joining the process group"

_progress_buffer: Any = None
_progress_rank = 0


@dataclass
class RankSpec:
    """Everything a rank needs, as plain data (``target`` may be a callable only under fork)."""

    rank: int
    world_size: int
    backend: str
    port: int
    timeout_s: float
    target: TargetRef | Callable[..., Any]
    kwargs: dict[str, Any] = field(default_factory=dict)
    workdir: str = ""
    capture: bool = True
    listen_fd: int = -1
    parent_pid: int = 0
    env: dict[str, str] = field(default_factory=dict)
    init_group: bool = True
    forked: bool = True


def report_progress(text: str) -> None:
    """Publish where this rank is ("epoch 0, batch 4") for the parent's hang report; no-op outside ranks."""
    if _progress_buffer is None:
        return
    raw = text.encode("utf-8", "replace")[: PROGRESS_BYTES - 1]
    start = _progress_rank * PROGRESS_BYTES
    _progress_buffer[start : start + PROGRESS_BYTES] = raw.ljust(PROGRESS_BYTES, b"\0")


def read_progress(buffer: Any, rank: int) -> str:
    start = rank * PROGRESS_BYTES
    raw = bytes(buffer[start : start + PROGRESS_BYTES])
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def stack_path(workdir: str, rank: int) -> str:
    return os.path.join(workdir, f"rank{rank}.stack")


def output_path(workdir: str, rank: int) -> str:
    return os.path.join(workdir, f"rank{rank}.out")


def _die_with_parent(parent_pid: int) -> None:
    if sys.platform != "linux":
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if parent_pid and os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def fresh_random_state() -> None:
    """Reseed Python, numpy and torch from entropy, as a freshly started rank process would be.

    Forked ranks inherit the parent's generators, so every rank would draw the same numbers and a
    loader that relies on unseeded global randomness would look correct here and break under torchrun.
    """
    import random

    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()


def _single_thread_torch() -> None:
    """A forked child must not use the parent's OpenMP pool: it hangs at its first parallel op.

    One intra-op thread per rank is also what a data check wants: W ranks share few cores.
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


def send_result(conn: Any, status: str, payload: Any) -> None:
    """Plain pickle, not torch's shared-memory reducer: tensors travel by value and survive our exit."""
    conn.send_bytes(pickle.dumps((status, payload), protocol=pickle.HIGHEST_PROTOCOL))


def _isolate(spec: RankSpec) -> None:
    try:
        os.setpgrp()
    except OSError:
        pass
    _die_with_parent(spec.parent_pid)
    if spec.listen_fd >= 0:
        try:
            os.close(spec.listen_fd)
        except OSError:
            pass
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _capture_output(spec: RankSpec) -> None:
    if not spec.capture:
        return
    fd = os.open(output_path(spec.workdir, spec.rank), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # Python-level streams may be a harness's capture objects (pytest's), not fds 1 and 2.
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115


_store: Any = None


def _init_group(spec: RankSpec) -> None:
    """Join the group. Gloo connects peers lazily, so a loader that never calls a collective never
    pays for the full mesh; the first collective it does call connects as usual."""
    global _store
    import torch.distributed as dist

    os.environ.setdefault("TORCH_GLOO_LAZY_INIT", "1")
    timeout = timedelta(seconds=spec.timeout_s)
    _store = dist.TCPStore("127.0.0.1", spec.port, spec.world_size, is_master=False, timeout=timeout)
    if spec.backend == "nccl":
        import torch

        torch.cuda.set_device(spec.rank % max(torch.cuda.device_count(), 1))
    dist.init_process_group(
        spec.backend, store=dist.PrefixStore("pg", _store), rank=spec.rank, world_size=spec.world_size,
        timeout=timeout,
    )  # fmt: skip


def _final_barrier(spec: RankSpec) -> None:
    """Wait for peers as a training loop's last collective would, so a peer's hang shows here.

    Through the rendezvous store, not a gloo collective: it needs no peer-to-peer connections.
    """
    import torch.distributed as dist

    report_progress("finished; waiting for peers at ddpcheck's final barrier")
    try:
        if spec.world_size > 1 and _store is not None:
            if _store.add("ddpcheck/finished", 1) == spec.world_size:
                _store.set("ddpcheck/all-finished", "1")
            _store.wait(["ddpcheck/all-finished"])
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # a peer died; our result is already sent
        pass


def _error_message(exc: BaseException) -> dict[str, Any]:
    return {
        "exc_type": type(exc).__name__,
        "exc_module": type(exc).__module__,
        "message": str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
        "traceback": "".join(traceback.format_exception(exc)),
        "time": time.time(),
    }


def rank_main(spec: RankSpec, conn: Any, progress: Any, ready: Any = None) -> None:
    """Process entry point of one rank."""
    global _progress_buffer, _progress_rank
    _isolate(spec)
    _progress_buffer, _progress_rank = progress, spec.rank
    os.environ.update(spec.env)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo" if sys.platform == "linux" else "lo0")
    os.environ["RANK"] = str(spec.rank)
    os.environ["WORLD_SIZE"] = str(spec.world_size)
    os.environ["LOCAL_RANK"] = str(spec.rank)
    _capture_output(spec)
    if spec.forked:
        _single_thread_torch()
    fresh_random_state()
    stack_file = open(stack_path(spec.workdir, spec.rank), "w")  # noqa: SIM115 - lives as long as the rank
    faulthandler.enable(file=stack_file, all_threads=True)
    faulthandler.register(STACK_SIGNAL, file=stack_file, all_threads=True, chain=False)
    code = 0
    try:
        report_progress(JOINING)
        if spec.init_group:
            if ready is not None and not ready.wait(spec.timeout_s):
                raise TimeoutError("the parent never started the rendezvous store")
            _init_group(spec)
        report_progress("running")
        func = spec.target.resolve() if isinstance(spec.target, TargetRef) else spec.target
        value = func(**spec.kwargs)
        send_result(conn, "ok", value)
    except BaseException as exc:
        code = 1
        try:
            send_result(conn, "error", _error_message(exc))
        except Exception:
            pass
    finally:
        try:
            conn.close()
        except Exception:
            pass
    if spec.init_group and code == 0:  # a failed rank leaves at once, as it would in a real job
        _final_barrier(spec)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
