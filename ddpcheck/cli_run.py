"""``ddpcheck run [OPTIONS] -- SCRIPT [ARGS...]`` and ``ddpcheck judge DIR [--reference DIR1]``.

``run`` is a torchrun drop-in that audits the training script as written: everything after ``--`` (or
after ``-m MODULE``) is the script's own command line, so its options never meet ours. ``judge``
judges traces recorded inside the user's own launch (``torchrun ... -m ddpcheck.record --out DIR``).
The options they share with loader files keep their names, meanings and ``[tool.ddpcheck]`` defaults
(the loader-file parser's own actions are reused, so both stay one definition). Exit codes as for
loader files: 0 passed, 1 a check failed, 2 bad input, 3 the script failed or hung, 130 interrupted.
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ddpcheck import hygiene
from ddpcheck.exits import EXIT_BAD_INPUT, EXIT_INTERRUPTED
from ddpcheck.options import IGNORE_INDEX
from ddpcheck.wire.argv import batch_function, model_steps, nonnegative, split_command

if TYPE_CHECKING:
    from ddpcheck.result import CheckResult

BATCH_WINDOW = 8  # calls of a --batches function per window, without --steps
MESH_OPTIONS = ("--mesh", "--data-dims", "--sequence-dims")
JUDGING_OPTIONS = ("--allow", "--max-idle")
REPORT_OPTIONS = ("--format", "--report-dir", "--junit", "--quiet", "--verbose", "--color")
SHARED = (
    "--world-sizes", *MESH_OPTIONS, "--epochs", "--timeout", "--max-time", *JUDGING_OPTIONS, "--steps",
    "--no-determinism", "--no-work", "--work-cost", *REPORT_OPTIONS,
)  # fmt: skip
JUDGE_SHARED = (*MESH_OPTIONS, *JUDGING_OPTIONS, *REPORT_OPTIONS)


@dataclass(frozen=True)
class LoaderCommand:
    """What ``ddpcheck run``/``judge`` take from the loader-file command (``ddpcheck.cli``), handed over by
    it (this module never imports it): its parser, whose actions and defaults the shared options reuse,
    and how it colours and fits the table."""

    build_parser: Callable[[], argparse.ArgumentParser]
    use_color: Callable[[str, TextIO], bool]
    terminal_width: Callable[[], int]


def _copy_options(parser: argparse.ArgumentParser, names: Sequence[str], command: LoaderCommand) -> None:
    """The loader-file parser's own actions for the options both share: one definition of each."""
    source = command.build_parser()
    by_option = {option: action for action in source._actions for option in action.option_strings}
    for name in names:
        action = by_option.get(name)
        if action is not None:
            parser._add_action(copy.copy(action))


def build_run_parser(command: LoaderCommand) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ddpcheck run",
        usage="ddpcheck run [OPTIONS] -- SCRIPT [ARGS...]\n       ddpcheck run [OPTIONS] -m MODULE [ARGS...]",
        description=(
            "Run a training script as torchrun would, at world size 1 and every requested layout, and "
            "check every DataLoader it iterates."
        ),
    )
    _copy_options(parser, SHARED, command)
    parser.add_argument(
        "--model-steps",
        type=model_steps,
        default=2,
        metavar="N|all",
        help="batches of each epoch the script's own loop receives (its model, eval and checkpoint code "
        "run as written); the rest of the epoch is recorded past it. 'all': whole epochs",
    )
    parser.add_argument(
        "--hooks",
        default="",
        metavar="FILE",
        help="a file with loader-file hooks (sample_ids, batch_work, ...)",
    )
    parser.add_argument(
        "--no-step",
        dest="step",
        action="store_false",
        help="do not watch the training step (step_equivalence, equal_microsteps; supervision and "
        "rng_independence then judge the loaders' batches alone); saves one replay launch per layout",
    )
    parser.add_argument(
        "--ignore-index",
        type=int,
        default=IGNORE_INDEX,
        metavar="N",
        help="the label value that supervises nothing, for supervision and the step's token counts (-100)",
    )
    parser.add_argument(
        "--no-metrics",
        dest="metrics",
        action="store_const",
        const=False,
        default=None,
        help="leave the script's evaluation alone (metric_equivalence): it is cut like any epoch",
    )
    parser.add_argument(
        "--eval-rounds",
        type=nonnegative,
        default=1,
        metavar="N",
        help="evaluations compared (handed to the script whole, on the single process's weights)",
    )
    parser.add_argument(
        "--batches",
        type=batch_function,
        default="",
        metavar="NAME",
        help="a script without a DataLoader: record what this function returns (get_batch, Cls.method, "
        "a generator; module:name for a module's) as its batches, in windows of --steps calls "
        f"(default {BATCH_WINDOW})",
    )
    return parser


