"""The terminal report: a PASS/FAIL grid, the evidence behind each failure, divergence, one summary line.

The grid has one row per world size and one column per check (short labels, explained by a legend
line), which fits 100 columns even with all eleven checks. A training script's loaders get a column of
their own, or, where that would not fit, a line above each loader's rows. On a narrower ``width`` the
grid turns (``layout="auto"``): one row per check, one column per world size (a table per script
loader), cut into several tables where the world sizes do not fit side by side. Both forms end in
"ranks" (rank failures, or why a world size was skipped).
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Sequence
from typing import Literal

import tabulate as tabulate_module
from tabulate import tabulate

from ddpcheck.messages import short_hash_ids
from ddpcheck.report.rows import Row
from ddpcheck.report.view import (
    NOT_RUN,
    RESUME_HEADERS,
    STATUS_WORD,
    ReportView,
    as_view,
    divergence_cause,
    failure_ranks,
    fmt_diff,
    fmt_number,
    resume_cells,
    resume_notes,
    resume_summary,
    same_failures,
    trim_stack,
)
from ddpcheck.result import CheckResult
from ddpcheck.verdict import NO_OVERLAP, SHORT_LABELS

Layout = Literal["auto", "wide", "tall"]
Paint = Callable[[str, str], str]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_COLORS = {"pass": "32", "fail": "1;31", "skip": "33", "n/a": "2", "allowed": "35"}
_MIN_WRAP = 16  # narrowest a wrapped free-text column may get
_MIN_NOTE = 28  # a note column narrower than this goes below its table (no word-per-line columns)
_MIN_COLUMN = 8  # narrowest a layout's column of the tall grid gets
_INDENT = "    "


def render_table(
    result: CheckResult | ReportView,
    *,
    color: bool = False,
    width: int = 100,
    layout: Layout = "auto",
    not_applicable_in: str | None = None,
) -> str:
    """The whole terminal report as one string (no trailing newline); ``color`` adds ANSI colours.

    ``not_applicable_in``: where the reports are (a path); the reasons checks do not apply are then one
    line pointing there instead of a section (the terminal's form; ``-v`` and the files list them all).
    """
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
        _mixture(view, width),
        _details(view, width),
        _reasons(view.skipped, width, "Skipped (could not be judged)"),
        _not_applicable(view, width, not_applicable_in),
        _divergence(view, width),
        _metrics(view, width),
        _resume(view, width, not_applicable_in),
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
        if view.loader_column:  # a script's loaders: each a line above its rows instead of a column
            grouped = _wide_grid(view, paint, width, grouped=True)
            if visible_width(grouped) <= width:
                return grouped
    return _tall_grid(view, paint, width)


def _wide_grid(view: ReportView, paint: Paint, width: int, *, grouped: bool = False) -> str:
    """One row per layout, one column per check (short labels, explained in a legend line). A script's
    loaders get a column of their own, or (``grouped``) a line above each loader's rows."""
    checks = view.grid_columns
    named = ["loader"] if view.loader_column and not grouped else []
    headers = [*named, "ws", *(SHORT_LABELS.get(check, check) for check in checks)]
    shown = view.grid_rows
    rows = [
        [*([row.loader] if named else []), row.short, *(_status_cell(row, check, paint) for check in checks)]
        for row in shown
    ]
    if named:  # a loader's name once, on its first row
        for cells, before, row in zip(rows[1:], shown, shown[1:], strict=False):
            cells[0] = "" if row.loader == before.loader else cells[0]
    room = max(width - visible_width(_table(rows, headers, pad=False)) - 2, _MIN_WRAP)
    for cells, row in zip(rows, shown, strict=True):
        cells.append(_printable(row.ranks))
    grid = _table(rows, [*headers, "ranks"], pad=False, maxcolwidths=[None] * len(headers) + [room])
    if grouped:
        grid = _group_lines(grid, shown, width)
    if not view.legend:
        return grid
    return grid + "\n\n" + textwrap.fill(f"columns: {view.legend}", width=width, subsequent_indent="  ")


def _group_lines(grid: str, rows: Sequence[Row], width: int) -> str:
    """``grid`` (a header, a rule, then each row's lines) with each loader's name on a line of its own
    above its first row. A row's ranks may wrap over several lines: rows are found by their first cell."""
    lines = grid.splitlines()
    out, body = lines[:2], lines[2:]
    starts = [i for i, line in enumerate(body) if line[:1].strip()]  # a wrapped line starts blank
    for n, (row, start) in enumerate(zip(rows, starts, strict=False)):
        if n == 0 or row.loader != rows[n - 1].loader:
            out += _wrap(_printable(row.loader), width, "", _INDENT)
        end = starts[n + 1] if n + 1 < len(starts) else len(body)
        out += body[start:end]
    return "\n".join(out)


def _tall_grid(view: ReportView, paint: Paint, width: int) -> str:
    """One row per check, one column per layout: fits any number of checks. A script's loaders get a
    table each, under their name; layouts that do not fit side by side go on in another table."""
    if not view.loader_column:
        return _tall_tables(view.rows, view.grid_columns, paint, width, lambda row: row.label)
    blocks = []
    for loader in dict.fromkeys(row.loader for row in view.rows):
        mine = [row for row in view.rows if row.loader == loader]
        table = _tall_tables(mine, view.grid_columns, paint, width, _layout_alone)
        blocks.append("\n".join([*_wrap(_printable(loader), width, "", _INDENT), table]))
    return "\n\n".join(blocks)


def _layout_alone(row: Row) -> str:
    """A script loader's row headed by its layout alone (``ws=2``): the loader names its table."""
    return row.label.removeprefix(f"{row.loader} ")


def _tall_tables(
    rows: Sequence[Row], checks: Sequence[str], paint: Paint, width: int, head: Callable[[Row], str]
) -> str:
    """``rows`` as tall tables, as many layouts side by side as fit ``width`` (a layout 8 columns or more)."""
    label_width = max(len(label) for label in ["check", "ranks", *checks])
    fit = max((width - label_width) // (_MIN_COLUMN + 2), 1)
    tables = []
    for start in range(0, len(rows), fit):
        chunk = rows[start : start + fit]
        column = max((width - label_width - 2 * len(chunk)) // len(chunk), _MIN_COLUMN)
        tables.append(_tall_table(chunk, checks, paint, width, head, label_width, column))
    return "\n\n".join(tables)


def _tall_table(
    rows: Sequence[Row],
    checks: Sequence[str],
    paint: Paint,
    width: int,
    head: Callable[[Row], str],
    label_width: int,
    column: int,
) -> str:
    headers = ["check", *(head(row).replace(" ", "\n") for row in rows)]
    cells = [[check, *(_status_cell(row, check, paint) for row in rows)] for check in checks]
    texts = [_printable(row.ranks) for row in rows]
    below = [_word_a_line(text, column) for text in texts]  # those go under the grid, whole
    cells.append(["ranks", *(("below" if low else text) for text, low in zip(texts, below, strict=True))])
    grid = _table(cells, headers, maxcolwidths=[None] + [column] * len(rows))
    if not any(below):
        return grid
    lines = [grid, ""]
    for row, text, low in zip(rows, texts, below, strict=True):
        if low:
            lines += _wrap(f"ranks at {row.label}: {text}", width)
    return "\n".join(lines)


def _word_a_line(text: str, column: int) -> bool:
    """Whether ``text`` wrapped to ``column`` would leave a word alone on a line (a note read a word at a
    time down the screen): such a text goes below its table instead."""
    lines = textwrap.wrap(text, column, break_long_words=False, break_on_hyphens=False)
    return len(lines) > 1 and any(len(line.split()) == 1 for line in lines)


def _causes(view: ReportView, width: int) -> str:
    """Each distinct cause once, with the checks and layouts it explains and how to fix it."""
    lines: list[str] = []
    ids = sample_ids(view)
    for cause in view.causes:
        lines += _wrap(ids(f"[{cause.number}] {cause.title}"), width)
        lines += _wrap(f"-> {cause.explains}", width, _INDENT, _INDENT * 2)
        if cause.fix:
            lines += _wrap(f"fix: {cause.fix}", width, _INDENT, _INDENT * 2)
    return _section("Causes", lines)


def _padding(view: ReportView, width: int) -> str:
    """What padding costs where it repeated samples (it passes, but an evaluation counts them twice);
    not where ranks overlap: those repeats are no_overlap's failure, told in its own words."""
    lines: list[str] = []
    for row in padded_only(view):
        lines += _wrap(f"[{row.label}] {row.padding}", width)
    return _section("Padding (samples repeated to even out the ranks)", lines)


def _idle(view: ReportView, width: int) -> str:
    """The share of rank-steps spent waiting for each step's slowest rank, where work was measured."""
    lines: list[str] = []
    for row in view.measured:
        lines += _wrap(f"[{row.label}] idle {row.idle}", width)
    return _section("Work balance", lines)


def _details(view: ReportView, width: int) -> str:
    """The evidence, grouped by cause: each failing check once, at the first layout it fails at."""
    lines: list[str] = []
    ids = sample_ids(view)
    for cause in view.causes:
        for finding in cause.findings:
            also = f" (also {', '.join(finding.also)})" if finding.also else ""
            tag = " (allowed)" if finding.status == "allowed" else ""
            head = f"[{cause.number}] {finding.where} {finding.check}{tag}{also}: {finding.detail}"
            lines += _wrap(ids(head), width)
            for name, text in finding.evidence:
                lines += _wrap(ids(f"{name}: {text}"), width, _INDENT, _INDENT * 2)
    for entries in same_failures(view.failures):
        entry, failure = entries[0], entries[0].failure
        number = f"[{entry.cause}] " if entry.cause is not None else ""
        ranks = failure_ranks(entries)
        count = f" (x{len(entries)})" if len(entries) > 1 else ""
        lines += _wrap(f"{number}{ranks} {failure.kind}: {failure.message}{count}", width)
        if failure.progress:
            lines += _wrap(f"progress: {failure.progress}", width, _INDENT, _INDENT * 2)
        if failure.stack.strip():
            lines.append(f"{_INDENT}stack{' (the first)' if len(entries) > 1 else ''}:")
            lines += [f"{_INDENT * 2}{line}" for line in trim_stack(failure.stack)]
        if failure.output.strip():
            lines.append(f"{_INDENT}its last output lines{' (the first)' if len(entries) > 1 else ''}:")
            lines += [f"{_INDENT * 2}{line}" for line in failure.output.splitlines()]
    return _section("Details", lines)


def sample_ids(view: ReportView) -> Callable[[str], str]:
    """How sample ids read in text: content hashes as ``#1a2b3c4`` (not 19-digit integers), others as
    they are (the JSON keeps every id whole)."""
    return short_hash_ids if view.result.id_source == "content-hash" else str


def padded_only(view: ReportView) -> list[Row]:
    """The layouts whose repeats are padding alone: where ranks overlap, the samples seen twice are the
    overlap's (counted by no_overlap), and listing them as padding would count one thing two ways."""
    return [row for row in view.padded if row.cell(NO_OVERLAP).status in (None, "pass", "n/a")]


def _not_applicable(view: ReportView, width: int, where: str | None) -> str:
    """Why checks do not apply: every reason, or (on a terminal) one line saying which and where."""
    if where is None or not view.not_applicable:
        return _reasons(view.not_applicable, width, "Not applicable")
    checks = list(dict.fromkeys(reason.check for reason in view.not_applicable))
    shown = ", ".join(checks[:4]) + (f" and {len(checks) - 4} more" if len(checks) > 4 else "")
    n = len(view.not_applicable)
    line = f"Not applicable: {shown}; the {n} reason{'s' if n != 1 else ''} are in {where} (-v prints them)"
    if n == 1:
        line = f"Not applicable: {shown}; the reason is in {where} (-v prints it)"
    return "\n".join(_wrap(line, width))


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
        room = width - visible_width(_table(cells, headers, maxcolwidths=limits)) - 2
        causes = [divergence_cause(metric) for metric in run.divergence]
        if room < _MIN_NOTE and any(len(cause) > room for cause in causes):  # below, not a word a line
            table = _table(cells, headers, colalign=align[:-1], maxcolwidths=limits)
            notes = [
                line
                for metric, cause in zip(run.divergence, causes, strict=True)
                if cause
                for line in _wrap(f"cause ({metric.metric}): {cause}", width)
            ]
            blocks.append("\n".join([f"{row.label}:", table, *notes]))
            continue
        for line, cause in zip(cells, causes, strict=True):
            line.append(cause)
        table = _table(
            cells, [*headers, "cause"], colalign=align, maxcolwidths=[*limits, max(room, _MIN_WRAP)]
        )
        blocks.append(f"{row.label}:\n{table}")
    return _section("Divergence", "\n\n".join(blocks).splitlines())


def _metrics(view: ReportView, width: int) -> str:
    """Per layout whose evaluation was compared: each reported value at one process and at this layout."""
    blocks: list[str] = []
    for table in view.metric_tables:
        limits: list[int | None] = [None, 36, None, None, 24, None]
        lines = _wrap(table.caption, width)
        grid = _table(table.cells(), list(table.headers), maxcolwidths=limits)
        blocks.append("\n".join([f"{table.label}: {table.status.upper()}", *lines, grid]))
    return _section("Evaluation metrics", "\n\n".join(blocks).splitlines())


RESUME_SUMMARY_HEADERS = ("topology", "restores", "exact", "resharded", "refused", "failed", "worst loss")


def _resume(view: ReportView, width: int, files: str | None) -> str:
    """Resume and elastic restores: per topology change a line of counts (and the worst silent loss),
    the refusals' and failures' notes once each. The full table of every restore is in the report files
    (``files``: where they are); with no ``files`` given (``-v``) it follows here too."""
    summary = _resume_summary(view, width, files)
    if not summary or files is not None:
        return summary
    return summary + "\n\n" + _resume_table(view, width)


def _resume_summary(view: ReportView, width: int, files: str | None) -> str:
    found = resume_summary(view)
    if not found:
        return ""
    cells = [
        [
            s.topology,
            str(s.restores),
            *(_count(n) for n in (s.exact, s.resharded, s.refused, s.failed)),
            s.worst or "-",
        ]
        for s in found
    ]
    room = max(
        width - visible_width(_table([c[:-1] for c in cells], RESUME_SUMMARY_HEADERS[:-1])) - 2, _MIN_WRAP
    )
    lines = _table(cells, RESUME_SUMMARY_HEADERS, maxcolwidths=[None] * 6 + [room]).splitlines()
    for note, count, where in resume_notes(view):
        times = f" ({count} restores)" if count > 1 else ""
        lines += _wrap(f"{', '.join(where)}{times}: {note}", width, "- ", "  ")
    if files is not None:
        lines += _wrap(f"every restore, one line each: {files}", width)
    return _section("Resume and elastic restores", lines)


def _count(n: int) -> str:
    return str(n) if n else "-"


def _resume_table(view: ReportView, width: int) -> str:
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


def _mixture(view: ReportView, width: int) -> str:
    """Each source's share per rank and worker, where batches carry a source (summed over the epochs)."""
    blocks = []
    for table in view.mixtures:
        head = f"[{table.label}] {table.status.upper()}: expected from {table.expected_from}"
        blocks.append("\n".join([*_wrap(head, width), _table(table.cells(), table.headers)]))
    return _section("Mixture (shares of each source)", ["\n\n".join(blocks)]) if blocks else ""
