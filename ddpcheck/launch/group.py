"""The parent side: start one process group's ranks, host its rendezvous, collect, enforce deadlines.

One call to :func:`run_ranks` is one group: a TCPStore on a socket this process binds to 127.0.0.1
with an OS-chosen port (no racy free-port picking, nothing listening on other addresses), W rank
processes, one pipe per rank for its result. Every path out of :func:`run_ranks` (success, a crashed
or hung rank, Ctrl-C in the parent) kills what is still running, rank and DataLoader workers alike,
and waits for it, so no process outlives the call.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import timedelta
from multiprocessing.connection import wait
from typing import Any

import torch.distributed as dist

from ddpcheck.launch.beats import read_progress
from ddpcheck.launch.names import named_memory, unlink_left
from ddpcheck.launch.preload import find_rank_state_holders
from ddpcheck.launch.procs import (
    ExitWatch,
    FrameReader,
    Janitor,
    Reaper,
    kill_group,
    poll_interval,
    process_state,
    read_tail,
    short_tempdir,
    wait_objects,
)
from ddpcheck.launch.rank import (
    JOINING,
    NATIVE_STACK_SIGNAL,
    PYTHON_STACK_WAIT_S,
    STACK_SIGNAL,
    RankSpec,
    hash_seed_fixed,
    hashed_strings,
    rank_main,
)
from ddpcheck.launch.target import TargetRef
from ddpcheck.launch.watchdog import JOIN_ALLOWANCE_S, Deadline, Ending, Watchdog
from ddpcheck.wire.files import output_path, shared_bytes, stack_path

# A rank's own waits (for its store, its peers in a collective): the parent's watchdog decides what is
# hung, and a rank dies with its parent, so these only need to outlast any run: a week, as --timeout.
RANK_WAIT_S = 7 * 24 * 3600.0
_JOIN_POLL_S = 0.02
_MAX_WAIT_S = 3600.0  # one wait's bound (an infinite one would overflow the poll's timeout)
_STACK_WAIT_S = 2.0  # at most; usually the dumps land in milliseconds
PROGRESS_EVERY_S = 0.2  # how often ``on_progress`` hears every rank's position while ranks run
_OUTPUT_TAIL = 20_000  # bytes of a rank's output kept (its end); the rest is never read
_STACK_TAIL = 200_000
# What a rank's own communication layer says when a peer went away (gloo's transport errors).
_COMM_ERROR_HINTS = ("gloo/transport", "connection closed by peer", "connection reset by peer")
_COMM_ERROR_TYPES = ("DistBackendError", "DistNetworkError", "DistStoreError")

ProgressCallback = Callable[[list[str], float, bool], None]
"""``on_progress(positions, elapsed_s, finished)``: every rank's published position (``report_progress``;
"" before a rank says anything), seconds since the group started, and whether the group is over."""


@dataclass
class RankOutcome:
    """What became of one rank. ``kind``: ok | error | hang | killed | secondary | exited."""

    rank: int
    kind: str = "ok"
    value: Any = None
    message: str = ""
    error: str = ""
    exc_type: str = ""
    stack: str = ""
    progress: str = ""
    output: str = ""
    exitcode: int | None = None
    error_time: float = 0.0
    waiting: bool = False  # it waited for its peers (a collective) when the group was stopped

    @property
    def ok(self) -> bool:
        return self.kind == "ok"


@dataclass
class GroupResult:
    world_size: int
    backend: str
    outcomes: list[RankOutcome]
    seconds: float = 0.0
    diagnosis: str = ""  # one paragraph on a hang: which ranks waited where
    shortcuts: dict[str, Any] = field(default_factory=dict)  # --simulate: recognised samplers, verified
    fresh_interpreters: str = ""  # why the ranks ran as freshly started interpreters (FRESH_NOTE), or ""
    named_memory: tuple[
        int, ...
    ] = ()  # ranks that created shared memory by a name of their own (launch.names)

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outcomes)

    @property
    def values(self) -> list[Any]:
        return [o.value for o in self.outcomes]

    def failures(self) -> list[RankOutcome]:
        return [o for o in self.outcomes if not o.ok]

    def describe_failures(self) -> str:
        parts = [self.diagnosis] if self.diagnosis else []
        for o in self.failures():
            head = f"rank {o.rank}: {o.kind}: {o.message}"
            if o.progress:
                head += f" (at: {o.progress})"
            body = o.error or o.stack
            parts.append(head + ("\n" + body if body else ""))
            if o.output.strip():
                parts.append(f"--- rank {o.rank} captured output ---\n{o.output.rstrip()}")
        return "\n\n".join(parts)

    def raise_for_failures(self) -> None:
        if not self.ok:
            raise AssertionError(f"world size {self.world_size}: ranks failed\n{self.describe_failures()}")


def default_start_method(backend: str) -> str:
    """fork for CPU groups on Linux (fast, torch already imported); spawn where CUDA or the OS needs it."""
    env = os.environ.get("DDPCHECK_START_METHOD")
    if env:
        return env
    if backend == "nccl" or sys.platform != "linux":
        return "spawn"
    return "fork"


def bind_loopback() -> socket.socket:
    """A listening socket on 127.0.0.1 with a port the OS picked, held open until the store owns it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    return sock


