"""One entry point for "render this result as format X", shared by the package API and the writer."""

from __future__ import annotations

from ddpcheck.report.formats import Format, check_format
from ddpcheck.report.github import render_github
from ddpcheck.report.html import render_html
from ddpcheck.report.json_report import render_json
from ddpcheck.report.junit import render_junit
from ddpcheck.report.markdown import render_markdown
from ddpcheck.report.table import render_table
from ddpcheck.report.view import ReportView, as_view
from ddpcheck.result import CheckResult


def render(result: CheckResult | ReportView, fmt: Format) -> str:
    """``result`` as text in ``fmt`` ("table" is uncoloured; use render_table for colour)."""
    fmt = check_format(fmt)
    result = as_view(result)
    if fmt == "table":
        return render_table(result)
    if fmt == "json":
        return render_json(result)
    if fmt == "markdown":
        return render_markdown(result)
    if fmt == "html":
        return render_html(result)
    if fmt == "github":
        return render_github(result)
    return render_junit(result)
