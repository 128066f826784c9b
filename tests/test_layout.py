"""The package's layout holds: no import cycles, each layer imports only downwards and only what its
role allows, no private name or private module crosses a package, and no room outgrows its size limits.

Read from the source (``ast``), so a lazy import inside a function counts as much as a top-level one.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGE = ROOT / "ddpcheck"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(*, typing: bool = False) -> dict[str, set[str]]:
    """Every ddpcheck module -> the ddpcheck modules it imports anywhere in its source; the ones only
    named for type checking (under ``if TYPE_CHECKING:``) too when ``typing``."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_bytes())
        typing_only = (
            set()
            if typing
            else {
                id(n)
                for node in ast.walk(tree)
                if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                for n in ast.walk(node)
            }
        )
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


def test_there_are_no_import_cycles_through_type_checking_imports_either() -> None:
    """A circle only type checkers walk is still a circle of meaning: a module that needs the types
    of one that needs its own (the run's options once manufactured the rank's, which hold a recipe
    made from the options)."""
    graph = _imports(typing=True)
    assert any(graph[m] - _imports()[m] for m in graph)  # the walk really saw TYPE_CHECKING imports
    assert _cycle(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


# the floor: the Verdict, its statuses and the check ids, the checks' typed evidence, the exit codes; plain
# data that imports nothing of ddpcheck, under one name each (no module re-exports them)
FLOOR = ("ddpcheck.verdict", "ddpcheck.evidence", "ddpcheck.exits")


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [
        ("ddpcheck.reference", ("ddpcheck.",)),  # production code: torch only
        ("ddpcheck.launch", ("ddpcheck.checker", "ddpcheck.checks", "ddpcheck.scenarios", "ddpcheck.report")),
        ("ddpcheck.checks", ("ddpcheck.launch", "ddpcheck.checker", "ddpcheck.scenarios", "ddpcheck.report")),
        ("ddpcheck.report", ("ddpcheck.launch", "ddpcheck.checker", "ddpcheck.scenarios", "ddpcheck.checks")),
        ("ddpcheck.trace", ("ddpcheck.",)),
        ("ddpcheck.eval_trace", ("ddpcheck.",)),
    ],
)
def test_each_layer_imports_only_what_its_role_allows(layer: str, forbidden: tuple[str, ...]) -> None:
    graph = _imports()
    offending = {
        (module, dep)
        for module, deps in graph.items()
        if module == layer or module.startswith(layer + ".")
        for dep in deps
        if dep.startswith(forbidden) and not dep.startswith(layer)
    }
    assert offending == set()


# Top to bottom; a module imports only from its own package or from a lower level.
LEVELS = (
    (
        "ddpcheck.cli", "ddpcheck.cli_values", "ddpcheck.cli_run", "ddpcheck.record", "ddpcheck.__main__",
        "ddpcheck.pytest_plugin", "ddpcheck.testing",
        "ddpcheck.strategies", "ddpcheck.hygiene", "ddpcheck.progress", "ddpcheck.config",
    ),
    ("ddpcheck.session",),
    ("ddpcheck.scenarios",),
    ("ddpcheck.checker",),
    ("ddpcheck.launch", "ddpcheck.checks", "ddpcheck.reference", "ddpcheck.report"),
    ("ddpcheck.trace", "ddpcheck.eval_trace", "ddpcheck.tracefile", "ddpcheck.result", "ddpcheck.restores",
     "ddpcheck.figures", "ddpcheck.layout", "ddpcheck.messages", "ddpcheck.options", "ddpcheck.recorded",
     "ddpcheck.wire", "ddpcheck"),
    FLOOR,
)  # fmt: skip