def run_ranks(call: GroupCall) -> GroupResult:
    """Run ``call.target(**call.kwargs)`` in every rank of a fresh ``call.world_size`` group; return each
    rank's outcome. The group is described by one :class:`GroupCall`, as torchrun's ``elastic_launch``
    takes one launch config.

    ``timeout``: seconds a rank may go without progress (:mod:`ddpcheck.launch.watchdog`; a rank that is
    still joining the group gets ``JOIN_ALLOWANCE_S`` more); ``max_time``: the group's whole time once
    every rank has joined (None: no cap; see :class:`Deadline`). When a rank fails, the others get
    ``grace`` seconds to finish before they are stopped and marked ``secondary``. A hung rank is
    reported with its dumped stack, its last progress and since when; a rank still running at
    ``max_time`` as ``overtime``. Nothing started here survives the call.

    ``on_progress``, when given, is called from this thread at most every :data:`PROGRESS_EVERY_S`
    while ranks run (``finished=False``), and once more when the group is over (``finished=True``,
    whatever became of the ranks). It must return quickly. An exception it raises ends the group as
    Ctrl-C would: every rank is stopped, and the exception propagates.
    """
    return run_groups([call])[0]


@dataclass
class GroupCall:
    """One group: what every rank runs (``target(**kwargs)``), at which world size, and how (see
    :func:`run_ranks`)."""

    target: Callable[..., Any] | TargetRef
    world_size: int
    backend: str = "gloo"
    timeout: float = 60.0
    kwargs: dict[str, Any] | None = None
    start_method: str | None = None
    capture: bool = True
    grace: float = 1.0
    env: dict[str, str] | None = None
    init_group: bool = True
    on_progress: ProgressCallback | None = None
    max_time: float | None = None


def run_groups(calls: Sequence[GroupCall]) -> list[GroupResult]:
    """Independent groups side by side (a determinism rerun beside its run uses the second core).

    Every rank of every group is forked before any store's server thread or collecting thread
    starts: forking while one runs can copy a held native lock into a rank, which then deadlocks in
    its own store client. The first group is collected in this thread (its ``on_progress`` runs
    here; Ctrl-C lands here), the others in threads that end before this returns. Each group keeps
    its own deadlines, as if it ran alone.
    """
    with started_groups(calls) as started:
        return started.collect()


class StartedGroups:
    """Groups whose ranks are forked. A group is *opened* (its store started, its ranks let go) when
    :meth:`open` or :meth:`collect` asks for it; until then its ranks wait, costing no CPU. Forking
    every group up front means no rank inherits what this process builds later (traces), and no fork
    happens while a store's server thread runs: a collected group is closed (store and all) at once.
    """

    def __init__(self, groups: list[_Group]) -> None:
        self._groups = groups
        self._opened: set[int] = set()
        self._done: set[int] = set()

    def open(self, *indices: int) -> None:
        for i in indices:
            if i not in self._opened:
                self._groups[i].open()
                self._opened.add(i)

    def collect(self, *indices: int) -> list[GroupResult]:
        """Open (where needed) and collect the given groups side by side; all the others when none.
        Groups side by side whose ranks named shared memory machine-wide ran as two jobs never would:
        they are run again, one after another (:mod:`ddpcheck.launch.names`)."""
        chosen = list(indices) if indices else [i for i in range(len(self._groups)) if i not in self._done]
        self.open(*chosen)
        try:
            results = _collect_groups([self._groups[i] for i in chosen])
            again = [k for k, i in enumerate(chosen) if self._groups[i].needs_fresh_interpreters(results[k])]
        finally:
            for i in chosen:
                self._groups[i].stop()
                self._groups[i].close()
                self._done.add(i)
        calls = [self._groups[i].call for i in chosen]
        if len(chosen) > 1 and any(r.named_memory for r in results):
            return [run_groups([call])[0] for call in calls]  # each alone (and fresh where it hashes)
        return _rerun_fresh(results, again, calls)


