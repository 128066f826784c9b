"""The terminal report: a PASS/FAIL grid, the evidence behind each failure, divergence, one summary line.

The grid has one row per world size and one column per check (short labels, explained by a legend
line), which fits 100 columns even with all eleven checks. On a narrower ``width`` the grid turns
(``layout="auto"``): one row per check, one column per world size. Both forms end in "ranks" (rank
failures, or why a world size was skipped).
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Sequence
from typing import Literal

import tabulate as tabulate_module
from tabulate import tabulate

from ddpcheck.checks.ids import SHORT_LABELS
from ddpcheck.report._common import (
    NOT_RUN,
    RESUME_HEADERS,
    STATUS_WORD,
    Cause,
    cause_number,
    cause_title,
    causes,
    cell_status,
    check_columns,
    divergence_cause,
    evidence,
    explains,
    fmt_diff,
    fmt_number,
    rank_summary,
    resume_cells,
    show_backend,
    skip_reasons,
    summary_line,
    trim_stack,
    world_label,
)
from ddpcheck.result import CheckResult, WorldResult

Layout = Literal["auto", "wide", "tall"]
Paint = Callable[[str, str], str]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_COLORS = {"pass": "32", "fail": "1;31", "skip": "33", "n/a": "2", "allowed": "35"}
_MIN_WRAP = 16  # narrowest a wrapped free-text column may get
_INDENT = "    "


def render_table(
    result: CheckResult, *, color: bool = False, width: int = 100, layout: Layout = "auto"
) -> str:
    """The whole terminal report as one string (no trailing newline); ``color`` adds ANSI colours."""
    if layout not in ("auto", "wide", "tall"):
        raise ValueError(f"layout must be 'auto', 'wide' or 'tall', not {layout!r}")
    if width < 40:
        raise ValueError(f"width must be at least 40 columns, not {width}")
    paint = _painter(color)
    found = causes(result)
    blocks = [_title(result)]
    for block in (
        _causes(result, found, width),
        _grid(result, paint, width, layout),
        _details(result, found, width),
        _skips(result, width, "skip", "Skipped (could not be judged)"),
        _skips(result, width, "n/a", "Not applicable"),
        _divergence(result, width),
        _resume(result, width),
        _notes(result, width),
    ):
        if block:
            blocks.append(block)
    blocks.append(summary_line(result, paint if color else None))
    return "\n\n".join(blocks)


def _painter(color: bool) -> Paint:
    def paint(text: str, status: str) -> str:
        code = _COLORS.get(status)
        return f"\x1b[{code}m{text}\x1b[0m" if color and code else text

    return paint


def visible_width(text: str) -> int:
    """The widest line of ``text`` as a terminal shows it (ANSI colour codes take no room)."""
    return max((len(_ANSI.sub("", line)) for line in text.splitlines()), default=0)


def _title(result: CheckResult) -> str:
    facts = [f"ids: {result.id_source}", f"epochs: {result.epochs}"]
    backends = list(dict.fromkeys(run.backend for run in result.runs))
    if len(backends) == 1:
        facts.append(f"backend: {backends[0]}")
    return f"ddpcheck: {result.loader}  ({', '.join(facts)})"


def _section(title: str, body: Sequence[str]) -> str:
    return "\n".join([title, "-" * len(title), *body]) if body else ""


def _wrap(text: str, width: int, first: str = "", rest: str = _INDENT) -> list[str]:
    lines = textwrap.wrap(
        text,
        width,
        initial_indent=first,
        subsequent_indent=rest,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return lines or [first.rstrip()]


def _status_cell(run: WorldResult, check: str, paint: Paint) -> str:
    status = cell_status(run, check)
    if status is None:
        return NOT_RUN
    return paint(STATUS_WORD.get(status, status), status)


def _ranks_cell(run: WorldResult) -> str:
    parts = []
    if run.skipped:
        parts.append(f"skipped: {run.skipped}")
    if run.failures:
        parts.append(rank_summary(run.failures))
    text = "; ".join(parts) if parts else "ok"
    # a stray \b, \r or line separator in a reason would wreck the grid's column widths
    return "".join(ch if ch.isprintable() else " " for ch in text)


def _table(rows: list[list[str]], headers: Sequence[str], *, pad: bool = True, **kwargs: object) -> str:
    """tabulate "simple"; ``pad=False`` drops its 2-character cell padding (columns stay 2 apart)."""
    saved = tabulate_module.MIN_PADDING
    if not pad:
        tabulate_module.MIN_PADDING = 0
    try:
        return str(tabulate(rows, headers, tablefmt="simple", disable_numparse=True, **kwargs))
    finally:
        tabulate_module.MIN_PADDING = saved


def _grid(result: CheckResult, paint: Paint, width: int, layout: Layout) -> str:
    if not result.runs:
        return "(no world sizes were run)"
    checks = check_columns(result)
    if layout != "tall":
        wide = _wide_grid(result, checks, paint, width)
        if layout == "wide" or visible_width(wide) <= width:
            return wide
    return _tall_grid(result, checks, paint, width)


def _wide_grid(result: CheckResult, checks: Sequence[str], paint: Paint, width: int) -> str:
    """One row per world size, one column per check (short labels, explained in a legend line)."""
    with_backend = show_backend(result)
    headers = ["ws", *(SHORT_LABELS.get(check, check) for check in checks)]
    rows = [
        [
            f"{run.world_size} {run.backend}" if with_backend else str(run.world_size),
            *(_status_cell(run, check, paint) for check in checks),
        ]
        for run in result.runs
    ]
    room = max(width - visible_width(_table(rows, headers, pad=False)) - 2, _MIN_WRAP)
    for row, run in zip(rows, result.runs, strict=True):
        row.append(_ranks_cell(run))
    grid = _table(rows, [*headers, "ranks"], pad=False, maxcolwidths=[None] * len(headers) + [room])
    legend = ", ".join(f"{SHORT_LABELS[c]} = {c}" for c in checks if SHORT_LABELS.get(c, c) != c)
    return grid + "\n\n" + textwrap.fill(f"columns: {legend}", width=width, subsequent_indent="  ")


def _tall_grid(result: CheckResult, checks: Sequence[str], paint: Paint, width: int) -> str:
    """One row per check, one column per world size: fits any number of checks."""
    with_backend = show_backend(result)
    headers = ["check", *(world_label(run, with_backend).replace(" ", "\n") for run in result.runs)]
    rows = [[check, *(_status_cell(run, check, paint) for run in result.runs)] for check in checks]
    rows.append(["ranks", *(_ranks_cell(run) for run in result.runs)])
    label_width = max(len(label) for label in ["check", "ranks", *checks])
    runs = len(result.runs)
    column = max((width - label_width - 2 * runs) // runs, 8)
    return _table(rows, headers, maxcolwidths=[None] + [column] * runs)


def _causes(result: CheckResult, found: Sequence[Cause], width: int) -> str:
    """Each distinct cause once, with the checks and world sizes it explains."""
    with_backend = show_backend(result)
    lines: list[str] = []
    for cause in found:
        lines += _wrap(f"[{cause.number}] {cause_title(cause)}", width)
        lines += _wrap(f"-> {explains(cause, with_backend)}", width, _INDENT, _INDENT * 2)
    return _section("Causes", lines)


def _details(result: CheckResult, found: Sequence[Cause], width: int) -> str:
    with_backend = show_backend(result)
    lines: list[str] = []
    for run in result.runs:
        label = world_label(run, with_backend)
        for verdict in run.verdicts:
            if verdict.status not in ("fail", "allowed"):
                continue
            number = cause_number(found, verdict)
            tag = "allowed, " if verdict.status == "allowed" else ""
            ref = f" ({tag}cause {number})" if number is not None else ""
            lines += _wrap(f"[{label}] {verdict.check}{ref}: {verdict.detail or 'failed'}", width)
            for name, text in evidence(verdict, cause=number is None):
                lines += _wrap(f"{name}: {text}", width, _INDENT, _INDENT * 2)
        for failure in run.failures:
            lines += _wrap(f"[{label}] rank {failure.rank} {failure.kind}: {failure.message}", width)
            if failure.progress:
                lines += _wrap(f"progress: {failure.progress}", width, _INDENT, _INDENT * 2)
            if failure.stack.strip():
                lines.append(f"{_INDENT}stack:")
                lines += [f"{_INDENT * 2}{line}" for line in trim_stack(failure.stack)]
    return _section("Details", lines)


def _skips(result: CheckResult, width: int, status: str, title: str) -> str:
    lines: list[str] = []
    for where, check, why in skip_reasons(result, status):
        lines += _wrap(f"[{where}] {check}: {why}", width)
    return _section(title, lines)


def _divergence(result: CheckResult, width: int) -> str:
    with_backend = show_backend(result)
    headers = ["metric", "reference", "naive DDP", "corrected DDP", "naive diff", "corrected diff"]
    align = ("left", "right", "right", "right", "right", "right", "left")
    blocks: list[str] = []
    for run in result.runs:
        if not run.divergence:
            continue
        rows = [
            [
                row.metric,
                fmt_number(row.reference),
                fmt_number(row.naive),
                fmt_number(row.corrected),
                fmt_diff(row.naive_diff),
                fmt_diff(row.corrected_diff),
            ]
            for row in run.divergence
        ]
        limits: list[int | None] = [24, None, None, None, None, None]
        room = max(width - visible_width(_table(rows, headers, maxcolwidths=limits)) - 2, _MIN_WRAP)
        for cells, row in zip(rows, run.divergence, strict=True):
            cells.append(divergence_cause(row))
        table = _table(rows, [*headers, "cause"], colalign=align, maxcolwidths=[*limits, room])
        blocks.append(f"{world_label(run, with_backend)}:\n{table}")
    return _section("Divergence", "\n\n".join(blocks).splitlines())


def _resume(result: CheckResult, width: int) -> str:
    with_backend = show_backend(result)
    blocks: list[str] = []
    for run in result.runs:
        if not run.resume:
            continue
        rows = [resume_cells(row) for row in run.resume]
        room = max(width - visible_width(_table(rows, RESUME_HEADERS[:-1])) - 2, _MIN_WRAP)
        for cells, row in zip(rows, run.resume, strict=True):
            cells.append(row.note or NOT_RUN)
        table = _table(rows, RESUME_HEADERS, maxcolwidths=[None] * 7 + [room])
        blocks.append(f"{world_label(run, with_backend)}:\n{table}")
    return _section("Resume", "\n\n".join(blocks).splitlines())


def _notes(result: CheckResult, width: int) -> str:
    lines: list[str] = []
    for note in result.notes:
        lines += _wrap(note, width, "- ", "  ")
    return _section("Notes", lines)