def _unit(module: str) -> tuple[int, str]:
    """(level, package) of a module: the most specific entry of LEVELS that contains it."""
    best: tuple[int, str] | None = None
    for level, names in enumerate(LEVELS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and (
                best is None or len(name) > len(best[1])
            ):
                best = (level, name)
    assert best is not None, f"{module} is in no level of LEVELS: place it"
    return best


def test_each_module_imports_only_downwards() -> None:
    graph = _imports()
    upwards = {
        (module, dep) for module, deps in graph.items() for dep in deps if _unit(dep)[0] < _unit(module)[0]
    }
    assert upwards == set()


def test_the_level_of_a_module_is_its_most_specific_entry() -> None:
    assert _unit("ddpcheck.session.run") == (1, "ddpcheck.session")
    assert _unit("ddpcheck.verdict") == (6, "ddpcheck.verdict")  # the floor, below every other module
    assert _unit("ddpcheck.checks.overlap") == (4, "ddpcheck.checks")
    assert _private("ddpcheck.checks._format") and _private("ddpcheck.launch.rank._error_message")
    assert not _private("ddpcheck.launch.rank.error_message") and not _private("ddpcheck.__version__")


def _private_imports() -> set[tuple[str, str]]:
    """(module, what) for every private name or private module it takes from another package."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    found = set()
    for name, path in modules.items():
        mine = _unit(name)[1]
        tree = ast.parse(path.read_bytes())
        aliases: dict[str, str] = {}  # local name -> ddpcheck module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ddpcheck"):
                source = node.module
                for alias in node.names:
                    target = f"{source}.{alias.name}"
                    if target in modules:
                        aliases[alias.asname or alias.name] = target
                    if _unit(source)[1] != mine and (_private(source) or _private(alias.name)):
                        found.add((name, target))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("ddpcheck"):
                        if alias.asname:
                            aliases[alias.asname] = alias.name
                        if _unit(alias.name)[1] != mine and _private(alias.name):
                            found.add((name, alias.name))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                bound = aliases.get(node.value.id)
                if bound and _unit(bound)[1] != mine and _private(node.attr):
                    found.add((name, f"{bound}.{node.attr}"))
    return found


def _private(dotted: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in dotted.split("."))


def test_the_floor_imports_nothing_of_ddpcheck() -> None:
    """The Verdict, the check ids, the evidence and the exit codes are the bottom: every layer reads them,
    so they read nothing (the evidence is named for type checkers only), and no arrow runs back up."""
    graph = _imports(typing=False)
    assert {m: graph[m] for m in FLOOR} == {m: set() for m in FLOOR}
    assert "ddpcheck.evidence" in _imports(typing=True)["ddpcheck.verdict"]  # the walk sees the type


def _defined(module: str) -> set[str]:
    """The names a module defines at its top level (classes, functions, assignments)."""
    tree = ast.parse((PACKAGE.parent / (module.replace(".", "/") + ".py")).read_bytes())
    names = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    for node in tree.body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def test_the_floors_names_are_imported_from_the_floor() -> None:
    """One name for one thing: a Verdict, a check id, an evidence class or an exit code is imported from
    the module that defines it, never through a module that passes it on."""
    floor = {name: module for module in FLOOR for name in _defined(module)}
    assert {"Verdict", "COVERAGE", "WorkBalance", "EXIT_BAD_INPUT"} <= set(floor)
    passed_on = {
        f"{path.relative_to(ROOT)}:{node.lineno} {node.module}.{alias.name}"
        for path in [
            *PACKAGE.rglob("*.py"),
            *(ROOT / "tests").glob("*.py"),
            *(ROOT / "benchmarks").glob("*.py"),
        ]
        for node in ast.walk(ast.parse(path.read_bytes()))
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ddpcheck")
        for alias in node.names
        if alias.name in floor and node.module != floor[alias.name]
    }
    assert sorted(passed_on) == []


# the front ends, the session, the scenarios, the rank side and the launcher launch, read and wrap: a verdict
# is built and rewritten in checks/ only
NO_VERDICTS = ("ddpcheck.session", "ddpcheck.checker", "ddpcheck.scenarios", "ddpcheck.launch", *LEVELS[0])
STATUS_WORDS = frozenset({"pass", "fail", "skip", "n/a", "allowed"})
STATUS_NAMES = frozenset({"PASS", "FAIL", "SKIP", "NOT_APPLICABLE", "ALLOWED"})
BUILDERS = frozenset({"Verdict", "passed", "skipped", "failed", "not_applicable", "allow"})
VERDICT_FIELDS = frozenset({"status", "detail", "cause", "fix", "evidence"})  # replace(v, status=...)


def _verdicts_made(module: str) -> list[str]:
    """What builds or rewrites a verdict in ``module``'s source, as ``module:line what``: a call of
    ``Verdict`` or of a builder of :mod:`ddpcheck.verdict`, a ``replace(`` of a verdict's fields, a status
    assigned (``.status =``, ``status=PASS``) or written as a literal (a rank's own ``status`` of its run,
    "ok" or "error", is not a verdict's)."""
    path = PACKAGE.parent / (module.replace(".", "/") + ".py")
    path = path if path.exists() else path.with_suffix("") / "__init__.py"
    tree = ast.parse(path.read_bytes())
    builders = {  # the builders this module imports from the floor (``failed`` is a common local name)
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "ddpcheck.verdict"
        for alias in node.names
        if alias.name in BUILDERS
    }
    found = []
    for node in ast.walk(tree):
        call = node.func if isinstance(node, ast.Call) else None
        name = call.id if isinstance(call, ast.Name) else call.attr if isinstance(call, ast.Attribute) else ""
        if isinstance(node, ast.Call) and (name == "Verdict" or name in builders):
            found.append(f"{module}:{node.lineno} {name}(")
        if (
            isinstance(node, ast.Call)
            and name == "replace"
            and VERDICT_FIELDS & {k.arg for k in node.keywords}
        ):
            found.append(f"{module}:{node.lineno} replace(")
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Attribute) and t.attr == "status" for t in targets):
                found.append(f"{module}:{node.lineno} .status =")
        if isinstance(node, ast.Constant) and node.value in STATUS_WORDS:
            found.append(f"{module}:{node.lineno} {node.value!r}")
        if (
            isinstance(node, ast.keyword)
            and isinstance(node.value, ast.Name)
            and node.value.id in STATUS_NAMES
        ):
            found.append(f"{module}:{node.value.lineno} {node.arg}={node.value.id}")
    return found


def test_no_verdict_is_built_or_rewritten_outside_the_checks() -> None:
    modules = [m for m in _imports() if m.startswith(NO_VERDICTS)]
    assert len(modules) > 60  # the walk really saw the front ends, the session, scenarios and rank side
    assert [hit for m in modules for hit in _verdicts_made(m)] == []


def test_the_verdict_walk_finds_a_verdict_and_a_status() -> None:
    assert _verdicts_made("ddpcheck.checks.fingerprint")  # the fingerprint's rule builds them: it is a check
    assert any(hit.endswith(" allow(") for hit in _verdicts_made("ddpcheck.checks.judge"))  # --allow, once


def test_the_judges_take_plain_data_not_the_result() -> None:
    """The resume judges fill rows that the result holds: the rows are plain data below both."""
    graph = _imports()
    judges = {m for m in graph if m.startswith("ddpcheck.checks.resume")}
    assert len(judges) >= 3
    assert {(m, d) for m in judges for d in graph[m] if d == "ddpcheck.result"} == set()
    assert "ddpcheck.restores" in graph["ddpcheck.result"]


ONE_DEFINITION = ("IGNORE_INDEX", "WORLD_SIZES", "TEST_WORLD_SIZES")  # constants once copied between layers


def test_a_shared_constant_is_defined_in_one_module() -> None:
    """The rank side counts supervised labels with the ignore index the checks judge with: one
    definition, in plain data both import (``ddpcheck.options``), not a copy per layer."""
    defined: dict[str, list[str]] = {name: [] for name in ONE_DEFINITION}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_bytes()).body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            targets += [node.target] if isinstance(node, ast.AnnAssign) else []
            for target in targets:
                if isinstance(target, ast.Name) and target.id in defined:
                    defined[target.id].append(_module_name(path))
    assert defined == {name: ["ddpcheck.options"] for name in ONE_DEFINITION}


