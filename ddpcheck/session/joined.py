"""Run inside an existing launch (torchrun, SLURM, or explicit rank/world/master) instead of spawning.

Every process of the launch is one rank: it records its own stream, rank 0 gathers the traces,
judges them against a single-process reference that rank 0 computed in a fresh local group before
joining, and writes the report; every rank then exits with the code rank 0 decided. This is how a
multi-node check runs: ``torchrun --nnodes=2 --nproc-per-node=8 -m ddpcheck loader.py``.

Judging is the local runs' own (:func:`ddpcheck.session.run.layout_result`, which hands the recordings
to :func:`ddpcheck.checks.judge.judge`: the data checks, ``--max-idle``, ``--allow``). What a joined
launch cannot do is said in the result: ``determinism`` (the launch runs once) and the checks that
start process groups of their own (:data:`SCENARIOS_NOTE`).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from ddpcheck.checker.loaderfile import BadLoaderFile, LoaderSpec, precheck
from ddpcheck.checker.recipe import record_options
from ddpcheck.checker.recording import RankRecording, record_rank
from ddpcheck.checks.replicas import data_parallel_view
from ddpcheck.exits import EXIT_BAD_INPUT
from ddpcheck.figures import figure_data
from ddpcheck.launch.rank import error_message
from ddpcheck.layout import Layout
from ddpcheck.options import BadInput, CheckOptions
from ddpcheck.result import CheckResult, RunRecord
from ddpcheck.session.plan import reference_layout
from ddpcheck.session.record import Job, record
from ddpcheck.session.run import layout_result, raise_if_bad_input, reference_notes, timed
from ddpcheck.trace import RankFailure, RunTrace

DETERMINISM_SKIP = "a joined launch runs once: start the launch twice and compare to check determinism"
SCENARIOS_NOTE = (
    "a joined launch does not run metric_equivalence, training_equivalence, resume or elastic_resume: "
    "each starts process groups of its own, which ddpcheck forks on one machine, while a joined launch's "
    "ranks are the launcher's (other nodes, their devices); run `ddpcheck LOADER.py --world-sizes N` on "
    "one machine for them"
)


@dataclass(frozen=True)
class JoinTarget:
    """Where to join: explicit values win; missing ones come from torchrun's or SLURM's environment."""

    rank: int | None = None
    world_size: int | None = None
    master_addr: str | None = None
    master_port: int | None = None

    @property
    def explicit(self) -> bool:
        return self.rank is not None or self.world_size is not None or self.master_addr is not None


def launched_rank(target: JoinTarget) -> int | None:
    """This process's rank when it belongs to a launch (explicit or from the environment), else None."""
    from ddpcheck.reference.dist import detect_launch

    if target.rank is not None:
        return target.rank
    launch = detect_launch(os.environ, require_rendezvous=False)
    return launch.rank if launch else None


def check_joined(path: str, options: CheckOptions, target: JoinTarget) -> tuple[CheckResult | None, int]:
    """Join the launch, record, and (rank 0) judge. Returns (result on rank 0 else None, exit code)."""
    import torch.distributed as dist

    from ddpcheck.reference.dist import connect, disconnect

    if (target.rank is None) != (target.world_size is None):
        raise BadInput("pass --rank and --world-size together")
    meshes = options.layouts
    if len(meshes) > 1:
        raise BadInput("a joined launch is one layout: give at most one --mesh, the launch's own")
    spec = LoaderSpec(path=str(path), factory=options.factory)
    try:
        rank = launched_rank(target)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    reference: RunTrace | None = None
    bad: str = ""
    if rank == 0:  # before joining: a fresh single-process group, no peers waiting on it yet
        try:
            precheck(spec)
            single = reference_layout(meshes)
            reference = record(spec, [Job(replace(options, set_epoch=True, simulate=False), single)])[0]
            raise_if_bad_input(reference)
        except (BadLoaderFile, BadInput) as exc:
            bad = str(exc)
    with _HeldStderr() as logged:  # c10d logs a failed connect with a C++ stack: our one line says it
        try:
            info = connect(
                backend=options.backend,
                rank=target.rank,
                world_size=target.world_size,
                master_addr=target.master_addr,
                master_port=target.master_port,
                timeout=timedelta(seconds=options.timeout),
            )
        except dist.DistError as exc:  # the launch's rendezvous, not the loader: bad environment, exit 2
            logged.drop()
            raise BadInput(rendezvous_error(target, options.timeout, exc)) from None
    started = time.monotonic()
    try:
        layout = meshes[0] if meshes else Layout.plain(info.world_size)
        if layout.world_size != info.world_size:  # every rank knows both: each exits 2 before any collective
            raise BadInput(
                f"mesh {layout.spec} has {layout.world_size} ranks, but the launch has {info.world_size}: "
                "--mesh describes the launch's own ranks"
            )
        payload: tuple[str, Any] = ("refused", None)  # rank 0 refused the loader: nothing recorded
        if not _broadcast(bad, info.rank):
            try:
                payload = (
                    "ok",
                    record_rank(record_options(spec, options, layout, digest=layout.replicas > 1)),
                )
            except BaseException as exc:
                payload = ("error", error_message(exc))
        gathered: list[Any] = [None] * info.world_size
        dist.all_gather_object(gathered, payload)
        result: CheckResult | None = None
        code = EXIT_BAD_INPUT
        if info.rank == 0 and not bad:
            assert reference is not None
            result = _judge(path, options, reference, gathered, info.backend, started, layout)
            code = result.exit_code
        codes = [code]
        dist.broadcast_object_list(codes, src=0)
        if bad and info.rank == 0:
            raise BadInput(bad)
        return result, int(codes[0])
    finally:
        disconnect()


