"""``ddpcheck LOADER.py``: argument parsing, exit codes and report writing; no checking logic.

Exit codes: 0 every check passed; 1 a check failed; 2 bad usage or input (missing file, syntax error,
no factory, factory raised, not a DataLoader, empty dataset, unwritable report dir, bad
``[tool.ddpcheck]`` value, ...); 3 a rank crashed or hung; 130 interrupted (Ctrl-C or SIGTERM at any
moment; the reports of what finished are written).

Option values come from the built-in defaults, then ``[tool.ddpcheck]`` in the nearest pyproject.toml,
then ``DDPCHECK_*`` variables, then the command line (see :mod:`ddpcheck.config`). This module imports
neither torch nor the checker at import time, so the signal handlers are in place before either loads.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
import tempfile
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ddpcheck import cli_values as values
from ddpcheck import hygiene
from ddpcheck.exits import EXIT_BAD_INPUT, EXIT_INTERRUPTED
from ddpcheck.layout import MAX_REAL_RANKS, MAX_SIMULATED_RANKS
from ddpcheck.messages import one_line
from ddpcheck.report.formats import PRINTED as PRINTED_FORMATS

if TYPE_CHECKING:
    from ddpcheck.options import CheckOptions
    from ddpcheck.result import CheckResult

__all__ = ["MAX_REAL_RANKS", "MAX_SIMULATED_RANKS", "build_parser", "main", "parse"]
OWN_REPORT_SUFFIXES = (".json", ".md", ".html", ".txt")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows every default once, tuples as the comma list the option takes, and hides meaningless ones
    (none, off, empty) and those the help text already states."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        empty = action.default in (None, False, [], (), "", argparse.SUPPRESS)
        if empty or "default" in text or not action.option_strings:
            return text
        if isinstance(action.default, tuple):
            return f"{text} (default: {','.join(map(str, action.default))})"
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line, as every other ddpcheck error (the usage block is in ``--help``)."""

    def error(self, message: str) -> Any:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ddpcheck")
    except PackageNotFoundError:  # running from a source tree that was never installed
        from ddpcheck import __version__

        return __version__


