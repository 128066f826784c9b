"""The arguments of a recording rank (``python -m ddpcheck.record``), typed once.

:class:`RecordArgs` is what the session builds for each rank it starts (:meth:`RecordArgs.to_argv`) and
what the rank parses back (:meth:`RecordArgs.from_argv`), one parser for both, so the two sides cannot
drift: ``RecordArgs.from_argv(a.to_argv()) == a`` for every valid record. The parser is also the command
line users type under their own launcher (``torchrun ... -m ddpcheck.record --out DIR -- train.py``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import NoReturn

from ddpcheck.options import IGNORE_INDEX

PROG = "python -m ddpcheck.record"
USAGE = f"{PROG} --out DIR [OPTIONS] -- SCRIPT [ARGS...] | -m MODULE [ARGS...]"
NO_SCRIPT = "give the script after --: -- train.py ARGS, or -m MODULE ARGS"


class ArgvError(ValueError):
    """A rank's command line that does not parse; the message is argparse's one line."""


@dataclass(frozen=True)
class RecordArgs:
    """Everything a recording rank is told on its command line; the defaults are the parser's."""

    out: str
    path: str = ""  # the script (``-- FILE ARGS``), or
    module: str = ""  # the module (``-m MODULE ARGS``)
    script_args: tuple[str, ...] = ()
    epochs: int = 2
    model_steps: int | None = 2  # None: all
    steps: int | None = None
    hooks: str = ""
    digest: bool = False
    work: bool = True
    work_cost: str = "tokens"
    batches: str = ""
    fingerprint: bool = False
    step: bool = False
    replay: str = ""
    replay_twice: bool = False
    mesh: str | None = None  # the spec as Layout.spec writes it
    data_dims: tuple[str, ...] | None = None
    ignore_index: int = IGNORE_INDEX
    compare_batches: int | None = None  # None: all
    tail_batches: int = 0
    eval_rounds: int = 1
    eval_weights: str = ""

    def to_argv(self) -> list[str]:
        """The command line after ``-m ddpcheck.record``: ``--out OUT`` first (a run's ranks are found by
        it), then each option that differs from its default, then the script and its arguments."""
        argv = _pair("--out", self.out)
        for item in fields(self):
            value = getattr(self, item.name)
            if item.name in _NOT_OPTIONS or value == item.default:
                continue
            flag = "--" + item.name.replace("_", "-")
            if item.name == "work":
                argv.append("--no-work")
            elif isinstance(value, bool):
                argv.append(flag)
            elif item.name in ("model_steps", "compare_batches") and value is None:
                argv += _pair(flag, "all")
            elif item.name == "data_dims":
                argv += _pair(flag, ",".join(value))
            else:
                argv += _pair(flag, str(value))
        if self.module:
            return [*argv, "-m", self.module, *self.script_args]
        return [*argv, "--", self.path, *self.script_args]

    @classmethod
    def from_argv(cls, argv: Sequence[str]) -> RecordArgs:
        """Parse a rank's command line; raises :class:`ArgvError` (argparse's message) when it is bad.
        ``--help`` prints the help and exits, as argparse does."""
        ours, path, module, script_args = split_command(argv)
        args = build_parser(_RaisingParser).parse_args(ours)
        if not path and not module:
            raise ArgvError(NO_SCRIPT)
        values = {k: v for k, v in vars(args).items() if k != "no_work"}
        return cls(path=path, module=module, script_args=tuple(script_args), work=not args.no_work, **values)


_NOT_OPTIONS = frozenset({"out", "path", "module", "script_args"})


def _pair(flag: str, value: str) -> list[str]:
    """``--flag value``, or ``--flag=value`` where the value would read as an option (``-1``, ``--``)."""
    return [f"{flag}={value}"] if value.startswith("-") else [flag, value]


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ArgvError(message)