@contextlib.contextmanager
def started_groups(calls: Sequence[GroupCall], *, hold: bool = False) -> Iterator[StartedGroups]:
    """:func:`run_groups` in steps: in the block every rank is forked, and this process may do other
    work (it must not fork while an opened group is uncollected) before collecting. ``hold``: no group
    is opened until asked for. Leaving the block, collected or not (an exception, Ctrl-C), stops and
    reaps everything the groups started.
    """
    for call in calls:
        if call.world_size < 1:
            raise ValueError(f"world size must be a positive integer, got {call.world_size}")
    groups: list[_Group] = []
    reaper = Reaper()
    reaper.start()
    # A held group's ranks may wait for every group before theirs, each running as long as it makes
    # progress: they wait for the store as long as any rank waits (they die with this process).
    patience = RANK_WAIT_S
    try:
        for call in calls:
            # a later group's ranks must not hold an earlier group's listening socket or janitor pipe
            close_fds = tuple(fd for g in groups for fd in g.private_fds)
            groups.append(_Group.start(call, close_fds=close_fds, ready_timeout=patience))
        started = StartedGroups(groups)
        if not hold:
            started.open(*range(len(groups)))
        yield started
    finally:
        for group in groups:
            group.stop()
        reaper.sweep({pid for group in groups for pid in group.pids})
        reaper.stop()
        for group in groups:
            group.close()


FRESH_NOTE = (
    "the loader hashes strings (hash() of a str depends on the interpreter's PYTHONHASHSEED): its ranks "
    "ran as freshly started interpreters, each with its own hash seed, as torchrun starts them"
)


def _rerun_fresh(results: list[GroupResult], again: list[int], calls: list[GroupCall]) -> list[GroupResult]:
    """Run the groups at ``again`` once more with every rank a fresh interpreter (spawn: each its own
    random str hash seed, as under torchrun) and put their results in place of the forked ones.

    Forked ranks share the parent's seed, so ``hash(name) % world_size`` agrees across them and
    nowhere else; only groups whose code hashed a string pay for the fresh start (seconds a rank).
    """
    fresh: list[tuple[int, GroupCall]] = []
    for k in again:
        call = calls[k]
        try:
            target = call.target if isinstance(call.target, TargetRef) else TargetRef.of(call.target)
        except TypeError:  # a closure cannot be found by name in a fresh interpreter: keep the fork's
            continue
        fresh.append((k, replace(call, target=target, start_method="spawn")))
    if not fresh:
        return results
    hide = all(isinstance(c.target, TargetRef) and c.target.module != "__main__" for _, c in fresh)
    with _main_script_hidden() if hide else contextlib.nullcontext(), _own_resource_tracker():
        rerun = run_groups([c for _, c in fresh])
    for (k, _), result in zip(fresh, rerun, strict=True):
        result.fresh_interpreters = FRESH_NOTE
        results[k] = result
    return results


@contextlib.contextmanager
def _own_resource_tracker() -> Iterator[None]:
    """Spawning ranks starts multiprocessing's resource tracker in this process; one started for the
    rerun is stopped with it (a process of ours must not outlive the run; a tracker that was already
    running belongs to whoever started it and is left alone)."""
    from multiprocessing import resource_tracker

    tracker: Any = resource_tracker._resource_tracker
    running = tracker._pid is not None
    try:
        yield
    finally:
        stop = getattr(tracker, "_stop", None)
        if not running and tracker._pid is not None and callable(stop):
            with contextlib.suppress(Exception):
                stop()