def test_no_private_name_crosses_a_package() -> None:
    assert _private_imports() == set()


def test_a_plain_type_of_the_checks_costs_no_check_and_no_numpy() -> None:
    """``ddpcheck.checks`` resolves its registry lazily: a front end that wants ``Verdict`` or a check id
    (from ``ddpcheck.verdict``) and imports the package imports neither the check modules nor numpy; the
    package's names still resolve on first use."""
    heavy = "('numpy', 'torch', 'ddpcheck.checks.registry', 'ddpcheck.checks.coverage')"
    code = (
        "import sys; from ddpcheck.verdict import Verdict, COVERAGE; import ddpcheck.checks; "
        f"print(sorted(m for m in {heavy} if m in sys.modules)); "
        "from ddpcheck.checks import REGISTRY, run_checks; print(len(REGISTRY) > 10, callable(run_checks))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["[]", "True True"]


def test_the_pytest_surface_imports_neither_torch_nor_the_checker() -> None:
    """pytest imports the entry point in every session: it must stay cheap."""
    heavy = "('torch', 'ddpcheck.session', 'ddpcheck.launch')"
    code = f"import sys, ddpcheck.pytest_plugin.plugin; print(sorted(m for m in {heavy} if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# --- sizes: no file over 800 lines, no function over 80 lines, none over 8 parameters ---

MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 80
MAX_PARAMETERS = 8  # self and cls not counted; *args and **kwargs count one each


def _sizes() -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """Every module's lines, every function's lines and parameters, by ``path`` and ``path:name``."""
    files: dict[str, int] = {}
    lengths: dict[str, int] = {}
    parameters: dict[str, int] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        name = path.relative_to(PACKAGE.parent).as_posix()
        files[name] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                where = f"{name}:{node.name}"
                lengths[where] = max(
                    lengths.get(where, 0), (node.end_lineno or node.lineno) - node.lineno + 1
                )
                a = node.args
                count = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)
                count += (a.vararg is not None) + (a.kwarg is not None)
                if a.args and a.args[0].arg in ("self", "cls"):
                    count -= 1
                parameters[where] = max(parameters.get(where, 0), count)
    return files, lengths, parameters


