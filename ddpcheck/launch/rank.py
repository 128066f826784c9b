"""The rank side: set up one process of a group, run the job, send back plain data, exit.

A rank makes itself safe to kill before anything else runs: its own process group (so a Ctrl-C in
the terminal reaches only the parent, and the parent can kill the rank together with its DataLoader
workers), a parent-death signal (so it dies with a SIGKILLed parent), and a stack dump on SIGUSR1
(so a hang is reported with the rank's stack). It ends with ``os._exit`` so that no inherited object
(the parent's store server, pytest's state) runs a destructor in the wrong process; the exit handlers
the rank registered itself, and its resource tracker, run first (:func:`run_exit_handlers`).
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import re
import shutil
import signal
import sys
import sysconfig
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import numpy.random  # noqa: F401 - imported once in the parent, not in every forked rank (~8 ms each)

from ddpcheck.launch.beats import attach, install_beats, report_progress, waiting
from ddpcheck.launch.names import watch_named_memory
from ddpcheck.launch.preload import refresh_rank_state
from ddpcheck.launch.procs import reap, write_frame
from ddpcheck.launch.target import TargetRef
from ddpcheck.messages import exception_text, one_line
from ddpcheck.wire.files import error_path, hash_flag_offset, named_flag_offset, output_path, stack_path

STACK_SIGNAL = signal.SIGUSR1  # every thread's stack, written between two bytecodes of the main thread
NATIVE_STACK_SIGNAL = signal.SIGUSR2  # faulthandler's dump, for a main thread held in C code
PYTHON_STACK_WAIT_S = 0.5  # how long the parent waits for the first dump before asking for the second
_PR_SET_PDEATHSIG = 1

JOINING = "joining the process group"


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
    run_id: str = ""
    close_fds: tuple[int, ...] = ()  # the parent's own descriptors a rank must not keep open
    ready_timeout_s: float = 0.0  # a group started on hold may wait this long for its store (0: timeout_s)
    watch_hashing: bool = False  # flag str hashing in ``progress`` (see watch_str_hashing)


def torchrun_env(rank: int, world_size: int, port: int, run_id: str, workdir: str) -> dict[str, str]:
    """What torchrun's elastic agent puts in every worker's environment (one node, no restarts).

    So code that sets itself up from the environment (accelerate's ``PartialState``, Lightning
    Fabric, ``init_process_group("env://")`` guarded by ``is_initialized()``) runs as under torchrun
    and finds the group ddpcheck already initialised. ``MASTER_PORT`` is the group's own store.
    """
    env = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "1",
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world_size),
        "ROLE_NAME": "default",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": run_id or "ddpcheck",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        "TORCHELASTIC_ERROR_FILE": error_path(workdir, rank),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }
    return env


def force_loopback() -> None:
    """Gloo and tensorpipe pick their interface from these: ddpcheck's own groups use loopback, always."""
    lo = "lo" if sys.platform == "linux" else "lo0"
    os.environ["GLOO_SOCKET_IFNAME"] = lo
    os.environ["TP_SOCKET_IFNAME"] = lo


RUN_TMPDIR_ENV = "DDPCHECK_RUN_TMPDIR"


@contextlib.contextmanager
def shared_tmp() -> Iterator[str]:
    """One temp directory for every group started inside: what a loader writes under the temp directory
    (litdata's optimized chunks, a cache keyed by path) is there again in the next topology, as it
    would be for a job restarted on the same machine. Removed on the way out, by its janitor if this
    process is killed."""
    from ddpcheck.launch.procs import Janitor, short_tempdir

    if os.environ.get(RUN_TMPDIR_ENV):  # nested (a pytest run inside a check): the outer one owns it
        yield os.environ[RUN_TMPDIR_ENV]
        return
    path = short_tempdir("ddpc-")
    janitor = Janitor(path)
    os.environ[RUN_TMPDIR_ENV] = path
    try:
        yield path
    finally:
        os.environ.pop(RUN_TMPDIR_ENV, None)
        janitor.close()  # before rmtree: it must not find the directory half removed
        shutil.rmtree(path, ignore_errors=True)


def private_tmp(workdir: str) -> None:
    """Temp files of user code (multiprocessing's ``pymp-*`` dirs, ...) go under the run's shared temp
    directory (:func:`shared_tmp`), else ddpcheck's workdir, which the parent removes on every way out;
    a rank ends with ``os._exit`` and cleans nothing itself."""
    import multiprocessing.process

    # not a subdirectory: AF_UNIX socket paths under it (multiprocessing's) must stay short
    path = os.environ.get(RUN_TMPDIR_ENV) or workdir
    os.environ["TMPDIR"] = path
    tempfile.tempdir = path  # the cached value from the parent would win over TMPDIR
    multiprocessing.process.current_process()._config.pop("tempdir", None)  # type: ignore[attr-defined]