def split_command(argv: Sequence[str]) -> tuple[list[str], str, str, list[str]]:
    """(our options, script path, module, the script's arguments): ``-- FILE ARGS`` or ``-m MODULE ARGS``.

    The first ``--`` or ``-m`` ends our options; a bare FILE after our options works too."""
    argv = list(argv)
    for i, arg in enumerate(argv):
        if arg == "--":
            rest = argv[i + 1 :]
            if rest[:1] == ["-m"]:
                return argv[:i], "", rest[1] if len(rest) > 1 else "", rest[2:]
            return argv[:i], rest[0] if rest else "", "", rest[1:]
        if arg == "-m":
            return argv[:i], "", argv[i + 1] if i + 1 < len(argv) else "", argv[i + 2 :]
    return argv, "", "", []


# --- the values: each option's syntax, one line when it is wrong ------------------------------------------


def model_steps(text: str) -> int | None:
    """``all`` or a positive number of batches per epoch that the script's own loop receives."""
    if text.strip().lower() == "all":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--model-steps takes a number of batches or 'all', got {text!r}"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"--model-steps must be at least 1 (or 'all'), got {text!r}")
    return value


def parse_name(spec: str) -> tuple[str, tuple[str, ...]]:
    """``data:get_batch`` -> ("data", ("get_batch",)); ``Cls.method`` -> ("__main__", ("Cls", "method"))."""
    module, _, qualname = spec.rpartition(":")
    parts = tuple(qualname.split("."))
    if not all(p.isidentifier() for p in parts) or (module and not all(
        p.isidentifier() for p in module.split(".")
    )):  # fmt: skip
        raise ValueError(f"--batches {spec!r}: give a function's name (get_batch, Cls.method, module:name)")
    return module or "__main__", parts


def batch_function(text: str) -> str:
    """``--batches NAME``: a function's name in the script (``get_batch``, ``Cls.method``) or a module's
    (``module:name``), checked for its form here, found as the script runs."""
    if not text:  # the default: no batch function (argparse runs a string default through this too)
        return text
    try:
        parse_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def batches_or_all(text: str) -> int | None:
    """``all`` or a number of batches, 0 included (``--compare-batches 0``: compare no window)."""
    if text.strip().lower() == "all":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of batches or 'all', got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more batches (or 'all'), got {text!r}")
    return value


def nonnegative(text: str) -> int:
    value = batches_or_all(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"expected a number of batches, got {text!r}")
    return value


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def mesh_spec(text: str) -> str:
    """``--mesh dp=2,tp=2`` through the one mesh parser (:func:`ddpcheck.layout.parse_mesh`), kept as the
    spec it reads back as; which dimensions split the data is settled once ``--data-dims`` is known."""
    from ddpcheck.layout import LayoutError, parse_mesh

    try:
        return parse_mesh(text, need_data=False).spec
    except LayoutError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def names(text: str) -> tuple[str, ...]:
    """``--data-dims dp_replicate,dp_shard``: mesh dimension names."""
    found = tuple(part.strip() for part in text.split(",") if part.strip())
    if not found or not all(name.isidentifier() for name in found):
        raise argparse.ArgumentTypeError(
            f"expected mesh dimension names such as dp or dp_replicate,dp_shard, got {text!r}"
        )
    return found


# --- the parser -------------------------------------------------------------------------------------------

DEFAULTS = RecordArgs(out="")


