"""Checking a loader from a test: ``assert_ddp_safe`` and the ``ddpcheck`` fixture's object.

(Public names are re-exported by ``ddpcheck.pytest_plugin``, the module users import.)

Both run the full checker (``check_loader``: real gloo ranks at every world size) on a loader factory
defined at module level in a test file, or on a loader file, and fail with the report table when a
check fails or a rank crashes. Under the pytest plugin every check is also recorded on the running
test (JUnit XML properties) and, with ``--ddpcheck-report DIR``, written there as JSON and Markdown,
and bad input (a loader file that does not exist, no factory) fails the test with one line.

The plugin's state for a session is a :class:`CheckSession` on the session's ``config.stash`` (one per
pytest process: every xdist worker has its own). ``assert_ddp_safe`` takes no config, so while a test
runs the plugin names that test's session in a context variable (:func:`running_item`), reset when the
test ends: nothing outlives a test, and a pytest run inside a test (pytester) has its own.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ddpcheck.options import CheckOptions
    from ddpcheck.result import CheckResult

LoaderSource = Callable[..., Any] | str | os.PathLike[str]
"""A module-level loader factory, or the path of a loader file (see ``ddpcheck.checker.loaderfile``)."""

_STEM_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_MAX_STEM = 120


class DdpCheckFailed(AssertionError):
    """A loader failed a ddpcheck check or a rank crashed; the message is the report table."""

    __module__ = "builtins"  # as pytest's outcomes: the short summary says "DdpCheckFailed: ..." in full

    def __init__(self, result: CheckResult) -> None:
        from ddpcheck.report import render_table

        self.result = result
        # the type already says ddpcheck: the first line (pytest's short summary) starts with the loader
        summary = failure_summary(result).removeprefix("ddpcheck: ")
        super().__init__(f"{summary}\n\n{render_table(result)}")


def failure_summary(result: CheckResult) -> str:
    """One line: what failed where, e.g. ``loader.py fails no_overlap at world size 2``."""
    problems = []
    for run in result.runs:
        failed = [v.check for v in run.verdicts if v.failed]
        mesh = run.layout is not None and run.layout.mesh
        where = f"mesh {run.label}" if mesh else f"world size {run.world_size}"
        if failed:
            problems.append(f"{', '.join(failed)} at {where}")
        own = [f for f in run.failures if f.kind != "secondary"] or list(run.failures)
        if own:
            ranks = ", ".join(str(f.rank) for f in own)
            problems.append(f"rank{'s' if len(own) > 1 else ''} {ranks} crashed or hung at {where}")
    path, sep, factory = result.loader.partition("::")
    name = Path(path).name + sep + factory
    return f"ddpcheck: {name} fails {'; '.join(problems) or 'its checks'}"


@dataclass
class CheckSession:
    """One pytest session's ddpcheck state; the plugin keeps it on ``config.stash`` (``plugin.py``)."""

    report_dir: Path | None = None
    rootdir: Path | None = None  # relative loader paths resolve here (pytest's rootdir), not the cwd
    item: Any = None  # the running pytest item (a node with ``nodeid`` and ``user_properties``)
    checks_per_item: dict[str, int] = field(default_factory=dict)


_running: contextvars.ContextVar[CheckSession | None] = contextvars.ContextVar("ddpcheck", default=None)


def current_session() -> CheckSession | None:
    """The session of the test that is running now, None outside a test run by the plugin."""
    return _running.get()


@contextlib.contextmanager
def running_item(session: CheckSession, item: Any) -> Iterator[None]:
    """While ``item`` runs: its checks are recorded on it, in ``session`` (the plugin wraps each test)."""
    token = _running.set(session)
    previous, session.item = session.item, item
    try:
        yield
    finally:
        session.item = previous
        _running.reset(token)


def report_stem(nodeid: str) -> str:
    """A file name stem for a test id: ``tests/t.py::test_a[ddp2]`` -> ``tests_t.py__test_a_ddp2``."""
    stem = _STEM_UNSAFE.sub("_", nodeid.replace("::", "__")).strip("._-") or "ddpcheck"
    if len(stem) > _MAX_STEM:
        import hashlib

        digest = hashlib.blake2b(nodeid.encode(), digest_size=4).hexdigest()
        stem = f"{stem[: _MAX_STEM - 9]}-{digest}"
    return stem


