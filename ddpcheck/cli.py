"""``ddpcheck LOADER.py``: argument parsing, exit codes and report writing; no checking logic.

Exit codes: 0 every check passed; 1 a check failed; 2 bad usage or input (missing file, syntax error,
no factory, factory raised, not a DataLoader, empty dataset, unwritable report dir, ...); 3 a rank
crashed or hung; 130 interrupted (Ctrl-C or SIGTERM; the reports of what finished are written).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from ddpcheck.result import EXIT_BAD_INPUT, CheckResult

EXIT_INTERRUPTED = 130


def _world_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"world sizes must be comma-separated integers, got {text!r}"
        ) from None
    if not sizes or any(ws < 1 for ws in sizes):
        raise argparse.ArgumentTypeError(f"world sizes must be positive integers, got {text!r}")
    return sizes


def _number(
    convert: Callable[[str], Any],
    expected: str,
    ok: Callable[[Any], bool],
    bound: str,
    *,
    echo_text: bool = False,
) -> Callable[[str], Any]:
    """An argparse ``type``: convert, then check a bound; both failures are one-line usage errors."""

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not ok(value):
            shown = repr(text) if echo_text else value
            raise argparse.ArgumentTypeError(f"{bound}, got {shown}")
        return value

    return parse


_positive_int = _number(int, "an integer", lambda v: v >= 1, "must be at least 1")
_positive_float = _number(float, "a number of seconds", lambda v: v > 0, "must be positive")
_non_negative_float = _number(
    float, "a number", lambda v: 0 <= v < float("inf"), "must be a non-negative number", echo_text=True
)
_non_negative_int = _number(int, "an integer", lambda v: v >= 0, "must be 0 or more")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ddpcheck",
        description="Prove a PyTorch DataLoader is correct under DistributedDataParallel.",
        epilog="exit codes: 0 all checks pass, 1 a check failed, 2 bad usage or input, "
        "3 a rank crashed or hung, 130 interrupted",
    )
    parser.add_argument("loader", help="Python file that defines the DataLoader factory")
    parser.add_argument("--world-sizes", type=_world_sizes, default=(1, 2, 3, 4), metavar="1,2,3,4")
    parser.add_argument("--epochs", type=_positive_int, default=2)
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument(
        "--factory", default="make_loader", help="factory function name (default make_loader)"
    )
    parser.add_argument(
        "--patch", action="store_true", help="shard a plain loader with patch_dataloader_to_ddp"
    )
    parser.add_argument("--simulate", action="store_true", help="run ranks one after another in this process")
    parser.add_argument("--load-data", action="store_true", help="iterate the real loader, workers and all")
    parser.add_argument(
        "--no-set-epoch", action="store_true", help="emulate a loop that never calls set_epoch"
    )
    parser.add_argument("--no-determinism", action="store_true", help="skip the second run per world size")
    parser.add_argument(
        "--batch-size", type=_positive_int, default=None, help="passed to factories that take it"
    )
    parser.add_argument(
        "--timeout", type=_positive_float, default=120.0, help="seconds per group (default 120)"
    )
    parser.add_argument(
        "--steps",
        type=_positive_int,
        default=None,
        metavar="N",
        help="run N steps per rank per epoch window (for infinite or iteration-based samplers)",
    )
    parser.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="CHECK",
        help="report CHECK's failure as 'allowed' instead of failing (repeatable; e.g. a design choice)",
    )
    # --- resume and elastic resume (ddpcheck.scenarios.resume) ---
    parser.add_argument(
        "--no-resume", action="store_true", help="skip the mid-epoch resume check"
    )
    parser.add_argument(
        "--elastic",
        action="store_true",
        help="also restore state saved at one world size at every other requested world size",
    )
    # --- metric and training equivalence (ddpcheck.evaluate, ddpcheck.training) ---
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
        type=_non_negative_float,
        default=None,
        metavar="REL",
        help="relative tolerance for metric_equivalence (default: exact for integers, 1e-6 for floats)",
    )
    hooks.add_argument(
        "--train-steps",
        type=_non_negative_int,
        default=3,
        metavar="K",
        help="SGD steps compared by training_equivalence (default 3; 0 turns it off)",
    )
    # --- end ---
    parser.add_argument("--report-dir", type=Path, default=Path("reports"))
    parser.add_argument("--format", choices=("table", "json", "markdown"), default="table")
    parser.add_argument("--junit", type=Path, default=None, metavar="PATH", help="also write JUnit XML here")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    join = parser.add_argument_group(
        "joining an existing launch",
        "under torchrun or srun ddpcheck joins that launch (one process per rank) instead of spawning; "
        "these flags join one explicitly",
    )
    join.add_argument("--rank", type=int, default=None)
    join.add_argument("--world-size", type=_positive_int, default=None)
    join.add_argument("--master-addr", default=None)
    join.add_argument("--master-port", type=int, default=None)
    return parser


def _error(message: str) -> int:
    print(f"ddpcheck: error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _ensure_writable(directory: Path) -> None:
    """Fail before any rank starts when reports could not be written afterwards."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".ddpcheck-probe-"):
            pass
    except OSError as exc:
        raise OSError(f"cannot write reports to {directory}: {exc.strerror or exc}") from None


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from ddpcheck.joined import JoinTarget, check_joined
    from ddpcheck.runner import BadInput, CheckOptions, Interrupted, check_loader

    try:
        _ensure_writable(args.report_dir)
        if args.junit is not None:
            _ensure_writable(args.junit.parent)
    except OSError as exc:
        return _error(str(exc))
    options = CheckOptions(
        world_sizes=args.world_sizes,
        epochs=args.epochs,
        backend=args.backend,
        factory=args.factory,
        patch=args.patch,
        simulate=args.simulate,
        load_data=args.load_data,
        set_epoch=not args.no_set_epoch,
        timeout=args.timeout,
        determinism=not args.no_determinism,
        batch_size=args.batch_size,
        metrics=args.metrics,
        metric_tolerance=args.metric_tolerance,
        train_steps=args.train_steps,
        steps=args.steps,
        allow=tuple(args.allow),
        resume=not args.no_resume,
        elastic=args.elastic,
    )
    target = JoinTarget(args.rank, args.world_size, args.master_addr, args.master_port)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    progress = None if args.quiet else (lambda msg: print(f"ddpcheck: {msg}", file=sys.stderr, flush=True))
    interrupted = False
    try:
        if target.explicit or _in_launch():
            joined, code = check_joined(args.loader, options, target)
            if joined is None:  # not rank 0: rank 0 reports for everyone
                return code
            result = joined
        else:
            result = check_loader(args.loader, options, progress=progress)
    except BadInput as exc:
        return _error(str(exc))
    except Interrupted as exc:
        result, interrupted = exc.partial, True
    finally:
        signal.signal(signal.SIGTERM, previous)
    return _publish(result, args, interrupted)


def _in_launch() -> bool:
    from ddpcheck.reference.dist import detect_launch

    try:
        return detect_launch(os.environ, require_rendezvous=False) is not None
    except ValueError:
        return True  # a half-set launch environment: let the join path report it precisely


def _publish(result: CheckResult, args: argparse.Namespace, interrupted: bool) -> int:
    """Write the report files first (nothing is lost), then print, then pick the exit code."""
    from ddpcheck.report import ReportWriteError, render, render_table, write_reports

    try:
        paths = write_reports(result, args.report_dir, junit_path=args.junit)
    except ReportWriteError as exc:
        print(render(result, args.format))
        return _error(str(exc))
    if args.format == "table":
        print(render_table(result, color=sys.stdout.isatty()))
    else:
        print(render(result, args.format))
    if not args.quiet:
        print(f"ddpcheck: reports: {', '.join(str(p) for p in paths)}", file=sys.stderr)
    if interrupted:
        print("ddpcheck: interrupted; the reports cover what finished", file=sys.stderr)
        return EXIT_INTERRUPTED
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