def build_parser(kind: type[argparse.ArgumentParser] = argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``python -m ddpcheck.record``'s options (the script's come after ``--``); ``kind``: the parser's
    class (:meth:`RecordArgs.from_argv` raises instead of exiting)."""
    parser = kind(
        prog=PROG,
        usage=USAGE,
        description="Record what a training script's DataLoaders yield on this rank (no judging).",
    )
    parser.add_argument("--out", required=True, help="directory for this launch's trace files")
    parser.add_argument(
        "--epochs", type=positive, default=DEFAULTS.epochs, help="epochs of the main loader to record"
    )
    parser.add_argument(
        "--model-steps",
        type=model_steps,
        default=DEFAULTS.model_steps,
        metavar="N|all",
        help="batches of each epoch the script's loop receives; the rest is recorded past it",
    )
    parser.add_argument(
        "--steps", type=positive, default=DEFAULTS.steps, help="windows of N batches (endless loaders)"
    )
    parser.add_argument(
        "--hooks", default=DEFAULTS.hooks, help="a file with loader-file hooks (sample_ids, batch_work)"
    )
    parser.add_argument("--digest", action="store_true", help="digest batch contents (mesh replicas)")
    parser.add_argument("--no-work", action="store_true", help="do not measure token work")
    parser.add_argument("--work-cost", choices=("tokens", "attention"), default=DEFAULTS.work_cost)
    parser.add_argument(
        "--batches",
        type=batch_function,
        default=DEFAULTS.batches,
        metavar="NAME",
        help="record the calls of this function of the script (get_batch, Cls.method, module:name) as "
        "batches, in windows of --steps calls (default 8)",
    )
    parser.add_argument(
        "--fingerprint",
        action="store_true",
        help="write no ids: at the end, prove with the other ranks (a gloo group of ddpcheck's own) that "
        "every dataset index was yielded once, naming the ids that were not (every process a "
        "data-parallel rank); writes OUT/fingerprint-rankR.json, exit 1 when an epoch fails",
    )
    _step_arguments(parser)
    _eval_arguments(parser)
    return parser


def _eval_arguments(parser: argparse.ArgumentParser) -> None:
    """The script's own evaluation (issue 41)."""
    group = parser.add_argument_group("the script's evaluation (issue 41)")
    group.add_argument(
        "--eval-rounds",
        type=nonnegative,
        default=DEFAULTS.eval_rounds,
        metavar="N",
        help="hand the first N evaluations that run whole to the script whole and record what it reports "
        "(0: none); at one process the weights each evaluates are saved under OUT/eval",
    )
    group.add_argument(
        "--eval-weights",
        default=DEFAULTS.eval_weights,
        metavar="DIR1",
        help="evaluate on the weights the one-process launch recorded in DIR1 saved (restored after each)",
    )


def _step_arguments(parser: argparse.ArgumentParser) -> None:
    """The training step's options (issue 35)."""
    step = parser.add_argument_group("the training step (issue 35)")
    step.add_argument(
        "--step",
        dest="step",
        action="store_true",
        default=DEFAULTS.step,
        help="watch the training step: backward and forward counts, gradients, random draws; save the "
        "compared steps' batches under OUT/step for a replay",
    )
    step.add_argument("--no-step", dest="step", action="store_false", help="do not watch the step (default)")
    step.add_argument(
        "--replay",
        default=DEFAULTS.replay,
        metavar="DIR",
        help="replay the compared steps of the launch recorded in DIR (run at world size 1); implies --step",
    )
    step.add_argument(
        "--replay-twice",
        action="store_true",
        default=DEFAULTS.replay_twice,
        help="with --replay: feed every rank's batch twice (probes whether the loss is a mean or a sum)",
    )
    step.add_argument(
        "--mesh",
        type=mesh_spec,
        default=DEFAULTS.mesh,
        metavar="dp=2,tp=2",
        help="with --replay: the recorded launch's device mesh; the replay joins the batches of one rank per "
        "data-parallel coordinate (its tensor and context peers hold the same samples)",
    )
    step.add_argument(
        "--data-dims",
        type=names,
        default=DEFAULTS.data_dims,
        metavar="NAME[,NAME]",
        help="with --mesh: the dimensions that split the data (default: the names that start with dp)",
    )
    step.add_argument(
        "--ignore-index",
        type=int,
        default=DEFAULTS.ignore_index,
        metavar="N",
        help="the label value that supervises nothing (-100)",
    )
    step.add_argument(
        "--compare-batches",
        type=batches_or_all,
        default=DEFAULTS.compare_batches,
        metavar="N|all",
        help="compare the step windows that start in an epoch's first N batches (default: all)",
    )
    step.add_argument(
        "--tail-batches",
        type=nonnegative,
        default=DEFAULTS.tail_batches,
        metavar="N",
        help="also compare windows that start in an epoch's last N batches",
    )


def exit_with(message: str) -> NoReturn:
    """A bad command line as argparse reports it: the usage, one error line, exit 2."""
    build_parser().error(message)