@contextlib.contextmanager
def _main_script_hidden() -> Iterator[None]:
    """Spawned ranks do not run the parent's ``__main__`` again: a script that calls ddpcheck without
    an ``if __name__ == "__main__"`` guard would otherwise start a whole check in every rank. Ranks
    find their target by module name, so they never need the script."""
    main = sys.modules.get("__main__")
    saved: dict[str, Any] = {
        k: main.__dict__[k] for k in ("__file__", "__spec__") if main is not None and k in main.__dict__
    }
    try:
        if main is not None:
            main.__dict__.pop("__file__", None)
            main.__dict__["__spec__"] = None
        yield
    finally:
        if main is not None:
            main.__dict__.pop("__spec__", None)
            main.__dict__.update(saved)


def _collect_groups(groups: list[_Group]) -> list[GroupResult]:
    if len(groups) == 1:
        return [groups[0].collect()]
    with ThreadPoolExecutor(len(groups) - 1, thread_name_prefix="ddpcheck-collect") as pool:
        others = [pool.submit(group.collect) for group in groups[1:]]
        try:
            first = groups[0].collect()
        except BaseException:
            for group in groups:  # the other collectors see their ranks exit and return
                group.stop()
            raise
        return [first, *(future.result() for future in others)]


@dataclass
class _Group:
    """One started group: its ranks are forked; :meth:`open` lets them join, :meth:`collect` waits."""

    call: GroupCall
    procs: list[Any]
    conns: list[Any]
    progress: Any
    ready: Any
    workdir: str
    janitor: Janitor
    listen_fd: int
    port: int
    started: float
    store: Any = None

    @classmethod
    def start(cls, call: GroupCall, close_fds: tuple[int, ...] = (), ready_timeout: float = 0.0) -> _Group:
        method = call.start_method or default_start_method(call.backend)
        target = call.target
        if method != "fork" and not isinstance(target, TargetRef):
            target = TargetRef.of(target)
        ctx: Any = mp.get_context(method)
        find_rank_state_holders()  # what each forked rank refreshes once it knows its rank
        workdir = short_tempdir("ddpc-g")
        janitor = Janitor(workdir)  # first: it must inherit none of the group's descriptors
        sock = bind_loopback()
        port = sock.getsockname()[1]
        listen_fd = sock.detach()  # the store owns it from open() on (and closes it)
        group = cls(
            call=call,
            procs=[],
            conns=[],
            progress=ctx.Array("c", shared_bytes(call.world_size), lock=False),  # the slots, 2 flags a rank
            ready=ctx.Event(),
            workdir=workdir,
            janitor=janitor,
            listen_fd=listen_fd,
            port=port,
            started=time.monotonic(),
        )
        try:
            for rank in range(call.world_size):
                spec = RankSpec(
                    rank=rank,
                    world_size=call.world_size,
                    backend=call.backend,
                    port=port,
                    timeout_s=RANK_WAIT_S,  # the parent's watchdog fires first
                    ready_timeout_s=ready_timeout,
                    target=target,
                    kwargs=dict(call.kwargs or {}),
                    workdir=workdir,
                    capture=call.capture,
                    listen_fd=listen_fd if method == "fork" else -1,
                    parent_pid=os.getpid(),
                    env=dict(call.env or {}),
                    init_group=call.init_group,
                    forked=method == "fork",
                    run_id=f"ddpcheck-{os.getpid()}-{port}",
                    close_fds=(janitor.fd, *close_fds),
                    watch_hashing=method == "fork" and not hash_seed_fixed(),
                )
                reader, writer = ctx.Pipe(duplex=False)
                args = (spec, writer, group.progress, group.ready)
                proc = ctx.Process(target=rank_main, args=args, name=f"ddpcheck-rank{rank}")
                proc.start()
                janitor.watch(proc.pid)
                writer.close()
                group.procs.append(proc)
                group.conns.append(reader)
        except BaseException:
            group.stop()
            group.close()
            raise
        return group

    def needs_fresh_interpreters(self, result: GroupResult) -> bool:
        """Its forked ranks hashed strings while the hash seed is random: fresh ranks may disagree."""
        method = self.call.start_method or default_start_method(self.call.backend)
        if method != "fork" or hash_seed_fixed() or not hashed_strings(self.progress, self.call.world_size):
            return False
        return result.ok  # a failed rank is the answer already; a fresh start would cost seconds more

    @property
    def private_fds(self) -> tuple[int, ...]:
        return (self.listen_fd, self.janitor.fd)

    @property
    def pids(self) -> set[int]:
        """Ours: the ranks and the janitor (whatever else the reaper finds is an orphan)."""
        return {self.janitor.pid} | {p.pid for p in self.procs if p.pid is not None}

    def open(self) -> None:
        """Start the store (ranks wait for ``ready`` before connecting: no client meets a socket
        without a server behind it). The group's deadlines count from here."""
        call = self.call
        self.started = time.monotonic()
        if call.init_group:
            self.store = dist.TCPStore(
                "127.0.0.1",
                self.port,
                call.world_size,
                is_master=True,
                wait_for_workers=False,
                timeout=timedelta(seconds=RANK_WAIT_S),
                master_listen_fd=self.listen_fd,
            )
        self.ready.set()

    def collect(self) -> GroupResult:
        call = self.call
        outcomes = _collect(
            self.procs, self.conns, self.progress, self.workdir,
            Deadline(self.started, call.timeout, call.max_time),
            call.grace, call.on_progress,
        )  # fmt: skip
        result = GroupResult(call.world_size, call.backend, outcomes, time.monotonic() - self.started)
        result.diagnosis = _diagnose(result)
        result.named_memory = tuple(named_memory(self.progress, call.world_size))
        if call.on_progress is not None:
            call.on_progress([o.progress for o in outcomes], result.seconds, True)
        return result

    def stop(self) -> None:
        _stop_all(self.procs)

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
        self.conns = []
        if self.store is None and self.listen_fd >= 0:
            os.close(self.listen_fd)
        self.listen_fd = -1
        # Dropping the store closes listen_fd: closing it here too could close a later group's reused fd.
        self.store = None
        unlink_left(self.workdir)  # every rank is stopped: what a killed one named must not outlive it
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.janitor.close()


