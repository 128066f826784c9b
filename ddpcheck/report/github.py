"""GitHub Actions annotations (``--format github``): one ``::error`` per failing check and crashed rank.

GitHub places an annotation by repository path and line: the loader file's ``def <factory>`` line.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

from ddpcheck.report.view import ReportView, as_view
from ddpcheck.result import CheckResult


def escape_data(text: str) -> str:
    """A workflow command's message, escaped as the runner expects."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """A workflow command's property value (file, title): ``:`` and ``,`` would end it."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def factory_line(path: str, factory: str) -> int:
    """The line of ``def <factory>`` in the loader file (the first, at any depth); 1 when not found."""
    try:
        tree = ast.parse(Path(path).read_bytes(), filename=path)
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return 1
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == factory:
            return node.lineno
    return 1


def _annotation_path(path: str) -> str:
    """Relative to the checkout when inside it: GitHub places annotations by repository path."""
    workspace = os.environ.get("GITHUB_WORKSPACE")
    if workspace:
        absolute = os.path.abspath(path)
        root = os.path.abspath(workspace)
        if os.path.commonpath([absolute, root]) == root:
            return os.path.relpath(absolute, root)
    return path


def github_annotations(result: CheckResult | ReportView, loader: str, factory: str) -> str:
    """One ``::error`` per failing check and per crashed rank, or a ``::notice`` that all passed."""
    view = as_view(result)
    file = escape_property(_annotation_path(loader))
    line = factory_line(loader, factory)
    out = []
    for row in view.rows:
        run = row.run
        where = (
            f"({row.run.label})" if run.layout is not None and run.layout.mesh else f"(W={run.world_size})"
        )
        for verdict in run.verdicts:
            if verdict.failed:
                message = verdict.detail + (f" Likely cause: {verdict.cause}" if verdict.cause else "")
                title = escape_property(f"ddpcheck {verdict.check} {where}")
                out.append(f"::error file={file},line={line},title={title}::{escape_data(message)}")
        for failure in run.failures:
            title = escape_property(f"ddpcheck rank {failure.rank} {failure.kind} {where}")
            out.append(f"::error file={file},line={line},title={title}::{escape_data(failure.message)}")
    if not out:
        sizes = ",".join(row.run.label for row in view.rows)
        out.append(
            f"::notice file={file},line={line},title=ddpcheck::every check passes at world sizes {sizes}"
        )
    return "\n".join(out)


def render_github(result: CheckResult | ReportView) -> str:
    """``result`` as annotations on its loader file (the factory the run used, ``make_loader`` by default)."""
    res = as_view(result).result
    path = res.loader.partition("::")[0]
    options = res.options.options
    return github_annotations(result, path, options.factory if options is not None else "make_loader")
