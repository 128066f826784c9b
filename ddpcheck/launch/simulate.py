"""Simulated ranks: the ranks of a world run one after another in a few forked child processes.

For world sizes far beyond the machine (up to 1024 and more) when the loader needs no real
collectives. A child runs many ranks, not one (W=1024 stays cheap), and it is a rank in every other
respect: its own process group, dead with the parent, a deadline on progress (``timeout``: no batch for
that long, as a real rank gets), output captured to a file and read back as a bounded tail, results back
over a pipe as plain data. So user code that calls ``sys.exit``, loops forever, leaves a non-daemon
thread or child processes, prints, or installs signal handlers cannot touch ddpcheck.

Memory stays near one rank's own: a child drops every reference to a rank's objects and hands the
memory back (:mod:`ddpcheck.launch.memory`) before the next rank, and the number of children side by
side follows the first rank's measured peak, not only the number of cores.

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
import multiprocessing.connection
import os
import shutil
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from ddpcheck.launch import rank as rank_side
from ddpcheck.launch.beats import COLLECTIVES, attach, beat, read_progress, report_progress
from ddpcheck.launch.group import GroupResult, RankOutcome, bind_loopback, dump_stacks
from ddpcheck.launch.memory import (
    available_bytes,
    gib,
    peak_bytes,
    reset_peak,
    return_freed_memory,
    rss_bytes,
    total_bytes,
)
from ddpcheck.launch.preload import find_rank_state_holders, refresh_rank_state
from ddpcheck.launch.procs import (
    ExitWatch,
    FrameReader,
    Janitor,
    Reaper,
    kill_group,
    poll_interval,
    process_state,
    read_frame,
    read_span_tail,
    read_tail,
    short_tempdir,
    wait_objects,
    write_frame,
)
from ddpcheck.launch.rank import force_loopback, fresh_random_state, make_killable, private_tmp, torchrun_env
from ddpcheck.launch.shared_work import known_samplers, shared_permutations
from ddpcheck.launch.watchdog import DEFAULT_LIMITS, Limits, Watchdog, overtime_message, stall_message
from ddpcheck.trace import spill_every, spill_threshold
from ddpcheck.tracefile import spill_to
from ddpcheck.wire.files import PROGRESS_BYTES, child_stack_path

_START_ALLOWANCE_S = 10.0  # on top of a child's first timeout: the fork, on a loaded machine
TRIM_FROM_BYTES = 32 << 20  # a rank that leaves its child this much larger has its memory handed back
_OUTPUT_TAIL = 20_000
_STACK_TAIL = 200_000


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
MAX_PARTS = 4  # children side by side, at most (fewer where one rank's memory times them would not fit)
CHUNK_S = 0.25  # ranks are handed to a child in chunks of about this much work
ESTIMATE_FROM_S = 180.0  # a simulation estimated to take longer says so, and how to shorten it
WORLD_HELD_IDS = 1 << 24  # ids a simulated world keeps in memory across its ranks; larger epochs spill
SPILL_FLOOR = 1 << 14  # ... but an epoch this small stays in memory (a file each would cost more)
MEMORY_HEADROOM = 0.8  # of the machine's available memory, what the children side by side may plan on
_MEMORY_POLL_S = 0.5  # how often the machine's free memory is looked at while ranks run


class SimulationTooLarge(RuntimeError):
    """The simulated ranks would need more memory than the machine has: said before running them."""

    harness_error = True


@dataclass
class _Child:
    """One child process (a slot of the progress array) and the ranks it was given, in order: the first
    of ``assigned`` is the one it runs now."""

    slot: int
    workdir: str
    proc: Any = None
    orders_fd: int = -1
    reader: FrameReader | None = None
    watch: ExitWatch | None = None
    assigned: deque[int] = field(default_factory=deque)
    told_stop: bool = False
    done_at: float | None = None  # when it said done (it then runs its exit handlers and exits)
    ended: str = ""  # why it was stopped or died early: hang | overtime | memory | exited | fatal
    message: str = ""
    stack: str = ""
    fatal: dict[str, Any] | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    output_end: int = 0  # where its last finished rank's output ended
    seconds: list[float] = field(default_factory=list)  # each finished rank's time
    progress: str = ""

    @property
    def alive(self) -> bool:
        return self.watch is not None

    @property
    def busy(self) -> bool:
        return self.alive and bool(self.assigned) and not self.ended


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
    limits: Limits = DEFAULT_LIMITS,
    capture: bool = True,
    ranks: Sequence[int] | None = None,
    shortcuts: bool = False,
    on_note: Callable[[str], None] | None = None,
) -> GroupResult:
    """Run ``target(**kwargs)`` once per rank in forked children; raises NeedsCollectives if it needs
    peers, SimulationTooLarge if its ranks would not fit the machine's memory.

    ``ranks``: only these ranks of the ``world_size`` world (a sample; the result has their outcomes only).
    ``shortcuts``: torch's ``DistributedSampler`` computes its share directly from ``SHORTCUTS_FROM`` ranks
    on, verified on some ranks (:func:`~ddpcheck.launch.shared_work.known_samplers`), and its epochs over
    ``ARRAYS_FROM`` samples and more are read as arrays at any world size
    (:func:`~ddpcheck.launch.shared_work.epoch_array`); the result's ``shortcuts`` says what was done.

    One child runs the first rank alone and measures it (time, peak memory); from ``SPLIT_MIN_RANKS``
    ranks on, as many children as there are cores (at most ``MAX_PARTS``) and as fit the machine's
    memory at that peak then take the rest in chunks, each child its ranks one after another, every
    rank's objects dropped and its memory handed back before the next. A simulation estimated to take
    longer than ``ESTIMATE_FROM_S`` says so through ``on_note``. A child whose rank makes no progress for
    ``limits.timeout`` seconds is stopped: that rank is ``hang``, with its stack and since when; every
    rank not run yet is ``secondary``. ``limits.max_time``: the whole call's cap (None: none); ranks still
    running then are ``overtime``.
    """
    if world_size < 1:
        raise ValueError(f"world size must be a positive integer, got {world_size}")
    if dist.is_initialized():
        raise RuntimeError("--simulate needs a process without a default process group")
    chosen = sorted(set(ranks)) if ranks is not None else list(range(world_size))
    if not chosen or chosen[0] < 0 or chosen[-1] >= world_size:
        raise ValueError(f"ranks must be a non-empty selection of 0..{world_size - 1}")
    find_rank_state_holders()  # what each simulated rank refreshes once it knows its rank
    simulation = _Simulation(target, world_size, dict(kwargs or {}), capture, shortcuts)
    run = _Simulator(simulation, chosen, limits, on_note or (lambda _text: None))
    reaper = Reaper()
    reaper.start()
    try:
        run.run()
    finally:
        run.close(reaper)
    if run.needs:
        raise NeedsCollectives(run.needs)
    return run.result()


class _Simulator:
    """The parent's side of one :func:`simulate_ranks` call: hands ranks out, watches progress, memory
    and time, and collects results. One thread; children are forked only from it."""

    def __init__(
        self,
        simulation: _Simulation,
        chosen: list[int],
        limits: Limits,
        note: Callable[[str], None],
    ) -> None:
        self.simulation, self.chosen, self.note = simulation, chosen, note
        self.timeout, self.max_time = limits.timeout, limits.max_time
        self.started = time.monotonic()
        self.ctx: Any = mp.get_context("fork")
        self.workdir = short_tempdir("ddpc-s")
        self.janitor = Janitor(self.workdir)  # removes workdir and the children's groups if we are SIGKILLed
        self.progress = self.ctx.Array("c", PROGRESS_BYTES * MAX_PARTS, lock=False)
        self.watchdog = Watchdog(self.progress, MAX_PARTS, self.timeout, self.started)
        self.children: list[_Child] = []
        self.pending: deque[int] = deque(chosen)
        self.results: dict[int, RankOutcome] = {}
        self.measured = False  # the first rank's time and memory are in; the other children started
        self.stopping = False  # no more ranks handed out: a child hung, died or ran out of time
        self.needs = ""
        self.next_memory_check = 0.0

    @property
    def cap(self) -> float:
        return self.started + self.max_time if self.max_time is not None else float("inf")

    def run(self) -> None:
        self._start_child([self.pending.popleft()])  # the first rank alone: it is measured
        while any(child.alive for child in self.children):
            now = time.monotonic()
            self.watchdog.observe(now)
            self._police(now)
            self._wait(now)
            self._take()
            self._hand_out()

    def _allowance(self, slot: int) -> float:
        """A child that has not said a word yet is still being forked (slow on a loaded machine)."""
        return _START_ALLOWANCE_S if self.watchdog.counts[slot] <= 0 else 0.0

    def _police(self, now: float) -> None:
        """Stop what stalls (``timeout``), what runs past ``max_time``, and the largest child when the
        machine is about to run out of memory."""
        busy = [c for c in self.children if c.busy]
        stalled = self.watchdog.stalled(now, [c.slot for c in busy], self._allowance)
        for child in busy:
            if child.slot in stalled:
                self._end(child, "hang", now)
            elif now >= self.cap:
                self._end(child, "overtime", now)
        if now >= self.next_memory_check:
            self.next_memory_check = now + _MEMORY_POLL_S
            self._memory_guard(now)

    def _memory_guard(self, now: float) -> None:
        available, total = available_bytes(), total_bytes()
        busy = [c for c in self.children if c.busy]
        if not available or not total or not busy or available >= max(256 << 20, total // 32):
            return
        sizes = {id(c): rss_bytes(c.proc.pid) for c in busy}
        if sum(sizes.values()) < total // 2:
            return  # not ours that fill the machine
        largest = max(busy, key=lambda c: sizes[id(c)])
        largest.message = (
            f"stopped before it filled the machine's memory: it held {gib(sizes[id(largest)])}, "
            f"{gib(available)} of {gib(total)} were left ({len(busy)} simulated ranks running side by side)"
        )
        self._end(largest, "memory", now)

    def _end(self, child: _Child, why: str, now: float) -> None:
        """Stop ``child`` (group and all); its current rank's outcome says ``why``."""
        silence = self.watchdog.silence(child.slot, now)
        child.progress = read_progress(self.progress, child.slot)
        if why == "hang":
            child.message = stall_message(silence, self.timeout) + " (--simulate)"
            if process_state(child.proc.pid) == "T":
                child.message += " (the process was stopped, e.g. by SIGSTOP)"
            else:
                child.stack = _dump_stack(child.proc, child.workdir)
        elif why == "overtime":
            child.message = overtime_message(self.max_time or 0.0, silence) + " (--simulate)"
        child.ended = why
        self.stopping = True
        kill_group(child.proc.pid)

    def _wait(self, now: float) -> None:
        busy = [c.slot for c in self.children if c.busy]
        limit = min(self.watchdog.due(now, busy, self._allowance), self.cap - now, _MEMORY_POLL_S)
        for child in self.children:
            if child.done_at is not None and child.alive:  # its exit handlers have a bound of their own
                limit = min(limit, child.done_at + rank_side.EXIT_HANDLERS_S + 1.0 - now)
        watches = [c.watch for c in self.children if c.watch is not None]
        poll = poll_interval(watches)
        objects: list[Any] = [c.reader for c in self.children if c.reader is not None and not c.reader.eof]
        for watch in watches:
            objects += wait_objects(watch)
        mp.connection.wait(objects, timeout=max(min(limit, poll or limit), 0.0))

    def _take(self) -> None:
        """Every message there is, then every exit."""
        for child in self.children:
            if child.reader is not None:
                for message in child.reader.pump():
                    self._message(child, message)
        now = time.monotonic()
        for child in self.children:
            watch = child.watch
            if watch is None:
                continue
            exited = (
                child.proc.exitcode is not None
                if watch.fd is None
                else bool(mp.connection.wait([watch.fd], 0))
            )
            late = child.done_at is not None and now > child.done_at + rank_side.EXIT_HANDLERS_S + 1.0
            if not exited and not late:
                continue
            if late:
                kill_group(child.proc.pid)
            if child.reader is not None:  # what it wrote before exiting
                for message in child.reader.pump():
                    self._message(child, message)
            watch.close()
            child.watch = None
            child.proc.join(timeout=1.0)
            if child.assigned and not child.ended:
                child.ended = "exited"
                self.stopping = True

    def _message(self, child: _Child, message: Any) -> None:
        kind = message[0]
        if kind == "rank":
            _, rank, status, payload, begin, end, seconds = message
            if child.assigned and child.assigned[0] == rank:
                child.assigned.popleft()
            child.output_end = end
            child.seconds.append(seconds)
            self.results[rank] = _outcome(rank, status, payload, child, begin, end, self.simulation.capture)
        elif kind == "mem":
            _, rank, seconds, base, peak, _after, size = message
            if not self.measured:
                self._measured(seconds, max(peak - base, 0), size)
        elif kind == "done":
            child.summary, child.done_at = message[1], time.monotonic()
        elif kind == "needs":
            self.needs, self.stopping = message[1], True
        elif kind == "fatal":
            child.fatal, child.ended, self.stopping = message[1], "fatal", True

    def _measured(self, seconds: float, peak: int, result_bytes: int) -> None:
        """The first rank is in: how many children side by side, whether the rest fits, how long it takes."""
        self.measured = True
        left = len(self.pending)
        if not left:
            return
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        parts = min(max(cores, 1), MAX_PARTS) if len(self.chosen) >= SPLIT_MIN_RANKS else 1
        available = available_bytes()
        need_results = result_bytes * len(self.chosen)
        if available:
            room = int(available * MEMORY_HEADROOM) - need_results
            parts = max(1, min(parts, room // max(int(peak * 1.25), 1 << 20)))
            if peak * 1.25 + need_results > available * MEMORY_HEADROOM:
                raise SimulationTooLarge(self._too_large(peak, result_bytes, available))
        estimate = seconds * left / parts
        if estimate > ESTIMATE_FROM_S:
            self.note(self._estimate_note(seconds, left, parts, estimate))
        for _ in range(parts - 1):
            self._start_child([])

    def _too_large(self, peak: int, result_bytes: int, available: int) -> str:
        world, count = self.simulation.world_size, len(self.chosen)
        return (
            f"world size {world}: simulating {count} ranks needs about {gib(peak)} for one rank's loader "
            f"and {gib(result_bytes * count)} for their recorded samples ({gib(result_bytes)} each), more "
            f"than the {gib(available)} this machine has available; check fewer or smaller world sizes, "
            "--epochs 1, or a dataset of fewer samples"
        )

    def _estimate_note(self, seconds: float, left: int, parts: int, estimate: float) -> str:
        side = f", {parts} at a time" if parts > 1 else ""
        return (
            f"world size {self.simulation.world_size}: about {_duration(estimate)} to simulate {left} more "
            f"ranks ({seconds:.1f} s for the first{side}); to shorten it: fewer world sizes "
            "(--world-sizes), --epochs 1, or torch's own DistributedSampler (the exact class), whose "
            "shares --simulate computes directly"
        )

    def _hand_out(self) -> None:
        """Give every child with at most one rank left a chunk more (its orders wait in the pipe while it
        works), or tell it to stop."""
        if not self.measured and not self.stopping and not self.needs:
            return
        for child in self.children:
            if not child.alive or child.ended or child.told_stop or len(child.assigned) > 1:
                continue
            if self.pending and not self.stopping:
                chunk = self._chunk(child)
                if not child.assigned:  # it waited for orders: its silence counts from now
                    self.watchdog.restart(child.slot, time.monotonic())
                child.assigned.extend(chunk)
                write_frame(child.orders_fd, ("run", chunk))
            elif not child.assigned:
                child.told_stop = True
                write_frame(child.orders_fd, ("stop",))

    def _chunk(self, child: _Child) -> list[int]:
        recent = child.seconds[-8:] or [rank for c in self.children for rank in c.seconds[-8:]]
        per_rank = sum(recent) / len(recent) if recent else CHUNK_S
        busy = max(sum(1 for c in self.children if c.alive and not c.ended), 1)
        size = max(1, min(int(CHUNK_S / max(per_rank, 1e-4)), -(-len(self.pending) // (2 * busy))))
        return [self.pending.popleft() for _ in range(min(size, len(self.pending)))]

    def _start_child(self, ranks: list[int]) -> None:
        """Fork a child for the next free slot; it closes every pipe end of the children before it."""
        slot = len(self.children)
        workdir = os.path.join(self.workdir, f"c{slot}")
        os.makedirs(workdir, exist_ok=True)
        child = _Child(slot, workdir)
        orders_read, child.orders_fd = os.pipe()
        result_read, result_write = os.pipe()
        theirs = tuple(fd for c in self.children for fd in (c.orders_fd, c.reader.fd if c.reader else -1))
        try:
            child.proc = self.ctx.Process(
                target=_child_main,
                args=(
                    self.simulation,
                    orders_read,
                    result_write,
                    (*(fd for fd in theirs if fd >= 0), child.orders_fd, result_read, self.janitor.fd),
                    self.progress,
                    slot,
                    workdir,
                    os.getpid(),
                ),
                name="ddpcheck-simulated-ranks",
            )
            child.proc.start()
        finally:
            os.close(orders_read)
            os.close(result_write)
        self.janitor.watch(child.proc.pid)
        child.reader = FrameReader(result_read)
        child.watch = ExitWatch(child.proc.pid)
        self.children.append(child)
        if ranks:
            child.assigned.extend(ranks)
            write_frame(child.orders_fd, ("run", ranks))

    def result(self) -> GroupResult:
        """Every chosen rank's outcome, in rank order; the shortcuts the children took, summed."""
        failed = {c.assigned[0]: c for c in self.children if c.ended and c.assigned}
        first_failed = min(failed, default=None)
        outcomes = []
        for rank in self.chosen:
            if rank in self.results:
                outcomes.append(self.results[rank])
            elif rank in failed:
                outcomes.append(self._failed(rank, failed[rank]))
            else:
                why = (
                    f"simulated rank {first_failed} did not finish" if first_failed is not None else "stopped"
                )
                outcomes.append(RankOutcome(rank=rank, kind="secondary", message=f"not run: {why}"))
        result = GroupResult(
            self.simulation.world_size, "simulated", outcomes, time.monotonic() - self.started
        )
        for child in self.children:
            for key, value in child.summary.items():
                if isinstance(value, int):
                    result.shortcuts[key] = result.shortcuts.get(key, 0) + value
                elif value:
                    result.shortcuts[key] = value
        return result

    def _failed(self, rank: int, child: _Child) -> RankOutcome:
        """The outcome of the rank a child was running when it was stopped or died."""
        outcome = RankOutcome(rank=rank, progress=child.progress, stack=child.stack, message=child.message)
        if child.ended in ("hang", "overtime"):
            outcome.kind = child.ended
        elif child.ended == "memory":
            outcome.kind = "killed"
        elif child.ended == "fatal" and child.fatal is not None:
            outcome.kind, outcome.message = "error", child.fatal.get("message", "")
            outcome.error, outcome.exc_type = (
                child.fatal.get("traceback", ""),
                child.fatal.get("exc_type", ""),
            )
        else:
            _exited(outcome, child)
        if self.simulation.capture:
            out_path = os.path.join(child.workdir, "ranks.out")
            size = os.path.getsize(out_path) if os.path.exists(out_path) else 0
            outcome.output = read_span_tail(out_path, child.output_end, size, _OUTPUT_TAIL)
        return outcome

    def close(self, reaper: Reaper) -> None:
        """Nothing of the group outlives it: every child killed (group and all) and reaped, every pipe
        closed, the work directory removed."""
        for child in self.children:
            if child.proc is not None and child.proc.pid is not None:
                kill_group(child.proc.pid)
        for child in self.children:
            if child.proc is not None and child.proc.pid is not None:
                child.proc.join(timeout=5)
            if child.watch is not None:
                child.watch.close()
                child.watch = None
            for fd in (child.orders_fd, child.reader.fd if child.reader else -1):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
        reaper.sweep({c.proc.pid for c in self.children if c.proc is not None and c.proc.pid is not None})
        reaper.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.janitor.close()


def _outcome(
    rank: int, status: str, payload: Any, child: _Child, begin: int, end: int, capture: bool
) -> RankOutcome:
    if status == "ok":
        return RankOutcome(rank=rank, kind="ok", value=payload)
    outcome = RankOutcome(
        rank=rank,
        kind="error",
        message=payload.get("message", ""),
        error=payload.get("traceback", ""),
        exc_type=payload.get("exc_type", ""),
        error_time=payload.get("time", 0.0),
    )
    if capture:
        outcome.output = read_span_tail(os.path.join(child.workdir, "ranks.out"), begin, end, _OUTPUT_TAIL)
    return outcome


def _exited(outcome: RankOutcome, child: _Child) -> None:
    """A child that died while running ``outcome``'s rank (os._exit in user code, a signal)."""
    code = child.proc.exitcode
    outcome.exitcode = code
    if code is not None and code < 0:
        outcome.kind, outcome.message = "killed", f"killed by signal {-code}"
        with contextlib.suppress(ValueError):
            outcome.message = f"killed by {rank_side.signal.Signals(-code).name}"
    else:
        outcome.kind = "exited"
        outcome.message = f"exited with code {code} before sending a result (os._exit in user code?)"
    if child.reader is not None and child.reader.partial:
        outcome.message += f"; its result was cut off after {child.reader.partial} bytes"
    outcome.stack = read_tail(child_stack_path(child.workdir), _STACK_TAIL)


def _dump_stack(proc: Any, workdir: str) -> str:
    path = child_stack_path(workdir)
    dump_stacks([(proc, path)])
    return read_tail(path, _STACK_TAIL)


def _duration(seconds: float) -> str:
    minutes = int(seconds // 60 + 0.5)
    if minutes < 120:
        return f"{minutes} min"
    return f"{minutes / 60:.1f} h"


def _child_main(
    simulation: _Simulation,
    orders_fd: int,
    fd: int,
    parent_fds: tuple[int, ...],
    progress: Any,
    slot: int,
    workdir: str,
    parent_pid: int,
) -> None:
    """One child of a simulated group: runs the ranks it is sent, one framed message each, until told
    to stop."""
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
    rank_side.install_stack_dumps(open(child_stack_path(workdir), "w"))  # noqa: SIM115
    attach(progress, slot)
    port_holder = bind_loopback()  # MASTER_PORT names a loopback port that is ours, not a stranger's
    port = port_holder.getsockname()[1]
    try:
        done = _serve(simulation, orders_fd, fd, workdir, port)
        write_frame(fd, ("done", done))
    except EOFError:  # the parent has gone
        pass
    except BaseException as exc:  # ddpcheck's own failure around the ranks, not a rank's
        with contextlib.suppress(BaseException):
            write_frame(fd, ("fatal", rank_side.error_message(exc)))
    rank_side.run_exit_handlers(0, forked=True)  # every simulated rank's, as their processes would
    with contextlib.suppress(BaseException):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(0)


def _serve(simulation: _Simulation, orders_fd: int, fd: int, workdir: str, port: int) -> dict[str, Any]:
    """Run the ranks each order names, in turn, until told to stop; returns what :func:`known_samplers`
    did (empty without ``shortcuts``)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    run_id = f"ddpcheck-sim-{os.getpid()}"
    lists = simulation.world_size >= SHORTCUTS_FROM
    known = known_samplers(lists=lists) if simulation.shortcuts else contextlib.nullcontext(None)
    run_dir = os.environ.get(rank_side.RUN_TMPDIR_ENV, "")
    if run_dir:  # large epochs go to the run's temp directory: neither this child nor the parent holds them
        spill_to(os.path.join(run_dir, ".ddpcheck-simulated-ids"))
        # ... and "large" is the world's share: the parent holds every rank's in-memory epochs at once
        spill_every(max(SPILL_FLOOR, min(spill_threshold(), WORLD_HELD_IDS // simulation.world_size)))
    # one rank alone (the reference) has nobody to share a permutation with: it would only hold memory
    shared = shared_permutations() if simulation.world_size > 1 else contextlib.nullcontext(None)
    with collectives_forbidden(), shared, known as done:
        cwd = os.getcwd()
        first = True
        while True:
            order = read_frame(orders_fd)
            if order[0] != "run":
                break
            for rank in order[1]:
                os.chdir(cwd)  # as a process of its own would: a rank's chdir must not move the next one
                os.environ.update(torchrun_env(rank, simulation.world_size, port, run_id, workdir))
                if not _run_rank(simulation, rank, fd, FakeStore, first):
                    return {}
                first = False
    return done.summary() if done is not None else {}


def _run_rank(simulation: _Simulation, rank: int, fd: int, store: Callable[[], Any], first: bool) -> bool:
    """One simulated rank: its result and time, then, once every reference to its objects is gone and the
    memory they held handed back, its memory (for the child's ``first`` rank, the parent's measure, and for
    any rank that grew the child). False: it needed collectives (said so already)."""
    begin = _position(simulation.capture)
    refresh_rank_state()
    report_progress(f"simulated rank {rank}: starting")
    fresh_random_state()
    base = rss_bytes()
    reset_peak()
    started = time.perf_counter()
    dist.init_process_group("fake", store=store(), rank=rank, world_size=simulation.world_size)
    status: str
    payload: Any
    try:
        status, payload = "ok", simulation.target(**simulation.kwargs)
    except NeedsCollectives as exc:
        write_frame(fd, ("needs", str(exc)))
        return False
    except BaseException as exc:  # SystemExit and KeyboardInterrupt too: this rank failed
        status, payload = "error", rank_side.error_message(exc)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    seconds = time.perf_counter() - started
    size = write_frame(fd, ("rank", rank, status, payload, begin, _position(simulation.capture), seconds))
    del payload
    grew = rss_bytes() - base > TRIM_FROM_BYTES
    if first or grew:
        peak = peak_bytes()
        if grew:
            return_freed_memory()
        write_frame(fd, ("mem", rank, seconds, base, peak, rss_bytes(), size))
    beat()
    return True


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