class _VersionAction(argparse.Action):
    """``--version``, read from the package metadata only when asked (it costs every run ~25 ms)."""

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        print(f"{parser.prog} {_version()}")  # on stdout, as argparse's own version action
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    """The command's parser: its option groups, each built by a function of its own below."""
    parser = _Parser(
        prog="ddpcheck",
        description="Prove a PyTorch DataLoader is correct under DistributedDataParallel.",
        epilog="defaults are read from [tool.ddpcheck] in the nearest pyproject.toml (keys named like the "
        "long options, e.g. world-sizes = [1, 2]), then DDPCHECK_* variables (DDPCHECK_WORLD_SIZES=1,2); "
        "the command line wins. Colour: NO_COLOR turns it off, FORCE_COLOR on. "
        "exit codes: 0 all checks pass, 1 a check failed, 2 bad usage or input, "
        "3 a rank crashed or hung, 130 interrupted",
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("loader", help="Python file that defines the DataLoader factory")
    parser.add_argument("--version", action=_VersionAction, nargs=0, help="show the version and exit")
    _layout_options(parser)
    _loader_options(parser)
    _resume_options(parser)
    _work_options(parser)
    _equivalence_options(parser)
    _report_options(parser)
    _join_options(parser)
    return parser


def _layout_options(parser: argparse.ArgumentParser) -> None:
    """The world sizes and meshes checked, and how their ranks run (:mod:`ddpcheck.layout`)."""
    from ddpcheck import options as limits  # plain values, no torch: the bounds the help names

    layout = parser.add_argument_group("layout", "the world sizes and device meshes checked, and their ranks")
    layout.add_argument(
        "--world-sizes",
        type=values.world_sizes,
        default=limits.WORLD_SIZES,
        metavar=",".join(map(str, limits.WORLD_SIZES)),
        help=f"world sizes to check (real ranks: at most {MAX_REAL_RANKS}; "
        f"with --simulate at most {MAX_SIMULATED_RANKS})",
    )
    layout.add_argument(
        "--mesh",
        "--meshes",
        dest="meshes",
        type=values.mesh,
        action="append",
        default=[],
        metavar="dp=2,tp=2",
        help="a device mesh to check, dimensions outermost first (repeatable; --meshes is the same flag; "
        "with --world-sizes too): only data-parallel dimensions (names starting with dp) split the data, "
        "the others must see identical batches",
    )
    layout.add_argument(
        "--data-dims",
        type=values.names,
        default=(),
        metavar="NAME[,NAME]",
        help="the mesh dimensions that split the data (default: the names that start with dp)",
    )
    layout.add_argument(
        "--sequence-dims",
        type=values.names,
        default=None,
        metavar="NAME[,NAME]",
        help="mesh dimensions whose ranks get the same samples, each its own slice of every sequence "
        "(DeepSpeed Ulysses): their contents are not compared (default: the names that start with sp)",
    )
    layout.add_argument(
        "--simulate",
        action="store_true",
        help="simulate ranks on torch's fake backend, one after another in child processes (for world "
        "sizes beyond this machine; the loader must need no collectives)",
    )
    layout.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="process group backend")
    layout.add_argument(
        "--timeout",
        type=values.seconds,
        default=120.0,
        metavar="S",
        help="seconds a rank may go without progress (a batch, an epoch boundary, a collective) before it "
        f"is reported hung; a rank that keeps yielding never is (at most {limits.MAX_TIMEOUT:.0f}, one week)",
    )
    layout.add_argument(
        "--max-time",
        type=values.seconds,
        default=None,
        metavar="S",
        help="seconds a process group may run in all, progress or not (default: no limit); ranks still "
        "running then are reported as having run past --max-time",
    )


def _loader_options(parser: argparse.ArgumentParser) -> None:
    """How the factory is called and its loader iterated."""
    loader = parser.add_argument_group("loader", "how the factory is called and its loader iterated")
    loader.add_argument("--factory", default="make_loader", metavar="NAME", help="factory function name")
    loader.add_argument(
        "--factory-arg",
        dest="factory_args",
        type=values.factory_arg,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="keyword passed to the factory (repeatable; VALUE is a Python literal, else a string)",
    )
    loader.add_argument(
        "--batch-size",
        type=values.integer,
        default=None,
        metavar="N",
        help="passed to factories that take it",
    )
    loader.add_argument(
        "--epochs", type=values.integer, default=2, metavar="N", help="epochs recorded per run"
    )
    loader.add_argument(
        "--steps",
        type=values.integer,
        default=None,
        metavar="N",
        help="run N steps per rank per epoch window (for infinite or iteration-based samplers)",
    )
    loader.add_argument(
        "--patch", action="store_true", help="shard a plain loader with patch_dataloader_to_ddp"
    )
    loader.add_argument("--load-data", action="store_true", help="iterate the real loader, workers and all")
    loader.add_argument(
        "--no-set-epoch", action="store_true", help="emulate a loop that never calls set_epoch"
    )
    loader.add_argument("--no-determinism", action="store_true", help="skip the second run per world size")
    loader.add_argument(
        "--no-preload",
        action="store_true",
        help="let every rank import the file's third-party modules (default: once, before ranks start)",
    )


def _resume_options(parser: argparse.ArgumentParser) -> None:
    """The resume checks (:mod:`ddpcheck.scenarios.resume`)."""
    resume = parser.add_argument_group(
        "resume", "run where the loader has a state mechanism (state_dict, or save_state/load_state hooks)"
    )
    resume.add_argument("--no-resume", action="store_true", help="skip the mid-epoch resume check")
    resume.add_argument(
        "--elastic",
        action="store_true",
        help="also restore what one layout saved in every other requested world size and mesh",
    )
    resume.add_argument(
        "--dcp",
        action="store_true",
        help="save and load the data state with torch.distributed.checkpoint ({'dataloader': loader}, "
        "a Stateful), every rank together, as torchtitan checkpoints it",
    )
    resume.add_argument(
        "--resume-workers",
        type=values.worker_counts,
        default=(),
        metavar="N[,N]",
        help="also restore states into loaders rebuilt with these numbers of DataLoader workers (the "
        "factory takes num_workers; default: none)",
    )