def _all_joined(progress: Any, outcomes: list[RankOutcome]) -> bool:
    """Every rank is past the rendezvous (or already done): its progress says more than 'joining'."""
    return all(o.kind != "pending" or read_progress(progress, o.rank) not in ("", JOINING) for o in outcomes)


def _collect(
    procs: list[Any],
    conns: list[Any],
    progress: Any,
    workdir: str,
    deadline: Deadline,
    grace: float,
    on_progress: ProgressCallback | None = None,
) -> list[RankOutcome]:
    """Read results and exits until every rank is done, a rank stalls (the watchdog), ``max_time`` runs
    out, or grace after a failure.

    Never blocks on a rank: pipes are read without blocking and reassembled, and a rank's exit is seen
    through its pid (pidfd), so a helper process that inherited the rank's pipes cannot hide it.
    """
    world = len(procs)
    outcomes = [RankOutcome(rank=r, kind="pending") for r in range(world)]
    readers = {r: FrameReader(conn.fileno()) for r, conn in enumerate(conns)}
    watches = {r: ExitWatch(proc.pid) for r, proc in enumerate(procs)}
    watchdog = Watchdog(progress, world, deadline.timeout, deadline.started)
    ending = Ending(deadline)
    first_failure: float | None = None
    next_report = time.monotonic() + PROGRESS_EVERY_S

    def joining(rank: int) -> float:
        return JOIN_ALLOWANCE_S if read_progress(progress, rank) in ("", JOINING) else 0.0

    try:
        while readers or watches:
            now = time.monotonic()
            watchdog.observe(now)
            if deadline.joined_at is None and _all_joined(progress, outcomes):
                deadline.joined_at = now
            ending.stalled = tuple(watchdog.stalled(now, list(watches), joining))
            ending.overtime = now >= deadline.cap
            spent = first_failure is not None and now - first_failure >= grace
            if ending.stalled or ending.overtime or spent:
                ending.silences = {r: watchdog.silence(r, now) for r in watches}
                for r in watches:
                    outcomes[r].waiting = watchdog.waiting[r]
                break
            if on_progress is not None and now >= next_report:
                on_progress([read_progress(progress, r) for r in range(world)], now - deadline.started, False)
                now = time.monotonic()
                next_report = now + PROGRESS_EVERY_S
            limit = min(watchdog.due(now, list(watches), joining), deadline.cap - now)
            if on_progress is not None:
                limit = min(limit, next_report - now)
            if first_failure is not None:
                limit = min(limit, grace - (now - first_failure))
            if deadline.joined_at is None:
                limit = min(limit, _JOIN_POLL_S)  # joining is seen through progress, not through an event
            poll = poll_interval(list(watches.values()))
            if poll is not None:
                limit = min(limit, poll)
            _wait_ranks(procs, readers, watches, outcomes, limit)
            if first_failure is None and _any_failed(outcomes, set(readers)):
                first_failure = time.monotonic()
    finally:
        for watch in watches.values():
            watch.close()
    stuck = sorted(r for r in watches if procs[r].exitcode is None)
    stopped = {r for r in stuck if process_state(procs[r].pid) == "T"}
    _dump_stacks(procs, [r for r in stuck if r not in stopped], workdir)
    for r, outcome in enumerate(outcomes):
        outcome.progress = read_progress(progress, r)
        if r in stuck and outcome.kind == "pending":
            outcome.kind, outcome.message = ending.judge(r)
        _finish(outcome, procs[r], workdir, stuck=r in stuck)
        if r in stopped and outcome.kind == "hang":
            reader = readers.get(r)
            partial = f", {reader.partial} bytes into its result" if reader and reader.partial else ""
            outcome.message += f" (the process was stopped, e.g. by SIGSTOP{partial})"
    _mark_secondary(outcomes)
    return outcomes