def loader_spec(source: LoaderSource, factory: str | None, rootdir: Path | None = None) -> tuple[str, str]:
    """(loader file path, factory name) for a module-level factory function or a loader file path; a
    relative path is taken from ``rootdir`` (default: the running test's session's), else the cwd."""
    __tracebackhide__ = True
    if isinstance(source, (str, os.PathLike)):
        given = Path(os.fspath(source)).expanduser()
        if rootdir is None:
            session = current_session()
            rootdir = session.rootdir if session is not None else None
        if not given.is_absolute() and rootdir is not None:
            given = rootdir / given  # as pytest resolves testpaths: `cd tests && pytest` finds the same file
        return str(given), factory or "make_loader"
    if not callable(source):
        raise TypeError(
            f"expected a loader factory function or the path of a loader file, got {type(source).__name__}"
        )
    if factory is not None:
        raise TypeError("factory= names the function in a loader file; pass it only with a path")
    name = getattr(source, "__name__", "")
    qualname = getattr(source, "__qualname__", "")
    module = sys.modules.get(getattr(source, "__module__", "") or "")
    if not name or qualname != name or getattr(module, name, None) is not source:
        raise TypeError(
            f"{qualname or source!r} is not a module-level function; ranks re-import its file and look it "
            "up by name, so define the factory at the top level of a module (no lambda, closure or method)"
        )
    try:
        path = inspect.getfile(source)
    except TypeError:
        raise TypeError(f"{source!r} has no source file; define it in a .py file") from None
    return path, name


def check_options(
    world_sizes: int | tuple[int, ...] | list[int] | None,
    epochs: int,
    factory: str | None,
    options: dict[str, Any],
) -> CheckOptions:
    """``CheckOptions`` from keyword options; an unknown option is a TypeError that lists the known ones.

    ``meshes`` may be specs (``"dp=2,tp=2"``) or dicts (``{"dp": 2, "tp": 2}``); without ``world_sizes``
    a check with meshes checks only the meshes, else world sizes 1 and 2.
    """
    __tracebackhide__ = True
    from ddpcheck.options import TEST_WORLD_SIZES, CheckOptions
    from ddpcheck.pytest_plugin.marker import MarkerError, check_meshes

    internal = ("world_sizes", "epochs", "option_sources", "config_file")  # not the user's to give
    allowed = sorted(f.name for f in fields(CheckOptions) if f.name not in internal)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise TypeError(f"unknown ddpcheck option(s) {', '.join(unknown)}; choose from {', '.join(allowed)}")
    if options.get("meshes"):
        try:
            options = {**options, "meshes": check_meshes(options["meshes"])}
        except MarkerError as exc:
            raise TypeError(str(exc)) from None
    if "data_dims" in options:
        options = {**options, "data_dims": tuple(options["data_dims"])}
    if world_sizes is None:
        world_sizes = () if options.get("meshes") else TEST_WORLD_SIZES
    sizes = (world_sizes,) if isinstance(world_sizes, int) else tuple(world_sizes)
    return CheckOptions(world_sizes=sizes, epochs=epochs, factory=factory or "make_loader", **options)


def run_check(
    source: LoaderSource,
    *,
    world_sizes: int | tuple[int, ...] | list[int] | None = None,
    epochs: int = 2,
    factory: str | None = None,
    item: Any = None,
    session: CheckSession | None = None,
    **options: Any,
) -> CheckResult:
    """Run the checker on ``source`` and record the result on ``item`` (default: the running test).

    Returns the result whatever it says; :func:`assert_ddp_safe` is the failing variant. ``session``:
    the plugin's (default: the running test's); under it bad input fails the test with one line.
    """
    __tracebackhide__ = True
    from ddpcheck.options import BadInput
    from ddpcheck.session import check_loader

    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        raise RuntimeError(
            "ddpcheck starts its own process groups: call assert_ddp_safe / ddpcheck.check from a plain "
            "test, not from inside a @pytest.mark.ddp test or another initialised process group"
        )
    session = session if session is not None else current_session()
    path, name = loader_spec(source, factory, session.rootdir if session is not None else None)
    try:
        result = check_loader(path, check_options(world_sizes, epochs, name, options))
    except BadInput as exc:
        if session is None:  # outside the plugin: the exception, for the caller to handle
            raise
        bad = str(exc)
    else:
        bad = ""
    if bad:
        import pytest

        pytest.fail(f"ddpcheck: {bad}", pytrace=False)  # one line, no chained exception: it says what to fix
    if name != "make_loader":
        result = replace(result, loader=f"{result.loader}::{name}")
    record(result, item, session)
    return result


def record(result: CheckResult, item: Any = None, session: CheckSession | None = None) -> list[Path]:
    """Attach ``result`` to the running test (JUnit properties) and write its report files, if asked."""
    session = session if session is not None else current_session()
    item = item if item is not None else (session.item if session else None)
    if item is None:
        return []
    nodeid = str(getattr(item, "nodeid", "") or "ddpcheck")
    count = session.checks_per_item.get(nodeid, 0) + 1 if session else 1
    if session is not None:
        session.checks_per_item[nodeid] = count
    prefix = "ddpcheck" if count == 1 else f"ddpcheck#{count}"
    from ddpcheck.pytest_plugin.junit import add_properties

    add_properties(item, result_properties(result, prefix))
    if session is None or session.report_dir is None:
        return []
    from ddpcheck.report import write_reports

    stem = report_stem(nodeid) + ("" if count == 1 else f"-{count}")
    return write_reports(result, session.report_dir, stem=stem, formats=("json", "markdown"))