def _work_options(parser: argparse.ArgumentParser) -> None:
    """Work balance, packing and mixture (:mod:`ddpcheck.checker.work`, :mod:`ddpcheck.checks.work`)."""
    work = parser.add_argument_group(
        "work balance and packing",
        "measured when batches carry tokens (input_ids, attention_mask, position_ids) or the file defines "
        "batch_work(batch); the real loader is then iterated",
    )
    work.add_argument(
        "--work-cost",
        choices=("tokens", "attention"),
        default="tokens",
        help="a batch's work: its real tokens, or the sum of its documents' squared lengths",
    )
    work.add_argument(
        "--max-idle",
        type=values.fraction,
        default=None,
        metavar="FRACTION",
        help="fail work_balance when ranks would wait more than this share of their steps (e.g. 0.2)",
    )
    work.add_argument("--no-work", action="store_true", help="measure no work (work_balance and packing n/a)")
    work.add_argument(
        "--no-mixture",
        action="store_true",
        help="read no sample sources (mixture n/a; sources cost a batch load)",
    )


def _equivalence_options(parser: argparse.ArgumentParser) -> None:
    """Metric and training equivalence (the scenarios :mod:`~ddpcheck.scenarios.metric`, ``training``)."""
    hooks = parser.add_argument_group(
        "metric and training equivalence",
        "run when the loader file defines forward/metric (metric) or make_model and loss (training)",
    )
    hooks.add_argument(
        "--metrics",
        action="store_const",
        const=True,
        default=None,
        help="measure metric divergence even without forward/metric hooks (default outputs and metric)",
    )
    hooks.add_argument(
        "--no-metrics", dest="metrics", action="store_const", const=False, help="skip metric divergence"
    )
    hooks.add_argument(
        "--metric-tolerance",
        type=values.real,
        default=None,
        metavar="REL",
        help="relative tolerance for metric_equivalence (default: exact for integers, 1e-6 for floats)",
    )
    hooks.add_argument(
        "--train-steps",
        type=values.integer,
        default=3,
        metavar="K",
        help="SGD steps compared by training_equivalence (0 turns it off)",
    )


def _report_options(parser: argparse.ArgumentParser) -> None:
    """What is written to files and printed, and which failures are allowed."""
    out = parser.add_argument_group("reports", "what is written to files, and printed")
    out.add_argument(
        "--allow",
        type=values.check_ids,
        action="extend",
        default=[],
        metavar="CHECK[,CHECK]",
        help="report these checks' failures as 'allowed' instead of failing (a comma list, repeatable; "
        "e.g. a design choice)",
    )
    out.add_argument(
        "--report-dir", type=Path, default=Path("reports"), metavar="DIR", help="where report files go"
    )
    out.add_argument(
        "--format",
        choices=PRINTED_FORMATS,
        default="table",
        help="what to print on stdout (github: GitHub Actions annotations for failing checks)",
    )
    out.add_argument("--junit", type=Path, default=None, metavar="PATH", help="also write JUnit XML here")
    out.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour the table (auto: on a terminal, unless NO_COLOR is set or FORCE_COLOR is)",
    )
    out.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    out.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="full tracebacks for bad input (2) and crashed ranks (3), and the reasons checks do not apply",
    )