def test_no_file_is_over_800_lines() -> None:
    files = _sizes()[0]
    assert len(files) > 60  # the walk really saw the package
    over = {name for name, lines in files.items() if lines > MAX_FILE_LINES}
    assert over == set()


def test_no_function_is_over_80_lines() -> None:
    """The parser's option groups included: each group is a function of its own."""
    lengths = _sizes()[1]
    assert len(lengths) > 500 and lengths["ddpcheck/cli.py:build_parser"] > 10  # the walk measures
    long = {name: lines for name, lines in lengths.items() if lines > MAX_FUNCTION_LINES}
    assert long == {}


def test_no_function_takes_more_than_8_parameters() -> None:
    parameters = _sizes()[2]
    assert (
        parameters["ddpcheck/launch/group.py:run_ranks"] == 1
    )  # one GroupCall, as torchrun takes one config
    over = {name for name, count in parameters.items() if count > MAX_PARAMETERS}
    assert over == set()


# --- the files a rank writes for its parent: named in one module ---

WIRE_FILES = "ddpcheck.wire.files"
FILE_NAME_PATTERNS = re.compile(
    r"rank(\{\}|\*)\."  # rankR.trace, rankR.L.E.ids.npy, rankR.log, rankR.stacks, rank*.trace, ...
    r"|^rank\{\}$"  # a rank's folder of step windows
    r"|\.rank\{\}$"  # a rank's shard of the step's weights
    r"|fingerprint-rank[{*]|^\.fingerprint-$"
    r"|(^|\{\}|^ranks)\.(trace|spill|stacks?|ids\.npy|error\.json)$"
    r"|^(spill|array|round)\{\}"
    r"|^shm-names$"
)
FOLDER_NAMES = frozenset({"step", "params", "eval", "progress"})  # a part of a path os.path.join is given


def _file_names_spelled(source: str) -> list[str]:
    """The file names of a rank's files that ``source`` spells itself, as ``line: template``: a string or
    f-string (its fields as ``{}``) that reads as one, or a folder name given to ``os.path.join``."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    parts = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = "" if id(node) in docstrings or id(node) in parts else node.value
        else:
            text = ""
        if text and FILE_NAME_PATTERNS.search(text):
            found.append(f"{node.lineno}: {text}")
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and node.value.value in FOLDER_NAMES
            and any(isinstance(t, ast.Name) and t.id.endswith("_DIR") for t in node.targets)
        ):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.path.join", "join"):
            found += [
                f"{a.lineno}: join(..., {a.value!r})"
                for a in node.args
                if isinstance(a, ast.Constant) and a.value in FOLDER_NAMES
            ]
    return found


def test_the_files_a_rank_writes_are_named_in_one_module() -> None:
    """Traces, ids, step windows, the fingerprint verdict, the progress region, the forked ranks' files:
    the rank that writes one and the parent that reads it find it through :mod:`ddpcheck.wire.files`, so
    the two sides cannot name it two ways."""
    spelled = {
        f"{_module_name(path)}:{hit}"
        for path in PACKAGE.rglob("*.py")
        if _module_name(path) != WIRE_FILES
        for hit in _file_names_spelled(path.read_text(encoding="utf-8"))
    }
    assert sorted(spelled) == []
    owner = _file_names_spelled((PACKAGE / "wire" / "files.py").read_text(encoding="utf-8"))
    assert len(owner) >= 10  # the walk finds the names where they are spelled


def test_the_file_name_walk_finds_a_name_spelled_by_hand() -> None:
    source = (
        'import os\n"""rankR.trace in a docstring is prose"""\n'
        'a = os.path.join(out, f"rank{rank}.log")\nb = "rank*.trace"\n'
        'c = os.path.join(out, "step", "x")\nd = f"rank{\'s\' if n else \'\'} {n}"\n'
    )
    assert sorted(_file_names_spelled(source)) == ["3: rank{}.log", "4: rank*.trace", "5: join(..., 'step')"]
