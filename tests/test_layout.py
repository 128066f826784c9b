"""The package's layout holds: no import cycles, and each layer imports only what its role allows.

Read from the source (``ast``), so a lazy import inside a function counts as much as a top-level one.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ddpcheck"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Every ddpcheck module -> the ddpcheck modules it imports anywhere in its source (not the ones
    only named for type checking)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_bytes())
        typing_only = {
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)
        }
        found: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    found.add(target)
        graph[name] = found
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state and (found := visit(dep)):
                return found
        path.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_there_are_no_import_cycles() -> None:
    graph = _imports()
    assert len(graph) > 60  # the walk really saw the package
    assert _cycle(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


CHECK_DATA = ("ddpcheck.checks.ids", "ddpcheck.checks.verdict")  # check ids and the Verdict: plain data


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [
        ("ddpcheck.reference", ("ddpcheck.",)),  # production code: torch only
        ("ddpcheck.launch", ("ddpcheck.checker", "ddpcheck.checks", "ddpcheck.scenarios", "ddpcheck.report")),
        ("ddpcheck.checks", ("ddpcheck.launch", "ddpcheck.checker", "ddpcheck.scenarios", "ddpcheck.report")),
        ("ddpcheck.report", ("ddpcheck.launch", "ddpcheck.checker", "ddpcheck.scenarios", "ddpcheck.checks")),
        ("ddpcheck.trace", ("ddpcheck.",)),
    ],
)
def test_each_layer_imports_only_what_its_role_allows(layer: str, forbidden: tuple[str, ...]) -> None:
    graph = _imports()
    offending = {
        (module, dep)
        for module, deps in graph.items()
        if module == layer or module.startswith(layer + ".")
        for dep in deps
        if dep.startswith(forbidden) and not dep.startswith((layer, *CHECK_DATA))
    }
    assert offending == set()


def test_the_pytest_surface_imports_neither_torch_nor_the_checker() -> None:
    """pytest imports the entry point in every session: it must stay cheap."""
    heavy = "('torch', 'ddpcheck.checker.runner', 'ddpcheck.launch')"
    code = f"import sys, ddpcheck.pytest_plugin.plugin; print(sorted(m for m in {heavy} if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