def result_properties(result: CheckResult, prefix: str = "ddpcheck") -> list[tuple[str, str]]:
    """``(name, value)`` pairs for JUnit: the verdict, then every check's status per world size."""
    from ddpcheck.verdict import FAIL, PASS

    props = [(f"{prefix}.loader", result.loader), (f"{prefix}.result", PASS if result.ok else FAIL)]
    for run in result.runs:
        mesh = run.layout is not None and run.layout.mesh
        at = f"{prefix}.{run.label}" if mesh else f"{prefix}.ws{run.world_size}"
        if run.skipped:
            props.append((f"{at}.skipped", run.skipped))
        props.extend((f"{at}.{v.check}", v.status) for v in run.verdicts)
        if run.failures:
            props.append(
                (
                    f"{at}.rank_failures",
                    "; ".join(f"rank {f.rank} {f.kind}: {f.message}" for f in run.failures),
                )
            )
    return props


def assert_ddp_safe(
    factory_or_path: LoaderSource,
    *,
    world_sizes: int | tuple[int, ...] | list[int] | None = None,
    epochs: int = 2,
    factory: str | None = None,
    **options: Any,
) -> CheckResult:
    """Fail unless the loader passes every ddpcheck check at every world size; return the result.

    ``factory_or_path`` is a loader factory defined at module level (ranks re-import its file and call
    it by name with ``rank``/``world_size`` when it takes them) or the path of a loader file, whose
    factory ``factory`` names (default ``make_loader``). ``options`` are the other ``CheckOptions``
    fields (``backend``, ``patch``, ``timeout``, ``determinism``, ...; an unknown one is a TypeError
    that lists them). Raises :class:`DdpCheckFailed` (an AssertionError) with the report
    table. Bad input (no such file, no factory) fails the test with one line under the pytest plugin;
    elsewhere it raises ``ddpcheck.options.BadInput``, whose message is that line.
    """
    __tracebackhide__ = True
    result = run_check(factory_or_path, world_sizes=world_sizes, epochs=epochs, factory=factory, **options)
    if not result.ok:
        raise DdpCheckFailed(result)
    return result


class DdpCheck:
    """The ``ddpcheck`` fixture: checks loaders and records each result on the requesting test."""

    def __init__(self, item: Any = None, session: CheckSession | None = None) -> None:
        self._item = item
        self._session = session

    def check(
        self,
        factory_or_path: LoaderSource,
        *,
        world_sizes: int | tuple[int, ...] | list[int] | None = None,
        epochs: int = 2,
        factory: str | None = None,
        **options: Any,
    ) -> CheckResult:
        """Like :func:`assert_ddp_safe`: fail with the report table unless every check passes."""
        __tracebackhide__ = True
        result = run_check(
            factory_or_path,
            world_sizes=world_sizes,
            epochs=epochs,
            factory=factory,
            item=self._item,
            session=self._session,
            **options,
        )
        if not result.ok:
            raise DdpCheckFailed(result)
        return result

    def check_script(
        self,
        script: str | Path,
        args: Sequence[str] = (),
        *,
        world_sizes: int | tuple[int, ...] | list[int] | None = None,
        **options: Any,
    ) -> CheckResult:
        """Audit a training script as ``ddpcheck run -- SCRIPT ARGS`` does (a ``.py`` path, relative to
        pytest's rootdir, or a module name run as ``python -m`` from there); fail the test with the
        report table unless every check passes. ``world_sizes``: 1 and 2 when not given; ``options``:
        :func:`ddpcheck.check_script`'s."""
        __tracebackhide__ = True
        from ddpcheck.options import TEST_WORLD_SIZES, BadInput
        from ddpcheck.session.script import check_script

        session = self._session if self._session is not None else current_session()
        root = session.rootdir if session is not None and session.rootdir is not None else Path.cwd()
        if world_sizes is None:
            world_sizes = TEST_WORLD_SIZES
        sizes = (world_sizes,) if isinstance(world_sizes, int) else tuple(world_sizes)
        options.setdefault("cwd", str(root))
        try:
            result = check_script(str(script), args, world_sizes=sizes, **options)
        except BadInput as exc:
            import pytest

            pytest.fail(f"ddpcheck: {exc}", pytrace=False)
        record(result, self._item, session)
        if not result.ok:
            raise DdpCheckFailed(result)
        return result