def _wait_ranks(
    procs: list[Any],
    readers: dict[int, FrameReader],
    watches: dict[int, ExitWatch],
    outcomes: list[RankOutcome],
    limit: float,
) -> None:
    """Wait up to ``limit`` seconds for a message or an exit, then take every message and exit there is."""
    objects: list[Any] = [*readers.values()]
    for watch in watches.values():
        objects += wait_objects(watch)
    wait(objects, timeout=max(min(limit, _MAX_WAIT_S), 0.0))
    for r in list(readers):
        _take_messages(readers[r], outcomes[r])
        if readers[r].eof:
            del readers[r]
    for r in list(watches):
        if _exited(watches[r], procs[r]):
            watches.pop(r).close()
            procs[r].join(timeout=1.0)  # the pidfd can fire a moment before the exit status
            outcomes[r].exitcode = procs[r].exitcode
            reader = readers.pop(r, None)  # a helper may hold the pipe open: take what is there
            if reader is not None:
                _take_messages(reader, outcomes[r])
                _note_partial(reader, outcomes[r])


def _exited(watch: ExitWatch, proc: Any) -> bool:
    if watch.fd is not None:
        return bool(wait([watch.fd], timeout=0))
    return proc.exitcode is not None


def _take_messages(reader: FrameReader, outcome: RankOutcome) -> None:
    for message in reader.pump():
        status, payload = message
        if status == "unreadable":
            status, payload = "error", {"message": payload}
        if outcome.kind == "pending":
            _record_message(outcome, status, payload)


def _note_partial(reader: FrameReader, outcome: RankOutcome) -> None:
    if outcome.kind == "pending" and reader.partial:
        outcome.message = f"its result was cut off after {reader.partial} bytes"


def _any_failed(outcomes: list[RankOutcome], unread: set[int]) -> bool:
    """A rank reported an error, or exited and has nothing left to read."""
    return any(
        o.kind == "error" or (o.kind == "pending" and o.exitcode is not None and o.rank not in unread)
        for o in outcomes
    )


def _record_message(outcome: RankOutcome, status: str, payload: Any) -> None:
    if status == "ok":
        outcome.kind, outcome.value = "ok", payload
        return
    outcome.kind = "error"
    outcome.message = payload.get("message", "")
    outcome.error = payload.get("traceback", "")
    outcome.exc_type = payload.get("exc_type", "")
    outcome.error_time = payload.get("time", 0.0)