def hash_seed_fixed() -> bool:
    """Every freshly started interpreter hashes strings alike: ``PYTHONHASHSEED`` is a number in the
    environment, which torchrun passes on to every rank."""
    return os.environ.get("PYTHONHASHSEED", "").isdigit()


def _seed_dependent(obj: Any, depth: int = 0) -> bool:
    """``hash(obj)`` changes with the interpreter's hash seed: str, bytes and datetimes do (tuples
    and frozensets through their items); ints and floats do not."""
    import datetime

    if isinstance(obj, (str, bytes, datetime.date, datetime.time)):
        return True
    if depth < 3 and isinstance(obj, (tuple, frozenset)):
        return any(_seed_dependent(item, depth + 1) for item in obj)
    return False


def watch_str_hashing(flags: Any, offset: int) -> None:
    """Set ``flags[offset]`` the first time the user's own code (not ddpcheck, the standard library or
    an installed package) calls ``hash()`` on a str (or bytes, a datetime, a tuple of them) in this
    process or a DataLoader worker forked from it.

    A forked rank shares the parent's hash seed, so code that shards or orders by ``hash(name)``
    agrees across ranks here and disagrees under torchrun, where every rank is a fresh interpreter
    with its own seed. The seed cannot be changed in a running interpreter (interned strings and
    every dict keyed by them hold hashes made with it); the parent runs such a group again with
    freshly started ranks instead. Once set, the builtin is put back: no cost after the first hit.
    """
    import builtins

    real = builtins.hash
    paths = sysconfig.get_paths()
    own = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the ddpcheck package
    keys = ("stdlib", "platstdlib", "purelib", "platlib")
    skip = tuple(os.path.join(d, "") for d in {own, *(paths.get(k, "") for k in keys)} if d)

    def counts(filename: str) -> bool:
        """The user's own files only: libraries hash strings for their caches and keys all the time
        (attrs, pandas, pydantic, HF datasets' split names, generated ``__hash__`` code in
        ``<string>``), and every hit costs a fresh start of the group (seconds a rank)."""
        return not filename.startswith(skip) and not filename.startswith("<")

    def hash(obj: Any, /) -> int:  # stands in for the builtin
        if _seed_dependent(obj) and counts(sys._getframe(1).f_code.co_filename):
            flags[offset] = b"\x01"
            builtins.hash = real
        return real(obj)

    hash.__doc__ = real.__doc__
    builtins.hash = hash


def hashed_strings(flags: Any, world_size: int) -> list[int]:
    """The ranks whose flag :func:`watch_str_hashing` set."""
    return [r for r in range(world_size) if flags[hash_flag_offset(world_size, r)] != b"\x00"]


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
        # The CPU generator only, as at process start (accelerator generators are seeded when first
        # used). ``torch.seed()`` would also queue a CUDA seeding with a formatted stack: ~20 ms a rank.
        torch.default_generator.seed()


EXIT_HANDLERS_S = 10.0  # at most, for a rank's own exit handlers and resource tracker at its end


def fresh_exit_state() -> None:
    """A forked rank starts with no exit handlers and no resource tracker, as a fresh process does.

    The parent's ``atexit`` handlers (pytest's, logging's flush of the parent's buffers) must never
    run in a rank; the rank's own (mosaicml-streaming removes its ``/dev/shm`` segments in one) run at
    its end (:func:`run_exit_handlers`). A tracker inherited from the parent would clean the rank's
    leaked segments only when the parent exits: the rank starts its own when it first needs one.
    """
    import atexit
    from multiprocessing import resource_tracker

    atexit._clear()
    tracker: Any = resource_tracker._resource_tracker
    if tracker._fd is not None:
        with contextlib.suppress(OSError):
            os.close(tracker._fd)  # this process's copy only: the parent's tracker keeps running
    tracker._fd = tracker._pid = None


