"""The syntax of the command line's option values: one argparse ``type`` per kind of value, each a
one-line usage error naming what it expected. Their bounds and the rules across options are
:class:`ddpcheck.options.CheckOptions`' (checked when made); ``ddpcheck run`` and ``judge`` reuse the
loader command's options, and with them these.
"""

from __future__ import annotations

import argparse
import ast
import keyword
from collections.abc import Callable
from typing import Any

from ddpcheck.layout import Layout
from ddpcheck.wire.argv import names  # noqa: F401 - --data-dims, --sequence-dims: one syntax

MAX_JOINED_WORLD_SIZE = 1 << 20  # joining a launch: ranks live on many machines


def world_sizes(text: str) -> tuple[int, ...]:
    """``--world-sizes 1,2,4``: the syntax here; the rules on the sizes are CheckOptions'."""
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"world sizes must be comma-separated integers, got {text!r}"
        ) from None
    if not sizes:
        raise argparse.ArgumentTypeError(f"world sizes must be comma-separated integers, got {text!r}")
    return sizes


def mesh(text: str) -> Layout:
    """``--mesh dp=2,tp=2`` through the one mesh parser (:func:`ddpcheck.layout.parse_mesh`); which
    dimensions split the data is settled with ``--data-dims`` once both are known (CheckOptions)."""
    from ddpcheck.layout import LayoutError, parse_mesh

    try:
        return parse_mesh(text, need_data=False)
    except LayoutError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def fraction(text: str) -> float:
    """``--max-idle 0.2``: the syntax here; the rule (at least 0, below 1) is CheckOptions'."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction such as 0.2, got {text!r}") from None


def worker_counts(text: str) -> tuple[int, ...]:
    """``--resume-workers 0,2``: the syntax here; the bounds are CheckOptions' (checked when made)."""
    try:
        counts = tuple(dict.fromkeys(int(part) for part in text.split(",") if part.strip()))
    except ValueError:
        counts = ()
    if not counts:
        raise argparse.ArgumentTypeError(f"expected numbers of workers such as 0,2, got {text!r}")
    return counts


def check_ids(text: str) -> list[str]:
    """``--allow reshuffle,determinism``: a comma list (the option repeats too); the ids are validated
    with the other options (:class:`ddpcheck.options.CheckOptions`)."""
    ids = [part.strip() for part in text.split(",") if part.strip()]
    if not ids:
        raise argparse.ArgumentTypeError(f"expected check ids such as reshuffle,determinism, got {text!r}")
    return ids


def number(
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


def int_in(low: int, high: int) -> Callable[[str], Any]:
    return number(int, "an integer", lambda v: low <= v <= high, f"must be from {low} to {high}")


# the run's numbers: syntax here, their bounds once in ddpcheck.options.CheckOptions
integer = number(int, "an integer", lambda v: True, "")
seconds = number(float, "a number of seconds", lambda v: True, "")
real = number(float, "a number", lambda v: True, "")
rank = int_in(0, MAX_JOINED_WORLD_SIZE - 1)
joined_world_size = int_in(1, MAX_JOINED_WORLD_SIZE)
port = int_in(1, 65535)


def factory_arg(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` -> (key, Python literal, or the text itself when it is not one)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key.isidentifier() or keyword.iskeyword(key):
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE with KEY a Python name, got {text!r}")
    if key in ("rank", "world_size", "batch_size", "dp_rank", "dp_world_size", "mesh"):
        raise argparse.ArgumentTypeError(
            f"ddpcheck passes {key} itself" + (" (use --batch-size)" if key == "batch_size" else "")
        )
    try:
        value = ast.literal_eval(raw.strip())
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        value = raw
    return key, value
