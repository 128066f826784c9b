"""Shared pieces of every report: column order, labels, counts, the summary line, evidence text.

Kept in one place so the terminal table, Markdown and JUnit can never disagree on what passed.
Everything here reads a :class:`~ddpcheck.result.CheckResult`; nothing re-runs or re-judges a check.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ddpcheck.checks.ids import ALL_CHECKS
from ddpcheck.checks.verdict import Verdict
from ddpcheck.messages import count_text
from ddpcheck.result import CheckResult, MetricRow, ResumeRow, WorldResult
from ddpcheck.trace import RankFailure

STATUS_WORD = {"pass": "PASS", "fail": "FAIL", "skip": "skip", "n/a": "n/a", "allowed": "allowed"}
STATUS_RANK = ("fail", "allowed", "pass", "skip", "n/a")  # a cell with several verdicts shows the first
NO_CAUSE = "cause not identified"
NOT_RUN = "-"
FAILURE_VERB = {"error": "crashed", "hang": "hung", "killed": "was killed", "secondary": "aborted"}
MAX_LISTED = 12  # ranks / epochs / examples shown before "(+N more)"
MAX_EXAMPLE_CHARS = 60
STACK_LINES = 20


@dataclass(frozen=True)
class Counts:
    """What the summary line and the JUnit suite count; a skipped world size counts as one skip.

    ``allowed`` failures and ``n/a`` checks are counted apart: neither passed, neither failed.
    """

    passed: int
    failed: int
    skipped: int
    rank_failures: int
    world_sizes: tuple[int, ...]
    not_applicable: int = 0
    allowed: int = 0


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
    """The status of ``check`` in ``run`` (fail, allowed, pass, skip, n/a: the first present wins),
    ``None`` when it did not run."""
    statuses = [v.status for v in run.verdicts if v.check == check]
    if not statuses:
        return None
    for status in STATUS_RANK:
        if status in statuses:
            return status
    return statuses[0]


def count(result: CheckResult) -> Counts:
    """Verdicts by status; an unknown status counts as a skip (it could not be judged as pass/fail)."""
    tally = dict.fromkeys(STATUS_RANK, 0)
    for run in result.runs:
        if run.skipped:
            tally["skip"] += 1
        for verdict in run.verdicts:
            tally[verdict.status if verdict.status in tally else "skip"] += 1
    sizes = tuple(dict.fromkeys(run.world_size for run in result.runs))
    return Counts(
        passed=tally["pass"],
        failed=tally["fail"],
        skipped=tally["skip"],
        rank_failures=sum(len(run.failures) for run in result.runs),
        world_sizes=sizes,
        not_applicable=tally["n/a"],
        allowed=tally["allowed"],
    )


def summary_line(result: CheckResult, paint: Callable[[str, str], str] | None = None) -> str:
    """``ddpcheck: 27 passed, 2 failed, 3 n/a, 1 allowed, 1 skipped across world sizes 1,2 -> OK (exit 0)``.

    ``n/a`` and ``allowed`` appear only when there are some; the other counts always do.
    """
    c = count(result)
    parts = [f"{c.passed} passed", f"{c.failed} failed"]
    if c.not_applicable:
        parts.append(f"{c.not_applicable} n/a")
    if c.allowed:
        parts.append(f"{c.allowed} allowed")
    parts.append(f"{c.skipped} skipped")
    if c.rank_failures:
        parts.append(count_text(c.rank_failures, "rank failures"))
    if not c.world_sizes:
        where = "across no world sizes"
    elif len(c.world_sizes) == 1:
        where = f"across world size {c.world_sizes[0]}"
    else:
        where = "across world sizes " + ",".join(str(n) for n in c.world_sizes)
    word = "INTERRUPTED" if result.interrupted else "OK" if result.ok else "FAIL"
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


def evidence(verdict: Verdict, *, cause: bool = True) -> list[tuple[str, str]]:
    """The non-empty evidence fields of a failed verdict, as (label, text) pairs in report order.

    ``cause=False`` leaves the cause out (a report that lists causes once, at the top). Examples the
    detail sentence already quotes are not printed a second time.
    """
    examples = join_limited(verdict.examples, format_example)
    if examples and re.search(rf"(?<!\w)(?<!\d\.){re.escape(examples)}(?!\w)(?!\.\d)", verdict.detail):
        examples = ""
    rows = [
        ("cause", verdict.cause if cause else ""),
        ("ranks", join_limited(verdict.ranks, str)),
        ("epochs", join_limited(verdict.epochs, str)),
        ("e.g.", examples),
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
    parts = [row.effects] if row.effects else []
    if row.cause and row.cause not in parts:
        parts.append(row.cause)
    return "; ".join(parts) if parts else NOT_RUN


def skip_reasons(result: CheckResult, status: str = "skip") -> list[tuple[str, str, str]]:
    """(world labels, check, reason) for checks with ``status`` (skip or n/a), identical (check, reason)
    merged across sizes."""
    with_backend = show_backend(result)
    merged: dict[tuple[str, str], list[WorldResult]] = {}
    for run in result.runs:
        for verdict in run.verdicts:
            if verdict.status == status and verdict.detail:
                runs = merged.setdefault((verdict.check, verdict.detail), [])
                if not any(seen is run for seen in runs):
                    runs.append(run)
    return [(worlds_label(runs, with_backend), check, why) for (check, why), runs in merged.items()]


def worlds_label(runs: Sequence[WorldResult], with_backend: bool) -> str:
    """``ws=1,2,4`` (or ``ws=1 gloo, ws=2 nccl`` when backends differ)."""
    if with_backend:
        return ", ".join(world_label(run, True) for run in runs)
    return "ws=" + ",".join(str(run.world_size) for run in runs)


# ------------------------------------------------------------------ failures grouped by cause


@dataclass(frozen=True)
class Cause:
    """One distinct reason for failures, listed once at the top of a report with everything it explains.

    ``kind`` is ``fail`` (failed checks), ``allowed`` (failed, allowed with ``--allow``) or ``rank``
    (ranks that crashed, hung or were killed; the peers they took down are not listed as causes).
    ``where`` pairs each world size with what failed there: a check id, or ``rank N``.
    """

    number: int
    kind: str
    text: str
    where: tuple[tuple[WorldResult, str], ...]


CAUSE_KINDS = ("fail", "rank", "allowed")


def causes(result: CheckResult) -> list[Cause]:
    """Distinct causes in report order: failed checks, then rank failures, then allowed failures."""
    found: dict[tuple[str, str], list[tuple[WorldResult, str]]] = {}
    for kind in CAUSE_KINDS:
        for run in result.runs:
            for label, text in _cause_items(run, kind):
                where = found.setdefault((kind, text), [])
                if not any(seen is run and name == label for seen, name in where):
                    where.append((run, label))
    return [
        Cause(number, kind, text, tuple(where))
        for number, ((kind, text), where) in enumerate(found.items(), start=1)
    ]


def _cause_items(run: WorldResult, kind: str) -> list[tuple[str, str]]:
    if kind == "rank":
        return [
            (f"rank {f.rank}", f"{FAILURE_VERB.get(f.kind, f.kind)}: {first_line(f.message)}")
            for f in run.failures
            if f.kind != "secondary"
        ]
    return [(v.check, v.cause or NO_CAUSE) for v in run.verdicts if v.status == kind]


def first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def cause_number(found: Sequence[Cause], verdict: Verdict) -> int | None:
    """The number of the cause listed for a failed or allowed verdict."""
    text = verdict.cause or NO_CAUSE
    for cause in found:
        if cause.kind == verdict.status and cause.text == text:
            return cause.number
    return None


def explains(cause: Cause, with_backend: bool) -> str:
    """``coverage, no_overlap at ws=2,3; padding_bound at ws=3``: names sharing world sizes merged."""
    runs_of: dict[str, list[WorldResult]] = {}
    for run, name in cause.where:
        runs_of.setdefault(name, []).append(run)
    order = {check: i for i, check in enumerate(ALL_CHECKS)}
    names = sorted(runs_of, key=lambda name: order.get(name, len(order)))
    merged: dict[str, list[str]] = {}
    for name in names:
        merged.setdefault(worlds_label(runs_of[name], with_backend), []).append(name)
    return "; ".join(f"{', '.join(group)} at {where}" for where, group in merged.items())


def cause_title(cause: Cause) -> str:
    """The cause as its list line says it: allowed ones are marked, so they never read as failures."""
    return f"(allowed) {cause.text}" if cause.kind == "allowed" else cause.text


def resume_cells(row: ResumeRow) -> list[str]:
    """One stop point as table cells (shared by the terminal and Markdown tables)."""
    moved = f"{row.world_size_from} -> {row.world_size_to}"
    first = NOT_RUN if row.first_divergence is None else str(row.first_divergence)
    return [moved, str(row.epoch), str(row.step), row.status, str(row.skipped), str(row.repeated), first]


RESUME_HEADERS = ("ranks", "epoch", "stop at step", "status", "lost", "repeated", "first divergence", "note")