def run_exit_handlers(code: int, forked: bool) -> None:
    """What a normal interpreter exit runs, within :data:`EXIT_HANDLERS_S`: ``atexit`` handlers
    registered in this rank, multiprocessing's exit (finalizers; daemonic children stopped, others
    joined), then the rank's resource tracker, which unlinks what the rank created and never freed.
    A handler that hangs ends in ``os._exit(code)`` at the deadline."""
    import atexit

    started = time.monotonic()
    watchdog = threading.Timer(EXIT_HANDLERS_S, os._exit, (code,))
    watchdog.daemon = True
    watchdog.start()
    if code == 0:  # a failed rank's position says where it failed: keep it
        report_progress("finished; running the rank's exit handlers")
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    if forked:  # registered in the parent, so cleared at the rank's start; a fresh process runs it last
        with contextlib.suppress(BaseException):
            import multiprocessing.util

            multiprocessing.util._exit_function()  # type: ignore[attr-defined]
    with contextlib.suppress(BaseException):
        from multiprocessing import resource_tracker

        tracker: Any = resource_tracker._resource_tracker
        fd, pid = tracker._fd, tracker._pid
        if fd is not None and pid is not None:  # started by this rank: EOF on its pipe makes it clean up
            tracker._fd = tracker._pid = None
            os.close(fd)
            reap(pid, max(EXIT_HANDLERS_S - (time.monotonic() - started), 0.0))


def _single_thread_torch() -> None:
    """A forked child must not use the parent's OpenMP pool: it hangs at its first parallel op.

    One intra-op thread per rank is also what a data check wants: W ranks share few cores.
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


def send_result(conn: Any, status: str, payload: Any) -> None:
    """Plain pickle, not torch's shared-memory reducer: tensors travel by value and survive our exit.

    Framed by :func:`ddpcheck.launch.procs.write_frame`: the parent reads it without ever blocking."""
    write_frame(conn.fileno(), (status, payload))


def make_killable(parent_pid: int, close_fds: tuple[int, ...] = ()) -> None:
    """Own process group, die with the parent, default Ctrl-C/TERM, none of the parent's private fds."""
    try:
        os.setpgrp()
    except OSError:
        pass
    _die_with_parent(parent_pid)
    for fd in close_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _isolate(spec: RankSpec) -> None:
    make_killable(spec.parent_pid, (*([spec.listen_fd] if spec.listen_fd >= 0 else []), *spec.close_fds))


