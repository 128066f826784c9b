"""Shared pieces of every report: column order, labels, counts, the summary line, evidence text.

Kept in one place so the terminal table, Markdown and JUnit can never disagree on what passed.
Everything here reads a :class:`~ddpcheck.result.CheckResult`; nothing re-runs or re-judges a check.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ddpcheck.checks.ids import ALL_CHECKS
from ddpcheck.checks.verdict import Verdict
from ddpcheck.record import RankFailure
from ddpcheck.result import CheckResult, MetricRow, WorldResult

STATUS_WORD = {"pass": "PASS", "fail": "FAIL", "skip": "skip"}
NOT_RUN = "-"
FAILURE_VERB = {"error": "crashed", "hang": "hung", "killed": "was killed", "secondary": "aborted"}
MAX_LISTED = 12  # ranks / epochs / examples shown before "(+N more)"
MAX_EXAMPLE_CHARS = 60
STACK_LINES = 20


@dataclass(frozen=True)
class Counts:
    """What the summary line and the JUnit suite count; a skipped world size counts as one skip."""

    passed: int
    failed: int
    skipped: int
    rank_failures: int
    world_sizes: tuple[int, ...]


def check_columns(result: CheckResult) -> tuple[str, ...]:
    """Check ids seen in any run: known ids in ``ALL_CHECKS`` order, then unknown ones as first seen."""
    seen: list[str] = []
    for run in result.runs:
        for verdict in run.verdicts:
            if verdict.check not in seen:
                seen.append(verdict.check)
    known = [c for c in ALL_CHECKS if c in seen]
    return (*known, *(c for c in seen if c not in ALL_CHECKS))


def show_backend(result: CheckResult) -> bool:
    """Name the backend next to the world size only when runs used more than one."""
    return len({run.backend for run in result.runs}) > 1


def world_label(run: WorldResult, with_backend: bool) -> str:
    return f"ws={run.world_size} {run.backend}" if with_backend else f"ws={run.world_size}"


def cell_status(run: WorldResult, check: str) -> str | None:
    """The status of ``check`` in ``run`` (fail beats pass beats skip), ``None`` when it did not run."""
    statuses = [v.status for v in run.verdicts if v.check == check]
    if not statuses:
        return None
    for status in ("fail", "pass", "skip"):
        if status in statuses:
            return status
    return statuses[0]


def count(result: CheckResult) -> Counts:
    passed = failed = skipped = 0
    for run in result.runs:
        if run.skipped:
            skipped += 1
        for verdict in run.verdicts:
            if verdict.status == "pass":
                passed += 1
            elif verdict.status == "fail":
                failed += 1
            else:
                skipped += 1
    sizes = tuple(dict.fromkeys(run.world_size for run in result.runs))
    return Counts(passed, failed, skipped, sum(len(run.failures) for run in result.runs), sizes)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def summary_line(result: CheckResult, paint: Callable[[str, str], str] | None = None) -> str:
    """``ddpcheck: 27 passed, 2 failed, 1 skipped across world sizes 1,2,4 -> FAIL (exit 1)``."""
    c = count(result)
    parts = [f"{c.passed} passed", f"{c.failed} failed", f"{c.skipped} skipped"]
    if c.rank_failures:
        parts.append(_plural(c.rank_failures, "rank failure"))
    if not c.world_sizes:
        where = "across no world sizes"
    elif len(c.world_sizes) == 1:
        where = f"across world size {c.world_sizes[0]}"
    else:
        where = "across world sizes " + ",".join(str(n) for n in c.world_sizes)
    word = "OK" if result.ok else "FAIL"
    if paint is not None:
        word = paint(word, "pass" if result.ok else "fail")
    return f"ddpcheck: {', '.join(parts)} {where} -> {word} (exit {result.exit_code})"


def rank_summary(failures: Sequence[RankFailure]) -> str:
    """``rank 1 crashed; ranks 0, 2 aborted``: failures grouped by kind, kinds in first-seen order."""
    by_kind: dict[str, list[int]] = {}
    for failure in failures:
        by_kind.setdefault(failure.kind, []).append(failure.rank)
    parts = []
    for kind, ranks in by_kind.items():
        verb = FAILURE_VERB.get(kind, kind)
        noun = "rank" if len(ranks) == 1 else "ranks"
        parts.append(f"{noun} {join_limited(ranks, str)} {verb}")
    return "; ".join(parts)


def join_limited(items: Iterable[object], fmt: Callable[[object], str], limit: int = MAX_LISTED) -> str:
    """``a, b, c ... (+N more)``: evidence lists stay one readable line however long they are."""
    items = list(items)
    text = ", ".join(fmt(item) for item in items[:limit])
    if len(items) > limit:
        text += f" ... (+{len(items) - limit} more)"
    return text


def format_example(example: object) -> str:
    """Ints as themselves, everything else as its repr (so strings and tuples keep their edges)."""
    text = str(example) if type(example) is int else repr(example)
    if len(text) > MAX_EXAMPLE_CHARS:
        text = text[: MAX_EXAMPLE_CHARS - 3] + "..."
    return text


def evidence(verdict: Verdict) -> list[tuple[str, str]]:
    """The non-empty evidence fields of a failed verdict, as (label, text) pairs in report order."""
    rows = [
        ("cause", verdict.cause),
        ("ranks", join_limited(verdict.ranks, str)),
        ("epochs", join_limited(verdict.epochs, str)),
        ("e.g.", join_limited(verdict.examples, format_example)),
    ]
    return [(label, text) for label, text in rows if text]


def trim_stack(stack: str, max_lines: int = STACK_LINES) -> list[str]:
    """The innermost ``max_lines`` lines of a stack, with a marker line saying how many were left out.

    Python tracebacks put the innermost frame last, so their tail is kept; faulthandler-style dumps
    ("most recent call first") put it first, so their head is kept.
    """
    lines = [line.rstrip() for line in stack.strip("\n").splitlines()]
    omitted = len(lines) - max_lines
    if omitted <= 0:
        return lines
    if "most recent call first" in stack:
        return [*lines[:max_lines], f"... ({omitted} later lines omitted)"]
    start = omitted
    for shift in range(4):  # begin at a frame ("  File ...") rather than in the middle of one
        if start + shift < len(lines) and lines[start + shift].lstrip().startswith("File "):
            start += shift
            break
    return [f"... ({start} earlier lines omitted)", *lines[start:]]


def fmt_number(value: float) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if math.isnan(value):
            return "nan"
        return f"{value:.6g}"
    return str(value)


def fmt_diff(value: float) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if math.isnan(value):
            return "nan"
        return "0" if value == 0 else f"{value:+.4g}"
    return str(value)


def divergence_cause(row: MetricRow) -> str:
    """``duplicated 3, dropped 1`` / ``order only``, then the row's own ``cause`` text if any."""
    parts = []
    if row.duplicated:
        parts.append(f"duplicated {row.duplicated}")
    if row.dropped:
        parts.append(f"dropped {row.dropped}")
    if row.order_only:
        parts.append("order only")
    if row.cause and row.cause not in parts:
        parts.append(row.cause)
    return "; ".join(parts) if parts else NOT_RUN


def skip_reasons(result: CheckResult) -> list[tuple[str, str, str]]:
    """(world labels, check, reason) for skipped checks, identical (check, reason) merged across sizes."""
    with_backend = show_backend(result)
    merged: dict[tuple[str, str], list[WorldResult]] = {}
    for run in result.runs:
        for verdict in run.verdicts:
            if verdict.status == "skip" and verdict.detail:
                runs = merged.setdefault((verdict.check, verdict.detail), [])
                if not any(seen is run for seen in runs):
                    runs.append(run)
    return [(worlds_label(runs, with_backend), check, why) for (check, why), runs in merged.items()]


def worlds_label(runs: Sequence[WorldResult], with_backend: bool) -> str:
    """``ws=1,2,4`` (or ``ws=1 gloo, ws=2 nccl`` when backends differ)."""
    if with_backend:
        return ", ".join(world_label(run, True) for run in runs)
    return "ws=" + ",".join(str(run.world_size) for run in runs)
