"""The report people look at: one self-contained HTML file with inline SVG pictures.

Self-contained on purpose (CI artifacts are opened offline, from a zip, or behind a proxy): no
scripts, no external stylesheets, fonts or images; the CSS is inline and the pictures are inline SVG.
Every piece of user text is HTML-escaped. The page reads top down: verdict and summary, the causes
(each once, with what it explains and how to fix it), the grid (its cells link to the cause or the
pictures; it fits the page: check names stand upright, long cells wrap), the pictures per layout with
failing layouts first, the resume restores (a picture of the failed and refused ones above their
table), then the evidence, one card per cause.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from ddpcheck.figures import PACKED_NOTE
from ddpcheck.report.junit import xml_text
from ddpcheck.report.rows import Row
from ddpcheck.report.svg import epoch_summary, failed_checks, mixture_svg, pictures, resume_svg
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
    resume_caption,
    resume_cells,
    same_failures,
    trim_stack,
)
from ddpcheck.result import CheckResult
from ddpcheck.verdict import SHORT_LABELS

HTML_STACK_LINES = 80
OUTCOME_CSS = {"exact": "pass", "resharded": "pass", "refused": "refused", "failed": "fail"}
RESUME_LEGEND = (
    "exact = the stream continues exactly; resharded = another topology, the epoch still covered once; "
    "refused (grey) = the restore raised a clear error, an honest answer rather than a pass or a loss; "
    "failed = samples silently lost or repeated"
)

CSS = """
:root { --ink:#1f2328; --muted:#59636e; --line:#d1d9e0; --bg:#ffffff; --soft:#f6f8fa;
  --pass:#1a7f37; --pass-bg:#dafbe1; --fail:#cf222e; --fail-bg:#ffebe9; --skip:#9a6700; --skip-bg:#fff8c5;
  --na:#59636e; --na-bg:#eff2f5; --allowed:#8250df; --allowed-bg:#fbefff; --refused:#424a53;
  --refused-bg:#e6eaef; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--ink); line-height: 1.45;
  font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1200px; margin: 0 auto; padding: 24px 28px 48px; }
h1 { font-size: 26px; margin: 0 0 6px; display: flex; align-items: center; gap: 12px; }
h2 { font-size: 19px; margin: 32px 0 10px; padding-bottom: 6px; border-bottom: 1px solid var(--line); }
h3 { font-size: 16px; margin: 22px 0 8px; }
code, pre { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace;
  font-size: 13px; }