def build_judge_parser(command: LoaderCommand) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ddpcheck judge",
        description="Judge the traces one launch recorded (torchrun ... -m ddpcheck.record --out DIR).",
    )
    parser.add_argument("directory", help="the launch's trace directory")
    parser.add_argument(
        "--reference", default=None, metavar="DIR1", help="the same script recorded at one process"
    )
    parser.add_argument(
        "--replay",
        default=None,
        metavar="DIR1",
        help="the launch's one-process replay (python -m ddpcheck.record --replay DIR --out DIR1), for "
        "step_equivalence",
    )
    parser.add_argument(
        "--replay-twice",
        default=None,
        metavar="DIR2",
        help="the same replay fed every batch twice (... --replay DIR --replay-twice --out DIR2): says "
        "whether the loss is a sum over a fixed normaliser, compared with the replay / world size",
    )
    _copy_options(parser, JUDGE_SHARED, command)
    return parser


def _layered(
    parser: argparse.ArgumentParser, argv: Sequence[str], command: LoaderCommand
) -> argparse.Namespace:
    """Defaults < ``[tool.ddpcheck]`` < ``DDPCHECK_*`` < command line, read as for loader files (keys
    that only loader files use are accepted and left unused)."""
    from ddpcheck import config

    layered = config.load(command.build_parser())
    mine = {action.dest for action in parser._actions}
    defaults = {dest: value for dest, value in layered.values.items() if dest in mine}
    return parser.parse_args(list(argv), namespace=argparse.Namespace(**defaults))


def main_run(argv: Sequence[str], command: LoaderCommand) -> int:
    from ddpcheck.config import ConfigError

    ours, path, module, script_args = split_command(argv)
    parser = build_run_parser(command)
    try:
        args = _layered(parser, ours, command)
    except ConfigError as exc:
        return _error(str(exc))
    if not path and not module:
        parser.error("give the script after --: ddpcheck run [OPTIONS] -- train.py ARGS, or -m MODULE ARGS")
    args.target = (path, module, tuple(script_args))
    return _checked(args, _run_script, command)


def main_judge(argv: Sequence[str], command: LoaderCommand) -> int:
    from ddpcheck.config import ConfigError

    parser = build_judge_parser(command)
    try:
        args = _layered(parser, argv, command)
    except ConfigError as exc:
        return _error(str(exc))
    return _checked(args, _judge, command)


def _checked(args: argparse.Namespace, work: Any, command: LoaderCommand) -> int:
    from ddpcheck.options import BadInput

    try:
        outcome = work(args)
    except BadInput as exc:
        return _error(str(exc))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:
        detail = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        if getattr(args, "verbose", False):
            import traceback

            traceback.print_exc()
        return _error(
            f"internal error: {detail}" + ("" if args.verbose else " (run with -v for the traceback)")
        )
    if isinstance(outcome, int):
        return outcome
    result, interrupted = outcome
    hygiene.interrupts.publishing = True
    return publish(result, args, interrupted, command)


