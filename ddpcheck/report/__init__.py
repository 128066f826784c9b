"""Reports: render a CheckResult as a terminal table, JSON, Markdown, JUnit XML or HTML, or write them.

Reports read a :class:`~ddpcheck.result.CheckResult` and nothing else; they never recompute a check.
"""

from ddpcheck.report.dispatch import FORMATS, Format, render
from ddpcheck.report.files import ReportWriteError, write_reports
from ddpcheck.report.html import render_html
from ddpcheck.report.json_report import SCHEMA_VERSION, render_json, to_json_dict
from ddpcheck.report.junit import render_junit
from ddpcheck.report.markdown import render_markdown
from ddpcheck.report.table import render_table

__all__ = [
    "FORMATS",
    "SCHEMA_VERSION",
    "Format",
    "ReportWriteError",
    "render",
    "render_html",
    "render_json",
    "render_junit",
    "render_markdown",
    "render_table",
    "to_json_dict",
    "write_reports",
]
