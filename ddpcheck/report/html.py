"""The report people look at: one self-contained HTML file with inline SVG pictures.

Self-contained on purpose (CI artifacts are opened offline, from a zip, or behind a proxy): no
scripts, no external stylesheets, fonts or images; the CSS is inline and the pictures are inline SVG.
Every piece of user text is HTML-escaped. The page reads top down: verdict and summary, the causes
(each once, with what it explains), the grid, the details, then pictures per world size.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

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
from ddpcheck.report.junit import xml_text
from ddpcheck.report.svg import epoch_summary, pictures
from ddpcheck.result import CheckResult, WorldResult

HTML_STACK_LINES = 80

CSS = """
:root { --ink:#1f2328; --muted:#59636e; --line:#d1d9e0; --bg:#ffffff; --soft:#f6f8fa;
  --pass:#1a7f37; --pass-bg:#dafbe1; --fail:#cf222e; --fail-bg:#ffebe9; --skip:#9a6700; --skip-bg:#fff8c5;
  --na:#59636e; --na-bg:#eff2f5; --allowed:#8250df; --allowed-bg:#fbefff; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--ink); line-height: 1.45;
  font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1040px; margin: 0 auto; padding: 24px 28px 48px; }
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
table.grid td.status { text-align: center; font-weight: 600; white-space: nowrap; }
td.pass { color: var(--pass); background: var(--pass-bg); }
td.fail { color: var(--fail); background: var(--fail-bg); }
td.skip { color: var(--skip); background: var(--skip-bg); }
td.na { color: var(--na); background: var(--na-bg); font-weight: 400; }
td.allowed { color: var(--allowed); background: var(--allowed-bg); }
td.notrun { color: var(--muted); }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.legend { color: var(--muted); font-size: 13px; }
.item { border: 1px solid var(--line); border-radius: 6px; padding: 8px 12px; margin: 0 0 8px; }
.item.fail { border-left: 4px solid var(--fail); } .item.allowed { border-left: 4px solid var(--allowed); }
.item.rank { border-left: 4px solid var(--skip); }
.item .head { font-weight: 600; }
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


def render_html(result: CheckResult) -> str:
    """The whole page as text."""
    found = causes(result)
    with_backend = show_backend(result)
    word = result.verdict_word
    facts = f"ids: {result.id_source} · epochs: {result.epochs} · exit code {result.exit_code}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>ddpcheck {word}: {_e(result.loader)}</title>",
        f"<style>{CSS}</style></head><body><main>",
        f'<h1>ddpcheck <span class="badge {"ok" if result.ok else "failed"}">{word.upper()}</span></h1>',
        f'<p class="meta">Loader <code>{_e(result.loader)}</code></p>',
        f'<p class="meta">{_e(facts)}</p>',
        f'<p class="summary" id="summary">{_e(summary_line(result))}</p>',
    ]
    parts += _causes(found, with_backend)
    parts += _grid(result, with_backend)
    parts += _details(result, found, with_backend)
    parts += _reasons(result, "skip", "Skipped (could not be judged)")
    parts += _reasons(result, "n/a", "Not applicable")
    parts += _pictures(result, with_backend)
    parts += _divergence(result, with_backend)
    parts += _resume(result, with_backend)
    if result.notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{_e(n)}</li>" for n in result.notes) + "</ul>")
    parts.append("</main></body></html>")
    return "\n".join(parts)


def _causes(found: Sequence[Cause], with_backend: bool) -> list[str]:
    if not found:
        return []
    items = []
    for cause in found:
        items.append(
            f'<li class="{cause.kind}" id="cause-{cause.number}">'
            f'<span class="cause-no">[{cause.number}]</span>'
            f"{_e(cause_title(cause))}"
            f'<span class="explains">explains: {_e(explains(cause, with_backend))}</span></li>'
        )
    return ["<h2>Causes</h2>", '<ol class="causes">', *items, "</ol>"]


def _grid(result: CheckResult, with_backend: bool) -> list[str]:
    if not result.runs:
        return ['<p class="muted">No world sizes were run.</p>']
    checks = check_columns(result)
    head = "".join(f'<th title="{_e(c)}">{_e(SHORT_LABELS.get(c, c))}</th>' for c in checks)
    rows = []
    for run in result.runs:
        cells = [f"<th>{_e(world_label(run, with_backend))}</th>"]
        for check in checks:
            status = cell_status(run, check)
            if status is None:
                cells.append(f'<td class="status notrun">{NOT_RUN}</td>')
                continue
            css = {"n/a": "na"}.get(status, status)
            tip = "; ".join(v.detail for v in run.verdicts if v.check == check and v.detail)
            title = f' title="{_e(tip)}"' if tip else ""
            cells.append(f'<td class="status {css}"{title}>{_e(STATUS_WORD.get(status, status))}</td>')
        cells.append(f"<td>{_e(_ranks(run))}</td>")
        rows.append(f'<tr data-world-size="{run.world_size}">{"".join(cells)}</tr>')
    legend = ", ".join(f"{SHORT_LABELS[c]} = {c}" for c in checks if SHORT_LABELS.get(c, c) != c)
    return [
        "<h2>Checks</h2>",
        f'<table class="grid"><thead><tr><th>world size</th>{head}<th>ranks</th></tr></thead>',
        "<tbody>",
        *rows,
        "</tbody></table>",
        f'<p class="legend">{_e(legend)}</p>',
    ]