def _check_options(args: argparse.Namespace, **overrides: Any) -> Any:
    from ddpcheck.options import CheckOptions

    values: dict[str, Any] = {
        "world_sizes": tuple(getattr(args, "world_sizes", (1, 2, 4))),
        "epochs": getattr(args, "epochs", 2),
        "timeout": getattr(args, "timeout", 120.0),
        "max_time": getattr(args, "max_time", None),
        "allow": tuple(getattr(args, "allow", ()) or ()),
        "max_idle": getattr(args, "max_idle", None),
        "steps": getattr(args, "steps", None),
        "determinism": not getattr(args, "no_determinism", False),
        "work": not getattr(args, "no_work", False),
        "work_cost": getattr(args, "work_cost", "tokens"),
        "ignore_index": getattr(args, "ignore_index", IGNORE_INDEX),
        "meshes": tuple(getattr(args, "meshes", ()) or ()),
        "data_dims": tuple(getattr(args, "data_dims", ()) or ()),
        "sequence_dims": None if getattr(args, "sequence_dims", None) is None else tuple(args.sequence_dims),
        "resume": False,
        "metrics": getattr(args, "metrics", None),
    }
    values.update(overrides)
    return CheckOptions(**values)


def _run_script(args: argparse.Namespace) -> tuple[CheckResult, bool]:
    from ddpcheck.checker.script_env import ScriptTarget
    from ddpcheck.session import Interrupted
    from ddpcheck.session.script import ScriptOptions, audit_script

    path, module, script_args = args.target
    check = _check_options(args)
    if args.batches and check.steps is None:  # a batch function's windows: the checks' epochs
        check = replace(check, steps=BATCH_WINDOW)
    options = ScriptOptions(
        check=check,
        model_steps=args.model_steps,
        hooks=args.hooks,
        step=args.step,
        batches=args.batches,
        eval_rounds=args.eval_rounds,
    )
    quiet = getattr(args, "quiet", False)

    def progress(message: str) -> None:
        hygiene.interrupts.checkpoint()
        if not quiet:
            print(f"ddpcheck: {message}", file=sys.stderr, flush=True)

    target = ScriptTarget(path=path, module=module, args=script_args)
    try:
        return audit_script(target, options, progress=progress), False
    except Interrupted as exc:
        return exc.partial, True


def _judge(args: argparse.Namespace) -> tuple[CheckResult, bool]:
    from ddpcheck.options import BadInput, mesh_layouts
    from ddpcheck.session.script import judge_directory

    options = _check_options(args, world_sizes=(1,))
    meshes = mesh_layouts(options)
    if len(meshes) > 1:
        raise BadInput("a recorded launch is one layout: give at most one --mesh")
    layout = meshes[0] if meshes else None
    result = judge_directory(
        args.directory, args.reference, options, layout, replay=args.replay, twice=args.replay_twice
    )
    return result, False


def publish(result: CheckResult, args: argparse.Namespace, interrupted: bool, command: LoaderCommand) -> int:
    """Report files first (nothing is lost), then the printout, then the exit code."""
    from ddpcheck.report import ReportWriteError, reasons_path, render, render_table, write_reports

    report_dir = getattr(args, "report_dir", Path("reports"))
    try:
        paths = write_reports(result, report_dir, junit_path=getattr(args, "junit", None))
    except ReportWriteError as exc:
        return _error(str(exc))
    fmt: Any = getattr(args, "format", "table")
    color = getattr(args, "color", "auto")
    if fmt == "table":  # the reasons checks do not apply: one line, as for loader files (-v: every one)
        where = None if getattr(args, "verbose", False) else reasons_path(paths)
        paint = command.use_color(color, sys.stdout)
        text = render_table(result, color=paint, width=command.terminal_width(), not_applicable_in=where)
    else:
        text = render(result, fmt)
    try:
        print(text, flush=True)
    except OSError:
        pass
    if getattr(args, "verbose", False):
        for run in result.runs:
            for failure in run.failures:
                if failure.stack:
                    print(f"--- {run.label}, rank {failure.rank} ({failure.kind}) ---", file=sys.stderr)
                    print(failure.stack.rstrip(), file=sys.stderr)
    if not getattr(args, "quiet", False):
        print(f"ddpcheck: reports: {', '.join(str(p) for p in paths)}", file=sys.stderr)
    if interrupted:
        print("ddpcheck: interrupted; the reports cover what finished", file=sys.stderr)
        return EXIT_INTERRUPTED
    return result.exit_code


def _error(message: str) -> int:
    print(f"ddpcheck: error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT
