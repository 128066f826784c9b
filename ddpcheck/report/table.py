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
from ddpcheck.report.view import (
    NOT_RUN,
    RESUME_HEADERS,
    STATUS_WORD,
    ReportView,
    Row,
    as_view,
    divergence_cause,
    fmt_diff,
    fmt_number,
    resume_cells,
    trim_stack,
)
from ddpcheck.result import CheckResult

Layout = Literal["auto", "wide", "tall"]
Paint = Callable[[str, str], str]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_COLORS = {"pass": "32", "fail": "1;31", "skip": "33", "n/a": "2", "allowed": "35"}
_MIN_WRAP = 16  # narrowest a wrapped free-text column may get
_INDENT = "    "


def render_table(
    result: CheckResult | ReportView, *, color: bool = False, width: int = 100, layout: Layout = "auto"
) -> str:
    """The whole terminal report as one string (no trailing newline); ``color`` adds ANSI colours."""
    if layout not in ("auto", "wide", "tall"):
        raise ValueError(f"layout must be 'auto', 'wide' or 'tall', not {layout!r}")
    if width < 40:
        raise ValueError(f"width must be at least 40 columns, not {width}")
    view = as_view(result)
    paint = _painter(color)
    blocks = [_title(view.result)]
    for block in (
        _causes(view, width),
        _grid(view, paint, width, layout),
        _padding(view, width),
        _idle(view, width),
        _details(view, width),
        _reasons(view.skipped, width, "Skipped (could not be judged)"),
        _reasons(view.not_applicable, width, "Not applicable"),
        _divergence(view, width),
        _resume(view, width),
        _notes(view.result, width),
    ):
        if block:
            blocks.append(block)
    blocks.append(view.summary(paint if color else None))
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


def _status_cell(row: Row, check: str, paint: Paint) -> str:
    status = row.cell(check).status
    if status is None:
        return NOT_RUN
    return paint(STATUS_WORD.get(status, status), status)


def _printable(text: str) -> str:
    """A stray \\b, \\r or line separator in a reason would wreck the grid's column widths."""
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


def _grid(view: ReportView, paint: Paint, width: int, layout: Layout) -> str:
    if not view.rows:
        return "(no world sizes were run)"
    if layout != "tall":
        wide = _wide_grid(view, paint, width)
        if layout == "wide" or visible_width(wide) <= width:
            return wide
    return _tall_grid(view, paint, width)


def _wide_grid(view: ReportView, paint: Paint, width: int) -> str:
    """One row per layout, one column per check (short labels, explained in a legend line)."""
    checks = view.grid_columns
    headers = ["ws", *(SHORT_LABELS.get(check, check) for check in checks)]
    rows = [[row.short, *(_status_cell(row, check, paint) for check in checks)] for row in view.rows]
    room = max(width - visible_width(_table(rows, headers, pad=False)) - 2, _MIN_WRAP)
    for cells, row in zip(rows, view.rows, strict=True):
        cells.append(_printable(row.ranks))
    grid = _table(rows, [*headers, "ranks"], pad=False, maxcolwidths=[None] * len(headers) + [room])
    if not view.legend:
        return grid
    return grid + "\n\n" + textwrap.fill(f"columns: {view.legend}", width=width, subsequent_indent="  ")


def _tall_grid(view: ReportView, paint: Paint, width: int) -> str:
    """One row per check, one column per layout: fits any number of checks."""
    checks = view.grid_columns
    headers = ["check", *(row.label.replace(" ", "\n") for row in view.rows)]
    rows = [[check, *(_status_cell(row, check, paint) for row in view.rows)] for check in checks]
    rows.append(["ranks", *(_printable(row.ranks) for row in view.rows)])
    label_width = max(len(label) for label in ["check", "ranks", *checks])
    runs = len(view.rows)
    column = max((width - label_width - 2 * runs) // runs, 8)
    return _table(rows, headers, maxcolwidths=[None] + [column] * runs)


def _causes(view: ReportView, width: int) -> str:
    """Each distinct cause once, with the checks and layouts it explains and how to fix it."""
    lines: list[str] = []
    for cause in view.causes:
        lines += _wrap(f"[{cause.number}] {cause.title}", width)
        lines += _wrap(f"-> {cause.explains}", width, _INDENT, _INDENT * 2)
        if cause.fix:
            lines += _wrap(f"fix: {cause.fix}", width, _INDENT, _INDENT * 2)
    return _section("Causes", lines)


def _padding(view: ReportView, width: int) -> str:
    """What padding costs where it repeated samples (it passes, but an evaluation counts them twice)."""
    lines: list[str] = []
    for row in view.padded:
        lines += _wrap(f"[{row.label}] {row.padding}", width)
    return _section("Padding", lines)


def _idle(view: ReportView, width: int) -> str:
    """The share of rank-steps spent waiting for each step's slowest rank, where work was measured."""
    lines: list[str] = []
    for row in view.measured:
        lines += _wrap(f"[{row.label}] idle {row.idle}", width)
    return _section("Work balance", lines)


def _details(view: ReportView, width: int) -> str:
    """The evidence, grouped by cause: each failing check once, at the first layout it fails at."""
    lines: list[str] = []
    for cause in view.causes:
        for finding in cause.findings:
            also = f" (also {', '.join(finding.also)})" if finding.also else ""
            tag = " (allowed)" if finding.status == "allowed" else ""
            head = f"[{cause.number}] {finding.where} {finding.check}{tag}{also}: {finding.detail}"
            lines += _wrap(head, width)
            for name, text in finding.evidence:
                lines += _wrap(f"{name}: {text}", width, _INDENT, _INDENT * 2)
    for entry in view.failures:
        failure = entry.failure
        number = f"[{entry.cause}] " if entry.cause is not None else ""
        lines += _wrap(f"{number}{entry.where} rank {failure.rank} {failure.kind}: {failure.message}", width)
        if failure.progress:
            lines += _wrap(f"progress: {failure.progress}", width, _INDENT, _INDENT * 2)
        if failure.stack.strip():
            lines.append(f"{_INDENT}stack:")
            lines += [f"{_INDENT * 2}{line}" for line in trim_stack(failure.stack)]
    return _section("Details", lines)


def _reasons(reasons: Sequence[object], width: int, title: str) -> str:
    lines: list[str] = []
    for reason in reasons:
        where, check, why = (getattr(reason, name) for name in ("where", "check", "why"))
        lines += _wrap(f"[{where}] {check}: {why}", width)
    return _section(title, lines)


def _divergence(view: ReportView, width: int) -> str:
    headers = ["metric", "reference", "naive DDP", "corrected DDP", "naive diff", "corrected diff"]
    align = ("left", "right", "right", "right", "right", "right", "left")
    blocks: list[str] = []
    for row in view.rows:
        run = row.run
        if not run.divergence:
            continue
        cells = [
            [
                metric.metric,
                fmt_number(metric.reference),
                fmt_number(metric.naive),
                fmt_number(metric.corrected),
                fmt_diff(metric.naive_diff),
                fmt_diff(metric.corrected_diff),
            ]
            for metric in run.divergence
        ]
        limits: list[int | None] = [24, None, None, None, None, None]
        room = max(width - visible_width(_table(cells, headers, maxcolwidths=limits)) - 2, _MIN_WRAP)
        for line, metric in zip(cells, run.divergence, strict=True):
            line.append(divergence_cause(metric))
        table = _table(cells, [*headers, "cause"], colalign=align, maxcolwidths=[*limits, room])
        blocks.append(f"{row.label}:\n{table}")
    return _section("Divergence", "\n\n".join(blocks).splitlines())


def _resume(view: ReportView, width: int) -> str:
    blocks: list[str] = []
    for row in view.rows:
        if not row.run.resume:
            continue
        cells = [resume_cells(stop) for stop in row.run.resume]
        room = max(width - visible_width(_table(cells, RESUME_HEADERS[:-1])) - 2, _MIN_WRAP)
        for line, stop in zip(cells, row.run.resume, strict=True):
            line.append(stop.note or NOT_RUN)
        table = _table(cells, RESUME_HEADERS, maxcolwidths=[None] * (len(RESUME_HEADERS) - 1) + [room])
        blocks.append(f"{row.label}:\n{table}")
    return _section("Resume", "\n\n".join(blocks).splitlines())


def _notes(result: CheckResult, width: int) -> str:
    lines: list[str] = []
    for note in result.notes:
        lines += _wrap(note, width, "- ", "  ")
    return _section("Notes", lines)