def _join_options(parser: argparse.ArgumentParser) -> None:
    """Joining an existing launch (torchrun, srun) explicitly."""
    join = parser.add_argument_group(
        "joining an existing launch",
        "under torchrun or srun ddpcheck joins that launch (one process per rank) instead of spawning; "
        "these flags join one explicitly",
    )
    join.add_argument(
        "--rank", type=values.rank, default=None, help="this process's rank (0 .. world size - 1)"
    )
    join.add_argument("--world-size", type=values.joined_world_size, default=None, help="ranks in the launch")
    join.add_argument("--master-addr", default=None, metavar="HOST", help="rendezvous host of rank 0")
    join.add_argument(
        "--master-port", type=values.port, default=None, metavar="PORT", help="rendezvous TCP port (1-65535)"
    )


class UsageError(ValueError):
    """A combination of values no single option's parser can refuse; one line (exit 2)."""


def parse(argv: Sequence[str] | None, cwd: Path | None = None) -> argparse.Namespace:
    """Defaults < ``[tool.ddpcheck]`` < ``DDPCHECK_*`` < command line; ``option_sources`` says which won.

    Raises :class:`ddpcheck.config.ConfigError` for a bad file or variable; argparse exits on bad flags.
    """
    from ddpcheck import config

    parser = build_parser()
    layered = config.load(parser, cwd)
    args = parser.parse_args(argv, namespace=argparse.Namespace(**layered.values))
    given = _given_on_command_line(argv)
    for dest, value in vars(given).items():
        setattr(args, dest, value)  # lists from the command line replace the file's, not extend them
    sources = {action.dest: "default" for action in config.configurable(parser).values()}
    sources.update(layered.sources)
    sources.update({dest: "command line" for dest in vars(given) if dest in sources})
    args.option_sources = sources
    args.config_file = str(layered.file) if layered.file else None
    return args


def _given_on_command_line(argv: Sequence[str] | None) -> argparse.Namespace:
    """Only the options written on the command line (a parser whose defaults are all suppressed)."""
    quiet = build_parser()
    for action in quiet._actions:
        action.default = argparse.SUPPRESS
    return quiet.parse_args(argv)


def check_combination(args: argparse.Namespace) -> None:
    """Checks that need several options at once (argparse checks each alone): the run's options are
    checked here, once (:class:`~ddpcheck.options.CheckOptions` checks them when made), and kept as
    ``args.check_options`` with every mesh a Layout."""
    from ddpcheck.layout import LayoutError, check_ranks
    from ddpcheck.options import BadInput

    joined = args.rank is not None or args.world_size is not None or args.master_addr is not None
    if args.meshes and args.option_sources.get("world_sizes") == "default":
        args.world_sizes = ()  # --mesh alone checks the meshes (and the single-process reference)
    try:
        options = _options(args)
    except BadInput as exc:
        raise UsageError(_where(args, exc.option) + str(exc)) from None
    args.check_options = options
    if not joined and not args.simulate:
        try:
            for ws in options.world_sizes:
                check_ranks(ws, mesh=False)
            for mesh in options.layouts:  # parsed when the options were made
                check_ranks(mesh.world_size, mesh=True)
        except LayoutError as exc:
            raise UsageError(str(exc)) from None
    if args.rank is not None and args.world_size is not None and args.rank >= args.world_size:
        raise UsageError(f"--rank must be below --world-size ({args.world_size}), got {args.rank}")
    try:
        os.stat(args.loader)
    except FileNotFoundError:  # said before torch is imported (seconds), in the checker's own words
        raise UsageError(f"loader file not found: {args.loader}") from None
    except OSError as exc:
        what = "path too long" if exc.errno == errno.ENAMETOOLONG else (exc.strerror or str(exc))
        raise UsageError(f"cannot use loader file {_short(args.loader)}: {what}") from None
    except ValueError as exc:  # an embedded NUL byte
        raise UsageError(f"cannot use loader file {_short(args.loader)}: {exc}") from None
    if args.junit is not None:
        _refuse_own_report(args.junit, args.report_dir)


