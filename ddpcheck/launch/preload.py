"""Import a loader file's third-party modules once, in the parent, so forked ranks inherit them.

Every rank imports the user's file, and with it whatever the file imports: a file that imports
Lightning pays ~4 s per rank per run. Ranks are forked, so a module the parent already holds costs
them nothing. :func:`preload_imports` finds the file's top-level imports by reading its syntax tree
(the file itself never runs here), keeps the ones that resolve outside the user's project, and
imports them.

What it guards against, and what it does then:

- **User code.** Relative imports, ``__main__``, and modules that live in the loader's directory or
  its project (the nearest ancestor with ``pyproject.toml``, ``setup.py``, ``setup.cfg`` or ``.git``)
  are never imported; modules under site-packages or the standard library always count as
  third-party, even inside a project (a ``.venv`` there).
- **Failures.** An import that raises (``SystemExit`` included) or passes the deadline is skipped
  without a word: the rank imports it again and reports the error exactly as it would without
  preloading. The deadline interrupts a slow import with ``SIGALRM`` (main thread, no timer already
  armed); the interruption is a ``BaseException`` so that a library's ``except Exception`` around an
  optional import cannot swallow it and carry on half-configured.
- **Output.** File descriptors 1 and 2 go to a temporary file while importing, so nothing reaches
  stdout (a ``--format json`` report stays parseable); the text is kept in ``PreloadReport.output``.
  Python's ``sys.stdout``/``sys.stderr`` objects are left in place: a logging handler created at
  import keeps writing to fd 2, which a rank redirects into its own output file.
- **Threads.** A thread a module starts cannot be undone, so the module stays imported and the
  thread is recorded (Python threads by name, native ones by their ``/proc`` name).
  :attr:`PreloadReport.fork_safe` is False when one that is not known to survive ``fork`` appeared:
  the caller should say so (``notes()``), since ranks are then forked from a multi-threaded parent.
  Known-safe: jemalloc's background thread (pyarrow, so ``datasets``) and OpenBLAS pools, which
  stop and re-create themselves around ``fork`` through ``pthread_atfork`` handlers.
- **Rank environment.** A module that reads ``RANK``/``LOCAL_RANK``/... at import sees the parent's
  environment, where they are unset; in a rank it keeps those values. Lightning, Lightning Fabric and
  torchmetrics do exactly this for ``rank_zero_only.rank``; :func:`refresh_rank_state`, called in a
  rank once its environment is set, re-derives it. Other readers are listed in ``notes()``.
- **Thread pools.** Imports run with ``OMP_NUM_THREADS=1`` when it is unset, as in a rank, so a
  native library sizing its pool at load time (OpenBLAS) sizes it as the rank would have.
- **Environment.** Variables an import sets (Lightning: ``PYTORCH_NVML_BASED_CUDA_CHECK``,
  ``TORCHINDUCTOR_CACHE_DIR``) are kept, since the module's state may rely on them; ranks inherit
  them as if they had imported it. Listed in ``PreloadReport.env_set``.
- **CUDA and signals.** A module that initialises CUDA makes CUDA unusable in forked ranks: recorded.
  A module that installs a SIGINT/SIGTERM handler would take over the parent's Ctrl-C: the parent's
  handlers are put back and the change recorded.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import gc
import importlib
import importlib.util
import os
import signal
import site
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROJECT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")
# Variables a launcher sets per rank: a value read at import in the parent is wrong in every rank.
RANK_ENV = frozenset(
    {
        "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
        "ROLE_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_LOCALID",
        "SLURM_NTASKS", "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_SIZE", "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
    }
)  # fmt: skip
RANK_ENV_PREFIXES = ("TORCHELASTIC_",)
# What a rank's environment has unless the user set it (launch/rank.py ``torchrun_env``). Native
# libraries size their thread pools from it when loaded (OpenBLAS: scipy, so Lightning), so importing
# under the same value sizes them as a rank would, and starts no pool threads in the parent.
RANK_ENV_DEFAULTS = {"OMP_NUM_THREADS": "1"}
# Packages whose import-time rank reads are only ``rank_zero_only.rank`` (see refresh_rank_state).
RANK_STATE_REFRESHED = frozenset({"lightning", "lightning_fabric", "pytorch_lightning", "torchmetrics"})
# Native threads that survive fork by design: the library stops or re-creates them around fork with
# pthread_atfork handlers. jemalloc names its thread; OpenBLAS pools (numpy's, scipy's) show up as
# "python", so they are recognised by the OpenBLAS library the same import mapped.
FORK_AWARE_THREADS = frozenset({"jemalloc_bg_thd"})
FORK_AWARE_LIBRARIES = ("openblas",)
_OUTPUT_LIMIT = 20_000


@dataclass(frozen=True)
class ThreadNote:
    """Threads that importing ``module`` left running."""

    module: str
    python: tuple[str, ...] = ()
    native: tuple[str, ...] = ()  # every new native thread, "name (library)" where attributed
    unknown: tuple[str, ...] = ()  # the native ones not known to survive fork

    @property
    def fork_safe(self) -> bool:
        return not self.python and not self.unknown


@dataclass
class PreloadReport:
    """What :func:`preload_imports` found, imported and skipped; plain data."""

    path: str
    candidates: tuple[str, ...] = ()  # the modules it tried to import, in source order
    imported: dict[str, float] = field(default_factory=dict)  # module -> seconds
    already: tuple[str, ...] = ()
    skipped: dict[str, str] = field(default_factory=dict)  # module -> why
    threads: list[ThreadNote] = field(default_factory=list)
    rank_env: dict[str, tuple[str, ...]] = field(default_factory=dict)  # module -> variables read
    cuda_initialized_by: str = ""
    signals_restored: dict[str, tuple[str, ...]] = field(default_factory=dict)  # module -> signal names
    env_set: dict[str, tuple[str, ...]] = field(default_factory=dict)  # module -> variables it changed
    output: str = ""
    seconds: float = 0.0

    @property
    def fork_safe(self) -> bool:
        """Forking after this preload is as safe as before it (no new unknown threads, no CUDA)."""
        return not self.cuda_initialized_by and all(t.fork_safe for t in self.threads)

    def notes(self) -> list[str]:
        """One line per thing a user should know about the run (empty when nothing notable)."""
        out = []
        for t in self.threads:
            if not t.fork_safe:
                started = ", ".join([*t.python, *t.unknown])
                out.append(
                    f"importing {t.module} once in the parent started threads ({started}); ranks were forked "
                    "from a multi-threaded process"
                )
        if self.cuda_initialized_by:
            out.append(
                f"importing {self.cuda_initialized_by} initialised CUDA in the parent; forked ranks cannot "
                "use CUDA"
            )
        for module, variables in self.rank_env.items():
            if module.partition(".")[0] not in RANK_STATE_REFRESHED:
                out.append(
                    f"{module} reads {', '.join(variables)} when imported; imported once before the ranks "
                    "started, it saw them unset in every rank"
                )
        return out


def preload_imports(path: str, *, deadline_s: float) -> PreloadReport:
    """Import the third-party modules ``path`` imports at module level, within ``deadline_s`` seconds.

    Never raises for a bad file or a bad import (the rank reports those as before) and never writes
    to stdout. Call it in the parent before the first rank is forked.
    """
    started = time.monotonic()
    report = PreloadReport(path=str(path))
    try:
        source = Path(path).read_text(encoding="utf-8")
        entries = _imports(ast.parse(source, filename=str(path)))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return report
    user_dirs = _user_dirs(Path(path))
    candidates, already = [], []
    for name, member in entries:
        why = _not_preloadable(name, user_dirs)
        if why:
            if not member:
                report.skipped[name] = why
        elif name in sys.modules:
            already.append(name)
        else:
            candidates.append((name, member))
    report.already = tuple(already)
    attempted = []
    if candidates:
        with _captured_fds() as captured, _env_defaults(RANK_ENV_DEFAULTS):
            for name, member in candidates:
                if member and not _is_unloaded_submodule(name):
                    continue  # ``from m import x``: x is an attribute, or m failed (the rank says so)
                attempted.append(name)
                left = deadline_s - (time.monotonic() - started)
                if left <= 0:
                    report.skipped[name] = "deadline passed before it started"
                    continue
                _import_one(name, left, report)
        report.output = captured.text()
    report.candidates = tuple(attempted)
    report.seconds = time.monotonic() - started
    return report


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """While ranks are forked from this process, what it holds stays out of cyclic garbage collection
    (``gc.freeze``, again at each call so later imports join). With torch loaded a full collection
    walks over a million objects (~90 ms here, a few times a run), and in a forked rank it writes to
    every object's header, copying the inherited heap page by page. Frozen objects are still freed
    when their last reference goes. Unfrozen on the way out unless the caller froze first, so an
    in-process caller (the pytest plugin) keeps no garbage cycle in the permanent generation."""
    owner = gc.get_freeze_count() == 0
    gc.freeze()
    try:
        yield
    finally:
        if owner:
            gc.unfreeze()


_holders: tuple[int, tuple[str, ...]] | None = None  # (len(sys.modules) when found, module names)


def find_rank_state_holders() -> None:
    """In the parent, before forking: note which loaded modules carry a ``rank_zero_only`` with a
    ``rank``. A forked rank then refreshes just those: scanning every module there would touch, and so
    copy, much of its memory (about 10 ms a rank with torch loaded). Cheap when nothing was imported
    since the last call."""
    global _holders
    if _holders is not None and _holders[0] == len(sys.modules):
        return
    found = tuple(name for name, module in list(sys.modules.items()) if _rank_zero_only(module) is not None)
    _holders = (len(sys.modules), found)


def _rank_zero_only(module: Any) -> Any:
    func = getattr(module, "__dict__", {}).get("rank_zero_only")
    return func if callable(func) and isinstance(getattr(func, "rank", None), int) else None


def refresh_rank_state() -> list[str]:
    """In a forked rank, once RANK/LOCAL_RANK are set: re-derive state a preloaded module froze at import.

    Lightning, Lightning Fabric and torchmetrics set ``rank_zero_only.rank`` from the environment
    when imported (lightning_utilities' convention); imported in the parent, every rank would think
    it is rank 0 and run rank-zero-only code. Returns the modules it updated. Modules imported after
    the fork read the environment themselves; those from before are the ones
    :func:`find_rank_state_holders` noted (all modules when it was not called).
    """
    value = os.environ.get("RANK") or os.environ.get("LOCAL_RANK")
    if value is None or not value.isdigit():
        return []
    names = _holders[1] if _holders is not None else tuple(sys.modules)
    updated = []
    for name in names:
        func = _rank_zero_only(sys.modules.get(name))
        if func is not None:
            func.rank = int(value)
            updated.append(name)
    return updated


def _imports(tree: ast.Module) -> list[tuple[str, bool]]:
    """Absolute module names imported by module-level statements (also inside if/try; not functions),
    as (name, member): ``member`` when the name came from ``from m import name`` and may be no module.

    ``from a.b import c`` gives ``a.b`` and ``a.b.c`` (``c`` may be a submodule). Imports under
    ``if TYPE_CHECKING:`` never run, so they are left out; so are relative imports and ``__main__``.
    """
    found: list[tuple[str, bool]] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.extend((alias.name, False) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level == 0 and node.module and node.module != "__future__":
                    found.append((node.module, False))
                    found.extend((f"{node.module}.{a.name}", True) for a in node.names if a.name != "*")
            elif isinstance(node, ast.If):
                if not _is_type_checking(node.test):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try | getattr(ast, "TryStar", ast.Try)):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)

    visit(tree.body)
    unique: dict[str, bool] = {}
    for name, member in found:
        if name.partition(".")[0] != "__main__":
            unique[name] = unique.get(name, True) and member  # a plain import anywhere wins
    return list(unique.items())


def _is_unloaded_submodule(name: str) -> bool:
    """``a.b`` is a submodule not imported yet, and ``a`` imported fine (finding ``a.b`` is then safe)."""
    parent_name, _, attr = name.rpartition(".")
    parent = sys.modules.get(parent_name)
    if parent is None or hasattr(parent, attr) or name in sys.modules:
        return False
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError, AttributeError):
        return False


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _user_dirs(path: Path) -> tuple[Path, ...]:
    """The loader's directory, and its project root when it has one."""
    here = path.resolve().parent
    for candidate in (here, *here.parents):
        if any((candidate / marker).exists() for marker in PROJECT_MARKERS):
            return (here, candidate) if candidate != here else (here,)
    return (here,)


@functools.lru_cache(maxsize=1)
def _installed_dirs() -> tuple[Path, ...]:
    paths = sysconfig.get_paths()
    dirs = [paths.get(key, "") for key in ("purelib", "platlib", "stdlib", "platstdlib")]
    with contextlib.suppress(AttributeError):
        dirs += site.getsitepackages()
    with contextlib.suppress(AttributeError):
        dirs.append(site.getusersitepackages())
    return tuple(Path(d).resolve() for d in dirs if d)


def _not_preloadable(name: str, user_dirs: tuple[Path, ...]) -> str:
    """Why ``name`` must not be imported here ("" when it may). Looks at the top-level package only:
    finding a submodule would import its parent."""
    top = name.partition(".")[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError, AttributeError):
        return "not found"
    if spec is None:
        return "not found"
    if spec.origin in ("built-in", "frozen"):
        return ""
    places = list(spec.submodule_search_locations or ()) or ([spec.origin] if spec.origin else [])
    if not places:
        return "not found"
    installed = _installed_dirs()
    for place in places:
        where = Path(place).resolve()
        if _under(where, installed):
            continue
        if _under(where, user_dirs):
            return "part of the loader's project (user code)"
    return ""


def _under(path: Path, roots: tuple[Path, ...]) -> bool:
    return any(path == root or root in path.parents for root in roots)


class _Deadline(BaseException):
    """Raised inside a too-slow import; a BaseException so ``except Exception`` in a library misses it."""


def _import_one(name: str, budget: float, report: PreloadReport) -> None:
    before, env = _snapshot(), dict(os.environ)
    reads: set[str] = set()
    began = time.monotonic()
    try:
        with _environ_reads(reads), _alarm(budget):
            importlib.import_module(name)
    except _Deadline:
        report.skipped[name] = f"took longer than the {budget:.1f}s left of the deadline"
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit too: the rank reports it as it always did
        report.skipped[name] = f"failed: {type(exc).__name__}: {exc}".splitlines()[0][:300]
    else:
        report.imported[name] = time.monotonic() - began
    _compare(name, before, _snapshot(), report)
    changed = sorted(k for k in {*env, *os.environ} if env.get(k) != os.environ.get(k))
    if changed:  # kept: the module's state may rely on them, and a rank inherits them as if it had imported
        report.env_set[name] = tuple(changed)
    per_rank = {v for v in reads if v in RANK_ENV or v.startswith(RANK_ENV_PREFIXES)}
    if per_rank:
        report.rank_env[name] = tuple(sorted(per_rank))


@dataclass(frozen=True)
class _State:
    python: frozenset[int]
    native: frozenset[int]
    cuda: bool
    handlers: dict[int, Any]
    libraries: frozenset[str]


_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _snapshot() -> _State:
    torch = sys.modules.get("torch")
    cuda = bool(torch is not None and torch.cuda.is_initialized())
    return _State(
        python=frozenset(t.ident for t in threading.enumerate() if t.ident is not None),
        native=frozenset(_native_tids()),
        cuda=cuda,
        handlers={s: signal.getsignal(s) for s in _SIGNALS},
        libraries=frozenset(_mapped_libraries()),
    )


def _compare(name: str, before: _State, after: _State, report: PreloadReport) -> None:
    started = [t for t in threading.enumerate() if t.ident not in before.python]
    python_tids = {t.native_id for t in threading.enumerate()}
    native = [_thread_name(tid) for tid in sorted(after.native - before.native - python_tids)]
    if started or native:
        pools = sorted(
            os.path.basename(lib)
            for lib in after.libraries - before.libraries
            if any(key in os.path.basename(lib).lower() for key in FORK_AWARE_LIBRARIES)
        )
        named = [n if n in FORK_AWARE_THREADS or not pools else f"{n} ({pools[0]})" for n in native]
        unknown = [n for n in native if n not in FORK_AWARE_THREADS and not pools]
        report.threads.append(ThreadNote(name, tuple(t.name for t in started), tuple(named), tuple(unknown)))
    if after.cuda and not before.cuda and not report.cuda_initialized_by:
        report.cuda_initialized_by = name
    changed = [s for s in _SIGNALS if after.handlers[s] is not before.handlers[s]]
    if changed and threading.current_thread() is threading.main_thread():
        for s in changed:
            signal.signal(s, before.handlers[s])
        report.signals_restored[name] = tuple(signal.Signals(s).name for s in changed)


def _native_tids() -> list[int]:
    try:
        return [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:  # not Linux: Python threads are still compared
        return []


def _mapped_libraries() -> set[str]:
    """Shared libraries mapped into this process (Linux), to tell whose threads appeared."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as handle:
            return {line.split()[-1] for line in handle if ".so" in line}
    except OSError:
        return set()


def _thread_name(tid: int) -> str:
    try:
        with open(f"/proc/self/task/{tid}/comm", encoding="utf-8") as handle:
            return handle.read().strip() or f"tid {tid}"
    except OSError:
        return f"tid {tid}"


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """Interrupt the body after ``seconds`` with :class:`_Deadline`, where a signal can be used."""
    usable = (
        hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
        and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # someone else's timer: leave it alone
    )
    if not usable:
        yield
        return
    armed = [True]

    def fire(_signum: int, _frame: Any) -> None:
        if armed[0]:
            armed[0] = False
            raise _Deadline

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        yield
    finally:
        armed[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def _environ_reads(reads: set[str]) -> Iterator[None]:
    """Record which environment variables are looked up (``os.environ[...]``, ``.get``, ``in``, getenv)."""
    cls: Any = type(os.environ)
    get_item, contains = cls.__getitem__, cls.__contains__

    def getitem(self: Any, key: Any) -> Any:
        reads.add(str(key))
        return get_item(self, key)

    def has(self: Any, key: Any) -> bool:
        reads.add(str(key))
        return bool(contains(self, key))

    cls.__getitem__, cls.__contains__ = getitem, has
    try:
        yield
    finally:
        cls.__getitem__, cls.__contains__ = get_item, contains


@contextlib.contextmanager
def _env_defaults(defaults: dict[str, str]) -> Iterator[None]:
    """Set the variables that are unset, for the duration."""
    added = [key for key in defaults if key not in os.environ]
    os.environ.update({key: defaults[key] for key in added})
    try:
        yield
    finally:
        for key in added:
            if os.environ.get(key) == defaults[key]:  # not if an import set its own value
                del os.environ[key]


class _Captured:
    def __init__(self) -> None:
        self.file = tempfile.TemporaryFile(mode="w+b")  # noqa: SIM115 - closed by text()

    def text(self) -> str:
        self.file.seek(0)
        data = self.file.read()
        self.file.close()
        return data.decode("utf-8", "replace")[-_OUTPUT_LIMIT:]


@contextlib.contextmanager
def _captured_fds() -> Iterator[_Captured]:
    """fds 1 and 2 into a temporary file for the duration (what imports print must not reach stdout)."""
    captured = _Captured()
    _flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        os.dup2(captured.file.fileno(), 1)
        os.dup2(captured.file.fileno(), 2)
        yield captured
    finally:
        _flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()
