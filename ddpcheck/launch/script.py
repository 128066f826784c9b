"""Start a training script's ranks as ``torchrun --standalone --nproc-per-node W`` would, and watch them.

Every rank is a fresh interpreter (``python -m ddpcheck.record ... -- train.py ARGS``): its own hash
seed and random state, its own session (as torchrun's workers), exit handlers that run. The store is
this process's, as torchrun's agent hosts it (``TORCHELASTIC_USE_AGENT_STORE``), on a socket bound
to 127.0.0.1; the script's own ``init_process_group`` joins it. Every wait has a deadline: each rank
publishes its progress (batches, collectives, optimizer steps) in a file this process maps
(:mod:`ddpcheck.launch.beats`), and a rank without progress for ``timeout`` seconds is hung
(:mod:`ddpcheck.launch.watchdog`); it has its stacks dumped before it is killed; a rank that dies lets
the others go after a grace period. Nothing outlives the call: each rank's process group is killed on
the way out, and a janitor does it if this process is killed first.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ddpcheck.launch.beats import PROGRESS_FILE_ENV, PROGRESS_SLOT_ENV, read_progress
from ddpcheck.launch.procs import Janitor, kill_group, read_tail
from ddpcheck.launch.rank import NATIVE_STACK_SIGNAL, PYTHON_STACK_WAIT_S, STACK_SIGNAL, torchrun_env
from ddpcheck.launch.watchdog import Limits, Silence, Watchdog
from ddpcheck.launch.workdir import RunWorkdir, WorkdirGuard
from ddpcheck.wire.files import PROGRESS_BYTES, log_path, progress_path, stacks_path

STACK_ENV = "DDPCHECK_STACK_FILE"  # where a rank writes its stacks when asked (a hang)
_STORE_WAIT_S = 7 * 24 * 3600.0  # the store's own waits: the watchdog decides what is hung
PARENT_ENV = "DDPCHECK_PARENT_PID"  # a rank dies with this process
AFTER_FAILURE_GRACE_S = 10.0  # how long the other ranks may still finish once one has failed
START_ALLOWANCE_S = 60.0  # on top of ``timeout`` before a rank's first progress: the interpreter, torch
FINISH_GRACE_S = 300.0  # a rank whose script is over (writing its trace, exiting) is let go after this
_POLL_S = 0.05
OUTPUT_TAIL = 4000
OUTPUT_LINES = 12  # of a rank's own output, shown with its failure
OWN_PREFIX = "ddpcheck.record:"  # what the rank side prints itself, not the script


@dataclass
class ScriptRank:
    """One rank's process and what became of it."""

    rank: int
    proc: subprocess.Popen[bytes] | None = None
    log: str = ""
    stacks_file: str = ""
    returncode: int | None = None
    hung: bool = False  # made no progress for ``timeout`` seconds while working (or all ranks waited)
    waited: bool = False  # stopped while it waited for a hung rank
    overtime: bool = False  # still running at ``max_time``
    silence: Silence | None = None  # since when it had made no progress, when it was stopped
    progress: str = ""  # its last published position
    killed_after_failure: bool = False
    stacks: str = ""
    output: str = ""


@dataclass
class ScriptLaunch:
    """One launch of the script at one world size."""

    world_size: int
    out: str  # where the ranks write their traces
    ranks: list[ScriptRank] = field(default_factory=list)
    seconds: float = 0.0
    timed_out: bool = False
    timeout: float = 0.0
    max_time: float | None = None


@dataclass(frozen=True)
class _Rendezvous:
    """Where the ranks of one launch meet, as torchrun tells its workers: the store's port on 127.0.0.1,
    the run's id, the world size, and the launch's directory."""

    world_size: int
    port: int
    run_id: str
    out: str

    def env(self, rank: int) -> dict[str, str]:
        return torchrun_env(rank, self.world_size, self.port, self.run_id, self.out)


def launch_script(
    command: Sequence[str],
    world_size: int,
    out: str,
    *,
    cwd: str,
    limits: Limits,
    env: dict[str, str] | None = None,
    workdir: WorkdirGuard | None = None,
    label: str = "",
) -> ScriptLaunch:
    """Run ``python -m ddpcheck.record --out OUT ... -- SCRIPT ARGS`` (``command``: what follows
    ``python``) on ``world_size`` ranks; returns when every rank has ended or been killed.

    ``limits.timeout``: seconds a rank may go without progress; ``limits.max_time``: the launch's whole
    time (None: no cap). ``workdir``: the ranks see the working directory through this run's view of
    it (``label`` names the run in what the guard reports); it ends once every rank has."""
    import torch.distributed as dist

    from ddpcheck.launch.group import bind_loopback

    os.makedirs(out, exist_ok=True)
    launch = ScriptLaunch(world_size=world_size, out=out, timeout=limits.timeout, max_time=limits.max_time)
    progress = progress_path(out)
    with open(progress, "wb") as handle:
        handle.truncate(PROGRESS_BYTES * world_size)
    sock = bind_loopback()
    port = sock.getsockname()[1]
    store = dist.TCPStore(
        "127.0.0.1",
        port,
        world_size,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=_STORE_WAIT_S),
        master_listen_fd=sock.detach(),
    )
    janitor = Janitor(out)
    meeting = _Rendezvous(world_size, port, uuid.uuid4().hex[:12], out)
    started = time.monotonic()
    view: RunWorkdir | None = None
    try:
        if workdir is not None:
            view = workdir.start(label or f"world size {world_size}", janitor)
            cwd, env = view.cwd, {**(env or {}), **view.env}
        env = {**(env or {}), PROGRESS_FILE_ENV: progress}
        for rank in range(world_size):
            launch.ranks.append(_start(rank, meeting, command, cwd, env, janitor))
        with open(progress, "rb") as handle:
            slots = mmap.mmap(handle.fileno(), PROGRESS_BYTES * world_size, access=mmap.ACCESS_READ)
        try:
            _watch(launch, slots, started)
        finally:
            slots.close()
    finally:
        for entry in launch.ranks:
            if entry.proc is not None:
                kill_group(entry.proc.pid)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    entry.proc.wait(5.0)
                if entry.returncode is None:
                    entry.returncode = entry.proc.returncode
            entry.output = read_tail(entry.log, OUTPUT_TAIL)
        if view is not None and workdir is not None:
            workdir.finish(view)
        janitor.close()
        del store
        launch.seconds = time.monotonic() - started
    return launch