def _where(args: argparse.Namespace, option: str | None) -> str:
    """``pyproject.toml: [tool.ddpcheck] world-sizes: `` or ``DDPCHECK_EPOCHS: ``: where a refused value
    came from, when not from the command line (whose flags the message already names)."""
    source = args.option_sources.get(option or "", "")
    key = (option or "").replace("_", "-")
    if source == "pyproject.toml":
        return f"{args.config_file}: [tool.ddpcheck] {key}: "
    if source.startswith("env "):
        return f"{source[4:]}: "
    return ""


def _short(text: str, limit: int = 80) -> str:
    return repr(text) if len(text) <= limit else repr(text[: limit - 20] + "..." + text[-17:])


def _refuse_own_report(junit: Path, report_dir: Path) -> None:
    if str(junit) in ("", ".") or junit.is_dir():
        raise UsageError(f"--junit {str(junit) or repr('')} is a directory; give a file path")
    try:
        target = os.path.realpath(junit)
        own = {os.path.realpath(report_dir / f"ddpcheck{suffix}") for suffix in OWN_REPORT_SUFFIXES}
    except (OSError, ValueError):
        return  # _ensure_writable reports the unusable path
    if target in own:
        raise UsageError(
            f"--junit {junit} would overwrite ddpcheck's own report {Path(target).name}; choose another path"
        )


MAX_ERROR_LINE = 1000  # characters of an error message shown on its one line (-v shows it all)


