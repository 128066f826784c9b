"""One failed process group -> one readable pytest failure (or a skip/xfail that a rank asked for).

The report names every failed rank with its traceback (ddpcheck's own frames cut off) and its
captured output; ranks that only broke because a peer died first come last, marked secondary. A hang
shows the diagnosis and each stuck rank's stack instead.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from ddpcheck.launch import GroupResult, RankOutcome

_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line \d+')
_INTERNAL_MARKERS = (os.path.join("ddpcheck", "launch") + os.sep, os.path.join("ddpcheck", "plugin") + os.sep)
_BEATS = os.path.join("ddpcheck", "launch", "beats.py")
_SKIP_TYPES = ("Skipped",)
_XFAIL_TYPES = ("XFailed",)
_RULE = "-" * 24


class DdpTestFailed(pytest.fail.Exception):  # type: ignore[misc,name-defined]
    """A ``ddp``-marked test failed in one or more ranks; the message is the whole report."""

    __module__ = "builtins"  # as pytest does for its outcomes: the summary line says "DdpTestFailed: ..."

    def __init__(self, report: str) -> None:
        super().__init__(report, pytrace=False)


def _internal(path: str) -> bool:
    return any(marker in path for marker in _INTERNAL_MARKERS)


def trim_traceback(text: str) -> str:
    """Drop the frames of ddpcheck's rank machinery that lead into the test (they say nothing)."""
    out: list[str] = []
    skipping = False
    leading = True  # still before the first frame of the user's code in this traceback
    for line in text.splitlines():
        if line.startswith("Traceback (most recent call last)"):
            leading, skipping = True, False
            out.append(line)
            continue
        match = _FRAME.match(line)
        if match and line.startswith("  File"):
            skipping = leading and _internal(match["path"])
            if not skipping:
                leading = False
        elif not line.startswith("    "):
            skipping = False
        if not skipping:
            out.append(line)
    return "\n".join(out)


def trim_stack(text: str) -> str:
    """A faulthandler dump, reduced to the main thread's frames above ddpcheck's rank entry point."""
    blocks = [b for b in text.strip().split("\n\n") if b.strip()]
    current = [b for b in blocks if b.lstrip().startswith("Current thread")]
    chosen = current[-1] if current else (blocks[-1] if blocks else "")
    lines: list[str] = []
    for line in chosen.splitlines():
        match = _FRAME.match(line)
        if match and match["path"].endswith(_BEATS):
            continue  # the wrapper that counts a collective as progress: between torch and the test
        if match and _internal(match["path"]):
            break  # everything from here down is the rank machinery that called the test
        lines.append(line)
    others = len(blocks) - 1
    if others > 0:
        lines.append(f"  ({others} other thread{'s' if others > 1 else ''} not shown)")
    return "\n".join(lines)


def _order(result: GroupResult) -> list[RankOutcome]:
    failed = result.failures()
    return [o for o in failed if o.kind != "secondary"] + [o for o in failed if o.kind == "secondary"]


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def _headline(o: RankOutcome) -> str:
    what = f"{o.exc_type}: {o.message}" if o.exc_type else o.message
    where = f" (last progress: {o.progress})" if o.progress and o.kind != "error" else ""
    note = " [only because a peer failed first]" if o.kind == "secondary" else ""
    return f"rank {o.rank} {o.kind}: {_short(what)}{where}{note}"


def _section(o: RankOutcome) -> str:
    parts = [f"{_RULE} rank {o.rank} ({o.kind}) {_RULE}"]
    if o.error.strip():
        parts.append(trim_traceback(o.error).rstrip())
    elif o.stack.strip():
        parts.append("stack when stopped:\n" + trim_stack(o.stack))
    else:
        parts.append("(no traceback: the process ended without reporting an exception)")
    if o.output.strip():
        parts.append(f"captured output of rank {o.rank}:\n{o.output.rstrip()}")
    return "\n".join(parts)


def describe(result: GroupResult, timeout: float, max_time: float | None = None) -> str:
    """The failure report of one group: summary lines, diagnosis, then one section per failed rank."""
    failed = _order(result)
    primary = [o for o in failed if o.kind != "secondary"]
    hung = [o for o in failed if o.kind == "hang"]
    over = [o for o in failed if o.kind == "overtime"]
    first = primary[0] if primary else failed[0]
    ranks = ", ".join(str(o.rank) for o in primary) or str(first.rank)
    what = f"{first.exc_type}: {first.message}" if first.exc_type else first.message
    head = f"rank{'s' if len(primary) > 1 else ''} {ranks} of {result.world_size} failed: {_short(what)}"
    if hung:
        ranks = ", ".join(str(o.rank) for o in hung)
        head = f"hang: rank{'s' if len(hung) > 1 else ''} {ranks} of {result.world_size} made no progress "
        head += f"for the {timeout:g} s timeout"
    elif over:
        ranks = ", ".join(str(o.rank) for o in over)
        head = f"ran past max_time: rank{'s' if len(over) > 1 else ''} {ranks} of {result.world_size} "
        head += f"still running after {max_time or 0:g} s"
    secondary = len(failed) - len(primary)
    head += f"\n(world size {result.world_size}, backend {result.backend}, {result.seconds:.2f} s"
    head += (
        f"; {secondary} more rank{'s' if secondary > 1 else ''} stopped as a consequence)"
        if secondary
        else ")"
    )
    lines = [head, *(f"  {_headline(o)}" for o in failed)]
    blocks = ["\n".join(lines)]
    if result.diagnosis:
        blocks.append(result.diagnosis)
    blocks.extend(_section(o) for o in failed)
    return "\n\n".join(blocks)


def raise_outcome(result: GroupResult, timeout: float, max_time: float | None = None) -> None:
    """Nothing for a passing group; else skip, xfail or fail the running pytest item."""
    if result.ok:
        return
    failed = result.failures()
    own = [o for o in failed if o.kind != "secondary"]
    for kinds, outcome in ((_SKIP_TYPES, pytest.skip), (_XFAIL_TYPES, pytest.xfail)):
        asked = [o for o in failed if o.exc_type in kinds]
        if asked and all(o in asked for o in own):
            outcome(asked[0].message)
    raise DdpTestFailed(describe(result, timeout, max_time))