code { background: var(--soft); padding: 1px 5px; border-radius: 4px; }
pre { background: var(--soft); padding: 10px 12px; border-radius: 6px; overflow-x: auto; }
.badge { font-size: 14px; font-weight: 700; padding: 3px 10px; border-radius: 999px; color: #fff; }
.badge.ok { background: var(--pass); } .badge.failed { background: var(--fail); }
.meta { color: var(--muted); margin: 0 0 4px; }
.summary { font-weight: 600; margin: 8px 0 0; }
ol.causes { padding-left: 0; list-style: none; margin: 0; }
ol.causes li { border-left: 4px solid var(--fail); background: var(--fail-bg); padding: 8px 12px;
  margin: 0 0 8px; border-radius: 0 6px 6px 0; }
ol.causes li.allowed { border-color: var(--allowed); background: var(--allowed-bg); }
ol.causes li.rank { border-color: var(--skip); background: var(--skip-bg); }
.cause-no { font-weight: 700; margin-right: 6px; }
.explains { color: var(--muted); display: block; margin-top: 2px; }
table { border-collapse: collapse; margin: 6px 0 12px; font-size: 14px; }
th, td { border: 1px solid var(--line); padding: 5px 9px; text-align: left; vertical-align: top; }
th { background: var(--soft); font-weight: 600; }
div.grid { max-width: 100%; overflow-x: auto; }
table.grid { font-size: 13px; }
table.grid th, table.grid td { padding: 4px 5px; }
table.grid thead th.check { vertical-align: bottom; text-align: center; }
table.grid thead th.check span { writing-mode: vertical-rl; transform: rotate(180deg); white-space: nowrap; }
table.grid td.status { text-align: center; font-weight: 600; white-space: nowrap; padding: 4px 2px;
  font-size: 11px; }
table.grid tbody th, table.grid td.ranks, table.grid td.num { overflow-wrap: anywhere; min-width: 4em; }
table.grid td.ranks { min-width: 8em; }
td.pass { color: var(--pass); background: var(--pass-bg); }
td.fail { color: var(--fail); background: var(--fail-bg); }
td.skip { color: var(--skip); background: var(--skip-bg); }
td.na { color: var(--na); background: var(--na-bg); font-weight: 400; }
td.allowed { color: var(--allowed); background: var(--allowed-bg); }
td.refused { color: var(--refused); background: var(--refused-bg); font-weight: 400; }
td.notrun { color: var(--muted); }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.legend { color: var(--muted); font-size: 13px; }
.item { border: 1px solid var(--line); border-radius: 6px; padding: 8px 12px; margin: 0 0 8px; }
.item.fail { border-left: 4px solid var(--fail); } .item.allowed { border-left: 4px solid var(--allowed); }
.item.rank { border-left: 4px solid var(--skip); }
.item .head { font-weight: 600; }
.item .finding { margin: 6px 0 0; } .fix { display: block; margin-top: 2px; font-weight: 600; }
td.status a, th a { color: inherit; }
.item dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 6px 0 0; }
.item dt { color: var(--muted); } .item dd { margin: 0; }
ul.reasons li { margin: 2px 0; }
figure { margin: 12px 0 20px; }
figure svg { display: block; max-width: 100%; height: auto; border: 1px solid var(--line); border-radius: 6px;
  background: #fff; }
figcaption { color: var(--muted); font-size: 13px; margin-top: 4px; }
.muted { color: var(--muted); }
a { color: #0969da; text-decoration: none; } a:hover { text-decoration: underline; }
"""


def _e(text: object) -> str:
    return escape(xml_text(str(text)), quote=True)


def render_html(result: CheckResult | ReportView) -> str:
    """The whole page as text."""
    view = as_view(result)
    res = view.result
    word = res.verdict_word
    facts = f"ids: {res.id_source} · epochs: {res.epochs} · exit code {res.exit_code}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>ddpcheck {word}: {_e(res.loader)}</title>",
        f"<style>{CSS}</style></head><body><main>",
        f'<h1>ddpcheck <span class="badge {"ok" if res.ok else "failed"}">{word.upper()}</span></h1>',
        f'<p class="meta">{view.subject} <code>{_e(res.loader)}</code></p>',
        f'<p class="meta">{_e(facts)}</p>',
        f'<p class="summary" id="summary">{_e(view.summary())}</p>',
    ]
    parts += _causes(view)
    parts += _grid(view)
    parts += _pictures(view)
    parts += _resume(view)  # restores that lose samples are as much a finding as the pictures above
    parts += _mixture(view)
    parts += _step(view)
    parts += _metrics(view)
    parts += _details(view)
    parts += _divergence(view)
    parts += _reasons(view.skipped, "Skipped (could not be judged)")
    parts += _reasons(view.not_applicable, "Not applicable")
    if res.notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{_e(n)}</li>" for n in res.notes) + "</ul>")
    parts.append("</main></body></html>")
    return "\n".join(parts)


def _causes(view: ReportView) -> list[str]:
    if not view.causes:
        return []
    items = []
    for cause in view.causes:
        fix = f'<span class="fix">fix: {_e(cause.fix)}</span>' if cause.fix else ""
        items.append(
            f'<li class="{cause.kind}" id="cause-{cause.number}">'
            f'<span class="cause-no">[{cause.number}]</span>'
            f"{_e(cause.title)}"
            f'<span class="explains">explains: {_e(cause.explains)}</span>{fix}'
            f' <a class="evidence" href="#evidence-{cause.number}">evidence</a></li>'
        )
    return ["<h2>Causes</h2>", '<ol class="causes">', *items, "</ol>"]


def _grid(view: ReportView) -> list[str]:
    if not view.rows:
        return ['<p class="muted">No world sizes were run.</p>']
    head = "".join(
        f'<th class="check" title="{_e(c)}"><span>{_e(SHORT_LABELS.get(c, c))}</span></th>'
        for c in view.columns
    )
    padding = any(row.padding for row in view.rows)
    idle = any(row.idle for row in view.rows)
    rows = []
    for row in view.grid_rows:
        pictured = row.run.figures is not None
        shown = row.short if view.loader_column else row.label
        label = f'<a href="#{_e(row.anchor)}">{_e(shown)}</a>' if pictured else _e(shown)
        cells = [f"<th>{_e(row.loader)}</th>"] if view.loader_column else []
        cells.append(f"<th>{label}</th>")
        for cell in (row.cell(c) for c in view.columns):
            if cell.status is None:
                cells.append(f'<td class="status notrun">{NOT_RUN}</td>')
                continue
            css = {"n/a": "na"}.get(cell.status, cell.status)
            title = f' title="{_e(cell.tip)}"' if cell.tip else ""
            word = _e(STATUS_WORD.get(cell.status, cell.status))
            target = (
                f"#cause-{cell.cause}" if cell.cause is not None else f"#{row.anchor}" if pictured else ""
            )
            text = f'<a href="{_e(target)}">{word}</a>' if target else word
            cells.append(f'<td class="status {css}"{title}>{text}</td>')
        if padding:
            cells.append(f'<td class="num">{_e(row.padding or NOT_RUN)}</td>')
        if idle:
            cells.append(f'<td class="num">{_e(row.idle or NOT_RUN)}</td>')
        cells.append(f'<td class="ranks">{_e(row.ranks)}</td>')
        rows.append(f'<tr data-world-size="{row.run.world_size}">{"".join(cells)}</tr>')
    pad_head = ("<th>padding</th>" if padding else "") + ("<th>idle</th>" if idle else "")
    named = "<th>loader</th>" if view.loader_column else ""
    return [
        "<h2>Checks</h2>",
        f'<div class="grid"><table class="grid"><thead><tr>{named}<th>world size</th>{head}{pad_head}'
        "<th>ranks</th></tr></thead><tbody>",
        *rows,
        "</tbody></table></div>",
        f'<p class="legend">{_e(view.legend)}</p>',
    ]


def _details(view: ReportView) -> list[str]:
    """One card per cause: what it explains, how to fix it, each failing check's evidence once."""
    items: list[str] = []
    for cause in view.causes:
        if not cause.findings:
            continue
        body = [f'<div class="head">Evidence for cause [{cause.number}]</div>']
        if cause.fix:
            body.append(f'<div class="fix">fix: {_e(cause.fix)}</div>')
        for finding in cause.findings:
            also = f" (also {_e(', '.join(finding.also))})" if finding.also else ""
            tag = " (allowed)" if finding.status == "allowed" else ""
            rows = "".join(f"<dt>{_e(name)}</dt><dd>{_e(text)}</dd>" for name, text in finding.evidence)
            head = f"<b>{_e(finding.where)}</b> <code>{_e(finding.check)}</code>{tag}{also}"
            evidence = f"<dl>{rows}</dl>" if rows else ""
            body.append(f'<div class="finding">{head}: {_e(finding.detail)}{evidence}</div>')
        items.append(f'<div class="item {cause.kind}" id="evidence-{cause.number}">{"".join(body)}</div>')
    for entries in same_failures(view.failures):
        entry, failure = entries[0], entries[0].failure
        number = f"[{entry.cause}] " if entry.cause is not None else ""
        anchor = f' id="evidence-{entry.cause}"' if entry.cause is not None else ""
        count = f" (x{len(entries)})" if len(entries) > 1 else ""
        body = [f'<div class="head">{number}{_e(failure_ranks(entries))} {_e(failure.kind)}{count}</div>']
        body.append(f"<div>{_e(failure.message)}</div>")
        if failure.progress:
            body.append(f'<div class="muted">progress: {_e(failure.progress)}</div>')
        if failure.stack.strip():
            stack = "\n".join(trim_stack(failure.stack, HTML_STACK_LINES))
            first = " (the first)" if len(entries) > 1 else ""
            summary = f"<summary>stack of rank {failure.rank}{first}</summary>"
            body.append(f"<details>{summary}<pre>{_e(stack)}</pre></details>")
        if failure.output.strip():
            summary = f"<summary>last output lines of rank {failure.rank}</summary>"
            body.append(f"<details open>{summary}<pre>{_e(failure.output)}</pre></details>")
        items.append(f'<div class="item rank"{anchor}>{"".join(body)}</div>')
    return ["<h2>Details</h2>", *items] if items else []


def _reasons(reasons: Sequence[object], title: str) -> list[str]:
    items = []
    for reason in reasons:
        where, check, why = (getattr(reason, name) for name in ("where", "check", "why"))
        items.append(f"<li><b>[{_e(where)}]</b> <code>{_e(check)}</code>: {_e(why)}</li>")
    return [f"<h2>{_e(title)}</h2>", '<ul class="reasons">', *items, "</ul>"] if items else []


def _pictures(view: ReportView) -> list[str]:
    blocks: list[str] = []
    for row in view.pictured:
        data = row.run.figures
        if data is None:
            continue
        found = pictures(data, failed_checks(row.run))
        blocks.append(f'<section class="world" id="{_e(row.anchor)}" data-world-size="{row.run.world_size}">')
        blocks.append(f"<h3>{_e(_heading(row, view.with_backend))}</h3>")
        if not found:
            blocks.append(f'<p class="muted">No pictures: {_e(data.note or "nothing was recorded")}.</p>')
        for picture in found:
            caption = picture.title
            if picture.kind == "samples":  # rows packed per rank: no row count says anything of coverage
                caption = (
                    PACKED_NOTE if data.packed_rows else "; ".join(epoch_summary(f) for f in data.epochs)
                )
            blocks.append(
                f'<figure class="{picture.kind}">{picture.svg}<figcaption>{_e(caption)}</figcaption></figure>'
            )
        blocks.append("</section>")
    return ["<h2>Pictures</h2>", *blocks] if blocks else []


def _heading(row: Row, with_backend: bool) -> str:
    run = row.run
    name = (
        f"Mesh {run.label}" if run.layout is not None and run.layout.mesh else f"World size {run.world_size}"
    )
    return name + (f" ({run.backend})" if with_backend else "")


def _divergence(view: ReportView) -> list[str]:
    headers = ["metric", "reference", "naive DDP", "corrected DDP", "naive diff", "corrected diff", "cause"]
    blocks: list[str] = []
    for row in view.rows:
        if not row.run.divergence:
            continue
        lines = []
        for metric in row.run.divergence:
            numbers = (metric.reference, metric.naive, metric.corrected)
            cells = [f"<td>{_e(metric.metric)}</td>"]
            cells += [f'<td class="num">{_e(fmt_number(v))}</td>' for v in numbers]
            for diff in (metric.naive_diff, metric.corrected_diff):
                css = "num" + (" fail" if diff != 0 and diff == diff else "")
                cells.append(f'<td class="{css}">{_e(fmt_diff(diff))}</td>')
            cells.append(f"<td>{_e(divergence_cause(metric))}</td>")
            lines.append(f"<tr>{''.join(cells)}</tr>")
        head = "".join(f"<th>{h}</th>" for h in headers)
        blocks.append(
            f"<h3>{_e(row.label)}</h3>"
            f'<table class="divergence"><thead><tr>{head}</tr></thead><tbody>{"".join(lines)}</tbody></table>'
        )
    return ["<h2>Metric divergence</h2>", *blocks] if blocks else []


def _resume(view: ReportView) -> list[str]:
    blocks: list[str] = []
    for row in view.rows:
        if not row.run.resume:
            continue
        lines = []
        for stop in row.run.resume:
            cells = resume_cells(stop)
            css = OUTCOME_CSS.get(stop.outcome) or {"n/a": "na"}.get(stop.status, stop.status)
            tds = [f"<td>{_e(c)}</td>" for c in cells]
            word = stop.outcome or STATUS_WORD.get(stop.status, stop.status)
            tds[3] = f'<td class="status {_e(css)}">{_e(word)}</td>'
            tds.append(f"<td>{_e(stop.note or NOT_RUN)}</td>")
            lines.append(f"<tr>{''.join(tds)}</tr>")
        head = "".join(f"<th>{h}</th>" for h in RESUME_HEADERS)
        blocks.append(f'<section class="resume" id="resume-{_e(row.anchor)}"><h3>{_e(row.label)}</h3>')
        if row.bad_restores:
            svg = resume_svg(row.bad_restores, row.label)
            caption = resume_caption(view, row)
            blocks.append(f'<figure class="resume">{svg}<figcaption>{_e(caption)}</figcaption></figure>')
        blocks.append(
            f'<table class="resume"><thead><tr>{head}</tr></thead><tbody>{"".join(lines)}</tbody></table>'
            f'<p class="legend">{_e(RESUME_LEGEND)}</p></section>'
        )
    return ["<h2>Resume</h2>", *blocks] if blocks else []


def _step(view: ReportView) -> list[str]:
    """Per layout whose step was compared with one process's: each compared step's relative difference as
    a bar against the tolerance, and the ranks' micro-batches, samples and supervised labels."""
    blocks: list[str] = []
    for table in view.step_tables:
        head = "".join(f"<th>{_e(h)}</th>" for h in table.headers)
        rows = []
        for cells in table.cells():
            rows.append("<tr>" + "".join(f'<td class="num">{_e(c)}</td>' for c in cells) + "</tr>")
        css = {"n/a": "na"}.get(table.status, table.status)
        word = _e(STATUS_WORD.get(table.status, table.status))
        caption = f"The DDP step against one process's, {table.label}"
        blocks.append(
            f'<section class="step" id="{_e(table.anchor)}"><h3>{_e(table.label)} '
            f'<span class="status {css}">{word}</span></h3>'
            f'<p class="muted">tolerance {table.tolerance:g} for {_e(table.dtype)}</p>'
            f'<table class="step"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
            f'<figure class="step">{table.svg()}<figcaption>{_e(caption)}</figcaption></figure></section>'
        )
    return ["<h2>Training step</h2>", *blocks] if blocks else []


def _metrics(view: ReportView) -> list[str]:
    """Per layout whose evaluation was compared with one process's: each reported value at one process and
    at this layout (every rank's), whether they agree, the evaluations compared and the eval set's split."""
    blocks: list[str] = []
    for table in view.metric_tables:
        head = "".join(f"<th>{_e(h)}</th>" for h in table.headers)
        rows = []
        for cells in table.cells():
            css = ' class="fail"' if cells[-1] == "NO" else ""
            rows.append(f"<tr{css}>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
        status = {"n/a": "na"}.get(table.status, table.status)
        word = _e(STATUS_WORD.get(table.status, table.status))
        blocks.append(
            f'<section class="metric" id="{_e(table.anchor)}"><h3>{_e(table.label)} '
            f'<span class="status {status}">{word}</span></h3><p class="muted">{_e(table.caption)}</p>'
            f'<table class="metric"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
            "</section>"
        )
    return ["<h2>Evaluation metrics</h2>", *blocks] if blocks else []


def _mixture(view: ReportView) -> list[str]:
    """Per layout whose batches carry a source: each source's share per rank and worker, a table and a bar
    picture (the expected shares as ticks)."""
    blocks: list[str] = []
    for table in view.mixtures:
        head = "".join(f"<th>{_e(h)}</th>" for h in table.headers)
        rows = []
        for cells in table.cells():
            tds = [f"<th>{_e(cells[0])}</th>", *(f'<td class="num">{_e(c)}</td>' for c in cells[1:])]
            rows.append(f"<tr>{''.join(tds)}</tr>")
        css = {"n/a": "na"}.get(table.status, table.status)
        word = _e(STATUS_WORD.get(table.status, table.status))
        svg = mixture_svg(table.sources, table.groups, table.label)
        blocks.append(
            f'<section class="mixture" id="{_e(table.anchor)}"><h3>{_e(table.label)} '
            f'<span class="status {css}">{word}</span></h3>'
            f'<p class="muted">expected from {_e(table.expected_from)}; shares summed over the epochs</p>'
            f'<table class="mixture"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
            f'<figure class="mixture">{svg}'
            f"<figcaption>{_e('Shares of each source, ' + table.label)}</figcaption>"
            "</figure></section>"
        )
    return ["<h2>Mixture</h2>", *blocks] if blocks else []