class _HeldStderr:
    """What native code writes to fd 2 meanwhile, replayed on leaving unless ``drop`` was called."""

    def __init__(self) -> None:
        self.dropped = False

    def drop(self) -> None:
        self.dropped = True

    def __enter__(self) -> _HeldStderr:
        sys.stderr.flush()
        self._sink = tempfile.TemporaryFile()
        self._saved = os.dup(2)
        os.dup2(self._sink.fileno(), 2)
        return self

    def __exit__(self, *exc: object) -> None:
        os.dup2(self._saved, 2)
        os.close(self._saved)
        with self._sink as sink:
            sink.seek(0)
            text = sink.read()
        if text and not self.dropped:
            os.write(2, text)


def rendezvous_error(target: JoinTarget, timeout: float, exc: BaseException) -> str:
    """One line naming the rendezvous that failed and what to check (a launch problem, not a loader's)."""
    from ddpcheck.reference.dist import detect_launch

    addr: object = target.master_addr
    port: object = target.master_port
    if addr is None or port is None:
        try:
            launch = detect_launch(os.environ, require_rendezvous=False)
        except ValueError:
            launch = None
        addr = addr if addr is not None else (launch.master_addr if launch else os.environ.get("MASTER_ADDR"))
        port = port if port is not None else (launch.master_port if launch else os.environ.get("MASTER_PORT"))
    reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
    return (
        f"cannot join the launch's rendezvous at {addr}:{port} within {timeout:g} s ({reason}): check that "
        "rank 0 is running and listening there, that MASTER_ADDR/MASTER_PORT (or --master-addr/"
        "--master-port) match on every rank, and that no firewall blocks the port; a slow start needs a "
        "larger --timeout"
    )


def _broadcast(bad: str, rank: int) -> str:
    """Rank 0's bad-input verdict, shared so no rank records a loader rank 0 already rejected."""
    import torch.distributed as dist

    box = [bad if rank == 0 else ""]
    dist.broadcast_object_list(box, src=0)
    return str(box[0])


def _judge(
    path: str,
    options: CheckOptions,
    reference: RunTrace,
    gathered: list[Any],
    backend: str,
    started: float,
    layout: Layout,
) -> CheckResult:
    recordings = [p[1] for p in gathered if p[0] == "ok" and isinstance(p[1], RankRecording)]
    failures = tuple(
        RankFailure(rank=r, kind="error", message=p[1].get("message", ""), stack=p[1].get("traceback", ""))
        for r, p in enumerate(gathered)
        if p[0] == "error"
    )
    run = RunTrace(
        world_size=len(gathered),
        backend=backend,
        ranks=tuple(r.trace for r in recordings),
        id_source=recordings[0].id_source if recordings else "index",
        set_epoch=options.set_epoch,
        failures=failures,
    )
    figures = figure_data(reference, data_parallel_view(layout, run))
    judged = layout_result(reference, run, None, layout, options, figures=figures, once=DETERMINISM_SKIP)
    world = timed(judged, started)
    return CheckResult(
        loader=str(path),
        runs=(world,),
        id_source=reference.id_source,
        epochs=options.epochs,
        options=RunRecord(options, joined=True),
        notes=(*reference_notes(reference, (layout.dp_world_size,)), SCENARIOS_NOTE),
    )
