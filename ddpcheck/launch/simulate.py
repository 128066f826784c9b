"""Simulated ranks: every rank of a world runs one after another in one forked child process.

For world sizes far beyond the machine (up to 1024 and more) when the loader needs no real
collectives. The whole group is one child, not one per rank (W=1024 stays cheap), and that child is
a rank in every other respect: its own process group, dead with the parent, a deadline per simulated
rank (``timeout``, as a real rank gets), output captured to a file and read back as a bounded tail,
results back over a pipe as plain data. So user code that calls ``sys.exit``, loops forever, leaves a
non-daemon thread or child processes, prints, or installs signal handlers cannot touch ddpcheck.

Each rank sees an initialised default group on torch's ``fake`` backend and torchrun's environment,
so factories that read ``torch.distributed.get_rank()`` or ``RANK`` work. Any real collective
(all_reduce, broadcast, ...) is refused with :class:`NeedsCollectives` and the simulation stops: a
fake result would be a lie.
Module-level code of the user's file runs once, not once per rank, and a seeded permutation that
every rank draws identically is computed once (:mod:`ddpcheck.launch.shared_work`).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from ddpcheck.launch import rank as rank_side
from ddpcheck.launch.group import GroupResult, RankOutcome, bind_loopback, dump_stacks
from ddpcheck.launch.preload import find_rank_state_holders, refresh_rank_state
from ddpcheck.launch.procs import (
    ExitWatch,
    FrameReader,
    Janitor,
    Reaper,
    kill_group,
    poll_interval,
    process_state,
    read_span_tail,
    read_tail,
    short_tempdir,
    wait_objects,
    write_frame,
)
from ddpcheck.launch.rank import (
    PROGRESS_BYTES,
    force_loopback,
    fresh_random_state,
    make_killable,
    private_tmp,
    read_progress,
    torchrun_env,
)
from ddpcheck.launch.shared_work import known_samplers, shared_permutations

_START_ALLOWANCE_S = 10.0  # on top of the first simulated rank's timeout: the fork, on a loaded machine
_OUTPUT_TAIL = 20_000
_STACK_TAIL = 200_000

COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "all_to_all",
    "all_to_all_single", "barrier", "monitored_barrier", "broadcast", "broadcast_object_list",
    "reduce", "reduce_scatter", "reduce_scatter_tensor", "gather", "gather_object", "scatter",
    "scatter_object_list", "send", "recv", "isend", "irecv",
)  # fmt: skip


class NeedsCollectives(RuntimeError):
    """The loader called a collective, which a simulated rank cannot answer truthfully."""

    harness_error = True  # about ddpcheck's mode, not the user's code: never re-wrapped


@contextlib.contextmanager
def collectives_forbidden() -> Iterator[None]:
    from torch.distributed import distributed_c10d

    saved: list[tuple[Any, str, Any]] = []

    def refuse(name: str) -> Callable[..., Any]:
        def refused(*args: Any, **kwargs: Any) -> Any:
            raise NeedsCollectives(
                f"the loader calls torch.distributed.{name}, which --simulate cannot answer; "
                "run without --simulate (real gloo ranks)"
            )

        return refused

    for module in (dist, distributed_c10d):
        for name in COLLECTIVES:
            if hasattr(module, name):
                saved.append((module, name, getattr(module, name)))
                setattr(module, name, refuse(name))
    try:
        yield
    finally:
        for module, name, original in saved:
            setattr(module, name, original)


SPLIT_MIN_RANKS = 64  # from this world size on, the ranks are shared out over the machine's cores
# From this world size on, recognised samplers compute their share directly: below it the saving is
# small. (Epochs of ARRAYS_FROM samples and more are read as arrays at every world size, the reference's too.)
SHORTCUTS_FROM = 64
MAX_PARTS = 4


def _parts(ranks: Sequence[int]) -> list[list[int]]:
    """Consecutive slices of ``ranks``, one a child: one below ``SPLIT_MIN_RANKS``, else one a core (<= 4)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    count = min(max(cores, 1), MAX_PARTS) if len(ranks) >= SPLIT_MIN_RANKS else 1
    bounds = [len(ranks) * i // count for i in range(count + 1)]
    return [list(ranks[bounds[i] : bounds[i + 1]]) for i in range(count)]


@dataclass
class _Part:
    """One child process and the ranks it simulates, in order."""

    ranks: list[int]
    workdir: str
    progress: Any
    read_fd: int = -1
    proc: Any = None
    collected: _Collected | None = None


@dataclass(frozen=True)
class _Simulation:
    """What every child of one simulated group runs: ``target(**kwargs)`` as each of its ranks of a
    ``world_size`` world; ``capture``: the ranks' output to a file; ``shortcuts``: see
    :func:`simulate_ranks`."""

    target: Callable[..., Any]
    world_size: int
    kwargs: dict[str, Any]
    capture: bool
    shortcuts: bool


def simulate_ranks(
    target: Callable[..., Any],
    world_size: int,
    *,
    kwargs: dict[str, Any] | None = None,
    timeout: float = 120.0,
    capture: bool = True,
    ranks: Sequence[int] | None = None,
    shortcuts: bool = False,
) -> GroupResult:
    """Run ``target(**kwargs)`` once per rank in forked children; raises NeedsCollectives if it needs peers.

    ``ranks``: only these ranks of the ``world_size`` world (a sample; the result has their outcomes only).
    ``shortcuts``: torch's ``DistributedSampler`` computes its share directly from ``SHORTCUTS_FROM`` ranks
    on, verified on some ranks (:func:`~ddpcheck.launch.shared_work.known_samplers`), and its epochs over
    ``ARRAYS_FROM`` samples and more are read as arrays at any world size
    (:func:`~ddpcheck.launch.shared_work.epoch_array`); the result's ``shortcuts`` says what was done.

    Below ``SPLIT_MIN_RANKS`` ranks one child runs them all in order; from there on the ranks are cut
    into contiguous ranges, one child per core, which run side by side. Within a child, each
    simulated rank must finish within ``timeout`` seconds of the previous one; the first hung rank is
    reported as ``hang`` with its stack and progress, the ranks after it in that child as ``secondary``.
    """
    if world_size < 1:
        raise ValueError(f"world size must be a positive integer, got {world_size}")
    if dist.is_initialized():
        raise RuntimeError("--simulate needs a process without a default process group")
    ctx: Any = mp.get_context("fork")
    chosen = sorted(set(ranks)) if ranks is not None else list(range(world_size))
    if not chosen or chosen[0] < 0 or chosen[-1] >= world_size:
        raise ValueError(f"ranks must be a non-empty selection of 0..{world_size - 1}")
    started = time.monotonic()
    find_rank_state_holders()  # what each simulated rank refreshes once it knows its rank
    simulation = _Simulation(target, world_size, dict(kwargs or {}), capture, shortcuts)
    workdir = short_tempdir("ddpc-s")
    janitor = Janitor(workdir)  # removes workdir and the children's groups should this process be SIGKILLed
    ranges = _parts(chosen)
    parts: list[_Part] = []
    for part_ranks in ranges:
        sub = workdir if len(ranges) == 1 else os.path.join(workdir, f"p{part_ranks[0]}")
        os.makedirs(sub, exist_ok=True)
        parts.append(_Part(part_ranks, sub, ctx.Array("c", PROGRESS_BYTES, lock=False)))
    reaper = Reaper()
    reaper.start()
    try:
        for part in parts:
            _start_part(ctx, simulation, part, parts, janitor)
        threads = [
            threading.Thread(target=_collect_part, args=(part, timeout), daemon=True) for part in parts
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return _group_result(simulation, parts, started)
    finally:
        _close(parts, reaper, janitor, workdir)


def _start_part(ctx: Any, simulation: _Simulation, part: _Part, parts: list[_Part], janitor: Janitor) -> None:
    """Fork ``part``'s child; it closes the read ends of the pipes started before it (``parts``')."""
    part.read_fd, write_fd = os.pipe()
    try:
        part.proc = ctx.Process(
            target=_child_main,
            args=(
                simulation,
                tuple(part.ranks),
                write_fd,
                (*(p.read_fd for p in parts if p.read_fd >= 0), janitor.fd),
                part.progress,
                part.workdir,
                os.getpid(),
            ),
            name="ddpcheck-simulated-ranks",
        )
        part.proc.start()
        janitor.watch(part.proc.pid)
    finally:
        os.close(write_fd)


def _group_result(simulation: _Simulation, parts: list[_Part], started: float) -> GroupResult:
    """Every part's outcomes, in rank order, and the shortcuts the parts took, summed; NeedsCollectives
    when a part's ranks needed peers."""
    for part in parts:
        assert part.collected is not None
        if part.collected.needs:
            raise NeedsCollectives(part.collected.needs)
    outcomes: list[RankOutcome] = []
    capture = simulation.capture
    for part in parts:
        assert part.collected is not None
        outcomes += _outcomes(part.collected, part.proc, part.progress, part.workdir, capture, part.ranks)
    result = GroupResult(simulation.world_size, "simulated", outcomes, time.monotonic() - started)
    for part in parts:
        assert part.collected is not None
        for key, value in part.collected.shortcuts.items():
            if isinstance(value, int):
                result.shortcuts[key] = result.shortcuts.get(key, 0) + value
            elif value:
                result.shortcuts[key] = value
    return result


def _close(parts: list[_Part], reaper: Reaper, janitor: Janitor, workdir: str) -> None:
    """Nothing of the group outlives it: every child joined or killed (group and all), every pipe
    closed, the work directory removed."""
    for part in parts:  # a child that said done runs its exit handlers (rank_side.run_exit_handlers)
        if part.proc is not None and part.collected is not None and part.collected.done:
            part.proc.join(timeout=rank_side.EXIT_HANDLERS_S + 1.0)
    for part in parts:
        if part.proc is not None and part.proc.pid is not None:
            kill_group(part.proc.pid)
    for part in parts:
        if part.proc is not None and part.proc.pid is not None:
            part.proc.join(timeout=5)
    reaper.sweep({p.proc.pid for p in parts if p.proc is not None and p.proc.pid is not None})
    reaper.stop()
    for part in parts:
        if part.read_fd >= 0:
            os.close(part.read_fd)
    shutil.rmtree(workdir, ignore_errors=True)
    janitor.close()


def _collect_part(part: _Part, timeout: float) -> None:
    collected = _Collected(len(part.ranks))
    try:
        _collect(part.proc, FrameReader(part.read_fd), collected, timeout)
    except BaseException as exc:  # the thread's failure must not pass for a clean ending
        collected.fatal = rank_side.error_message(exc)
    part.collected = collected


class _Collected:
    """What came back from the child: per-rank results (in rank order) and how it ended."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.results: list[tuple[str, Any, int, int]] = []  # status, payload, output span
        self.done = False
        self.needs = ""
        self.fatal: dict[str, Any] | None = None
        self.timed_out = False
        self.partial = 0
        self.shortcuts: dict[str, Any] = {}


def _collect(proc: Any, reader: FrameReader, collected: _Collected, timeout: float) -> None:
    """Read until the child says done, exits, or one simulated rank runs past ``timeout``."""
    watch = ExitWatch(proc.pid)
    deadline = time.monotonic() + timeout + _START_ALLOWANCE_S
    try:
        while True:
            now = time.monotonic()
            if now >= deadline:
                collected.timed_out = True
                break
            limit = deadline - now
            poll = poll_interval([watch])
            objects: list[Any] = [reader, *wait_objects(watch)]
            mp.connection.wait(objects, timeout=min(limit, poll or limit))
            exited = (
                proc.exitcode is not None if watch.fd is None else bool(mp.connection.wait([watch.fd], 0))
            )
            for message in reader.pump():
                if message[0] == "rank":
                    _, status, payload, begin, end = message
                    collected.results.append((status, payload, begin, end))
                    deadline = time.monotonic() + timeout
                elif message[0] == "done":
                    collected.done = True
                    collected.shortcuts = message[1] if len(message) > 1 else {}
                elif message[0] == "needs":
                    collected.needs = message[1]
                elif message[0] == "fatal":
                    collected.fatal = message[1]
            if collected.done or collected.needs or collected.fatal or exited:
                collected.partial = reader.partial
                break
    finally:
        watch.close()


def _outcomes(
    collected: _Collected, proc: Any, progress: Any, workdir: str, capture: bool, ranks: Sequence[int]
) -> list[RankOutcome]:
    """Outcomes of the ``ranks`` one child ran, in rank order."""
    out_path = os.path.join(workdir, "ranks.out")
    outcomes: list[RankOutcome] = []
    last_end = 0
    for rank, (status, payload, begin, end) in zip(ranks, collected.results, strict=False):
        last_end = end
        if status == "ok":
            outcomes.append(RankOutcome(rank=rank, kind="ok", value=payload))
            continue
        outcome = RankOutcome(
            rank=rank,
            kind="error",
            message=payload.get("message", ""),
            error=payload.get("traceback", ""),
            exc_type=payload.get("exc_type", ""),
            error_time=payload.get("time", 0.0),
        )
        if capture:
            outcome.output = read_span_tail(out_path, begin, end, _OUTPUT_TAIL)
        outcomes.append(outcome)
    if len(outcomes) == collected.world_size:
        return outcomes
    current = RankOutcome(rank=ranks[len(outcomes)], progress=read_progress(progress, 0))
    if collected.timed_out:
        current.kind, current.message = "hang", "no result before the deadline (--simulate)"
        if process_state(proc.pid) == "T":
            current.message += " (the process was stopped, e.g. by SIGSTOP)"
        else:
            current.stack = _dump_stack(proc, workdir)
    elif collected.fatal is not None:
        current.kind, current.message = "error", collected.fatal.get("message", "")
        current.error, current.exc_type = (
            collected.fatal.get("traceback", ""),
            collected.fatal.get("exc_type", ""),
        )
    else:
        proc.join(timeout=1.0)
        code = proc.exitcode
        current.exitcode = code
        if code is not None and code < 0:
            current.kind, current.message = "killed", f"killed by signal {-code}"
            with contextlib.suppress(ValueError):
                current.message = f"killed by {rank_side.signal.Signals(-code).name}"
        else:
            current.kind = "exited"
            current.message = f"exited with code {code} before sending a result (os._exit in user code?)"
        if collected.partial:
            current.message += f"; its result was cut off after {collected.partial} bytes"
        current.stack = read_tail(os.path.join(workdir, "ranks.stack"), _STACK_TAIL)
    if capture:
        size = os.path.getsize(out_path) if os.path.exists(out_path) else 0
        current.output = read_span_tail(out_path, last_end, size, _OUTPUT_TAIL)
    outcomes.append(current)
    for rank in ranks[len(outcomes) :]:
        outcomes.append(
            RankOutcome(
                rank=rank, kind="secondary", message=f"not run: simulated rank {current.rank} did not finish"
            )
        )
    return outcomes


def _dump_stack(proc: Any, workdir: str) -> str:
    path = os.path.join(workdir, "ranks.stack")
    dump_stacks([(proc, path)])
    return read_tail(path, _STACK_TAIL)


def _child_main(
    simulation: _Simulation,
    ranks: tuple[int, ...],
    fd: int,
    parent_fds: tuple[int, ...],
    progress: Any,
    workdir: str,
    parent_pid: int,
) -> None:
    """One simulated group's process: its ranks in order, one framed message per rank, then exit."""
    make_killable(parent_pid, parent_fds)
    force_loopback()
    private_tmp(workdir)
    if simulation.capture:
        out = os.open(os.path.join(workdir, "ranks.out"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    rank_side._single_thread_torch()
    rank_side.fresh_exit_state()
    rank_side.install_stack_dumps(open(os.path.join(workdir, "ranks.stack"), "w"))  # noqa: SIM115
    rank_side._progress_buffer, rank_side._progress_rank = progress, 0
    port_holder = bind_loopback()  # MASTER_PORT names a loopback port that is ours, not a stranger's
    port = port_holder.getsockname()[1]
    try:
        done = _run_all(simulation, ranks, fd, workdir, port)
        write_frame(fd, ("done", done))
    except BaseException as exc:  # ddpcheck's own failure around the ranks, not a rank's
        with contextlib.suppress(BaseException):
            write_frame(fd, ("fatal", rank_side.error_message(exc)))
    rank_side.run_exit_handlers(0, forked=True)  # every simulated rank's, as their processes would
    with contextlib.suppress(BaseException):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(0)


def _run_all(
    simulation: _Simulation, ranks: tuple[int, ...], fd: int, workdir: str, port: int
) -> dict[str, Any]:
    """Each of ``ranks`` in turn; returns what :func:`known_samplers` did (empty without ``shortcuts``)."""
    target, world_size, kwargs = simulation.target, simulation.world_size, simulation.kwargs
    capture = simulation.capture
    from torch.testing._internal.distributed.fake_pg import FakeStore

    run_id = f"ddpcheck-sim-{os.getpid()}"
    lists = world_size >= SHORTCUTS_FROM
    known = known_samplers(lists=lists) if simulation.shortcuts else contextlib.nullcontext(None)
    with collectives_forbidden(), shared_permutations(), known as done:
        cwd = os.getcwd()
        for rank in ranks:
            begin = _position(capture)
            os.chdir(cwd)  # as a process of its own would: a rank's chdir must not move the next one
            os.environ.update(torchrun_env(rank, world_size, port, run_id, workdir))
            refresh_rank_state()
            rank_side.report_progress(f"simulated rank {rank}: starting")
            fresh_random_state()
            dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
            status: str
            payload: Any
            try:
                status, payload = "ok", target(**kwargs)
            except NeedsCollectives as exc:
                write_frame(fd, ("needs", str(exc)))
                return {}
            except BaseException as exc:  # SystemExit and KeyboardInterrupt too: this rank failed
                status, payload = "error", rank_side.error_message(exc)
            finally:
                if dist.is_initialized():
                    dist.destroy_process_group()
            write_frame(fd, ("rank", status, payload, begin, _position(capture)))
    return done.summary() if done is not None else {}


def _position(capture: bool) -> int:
    if not capture:
        return 0
    with contextlib.suppress(BaseException):
        sys.stdout.flush()
        sys.stderr.flush()
    try:
        return os.lseek(1, 0, os.SEEK_CUR)
    except OSError:
        return 0
