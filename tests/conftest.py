"""Paths every test module shares (import them: ``from tests.conftest import FIXTURES``), the test
session's own cache directories, and the fast lane (``pytest -m "not slow"``).

Caches: the suite must never write into the user's home caches (``~/.cache/torch_extensions``,
``huggingface``, ``matplotlib``, ...), and what an earlier run left there (a lock from a killed compile)
must not change this one. So this module, which pytest imports before any test module imports torch,
DeepSpeed, HF ``datasets`` or matplotlib, points every cache those libraries read at a fresh directory
of this session (:data:`CACHE_VARS`). The environment is inherited: pytest-xdist's workers, the ranks
ddpcheck forks and every subprocess a test starts with ``os.environ`` use the same directory, whose
libraries lock their own entries (torch's extension builds, HF's file locks). The process that
created it (the xdist controller, or pytest alone) removes it at the end.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Hypothesis: no per-example deadline and no "generation is slow" health check. The suite runs on shared
# CI machines under xdist, where a slow example is load, not a bug (time is measured by benchmarks/).
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")

ROOT = Path(__file__).resolve().parent.parent  # the repository
FIXTURES = ROOT / "fixtures"  # example loader files, good and buggy
FRAMEWORKS = FIXTURES / "frameworks"  # loaders built with real libraries
RESUME_FIXTURES = FIXTURES / "resume"
DATA = ROOT / "tests" / "data"  # loader files only the tests use
HOSTILE = DATA / "hostile"
GOOD = FIXTURES / "good_distributed_sampler.py"  # the textbook loader: passes everything
JUNIT_XSD = DATA / "junit-10.xsd"  # the JUnit schema CI systems read (tests/data/junit-10.README.md)

CACHE_ROOT_VAR = "DDPCHECK_TEST_CACHES"  # the session's cache directory, inherited by workers and ranks
CACHE_VARS = {  # variable -> directory under the session's root; XDG_CACHE_HOME covers the rest of ~/.cache
    "XDG_CACHE_HOME": "xdg-cache",
    "TORCH_EXTENSIONS_DIR": "torch_extensions",  # DeepSpeed's and torch's JIT-built C++ ops
    "TORCH_HOME": "torch",
    "TRITON_CACHE_DIR": "triton",
    "HF_HOME": "huggingface",
    "HF_DATASETS_CACHE": "huggingface/datasets",
    "MPLCONFIGDIR": "matplotlib",
}


def _session_caches() -> tuple[Path, bool]:
    """The session's cache root (created here unless a parent process of this session made it), and
    whether this process owns it; every variable of :data:`CACHE_VARS` points into it."""
    inherited = os.environ.get(CACHE_ROOT_VAR, "")
    owned = not (inherited and Path(inherited).is_dir())
    root = Path(tempfile.mkdtemp(prefix="ddpcheck-test-caches-")) if owned else Path(inherited)
    os.environ[CACHE_ROOT_VAR] = str(root)
    for var, sub in CACHE_VARS.items():
        (root / sub).mkdir(parents=True, exist_ok=True)
        os.environ[var] = str(root / sub)
    return root, owned


CACHES, _OWN_CACHES = _session_caches()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _OWN_CACHES:
        shutil.rmtree(CACHES, ignore_errors=True)


# --- the fast lane ---------------------------------------------------------------------------------------
# ``pytest -m "not slow"`` leaves out the end-to-end tests; CI runs the whole suite (README command 2).
# A test is end-to-end, and marked ``slow`` here, when it (or a helper or fixture of its module that it
# uses) starts another interpreter (``subprocess``, pytester's subprocess runs) or a whole ddpcheck run
# (``check_loader``, ``check_script``), so a new test of that kind joins the slow lane without anyone
# remembering to mark it. Tests that fork a process group of their own (``run_ranks``, the ``ddp`` marker)
# stay: a group starts in a fraction of a second. An explicit ``@pytest.mark.slow`` marks the rest (a
# whole run through ``cli.main`` in process, a test that waits for a deadline).
END_TO_END = frozenset({"check_loader", "check_script", "runpytest_subprocess"})
# Measured: over 5 s each in a serial run of the fast lane on the 2-core machine (load 11, 2026-11-26),
# with DataLoader workers, a framework imported in every rank, fresh interpreters or a gigabyte of output.
MEASURED_SLOW = (
    "tests/test_hostile_launch.py::test_accelerate_sets_itself_up_from_the_environment_and_reuses_*",
    "tests/test_hostile_launch.py::test_a_rank_writing_a_gigabyte_to_stdout_costs_the_parent_a_bounded_tail",
    "tests/test_first_day_rank.py::test_ranks_that_hash_strings_run_again_as_fresh_interpreters",
    "tests/test_launch.py::test_targets_are_found_by_name_under_spawn",
    "tests/test_reference_resume.py::test_interrupted_loader_resumes_exactly[[]*-stateful-workers]",
    "tests/test_reference_resume.py::test_elastic_loader_resume_covers_the_epoch[[]*-stateful-workers]",
)


def _call_names(node: ast.AST) -> tuple[set[str], bool]:
    """(names a function calls, whether it calls an end-to-end entry point itself)."""
    names, direct = set(), False
    for call in ast.walk(node):
        if not isinstance(call, ast.Call):
            continue
        func = call.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        starts = (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "subprocess"
        )
        direct = direct or starts or name in END_TO_END
        names.add(name)
    return names, direct


@functools.cache
def end_to_end_tests(path: Path) -> frozenset[str]:
    """The module-level functions of a test module that start an interpreter or a whole run, directly or
    through the module's own helpers and fixtures (a test's parameters name its fixtures)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    uses: dict[str, set[str]] = {}
    heavy: set[str] = set()
    for name, node in functions.items():
        called, direct = _call_names(node)
        uses[name] = (called | {a.arg for a in node.args.args}) & set(functions)
        if direct:
            heavy.add(name)
    grown = True
    while grown:
        more = {name for name, used in uses.items() if name not in heavy and used & heavy}
        heavy |= more
        grown = bool(more)
    return frozenset(heavy)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        function = getattr(item, "function", None)
        measured = any(fnmatch.fnmatchcase(item.nodeid, pattern) for pattern in MEASURED_SLOW)
        if measured or (function is not None and function.__name__ in end_to_end_tests(Path(item.path))):
            item.add_marker(pytest.mark.slow)