def _capture_output(spec: RankSpec) -> None:
    if not spec.capture:
        return
    fd = os.open(output_path(spec.workdir, spec.rank), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # None where the parent started without them
            stream.flush()
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
            with waiting():
                if _store.add("ddpcheck/finished", 1) == spec.world_size:
                    _store.set("ddpcheck/all-finished", "1")
                _store.wait(["ddpcheck/all-finished"])
        if dist.is_initialized() and spec.backend == "nccl":
            dist.destroy_process_group()  # gloo's teardown costs ~10 ms a rank; os._exit frees it all
    except Exception:  # a peer died; our result is already sent
        pass


_WORKER_CAUGHT = re.compile(r"^Caught (\S+) in DataLoader worker process (\d+)\.")
_FRAME = re.compile(r'^\s+File "(.+)", line (\d+), in (.+)$')


def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths.get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    torch_file = getattr(sys.modules.get("torch"), "__file__", None)
    if torch_file:
        dirs.add(os.path.dirname(str(torch_file)))
    return tuple(d for d in dirs if d)


def worker_headline(text: str) -> str:
    """'ValueError: msg [DataLoader worker process 0, file.py:25 in f]' from torch's re-raised text.

    torch re-raises a worker's exception in the main process as "Caught X in DataLoader worker
    process N." with the worker's traceback as text: the headline a user needs is the original
    exception and the user's own frame in it (the innermost one outside torch and the stdlib).
    Returns '' when ``text`` is not such a message.
    """
    lines = text.splitlines()
    match = _WORKER_CAUGHT.match(lines[0]) if lines else None
    if match is None:
        return ""
    frames: list[tuple[str, str, str]] = []
    exc_line = ""
    after_frame = False
    for line in lines[1:]:
        frame = _FRAME.match(line)
        if frame:
            frames.append((frame.group(1), frame.group(2), frame.group(3)))
            after_frame, exc_line = True, ""
        elif after_frame and line and not line[0].isspace() and not exc_line:
            exc_line = line.strip()
    exc_line = exc_line or match.group(1)
    libraries = _library_dirs()
    user = [f for f in frames if not f[0].startswith(libraries) and not f[0].startswith("<")]
    where = (user or frames)[-1:] if frames else []
    site = f", {where[0][0]}:{where[0][1]} in {where[0][2]}" if where else ""
    return f"{exc_line} [DataLoader worker process {match.group(2)}{site}]"


MAX_MESSAGE = 500  # characters of an exception's first line carried as its message
MAX_TRACEBACK = 64 * 1024  # characters of a traceback carried (its start and its end)


def error_message(exc: BaseException) -> dict[str, Any]:
    text = exception_text(exc)  # one whose __str__ raises still has a traceback to show
    message = text.splitlines()[0] if text else type(exc).__name__
    if isinstance(exc, SystemExit):
        message = f"the code called sys.exit({exc.code!r}) (a rank must return, not exit)"
    else:
        message = worker_headline(text) or message
    message = one_line(message, MAX_MESSAGE)
    try:
        trace = "".join(traceback.format_exception(exc))
    except Exception:
        trace = "".join(traceback.format_tb(exc.__traceback__)) + f"{type(exc).__name__}: {text}\n"
    if len(trace) > MAX_TRACEBACK:
        half = MAX_TRACEBACK // 2
        trace = f"{trace[:half]}\n... ({len(trace) - MAX_TRACEBACK:,} characters cut) ...\n{trace[-half:]}"
    return {
        "exc_type": type(exc).__name__,
        "exc_module": type(exc).__module__,
        "message": message,
        "traceback": trace,
        "time": time.time(),
    }


def install_stack_dumps(stack_file: Any) -> None:
    """A fatal error writes the stacks; :data:`STACK_SIGNAL` (a hang) writes them from a Python-level
    handler, :data:`NATIVE_STACK_SIGNAL` from faulthandler's own.

    faulthandler's handler runs at any instruction, and one arriving while the interrupted thread
    pushes a Python frame can read it half-made and crash the process (seen with CPython 3.11 under
    load, in a rank spinning in a Python loop). The Python-level handler runs between bytecodes, so
    every frame is whole; it cannot run while the main thread is held in C code (a collective), which
    is why the parent falls back to the native signal when nothing was written.
    """
    faulthandler.enable(file=stack_file, all_threads=True)
    faulthandler.register(NATIVE_STACK_SIGNAL, file=stack_file, all_threads=True, chain=False)
    fd = stack_file.fileno()

    def dump(signum: int, frame: Any) -> None:
        try:
            os.write(fd, format_stacks(frame).encode("utf-8", "replace"))
        except BaseException:  # nothing may reach the user code it interrupted
            pass

    signal.signal(STACK_SIGNAL, dump)


def format_stacks(frame: Any) -> str:
    """Every thread's stack in faulthandler's layout ("most recent call first"); ``frame`` is the main
    thread's, where the signal interrupted it."""
    current = threading.get_ident()
    stacks = [(current, frame), *((i, f) for i, f in sys._current_frames().items() if i != current)]
    blocks = []
    for ident, top in stacks:
        lines = [
            f"{'Current thread' if ident == current else 'Thread'} 0x{ident:016x} (most recent call first):"
        ]
        while top is not None:
            lines.append(f'  File "{top.f_code.co_filename}", line {top.f_lineno} in {top.f_code.co_name}')
            top = top.f_back
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def rank_main(spec: RankSpec, conn: Any, progress: Any, ready: Any = None) -> None:
    """Process entry point of one rank."""
    _isolate(spec)
    attach(progress, spec.rank)
    os.environ.update(spec.env)
    env = torchrun_env(spec.rank, spec.world_size, spec.port, spec.run_id, spec.workdir)
    if not spec.init_group:  # a body that connects itself must not find ddpcheck's store in MASTER_PORT
        env = {k: v for k, v in env.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    os.environ.update(env)
    refresh_rank_state()  # modules the parent preloaded read RANK when it was unset
    force_loopback()
    private_tmp(spec.workdir)
    _capture_output(spec)
    if spec.forked:
        _single_thread_torch()
        fresh_exit_state()
    if spec.watch_hashing:
        watch_str_hashing(progress, hash_flag_offset(spec.world_size, spec.rank))
    watch_named_memory(progress, named_flag_offset(spec.world_size, spec.rank), spec.workdir)
    fresh_random_state()
    install_stack_dumps(open(stack_path(spec.workdir, spec.rank), "w"))  # noqa: SIM115 - lives as the rank
    code = 0
    try:
        report_progress(JOINING)
        if spec.init_group:
            if ready is not None and not ready.wait(max(spec.timeout_s, spec.ready_timeout_s)):
                raise TimeoutError("the parent never started the rendezvous store")
            _init_group(spec)
        report_progress("running")
        install_beats()
        func = spec.target.resolve() if isinstance(spec.target, TargetRef) else spec.target
        value = func(**spec.kwargs)
        send_result(conn, "ok", value)
    except BaseException as exc:
        code = 1
        try:
            send_result(conn, "error", error_message(exc))
        except Exception:
            pass
    finally:
        try:
            conn.close()
        except Exception:
            pass
    if spec.init_group and code == 0:  # a failed rank leaves at once, as it would in a real job
        _final_barrier(spec)
    run_exit_handlers(code, spec.forked)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # user code may have closed or replaced them
            stream.flush()
    os._exit(code)
