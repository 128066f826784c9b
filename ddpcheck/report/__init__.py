"""Reports: render a CheckResult as a terminal table, JSON, Markdown, JUnit XML, HTML or GitHub annotations.

Reports read a :class:`~ddpcheck.result.CheckResult` and nothing else; they never recompute a check.
Names resolve lazily, so the command line can read :mod:`ddpcheck.report.formats` before anything heavy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "FORMATS": "ddpcheck.report.formats",
    "Format": "ddpcheck.report.formats",
    "render": "ddpcheck.report.dispatch",
    "ReportWriteError": "ddpcheck.report.files",
    "write_reports": "ddpcheck.report.files",
    "reasons_path": "ddpcheck.report.files",
    "render_html": "ddpcheck.report.html",
    "SCHEMA_VERSION": "ddpcheck.report.json_report",
    "render_json": "ddpcheck.report.json_report",
    "to_json_dict": "ddpcheck.report.json_report",
    "render_junit": "ddpcheck.report.junit",
    "render_markdown": "ddpcheck.report.markdown",
    "render_table": "ddpcheck.report.table",
    "render_github": "ddpcheck.report.github",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from ddpcheck.report.dispatch import render
    from ddpcheck.report.files import ReportWriteError, reasons_path, write_reports
    from ddpcheck.report.formats import FORMATS, Format
    from ddpcheck.report.github import render_github
    from ddpcheck.report.html import render_html
    from ddpcheck.report.json_report import SCHEMA_VERSION, render_json, to_json_dict
    from ddpcheck.report.junit import render_junit
    from ddpcheck.report.markdown import render_markdown
    from ddpcheck.report.table import render_table


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ddpcheck.report' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
