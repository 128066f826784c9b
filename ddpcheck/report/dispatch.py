"""One entry point for "render this result as format X", shared by the package API and the writer."""

from __future__ import annotations

from typing import Literal, cast, get_args

from ddpcheck.report.html import render_html
from ddpcheck.report.json_report import render_json
from ddpcheck.report.junit import render_junit
from ddpcheck.report.markdown import render_markdown
from ddpcheck.report.table import render_table
from ddpcheck.result import CheckResult

Format = Literal["table", "json", "markdown", "junit", "html"]
FORMATS: tuple[str, ...] = get_args(Format)


def check_format(fmt: object) -> Format:
    """``fmt`` itself when it names a report format, else a ValueError that lists the valid ones."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown report format {fmt!r}; expected one of: {', '.join(FORMATS)}")
    return cast(Format, fmt)


def render(result: CheckResult, fmt: Format) -> str:
    """``result`` as text in ``fmt`` ("table" is uncoloured; use render_table for colour)."""
    fmt = check_format(fmt)
    if fmt == "table":
        return render_table(result)
    if fmt == "json":
        return render_json(result)
    if fmt == "markdown":
        return render_markdown(result)
    if fmt == "html":
        return render_html(result)
    return render_junit(result)
