"""The pull-request report: a GitHub-flavoured Markdown summary of a CheckResult.

User text (details, messages, loader paths) is escaped so that a ``<module>`` or a ``|`` in it can
neither vanish as HTML nor break a table; stacks go into fenced blocks inside ``<details>``.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import replace
from urllib.parse import quote

from tabulate import tabulate

from ddpcheck.layout import Layout, file_safe
from ddpcheck.report.rows import Row
from ddpcheck.report.svg import RESUME_PICTURE, PictureFile, picture_files
from ddpcheck.report.table import padded_only, sample_ids
from ddpcheck.report.view import (
    NOT_RUN,
    RESUME_HEADERS,
    ReportView,
    as_view,
    divergence_cause,
    failure_ranks,
    fmt_diff,
    fmt_number,
    resume_caption,
    resume_cells,
    same_failures,
    trim_stack,
)
from ddpcheck.result import CheckResult, WorldResult

MD_STACK_LINES = 60  # collapsed by default, so more of the stack than in the terminal
_CELL = {"pass": "✅ pass", "fail": "❌ **FAIL**", "skip": "⏭️ skip", "n/a": "⚪ n/a", "allowed": "⚠️ allowed"}
_SPECIAL = re.compile(r"([\\`*_\[\]<>|~&])")


def md_escape(text: str) -> str:
    """Backslash-escape Markdown and HTML punctuation; newlines become spaces."""
    return _SPECIAL.sub(r"\\\1", " ".join(text.split()))


def md_code(text: str) -> str:
    """An inline code span that survives backticks inside ``text``."""
    text = " ".join(text.split())
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _fence(lines: Sequence[str]) -> str:
    longest = max((len(run) for line in lines for run in re.findall(r"`{3,}", line)), default=2)
    fence = "`" * max(3, longest + 1)
    return "\n".join([f"{fence}text", *lines, fence])


def _table(rows: list[list[str]], headers: Sequence[str]) -> str:
    return str(tabulate(rows, headers, tablefmt="github", disable_numparse=True))


def render_markdown(result: CheckResult | ReportView, *, figure_stem: str | None = None) -> str:
    """Headline, causes (with their fixes), grid, padding, details by cause, rank failures with stacks,
    skips, pictures, divergence, resume, notes.

    With ``figure_stem`` the pictures are linked as ``<figure_stem>-ws2-samples.svg`` and so on, the
    files :func:`~ddpcheck.report.write_reports` writes next to the Markdown file.
    """
    view = as_view(result)
    res = view.result
    icon = "⚠️" if res.interrupted else "✅" if res.ok else "❌"
    blocks = [
        f"## {icon} ddpcheck {res.verdict_word}",
        md_escape(view.summary()),
        f"{view.subject} {md_code(res.loader)} · ids {md_code(res.id_source)} · epochs {res.epochs}",
    ]
    if view.causes:
        blocks.append(_causes(view))
    blocks.append(_grid(view) if view.rows else "_No world sizes were run._")
    blocks += [
        b
        for b in (
            _padding(view),
            _idle(view),
            _mixture(view),
            _step(view),
            _metrics(view),
            _failed_checks(view),
            _rank_failures(view),
        )
        if b
    ]
    blocks += [
        b for b in (_reasons(view.skipped, "Skipped"), _reasons(view.not_applicable, "Not applicable")) if b
    ]
    drawn = picture_names(view, figure_stem) if figure_stem is not None else []
    if figure_stem is not None:
        blocks.append(_pictures(view, [p for p in drawn if p.picture.kind != RESUME_PICTURE]))
    restores = {id(p.run): p for p in drawn if p.picture.kind == RESUME_PICTURE}
    blocks += [b for b in (_divergence(view), _resume(view, restores), _notes(res)) if b]
    return "\n\n".join(b for b in blocks if b)


def _causes(view: ReportView) -> str:
    items = []
    ids = sample_ids(view)
    for c in view.causes:
        item = f"- **[{c.number}]** {md_escape(ids(c.title))}  \n  explains: {md_escape(c.explains)}"
        if c.fix:
            item += f"  \n  fix: {md_escape(c.fix)}"
        items.append(item)
    return "\n".join(["### Causes", "", *items])


def _status(row: Row, check: str) -> str:
    status = row.cell(check).status
    return NOT_RUN if status is None else _CELL.get(status, md_escape(status))


def _grid(view: ReportView) -> str:
    named = ["loader"] if view.loader_column else []  # a script's loaders: a column of their own
    headers = [*named, "world size", *(md_code(c) for c in view.grid_columns), "ranks"]
    rows = [
        [
            *([md_escape(row.loader)] if named else []),
            md_escape(row.short if named else row.label),
            *(_status(row, c) for c in view.grid_columns),
            md_escape(row.ranks),
        ]
        for row in view.grid_rows
    ]
    return _table(rows, headers)


def _idle(view: ReportView) -> str:
    items = [f"- **{md_escape(row.label)}** idle {md_escape(row.idle)}" for row in view.measured]
    return "\n".join(["### Work balance", "", *items]) if items else ""


def _padding(view: ReportView) -> str:
    items = [f"- **{md_escape(row.label)}** {md_escape(row.padding)}" for row in padded_only(view)]
    return "\n".join(["### Padding (samples repeated to even out the ranks)", "", *items]) if items else ""


def _failed_checks(view: ReportView) -> str:
    items: list[str] = []
    ids = sample_ids(view)
    for cause in view.causes:
        for finding in cause.findings:
            also = f" (also {md_escape(', '.join(finding.also))})" if finding.also else ""
            tag = " (allowed)" if finding.status == "allowed" else ""
            head = (
                f"- **[{cause.number}]** **{md_escape(finding.where)}** {md_code(finding.check)}{tag}{also}"
            )
            items.append(f"{head}: {md_escape(ids(finding.detail))}")
            for name, text in finding.evidence:
                items.append(f"  - {name}: {md_code(ids(text))}")
    return "\n".join(["### Details", "", *items]) if items else ""


def _rank_failures(view: ReportView) -> str:
    parts: list[str] = []
    for entries in same_failures(view.failures):
        entry, failure = entries[0], entries[0].failure
        number = f"**[{entry.cause}]** " if entry.cause is not None else ""
        count = f" (x{len(entries)})" if len(entries) > 1 else ""
        line = f"- {number}**{md_escape(failure_ranks(entries))}** {md_escape(failure.kind)}: "
        line += md_escape(failure.message) + count
        if failure.progress:
            line += f" (progress: {md_escape(failure.progress)})"
        parts.append(line)
        if failure.stack.strip():
            first = " (the first)" if len(entries) > 1 else ""
            summary = html.escape(f"stack of rank {failure.rank} at {entry.where}{first}")
            stack = _fence(trim_stack(failure.stack, MD_STACK_LINES))
            parts.append(f"\n<details><summary>{summary}</summary>\n\n{stack}\n\n</details>\n")
        if failure.output.strip():
            summary = html.escape(f"last output lines of rank {failure.rank} at {entry.where}")
            output = _fence(failure.output.splitlines())
            parts.append(f"\n<details><summary>{summary}</summary>\n\n{output}\n\n</details>\n")
    return "\n".join(["### Rank failures", "", *parts]).rstrip() if parts else ""


def _reasons(reasons: Sequence[object], title: str) -> str:
    items = []
    for reason in reasons:
        where, check, why = (getattr(reason, name) for name in ("where", "check", "why"))
        items.append(f"- **{md_escape(where)}** {md_code(check)}: {md_escape(why)}")
    return "\n".join([f"### {title}", "", *items]) if items else ""


def picture_key(run: WorldResult, with_backend: bool) -> str:
    """A layout's part of its pictures' file names: short, unique and filesystem-safe whatever its label
    (``ws2``, ``dp2-tp2``, ``dp1-2-1a2b3c4d``; a script's loader and the backend where they tell runs
    apart)."""
    layout = run.layout if run.layout is not None else Layout.plain(run.world_size)
    parts = [file_safe(run.loader)] if run.loader else []
    parts.append(layout.file_name)
    if with_backend:
        parts.append(file_safe(run.backend))
    return "-".join(parts)


def picture_names(view: ReportView, stem: str) -> list[PictureFile]:
    """Every picture with the file name the Markdown report links it by: ``<stem>-<key>-<kind>.svg``,
    the key from :func:`picture_key` (a label of any length or alphabet gives a short, distinct name)."""
    return [
        replace(item, name=f"{stem}-{picture_key(item.run, view.with_backend)}-{item.picture.kind}.svg")
        for item in picture_files(view, stem)
    ]


def _pictures(view: ReportView, drawn: Sequence[PictureFile]) -> str:
    blocks: list[str] = []
    last: object = None
    labels = {id(row.run): row.label for row in view.rows}
    for item in drawn:
        if item.run is not last:
            blocks.append(f"**{md_escape(labels.get(id(item.run), ''))}**")
            last = item.run
        blocks.append(f"![{md_escape(item.picture.title)}]({quote(item.name)})")
    return "\n\n".join(["### Pictures", *blocks]) if blocks else ""


def _resume(view: ReportView, pictures: dict[int, PictureFile]) -> str:
    """Per layout its restores, under the picture of its failed and refused ones (one bar per rank)
    where the pictures are written (``pictures``: by the id of the layout's run)."""
    blocks: list[str] = []
    for row in view.rows:
        if not row.run.resume:
            continue
        rows = [
            [*map(md_escape, resume_cells(stop)), md_escape(stop.note or NOT_RUN)] for stop in row.run.resume
        ]
        picture = pictures.get(id(row.run))
        drawn = ""
        if picture is not None:
            caption = md_escape(resume_caption(view, row))
            drawn = f"![{md_escape(picture.picture.title)}]({quote(picture.name)})\n\n{caption}\n\n"
        blocks.append(f"**{md_escape(row.label)}**\n\n{drawn}{_table(rows, RESUME_HEADERS)}")
    return "\n\n".join(["### Resume", *blocks]) if blocks else ""


def _divergence(view: ReportView) -> str:
    headers = ["metric", "reference", "naive DDP", "corrected DDP", "naive diff", "corrected diff", "cause"]
    blocks: list[str] = []
    for row in view.rows:
        if not row.run.divergence:
            continue
        rows = [
            [
                md_escape(metric.metric),
                fmt_number(metric.reference),
                fmt_number(metric.naive),
                fmt_number(metric.corrected),
                fmt_diff(metric.naive_diff),
                fmt_diff(metric.corrected_diff),
                md_escape(divergence_cause(metric)),
            ]
            for metric in row.run.divergence
        ]
        blocks.append(f"**{md_escape(row.label)}**\n\n{_table(rows, headers)}")
    return "\n\n".join(["### Divergence", *blocks]) if blocks else ""


def _notes(result: CheckResult) -> str:
    items = [f"- {md_escape(note)}" for note in result.notes]
    return "\n".join(["### Notes", "", *items]) if items else ""


def _step(view: ReportView) -> str:
    """Per layout whose step was compared: each compared step's difference and the ranks' counts."""
    parts = []
    for table in view.step_tables:
        head = (
            f"**{md_escape(table.label)}** {table.status.upper()}, tolerance {table.tolerance:g} "
            f"({md_escape(table.dtype)})"
        )
        cells = [[md_escape(c) for c in row] for row in table.cells()]
        parts.append(f"{head}\n\n{_table(cells, [md_escape(h) for h in table.headers])}")
    return "### Training step\n\n" + "\n\n".join(parts) if parts else ""


def _metrics(view: ReportView) -> str:
    """Per layout whose evaluation was compared: each value at one process and here, and what was compared."""
    parts = []
    for table in view.metric_tables:
        head = f"**{md_escape(table.label)}** {table.status.upper()}: {md_escape(table.caption)}"
        cells = [[md_escape(c) for c in row] for row in table.cells()]
        parts.append(f"{head}\n\n{_table(cells, [md_escape(h) for h in table.headers])}")
    return "### Evaluation metrics\n\n" + "\n\n".join(parts) if parts else ""


def _mixture(view: ReportView) -> str:
    """Each source's share per rank and worker, where batches carry a source (summed over the epochs)."""
    parts = []
    for table in view.mixtures:
        source = md_escape(table.expected_from)
        head = f"**{md_escape(table.label)}** {table.status.upper()}, expected from {source}"
        cells = [[md_escape(c) for c in row] for row in table.cells()]
        parts.append(f"{head}\n\n{_table(cells, [md_escape(h) for h in table.headers])}")
    return "### Mixture\n\n" + "\n\n".join(parts) if parts else ""
