"""``python -m ddpcheck.record --out DIR [OPTIONS] -- train.py ARGS``: record a training script's loaders.

Each process of a launch (``torchrun ... -m ddpcheck.record``, ``accelerate launch -m``, ``srun python
-m``) runs the unmodified script as its own ``__main__`` and writes what its loaders yielded to
``DIR/rank<R>.trace`` (plain data) and its ids to ``.npy`` files beside it (:mod:`ddpcheck.tracefile`);
nothing is judged here. With ``--step`` each rank also watches the
training step (``ddpcheck.checker.step``) and saves the compared steps' batches under ``DIR/step``;
``--replay DIR`` runs the script at world size 1 on the union of what those ranks received.
``ddpcheck judge DIR --reference DIR1`` judges the files later, ``ddpcheck run`` starts such processes
itself. Everything after ``--`` (or after ``-m MODULE``) belongs to the script, so its own ``--epochs``
never meets ours.

Exit codes: 0 recorded; 2 bad usage or a script that does not exist; 3 the script raised or exited
non-zero, or iterated no DataLoader (the trace file says which, with its error line); with
``--fingerprint`` (no trace files: each rank's verdict in ``OUT/fingerprint-rankR.json``) 1 when an epoch
is not every index exactly once.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddpcheck.exits import EXIT_BAD_INPUT, EXIT_FINGERPRINT_FAILED, EXIT_OK, EXIT_SCRIPT_FAILED
from ddpcheck.launch.workdir import enter_workdir  # the standard library only: no thread starts
from ddpcheck.wire.argv import ArgvError, RecordArgs, exit_with
from ddpcheck.wire.files import step_folder

if TYPE_CHECKING:
    from ddpcheck.checker.script import ScriptRecordOptions
    from ddpcheck.checker.script_env import ScriptTarget
    from ddpcheck.checker.step import StepWatcher


def main(argv: Sequence[str] | None = None) -> int:
    problem = enter_workdir()  # first: a mount namespace is entered only while this is one thread
    if problem:
        print(f"ddpcheck.record: {problem}", file=sys.stderr)
        return EXIT_SCRIPT_FAILED
    try:
        args = RecordArgs.from_argv(sys.argv[1:] if argv is None else argv)
    except ArgvError as exc:
        exit_with(str(exc))
    if args.path and not os.path.isfile(args.path):
        print(f"ddpcheck.record: no such script: {args.path}", file=sys.stderr)
        return EXIT_BAD_INPUT
    problem = _out_problem(args.out) or _mesh_problem(args)
    if problem:
        print(f"ddpcheck.record: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.eval_weights and not os.path.isdir(args.eval_weights):
        print(f"ddpcheck.record: --eval-weights {args.eval_weights}: no such directory", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.replay and not os.path.isdir(step_folder(args.replay)):
        print(
            f"ddpcheck.record: --replay {args.replay}: no recorded steps there (record with --step)",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    _die_with_launcher()
    _stack_dumps()
    _progress()
    from ddpcheck.checker.script import ScriptRecordOptions, record_script
    from ddpcheck.checker.script_env import ScriptTarget

    hooks = None
    if args.hooks:
        from ddpcheck.launch.target import load_file

        try:
            hooks = load_file(Path(args.hooks), "ddpcheck_script_hooks")
        except Exception as exc:
            print(
                f"ddpcheck.record: cannot load --hooks {args.hooks}: {type(exc).__name__}: {exc}",
                file=sys.stderr,
            )
            return EXIT_BAD_INPUT
    options = ScriptRecordOptions(
        epochs=args.epochs,
        model_steps=args.model_steps,
        steps=args.steps,
        hooks=args.hooks,
        digest=args.digest,
        work=args.work,
        work_cost=args.work_cost,
        ignore_index=args.ignore_index,
        batches=args.batches,
        eval_rounds=args.eval_rounds,
        eval_save=os.path.abspath(args.out),
        eval_weights=os.path.abspath(args.eval_weights) if args.eval_weights else "",
    )
    target = ScriptTarget(path=args.path, module=args.module, args=args.script_args)
    if args.fingerprint:
        return _fingerprinted(args.out, target, replace(options, eval_rounds=0), hooks)
    from ddpcheck.tracefile import spill_to, write_rank

    spill_to(args.out)  # an epoch's ids go to disk as they grow (ddpcheck.tracefile)
    watcher = _watch_step(args)
    trace = replace(record_script(target, options, hooks), frameworks=imported_frameworks())
    if watcher is not None:
        trace = replace(trace, steps=watcher.finish())
    _finished()  # the script is over: what is left (the trace written, the exit) is ddpcheck's, bounded
    write_rank(args.out, trace)
    if trace.status != "ok":
        print(f"ddpcheck.record: rank {trace.rank}: {trace.message}", file=sys.stderr)
        return EXIT_SCRIPT_FAILED
    if not trace.loaders and not trace.sources:
        print(f"ddpcheck.record: rank {trace.rank}: the script iterated no DataLoader", file=sys.stderr)
        return EXIT_SCRIPT_FAILED
    return EXIT_OK


def _fingerprinted(out: str, target: ScriptTarget, options: ScriptRecordOptions, hooks: Any) -> int:
    """``--fingerprint``: record, then prove coverage and overlap with the other ranks from summaries
    (:mod:`ddpcheck.checker.fingerprint`); ids live in a temporary folder under OUT until then. Writes
    ``OUT/fingerprint-rankR.json``; exit 1 when an epoch failed."""
    import json
    import shutil
    import tempfile

    from ddpcheck.checker.fingerprint import HELD_IDS, exchange, teardown_deferred
    from ddpcheck.checker.script import record_script
    from ddpcheck.checks.fingerprint import FingerprintReport
    from ddpcheck.trace import spill_every
    from ddpcheck.tracefile import spill_to
    from ddpcheck.wire.files import FINGERPRINT_HELD, fingerprint_path

    os.makedirs(out, exist_ok=True)
    held = tempfile.mkdtemp(prefix=FINGERPRINT_HELD, dir=out)

    def publish(report: FingerprintReport) -> None:
        with open(fingerprint_path(out, trace.rank), "w") as handle:
            data = {"ok": report.ok, "ranks": report.ranks, "seconds": report.seconds,
                    "cpu_seconds": report.cpu_seconds, "state_bytes": report.state_bytes,
                    "epochs": [vars(e) for e in report.epochs]}  # fmt: skip
            json.dump(data, handle, indent=1)
        if trace.rank == 0:
            print("\n".join(report.lines()), file=sys.stderr, flush=True)

    try:
        spill_to(held)
        spill_every(HELD_IDS)
        with teardown_deferred() as waiting:
            trace = record_script(target, options, hooks)
            try:
                report = exchange(trace, publish) if trace.status == "ok" else None
            finally:
                for teardown in waiting:
                    teardown()
    finally:
        shutil.rmtree(held, ignore_errors=True)
    if trace.status != "ok":
        print(f"ddpcheck.record: rank {trace.rank}: {trace.message}", file=sys.stderr)
        return EXIT_SCRIPT_FAILED
    if report is None:
        print(
            f"ddpcheck.record: rank {trace.rank}: --fingerprint needs the script's process group",
            file=sys.stderr,
        )
        return EXIT_SCRIPT_FAILED
    return EXIT_OK if report.ok else EXIT_FINGERPRINT_FAILED


# a framework, by the modules that show the script imported it
FRAMEWORK_MODULES = {"lightning": ("lightning.fabric", "lightning_fabric", "pytorch_lightning")}


def imported_frameworks() -> tuple[str, ...]:
    """The training frameworks the script imported (their launchers decide how its processes group)."""
    loaded = sys.modules
    return tuple(name for name, modules in FRAMEWORK_MODULES.items() if any(m in loaded for m in modules))


def _watch_step(args: RecordArgs) -> StepWatcher | None:
    """Install the step watcher when asked (``--step``, ``--replay``): before the script runs."""
    if not (args.step or args.replay):
        return None
    from ddpcheck.checker.step import StepOptions, install_watcher

    options = StepOptions(
        out="" if args.replay else args.out,
        replay=args.replay,
        replay_ranks=_replay_ranks(args),
        twice=bool(args.replay) and args.replay_twice,
        ignore_index=args.ignore_index,
        compare_batches=args.compare_batches,
        tail_batches=args.tail_batches,
    )
    return install_watcher(options)


def _out_problem(out: str) -> str:
    """Why ``--out`` cannot hold the traces ("" when it can): found before the script runs, as one line,
    not as a traceback once the script has trained (a file in the way, a read-only filesystem)."""
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as exc:
        return f"--out {out}: cannot create the trace directory ({exc.strerror or exc})"
    if not os.access(out, os.W_OK | os.X_OK):
        return f"--out {out}: the trace directory is not writable"
    return ""


def _mesh_problem(args: RecordArgs) -> str:
    """Why ``--mesh``/``--data-dims`` cannot be used ("": they can, or were not given)."""
    if args.data_dims is not None and args.mesh is None:
        return "--data-dims: give --mesh too"
    if args.mesh is None:
        return ""
    if not args.replay:
        return "--mesh: only with --replay (it names the recorded launch's mesh)"
    from ddpcheck.layout import LayoutError, parse_mesh

    try:
        parse_mesh(args.mesh, args.data_dims)
    except LayoutError as exc:
        return str(exc)
    return ""


def _replay_ranks(args: RecordArgs) -> tuple[int, ...] | None:
    """The recorded ranks a replay joins: one per data-parallel coordinate of ``--mesh`` (None: every rank).
    The mesh was checked for its form when parsed; a mesh without a data dimension is refused in main."""
    if args.mesh is None:
        return None
    from ddpcheck.layout import parse_mesh

    return tuple(parse_mesh(args.mesh, args.data_dims).representatives())


def _die_with_launcher() -> None:
    """Under ``ddpcheck run``: die with it, even if it is SIGKILLed (its janitor kills our group too)."""
    from ddpcheck.launch.script import PARENT_ENV

    parent = os.environ.get(PARENT_ENV, "")
    if not parent.isdigit() or sys.platform != "linux":
        return
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != int(parent):
        os._exit(1)


def _progress() -> None:
    """Under ``ddpcheck run``: publish this rank's progress where the launcher's watchdog reads it
    (batches, collectives, optimizer steps: ``--timeout`` is time without any of them)."""
    from ddpcheck.launch.beats import attach_file, install_beats

    if attach_file():  # no progress said before the script's first: its start has an allowance of its own
        install_beats()


def _finished() -> None:
    from ddpcheck.launch.beats import finished

    finished()


def _stack_dumps() -> None:
    from ddpcheck.launch.script import STACK_ENV

    where = os.environ.get(STACK_ENV, "")
    if not where:
        return
    from ddpcheck.launch.rank import install_stack_dumps

    install_stack_dumps(open(where, "a", buffering=1))  # noqa: SIM115 - open for the process's life


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.exit(code)