def _error(message: str, exc: BaseException | None = None, verbose: bool = False) -> int:
    if verbose and exc is not None:
        traceback.print_exception(exc, file=sys.stderr)
    print(f"ddpcheck: error: {one_line(message, MAX_ERROR_LINE)}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _ensure_writable(directory: Path) -> None:
    """Fail before any rank starts when reports could not be written afterwards."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".ddpcheck-probe-"):
            pass
    except OSError as exc:
        raise OSError(f"cannot write reports to {directory}: {exc.strerror or exc}") from None
    except ValueError as exc:  # a NUL byte in the path
        raise OSError(f"cannot write reports to {directory!r}: {exc}") from None


def main(argv: Sequence[str] | None = None) -> int:
    """The command. With ``argv=None`` (the process's own command line) interrupts are ignored once the
    exit code is known, so one arriving during interpreter shutdown cannot kill the process by signal;
    with an explicit ``argv`` (a caller in-process) the previous handlers and streams are restored on
    return.
    """
    global _own_process
    _own_process = argv is None
    streams = sys.stdout, sys.stderr
    hygiene.sane_standard_streams()
    previous = hygiene.install_signal_handlers()
    try:
        try:
            code = _main(argv)
        except KeyboardInterrupt:
            hygiene.interrupts.publishing = True
            code = _interrupted_before_results()
        except SystemExit as exc:  # argparse: --help, --version (0) or a usage error (2)
            code = exc.code if isinstance(exc.code, int) else EXIT_BAD_INPUT
    except KeyboardInterrupt:  # a second interrupt inside the handler above
        code = EXIT_INTERRUPTED
    hygiene.interrupts.publishing = True
    if hygiene.interrupts.happened and code != EXIT_INTERRUPTED:
        print("ddpcheck: interrupted", file=sys.stderr)
        code = EXIT_INTERRUPTED
    if argv is None:
        hygiene.ignore_interrupts()
        hygiene.exit_now(code)
    else:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        sys.unraisablehook = hygiene.interrupts.previous_hook
        sys.stdout, sys.stderr = streams
    return code


def _interrupted_before_results() -> int:
    print("ddpcheck: interrupted before the options were read; no report written", file=sys.stderr)
    return EXIT_INTERRUPTED


def _nothing_checked(args: argparse.Namespace) -> CheckResult:
    """The result of a run interrupted before its first layout finished: nothing was checked."""
    from ddpcheck.result import CheckResult

    note = "interrupted before the first world size or mesh was checked: nothing was checked"
    return CheckResult(loader=args.loader, runs=(), epochs=args.epochs, notes=(note,), interrupted=True)


def _main(argv: Sequence[str] | None) -> int:
    from ddpcheck.config import ConfigError

    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] in (["run"], ["judge"]):  # the training-script audit (ddpcheck.cli_run)
        from ddpcheck.cli_run import LoaderCommand, main_judge, main_run

        command = LoaderCommand(build_parser, use_color, terminal_width)
        return main_run(words[1:], command) if words[0] == "run" else main_judge(words[1:], command)
    try:
        args = parse(argv)
        check_combination(args)
    except (ConfigError, UsageError) as exc:
        return _error(str(exc))
    except Exception as exc:  # settings nobody foresaw (a file, a variable): still one line, exit 2
        return _error(f"cannot read the settings: {type(exc).__name__}: {exc}")
    try:
        _ensure_writable(args.report_dir)
        if args.junit is not None:
            _ensure_writable(args.junit.parent)
    except OSError as exc:
        return _error(str(exc))
    try:
        outcome = _run(args)
    except KeyboardInterrupt:  # before any layout finished (torch's import, the reference): say so
        hygiene.interrupts.publishing = True
        return _publish(_nothing_checked(args), args, interrupted=True)
    except Exception as exc:  # a bug of ours or an unreadable input nobody foresaw: still one line
        detail = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        hint = "" if args.verbose else " (run with -v for the traceback)"
        return _error(f"internal error: {detail}{hint}", exc, args.verbose)
    if isinstance(outcome, int):
        return outcome
    result, interrupted = outcome
    hygiene.interrupts.publishing = True  # from here to exit: reports first, and no interrupt can lose them
    return _publish(result, args, interrupted)


NEGATED = {
    "set_epoch": "no_set_epoch",
    "determinism": "no_determinism",
    "resume": "no_resume",
    "preload": "no_preload",
    "work": "no_work",
    "mixture": "no_mixture",
}


def _options(args: argparse.Namespace) -> CheckOptions:
    """The run's ``CheckOptions``: every option named like its field, the ``--no-X`` ones negated."""
    from dataclasses import fields

    from ddpcheck.options import CheckOptions

    values: dict[str, Any] = {}
    for field in fields(CheckOptions):
        if field.name in NEGATED:
            values[field.name] = not getattr(args, NEGATED[field.name])
        elif hasattr(args, field.name):
            values[field.name] = getattr(args, field.name)
    values["allow"] = tuple(args.allow)
    values["resume_workers"] = tuple(args.resume_workers)
    values["meshes"] = tuple(args.meshes)  # Layouts (the --mesh type parsed them)
    values["data_dims"] = tuple(args.data_dims)
    values["sequence_dims"] = None if args.sequence_dims is None else tuple(args.sequence_dims)
    values["factory_args"] = tuple(dict(args.factory_args or {}).items())
    return CheckOptions(**values)


def _run(args: argparse.Namespace) -> int | tuple[CheckResult, bool]:
    """Run the checker; an int is an exit code with nothing to publish."""

    from ddpcheck.checker.loaderfile import BadLoaderFile, LoaderSpec, precheck

    try:  # what needs no execution is said before torch is imported (about a second)
        precheck(LoaderSpec(args.loader, args.factory))
    except BadLoaderFile as exc:
        return _error(str(exc), exc, args.verbose)
    with hygiene.gc_paused(freeze=_own_process):
        from ddpcheck.options import BadInput
        from ddpcheck.progress import make_display
        from ddpcheck.session import Interrupted, check_loader
        from ddpcheck.session.joined import JoinTarget, check_joined

    options = args.check_options  # checked once, by check_combination
    target = JoinTarget(args.rank, args.world_size, args.master_addr, args.master_port)
    # progress on stderr: live lines on a terminal, plain ones elsewhere, nothing with --quiet
    color = use_color(args.color, sys.stderr)
    display = make_display(sys.stderr, quiet=args.quiet, color=color, epochs=args.epochs)

    def progress(message: str) -> None:
        hygiene.interrupts.checkpoint()
        display.message(f"ddpcheck: {message}")

    try:
        if target.explicit or _in_launch():
            try:
                joined, code = check_joined(args.loader, options, target)
            except ValueError as exc:  # an incomplete launch: --master-addr without rank and world size
                if isinstance(exc, BadInput):
                    raise
                if target.explicit and (args.rank is None or args.world_size is None):
                    return _error("--master-addr/--master-port need --rank and --world-size too")
                return _error(f"cannot join the launch: {exc}")
            if joined is None:  # not rank 0: rank 0 reports for everyone
                return code
            return joined, False
        return check_loader(args.loader, options, progress=progress, on_progress=display.update), False
    except BadInput as exc:
        return _error(str(exc), exc, args.verbose)
    except Interrupted as exc:
        return exc.partial, True
    finally:
        display.close()  # before anything else is printed


_own_process = False  # main() runs as the process's own command (argv=None): process-wide state is ours


def _in_launch() -> bool:
    from ddpcheck.reference.dist import detect_launch

    try:
        return detect_launch(os.environ, require_rendezvous=False) is not None
    except ValueError:
        return True  # a half-set launch environment: let the join path report it precisely


def use_color(choice: str, stream: TextIO, environ: dict[str, str] | None = None) -> bool:
    """``--color``; for ``auto``: NO_COLOR (any value) off, then FORCE_COLOR (not 0/false) on, then a tty."""
    env = os.environ if environ is None else environ
    if choice != "auto":
        return choice == "always"
    if env.get("NO_COLOR"):
        return False
    if env.get("FORCE_COLOR", "").strip().lower() not in ("", "0", "false", "no"):
        return True
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and env.get("TERM") != "dumb"


def terminal_width() -> int:
    """Columns of the terminal (COLUMNS wins); 100 when stdout is not one; never below the table's 40."""
    import shutil

    return max(40, shutil.get_terminal_size((100, 24)).columns)


def _publish(result: CheckResult, args: argparse.Namespace, interrupted: bool) -> int:
    """Write the report files first (nothing is lost), then print, then pick the exit code."""
    from ddpcheck.report import ReportWriteError, reasons_path, render, render_table, write_reports

    try:
        paths = write_reports(result, args.report_dir, junit_path=args.junit)
    except ReportWriteError as exc:
        print(render(result, "json" if args.format == "github" else args.format))
        return _error(str(exc))
    if args.format == "table":
        color = use_color(args.color, sys.stdout)
        where = None if args.verbose else reasons_path(paths)
        _print_out(render_table(result, color=color, width=terminal_width(), not_applicable_in=where))
    elif args.format == "github":
        _print_out(render(result, "github"))
    else:
        _print_out(render(result, args.format))
    if args.verbose:
        _print_rank_tracebacks(result)
    if not args.quiet:
        print(f"ddpcheck: reports: {', '.join(str(p) for p in paths)}", file=sys.stderr)
    if interrupted:
        print("ddpcheck: interrupted; the reports cover what finished", file=sys.stderr)
        return EXIT_INTERRUPTED
    return result.exit_code


def _print_out(text: str) -> None:
    """Print the result; a closed or full stdout (``| head``, ``> /dev/full``) costs the printout only:
    the reports are already written and the exit code still says what was found."""
    try:
        print(text, flush=True)
    except OSError as exc:
        try:  # later writes and the flush at exit must not fail again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        if exc.errno != errno.EPIPE:
            print(f"ddpcheck: could not print the result: {exc.strerror or exc}", file=sys.stderr)


def _print_rank_tracebacks(result: CheckResult) -> None:
    for run in result.runs:
        for failure in run.failures:
            if failure.stack:
                print(f"--- world size {run.world_size}, rank {failure.rank} ({failure.kind}) ---",
                      file=sys.stderr)  # fmt: skip
                print(failure.stack.rstrip(), file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
