"""Start a training script's ranks as ``torchrun --standalone --nproc-per-node W`` would, and watch them.

Every rank is a fresh interpreter (``python -m ddpcheck.record ... -- train.py ARGS``): its own hash
seed and random state, its own session (as torchrun's workers), exit handlers that run. The store is
this process's, as torchrun's agent hosts it (``TORCHELASTIC_USE_AGENT_STORE``), on a socket bound
to 127.0.0.1; the script's own ``init_process_group`` joins it. Every wait has a deadline; a rank
that hangs has its stacks dumped before it is killed; a rank that dies lets the others go after a
grace period. Nothing outlives the call: each rank's process group is killed on the way out, and a
janitor does it if this process is killed first.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from ddpcheck.launch.procs import Janitor, kill_group, read_tail
from ddpcheck.launch.rank import NATIVE_STACK_SIGNAL, PYTHON_STACK_WAIT_S, STACK_SIGNAL, torchrun_env
from ddpcheck.launch.workdir import RunWorkdir, WorkdirGuard

STACK_ENV = "DDPCHECK_STACK_FILE"  # where a rank writes its stacks when asked (a hang)
PARENT_ENV = "DDPCHECK_PARENT_PID"  # a rank dies with this process
AFTER_FAILURE_GRACE_S = 10.0  # how long the other ranks may still finish once one has failed
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
    hung: bool = False
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
    timeout: float,
    env: dict[str, str] | None = None,
    workdir: WorkdirGuard | None = None,
    label: str = "",
) -> ScriptLaunch:
    """Run ``python -m ddpcheck.record --out OUT ... -- SCRIPT ARGS`` (``command``: what follows
    ``python``) on ``world_size`` ranks; returns when every rank has ended or been killed.

    ``workdir``: the ranks see the working directory through this run's view of it (``label`` names
    the run in what the guard reports); it ends once every rank has."""
    import torch.distributed as dist

    from ddpcheck.launch.group import bind_loopback

    os.makedirs(out, exist_ok=True)
    launch = ScriptLaunch(world_size=world_size, out=out)
    sock = bind_loopback()
    port = sock.getsockname()[1]
    store = dist.TCPStore(
        "127.0.0.1",
        port,
        world_size,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=timeout + 30.0),
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
        for rank in range(world_size):
            launch.ranks.append(_start(rank, meeting, command, cwd, env, janitor))
        _watch(launch, started + timeout)
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
    entry = ScriptRank(rank=rank, log=os.path.join(out, f"rank{rank}.log"))
    entry.stacks_file = os.path.join(out, f"rank{rank}.stacks")
    env = dict(os.environ)
    env.pop("PYTHONHASHSEED", None)  # a fresh interpreter's own hash seed, as under torchrun
    env.update(meeting.env(rank))
    env["TORCHELASTIC_USE_AGENT_STORE"] = "True"  # this process hosts the store, as torchrun's agent
    env[STACK_ENV] = entry.stacks_file
    env[PARENT_ENV] = str(os.getpid())
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


def _watch(launch: ScriptLaunch, deadline: float) -> None:
    failed_at: float | None = None
    running = list(launch.ranks)
    while running:
        now = time.monotonic()
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
        if failed_at is not None and now - failed_at > AFTER_FAILURE_GRACE_S:
            _dump(running)
            for entry in running:
                entry.killed_after_failure = True
            return
        if now > deadline:
            launch.timed_out = True
            _dump(running)
            for entry in running:
                entry.hung = True
            return
        time.sleep(0.05)


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