def _start(
    rank: int,
    meeting: _Rendezvous,
    command: Sequence[str],
    cwd: str,
    extra: dict[str, str] | None,
    janitor: Janitor,
) -> ScriptRank:
    out = meeting.out
    entry = ScriptRank(rank=rank, log=log_path(out, rank))
    entry.stacks_file = stacks_path(out, rank)
    env = dict(os.environ)
    env.pop("PYTHONHASHSEED", None)  # a fresh interpreter's own hash seed, as under torchrun
    env.update(meeting.env(rank))
    env["TORCHELASTIC_USE_AGENT_STORE"] = "True"  # this process hosts the store, as torchrun's agent
    env[STACK_ENV] = entry.stacks_file
    env[PARENT_ENV] = str(os.getpid())
    env[PROGRESS_SLOT_ENV] = str(rank)
    env.update(extra or {})
    with open(entry.log, "wb") as log:
        entry.proc = subprocess.Popen(
            [sys.executable, *command],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # torchrun's workers run in their own session too
        )
    janitor.watch(entry.proc.pid)
    return entry


def _watch(launch: ScriptLaunch, progress: Any, started: float) -> None:
    """Until every rank has ended, a rank stalls (no progress for the timeout while working, or every
    rank still running waits), ``max_time`` runs out, or the grace after a failure is spent."""
    watchdog = Watchdog(progress, launch.world_size, launch.timeout, started)
    cap = started + launch.max_time if launch.max_time is not None else float("inf")

    def starting(rank: int) -> float:
        return START_ALLOWANCE_S if watchdog.counts[rank] <= 0 else 0.0

    failed_at: float | None = None
    running = list(launch.ranks)
    while running:
        now = time.monotonic()
        watchdog.observe(now)
        for entry in list(running):
            assert entry.proc is not None
            code = entry.proc.poll()
            if code is not None:
                entry.returncode = code
                running.remove(entry)
                if code != 0 and failed_at is None:
                    failed_at = now
        if not running:
            return
        for entry in running:  # its trace is written or being written: never a hang, but not forever
            if watchdog.finished[entry.rank] and now - watchdog.last[entry.rank] > FINISH_GRACE_S:
                assert entry.proc is not None
                kill_group(entry.proc.pid)
        stalled = watchdog.stalled(now, [e.rank for e in running], starting)
        spent = failed_at is not None and now - failed_at > AFTER_FAILURE_GRACE_S
        if stalled or now > cap or spent:
            for entry in running:
                entry.silence = watchdog.silence(entry.rank, now)
                entry.progress = read_progress(progress, entry.rank)
                entry.hung = entry.rank in stalled
                entry.waited = bool(stalled) and not entry.hung
                entry.overtime = not stalled and not spent
                entry.killed_after_failure = spent and not stalled
            launch.timed_out = not spent
            _dump(running)
            return
        time.sleep(_POLL_S)


def output_tail(output: str, lines: int = OUTPUT_LINES, width: int = 300) -> str:
    """The last ``lines`` lines the script printed on a rank (ddpcheck's own lines left out), each cut
    at ``width`` characters; "" when it printed nothing."""
    kept = [
        line if len(line) <= width else line[: width - 3] + "..."
        for line in output.splitlines()
        if line.strip() and not line.startswith(OWN_PREFIX) and not line.startswith("[... ")
    ]
    return "\n".join(kept[-lines:])


def _dump(entries: Sequence[ScriptRank]) -> None:
    """Ask each live rank for its stacks (Python-level first, native if nothing came), then read them."""
    for signum in (STACK_SIGNAL, NATIVE_STACK_SIGNAL):
        pending = [e for e in entries if not _size(e.stacks_file)]
        for entry in pending:
            assert entry.proc is not None
            with contextlib.suppress(OSError):
                os.kill(entry.proc.pid, signum)
        if pending:
            time.sleep(PYTHON_STACK_WAIT_S)
    for entry in entries:
        entry.stacks = read_tail(entry.stacks_file, 16000)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