def _ranks(run: WorldResult) -> str:
    parts = []
    if run.skipped:
        parts.append(f"skipped: {run.skipped}")
    if run.failures:
        parts.append(rank_summary(run.failures))
    return "; ".join(parts) if parts else "ok"


def _details(result: CheckResult, found: Sequence[Cause], with_backend: bool) -> list[str]:
    items: list[str] = []
    for run in result.runs:
        label = world_label(run, with_backend)
        for verdict in run.verdicts:
            if verdict.status not in ("fail", "allowed"):
                continue
            number = cause_number(found, verdict)
            ref = f' <a href="#cause-{number}">cause [{number}]</a>' if number is not None else ""
            tag = " (allowed)" if verdict.status == "allowed" else ""
            rows = "".join(
                f"<dt>{_e(name)}</dt><dd>{_e(text)}</dd>"
                for name, text in evidence(verdict, cause=number is None)
            )
            items.append(
                f'<div class="item {verdict.status}"><div class="head">[{_e(label)}] '
                f"<code>{_e(verdict.check)}</code>{tag}{ref}</div>"
                f"<div>{_e(verdict.detail or 'failed')}</div>"
                + (f"<dl>{rows}</dl>" if rows else "")
                + "</div>"
            )
        for failure in run.failures:
            body = [f'<div class="head">[{_e(label)}] rank {failure.rank} {_e(failure.kind)}</div>']
            body.append(f"<div>{_e(failure.message)}</div>")
            if failure.progress:
                body.append(f'<div class="muted">progress: {_e(failure.progress)}</div>')
            if failure.stack.strip():
                stack = "\n".join(trim_stack(failure.stack, HTML_STACK_LINES))
                summary = f"<summary>stack of rank {failure.rank}</summary>"
                body.append(f"<details>{summary}<pre>{_e(stack)}</pre></details>")
            items.append(f'<div class="item rank">{"".join(body)}</div>')
    return ["<h2>Details</h2>", *items] if items else []


def _reasons(result: CheckResult, status: str, title: str) -> list[str]:
    items = [
        f"<li><b>[{_e(where)}]</b> <code>{_e(check)}</code>: {_e(why)}</li>"
        for where, check, why in skip_reasons(result, status)
    ]
    return [f"<h2>{_e(title)}</h2>", '<ul class="reasons">', *items, "</ul>"] if items else []


def _pictures(result: CheckResult, with_backend: bool) -> list[str]:
    blocks: list[str] = []
    for run in result.runs:
        data = run.figures
        if data is None:
            continue
        found = pictures(data)
        label = world_label(run, with_backend)
        anchor = label.replace("=", "").replace(" ", "-")
        blocks.append(f'<section class="world" id="{_e(anchor)}" data-world-size="{run.world_size}">')
        heading = f"World size {run.world_size}" + (f" ({run.backend})" if with_backend else "")
        blocks.append(f"<h3>{_e(heading)}</h3>")
        if not found:
            blocks.append(f'<p class="muted">No pictures: {_e(data.note or "nothing was recorded")}.</p>')
        for picture in found:
            caption = picture.title
            if picture.kind == "samples":
                caption = "; ".join(epoch_summary(f) for f in data.epochs)
            blocks.append(
                f'<figure class="{picture.kind}">{picture.svg}<figcaption>{_e(caption)}</figcaption></figure>'
            )
        blocks.append("</section>")
    return ["<h2>Pictures</h2>", *blocks] if blocks else []


def _divergence(result: CheckResult, with_backend: bool) -> list[str]:
    headers = ["metric", "reference", "naive DDP", "corrected DDP", "naive diff", "corrected diff", "cause"]
    blocks: list[str] = []
    for run in result.runs:
        if not run.divergence:
            continue
        rows = []
        for row in run.divergence:
            numbers = (row.reference, row.naive, row.corrected)
            cells = [f"<td>{_e(row.metric)}</td>"]
            cells += [f'<td class="num">{_e(fmt_number(v))}</td>' for v in numbers]
            for diff in (row.naive_diff, row.corrected_diff):
                css = "num" + (" fail" if diff != 0 and diff == diff else "")
                cells.append(f'<td class="{css}">{_e(fmt_diff(diff))}</td>')
            cells.append(f"<td>{_e(divergence_cause(row))}</td>")
            rows.append(f"<tr>{''.join(cells)}</tr>")
        head = "".join(f"<th>{h}</th>" for h in headers)
        blocks.append(
            f"<h3>{_e(world_label(run, with_backend))}</h3>"
            f'<table class="divergence"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
        )
    return ["<h2>Metric divergence</h2>", *blocks] if blocks else []


def _resume(result: CheckResult, with_backend: bool) -> list[str]:
    blocks: list[str] = []
    for run in result.runs:
        if not run.resume:
            continue
        rows = []
        for row in run.resume:
            cells = resume_cells(row)
            css = {"n/a": "na"}.get(row.status, row.status)
            tds = [f"<td>{_e(c)}</td>" for c in cells]
            tds[3] = f'<td class="status {_e(css)}">{_e(STATUS_WORD.get(row.status, row.status))}</td>'
            tds.append(f"<td>{_e(row.note or NOT_RUN)}</td>")
            rows.append(f"<tr>{''.join(tds)}</tr>")
        head = "".join(f"<th>{h}</th>" for h in RESUME_HEADERS)
        blocks.append(
            f"<h3>{_e(world_label(run, with_backend))}</h3>"
            f'<table class="resume"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
        )
    return ["<h2>Resume</h2>", *blocks] if blocks else []