def _finish(outcome: RankOutcome, proc: Any, workdir: str, *, stuck: bool) -> None:
    if stuck:
        outcome.stack = read_tail(stack_path(workdir, outcome.rank), _STACK_TAIL)
    elif outcome.kind == "pending":
        code = proc.exitcode
        if code is not None and code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
            outcome.kind = "killed"
            outcome.message = f"killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
        else:
            outcome.kind = "exited"
            outcome.message = f"exited with code {code} before sending a result" + (
                f"; {outcome.message}" if outcome.message else ""
            )
        outcome.stack = read_tail(stack_path(workdir, outcome.rank), _STACK_TAIL)
    outcome.output = read_tail(output_path(workdir, outcome.rank), _OUTPUT_TAIL)


def _mark_secondary(outcomes: list[RankOutcome]) -> None:
    """A rank whose error is a broken connection only failed because a peer failed first."""

    def comm_error(o: RankOutcome) -> bool:
        text = (o.message + " " + o.exc_type).lower()
        return o.kind == "error" and (
            "dist" in o.exc_type.lower() or any(h in text for h in _COMM_ERROR_HINTS)
        )

    failed = [o for o in outcomes if o.kind in ("error", "killed", "exited", "hang", "overtime")]
    own = [o for o in failed if not comm_error(o)]
    if not own:  # only broken connections: the earliest one is where it started
        errors = sorted((o for o in failed if o.kind == "error"), key=lambda o: o.error_time)
        own = errors[:1]
    for o in failed:
        if o not in own and comm_error(o):
            o.kind = "secondary"


def _dump_stacks(procs: list[Any], ranks: list[int], workdir: str) -> None:
    dump_stacks([(procs[r], stack_path(workdir, r)) for r in ranks])


def dump_stacks(targets: Sequence[tuple[Any, str]]) -> None:
    """Ask each process (``(proc, its stack file)``) for its stacks and wait until every dump has
    landed: first from Python (safe at any moment, see :func:`~ddpcheck.launch.rank.install_stack_dumps`),
    then from faulthandler for those whose main thread is held in C code and wrote nothing."""
    if not targets:
        return
    started = time.monotonic()
    pending = list(targets)
    for signum, until in ((STACK_SIGNAL, PYTHON_STACK_WAIT_S), (NATIVE_STACK_SIGNAL, _STACK_WAIT_S)):
        for proc, _ in pending:
            try:
                os.kill(proc.pid, signum)
            except (ProcessLookupError, TypeError):
                pass
        while pending and time.monotonic() < started + until:
            time.sleep(0.02)
            pending = [(proc, path) for proc, path in pending if _size(path) == 0 and proc.is_alive()]
    time.sleep(0.05)  # a dump is written in one burst; let the last one finish


def _stop_all(procs: list[Any]) -> None:
    for proc in procs:
        if proc.pid is not None:
            kill_group(proc.pid)
    for proc in procs:
        if proc.pid is not None:
            proc.join(timeout=5)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _diagnose(result: GroupResult) -> str:
    hung = [o for o in result.outcomes if o.kind == "hang"]
    if not hung:
        return ""
    lines = [f"{len(hung)} of {result.world_size} ranks hung:"]
    for o in result.outcomes:
        where = o.progress or "unknown position"
        frame = _last_frame(o.stack)
        lines.append(
            f"  rank {o.rank} [{o.kind}] at {where}" + (f"; innermost frame: {frame}" if frame else "")
        )
    waiting = [o.rank for o in result.outcomes if "final barrier" in o.progress]
    if waiting and len(waiting) < result.world_size:
        busy = [o.rank for o in result.outcomes if o.rank not in waiting]
        why = (
            "never reached the same collective (uneven batch counts or a collective only some ranks call)"
            if all(o.waiting for o in hung)
            else "stopped making progress in their own code (their stacks show where)"
        )
        lines.append(f"  ranks {_join(waiting)} finished and wait for ranks {_join(busy)}, which {why}")
    return "\n".join(lines)


def _last_frame(stack: str) -> str:
    for block in stack.split("\n\n"):
        if "most recent call first" in block and "Current thread" in block:
            frames = [ln.strip() for ln in block.splitlines() if ln.strip().startswith("File ")]
            return frames[0] if frames else ""
    frames = [ln.strip() for ln in stack.splitlines() if ln.strip().startswith("File ")]
    return frames[0] if frames else ""


def _join(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)
