"""The pull-request report: a GitHub-flavoured Markdown summary of a CheckResult.

User text (details, messages, loader paths) is escaped so that a ``<module>`` or a ``|`` in it can
neither vanish as HTML nor break a table; stacks go into fenced blocks inside ``<details>``.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from urllib.parse import quote

from tabulate import tabulate

from ddpcheck.report._common import (
    NOT_RUN,
    RESUME_HEADERS,
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
from ddpcheck.report.svg import picture_files
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


def render_markdown(result: CheckResult, *, figure_stem: str | None = None) -> str:
    """Headline, causes, grid, details, rank failures with stacks, skips, pictures, divergence, notes.

    With ``figure_stem`` the pictures are linked as ``<figure_stem>-ws2-samples.svg`` and so on, the
    files :func:`~ddpcheck.report.write_reports` writes next to the Markdown file.
    """
    icon = "⚠️" if result.interrupted else "✅" if result.ok else "❌"
    found = causes(result)
    blocks = [
        f"## {icon} ddpcheck {result.verdict_word}",
        md_escape(summary_line(result)),
        f"Loader {md_code(result.loader)} · ids {md_code(result.id_source)} · epochs {result.epochs}",
    ]
    if found:
        blocks.append(_causes(result, found))
    if result.runs:
        blocks.append(_grid(result))
    else:
        blocks.append("_No world sizes were run._")
    blocks += [b for b in (_failed_checks(result, found), _rank_failures(result)) if b]
    blocks += [b for b in (_skips(result, "skip", "Skipped"), _skips(result, "n/a", "Not applicable")) if b]
    if figure_stem is not None:
        blocks.append(_pictures(result, figure_stem))
    blocks += [b for b in (_divergence(result), _resume(result), _notes(result)) if b]
    return "\n\n".join(b for b in blocks if b)


def _causes(result: CheckResult, found: list[Cause]) -> str:
    with_backend = show_backend(result)
    items = [
        f"- **[{c.number}]** {md_escape(cause_title(c))}  \n"
        f"  explains: {md_escape(explains(c, with_backend))}"
        for c in found
    ]
    return "\n".join(["### Causes", "", *items])


def _status(run: WorldResult, check: str) -> str:
    status = cell_status(run, check)
    return NOT_RUN if status is None else _CELL.get(status, md_escape(status))


def _ranks(run: WorldResult) -> str:
    parts = []
    if run.skipped:
        parts.append(f"skipped: {md_escape(run.skipped)}")
    if run.failures:
        parts.append(md_escape(rank_summary(run.failures)))
    return "; ".join(parts) if parts else "ok"


def _grid(result: CheckResult) -> str:
    checks = check_columns(result)
    with_backend = show_backend(result)
    headers = ["world size", *(md_code(c) for c in checks), "ranks"]
    rows = [
        [
            md_escape(world_label(run, with_backend)),
            *(_status(run, c) for c in checks),
            _ranks(run),
        ]
        for run in result.runs
    ]
    return _table(rows, headers)


def _failed_checks(result: CheckResult, found: list[Cause]) -> str:
    with_backend = show_backend(result)
    items: list[str] = []
    for run in result.runs:
        for verdict in run.verdicts:
            if verdict.status not in ("fail", "allowed"):
                continue
            where = md_escape(world_label(run, with_backend))
            number = cause_number(found, verdict)
            tag = " (allowed)" if verdict.status == "allowed" else ""
            ref = f" (cause [{number}])" if number is not None else ""
            detail = md_escape(verdict.detail or "failed")
            items.append(f"- **{where}** {md_code(verdict.check)}{tag}{ref}: {detail}")
            for name, text in evidence(verdict, cause=number is None):
                value = md_escape(text) if name == "cause" else md_code(text)
                items.append(f"  - {name}: {value}")
    return "\n".join(["### Details", "", *items]) if items else ""


def _rank_failures(result: CheckResult) -> str:
    with_backend = show_backend(result)
    parts: list[str] = []
    for run in result.runs:
        where = world_label(run, with_backend)
        for failure in run.failures:
            line = f"- **{md_escape(where)}** rank {failure.rank} {md_escape(failure.kind)}: "
            line += md_escape(failure.message)
            if failure.progress:
                line += f" (progress: {md_escape(failure.progress)})"
            parts.append(line)
            if failure.stack.strip():
                summary = html.escape(f"stack of rank {failure.rank} at {where}")
                stack = _fence(trim_stack(failure.stack, MD_STACK_LINES))
                parts.append(f"\n<details><summary>{summary}</summary>\n\n{stack}\n\n</details>\n")
    return "\n".join(["### Rank failures", "", *parts]).rstrip() if parts else ""


def _skips(result: CheckResult, status: str, title: str) -> str:
    items = [
        f"- **{md_escape(where)}** {md_code(check)}: {md_escape(why)}"
        for where, check, why in skip_reasons(result, status)
    ]
    return "\n".join([f"### {title}", "", *items]) if items else ""


def _pictures(result: CheckResult, stem: str) -> str:
    with_backend = show_backend(result)
    blocks: list[str] = []
    last: WorldResult | None = None
    for item in picture_files(result, stem):
        if item.run is not last:
            blocks.append(f"**{md_escape(world_label(item.run, with_backend))}**")
            last = item.run
        blocks.append(f"![{md_escape(item.picture.title)}]({quote(item.name)})")
    return "\n\n".join(["### Pictures", *blocks]) if blocks else ""


def _resume(result: CheckResult) -> str:
    with_backend = show_backend(result)
    blocks: list[str] = []
    for run in result.runs:
        if not run.resume:
            continue
        rows = [[*map(md_escape, resume_cells(row)), md_escape(row.note or NOT_RUN)] for row in run.resume]
        blocks.append(f"**{md_escape(world_label(run, with_backend))}**\n\n{_table(rows, RESUME_HEADERS)}")
    return "\n\n".join(["### Resume", *blocks]) if blocks else ""


def _divergence(result: CheckResult) -> str:
    with_backend = show_backend(result)
    headers = ["metric", "reference", "naive DDP", "corrected DDP", "naive diff", "corrected diff", "cause"]
    blocks: list[str] = []
    for run in result.runs:
        if not run.divergence:
            continue
        rows = [
            [
                md_escape(row.metric),
                fmt_number(row.reference),
                fmt_number(row.naive),
                fmt_number(row.corrected),
                fmt_diff(row.naive_diff),
                fmt_diff(row.corrected_diff),
                md_escape(divergence_cause(row)),
            ]
            for row in run.divergence
        ]
        blocks.append(f"**{md_escape(world_label(run, with_backend))}**\n\n{_table(rows, headers)}")
    return "\n\n".join(["### Divergence", *blocks]) if blocks else ""


def _notes(result: CheckResult) -> str:
    items = [f"- {md_escape(note)}" for note in result.notes]
    return "\n".join(["### Notes", "", *items]) if items else ""
