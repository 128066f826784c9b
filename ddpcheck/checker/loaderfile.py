"""The loader file contract: a Python file that defines a DataLoader factory and optional hooks.

::

    def make_loader(rank: int, world_size: int) -> DataLoader: ...   # both keywords optional
    def sample_ids(batch) -> Sequence[Hashable]: ...                  # optional identity hook

The factory runs inside each rank after the process group is up. It may take ``rank`` and
``world_size`` (passed when present; ``batch_size`` too when the run asks for one), read
``torch.distributed`` itself, or return a plain loader that ``--patch`` shards.

The parent only checks what needs no execution (the file exists, is Python, parses); everything
that runs user code happens in a rank and comes back as a :class:`BadLoaderFile` with a one-line
message.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from ddpcheck.messages import exception_text, one_line

SUPPLIED_KWARGS = ("rank", "world_size", "dp_rank", "dp_world_size", "mesh", "batch_size")
# the optional hooks a loader file may define beside its factory (never offered as a factory)
HOOKS = (
    "sample_ids", "set_epoch", "forward", "metric", "make_model", "loss", "resume_loader", "save_state",
    "load_state", "batch_work", "token_ids",
)  # fmt: skip


class BadLoaderFile(Exception):
    """The loader file or its factory cannot be used; the message is one line a user can act on."""


@dataclass(frozen=True)
class LoaderSpec:
    """Which file and factory to use: plain strings, so it travels to ranks as data."""

    path: str
    factory: str = "make_loader"


def precheck(spec: LoaderSpec) -> None:
    """Checks the parent can make without running user code: exists, is a .py file, parses."""
    path = Path(spec.path)
    if not path.exists():
        raise BadLoaderFile(f"loader file not found: {path}")
    if not path.is_file():
        raise BadLoaderFile(f"loader file is not a regular file: {path}")
    if path.suffix != ".py":
        raise BadLoaderFile(f"loader file must be a Python file (.py): {path}")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise BadLoaderFile(f"cannot read loader file {path}: {exc.strerror or exc}") from None
    try:  # as Python reads it: a PEP 263 coding line or a BOM picks the encoding, else UTF-8
        source = importlib.util.decode_source(raw)
    except (SyntaxError, UnicodeDecodeError, LookupError) as exc:
        raise BadLoaderFile(f"cannot read loader file {path}: {exc}") from None
    try:
        compile(source, str(path), "exec")
    except SyntaxError as exc:
        raise BadLoaderFile(f"syntax error in {path}, line {exc.lineno}: {exc.msg}") from None
    except ValueError as exc:  # a NUL byte (3.11; 3.12 raises SyntaxError)
        raise BadLoaderFile(f"syntax error in {path}: {exc}") from None
    except (RecursionError, MemoryError) as exc:
        raise BadLoaderFile(
            f"cannot compile {path}: an expression nests too deeply for Python ({type(exc).__name__})"
        ) from None
    if not spec.factory.isidentifier():
        raise BadLoaderFile(f"factory name must be a Python identifier, got {spec.factory!r}")
    tree = ast.parse(source)
    names: set[str] = set()
    _collect_names(tree.body, names)
    if spec.factory not in names and not names & {"*", "__getattr__"}:  # certain without running it
        functions = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        raise BadLoaderFile(no_factory(path.name, spec.factory, functions))


def no_factory(file: str, factory: str, functions: Iterable[str]) -> str:
    """``loader.py defines no factory named 'make_loader'; it defines build(): use --factory build``."""
    offered = [f for f in dict.fromkeys(functions) if not f.startswith("_") and f not in HOOKS]
    text = f"{file} defines no factory named {factory!r}"
    if len(offered) == 1:
        return f"{text}; it defines {offered[0]}(): use --factory {offered[0]}"
    if offered:
        return f"{text}; it defines {', '.join(f + '()' for f in offered[:8])}: use --factory NAME"
    return f"{text} (use --factory NAME)"


def load_module(spec: LoaderSpec, *, fresh: bool = False) -> ModuleType:
    """Import the user's file (inside a rank). Import errors become :class:`BadLoaderFile`.

    ``fresh`` runs the module's code again, as a restarted process would (the resume check).
    """
    path = Path(spec.path).resolve()
    name = f"ddpcheck_loader_{hashlib.blake2b(str(path).encode(), digest_size=6).hexdigest()}"
    if fresh:
        sys.modules.pop(name, None)
    if name in sys.modules:  # simulated ranks share one process: run module code once
        return sys.modules[name]
    from ddpcheck.launch.target import load_file  # here: the command prechecks a file before torch loads

    try:
        return load_file(path, name)
    except SyntaxError as exc:
        raise BadLoaderFile(f"syntax error in {path}, line {exc.lineno}: {exc.msg}") from None
    except Exception as exc:
        raise BadLoaderFile(f"importing {path.name} failed: {type(exc).__name__}: {exc}") from exc


def get_factory(module: ModuleType, spec: LoaderSpec) -> Callable[..., Any]:
    factory = getattr(module, spec.factory, None)
    if factory is None:
        functions = [
            name
            for name, value in vars(module).items()
            if inspect.isfunction(value) and value.__module__ == module.__name__
        ]
        raise BadLoaderFile(no_factory(Path(spec.path).name, spec.factory, functions))
    if not callable(factory):
        raise BadLoaderFile(f"{spec.factory!r} in {Path(spec.path).name} is not callable")
    return factory  # type: ignore[no-any-return]


def factory_kwargs(factory: Callable[..., Any], available: dict[str, Any]) -> dict[str, Any]:
    """The subset of ``available`` the factory accepts; a required parameter we can't supply is an error."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return {}
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    by_keyword = {k for k, p in params.items() if p.kind is not inspect.Parameter.POSITIONAL_ONLY}
    chosen = {k: v for k, v in available.items() if (accepts_any and k not in params) or k in by_keyword}
    for name, param in params.items():
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        if param.default is inspect.Parameter.empty and name not in chosen:
            if param.kind is inspect.Parameter.POSITIONAL_ONLY and name in available:
                raise BadLoaderFile(
                    f"factory {getattr(factory, '__name__', '?')}() takes {name!r} positional-only; "
                    "ddpcheck passes it by keyword (drop the '/')"
                )
            raise BadLoaderFile(
                f"factory {getattr(factory, '__name__', '?')}() has a required parameter {name!r}; "
                f"ddpcheck can pass only {', '.join(SUPPLIED_KWARGS)} (and --factory-arg values)"
            )
    return chosen


@dataclass(frozen=True)
class FactoryCall:
    """How a factory was called, read once when its loader is built: ``took``, the keywords it was given
    (of those ddpcheck offered); and what its signature says of keywords not offered: ``keywords``, the
    parameters it takes by name, ``any_keyword``, whether it takes ``**kwargs``, ``defaults``, each
    parameter's default. Empty for a loader no factory built (or a signature that cannot be read)."""

    took: frozenset[str] = frozenset()
    keywords: frozenset[str] = frozenset()
    positional: frozenset[str] = frozenset()  # positional-only: never passed by name
    any_keyword: bool = False
    defaults: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, factory: Callable[..., Any], available: dict[str, Any]) -> FactoryCall:
        took = frozenset(factory_kwargs(factory, available))
        try:
            params = inspect.signature(factory).parameters
        except (TypeError, ValueError):
            return cls(took)
        kind = inspect.Parameter
        named = (kind.POSITIONAL_OR_KEYWORD, kind.KEYWORD_ONLY)
        return cls(
            took,
            frozenset(k for k, p in params.items() if p.kind in named),
            frozenset(k for k, p in params.items() if p.kind is kind.POSITIONAL_ONLY),
            any(p.kind is kind.VAR_KEYWORD for p in params.values()),
            tuple((k, p.default) for k, p in params.items() if p.default is not kind.empty),
        )

    def takes(self, name: str) -> bool:
        """The factory takes ``name`` by keyword (a rebuild can pass it: ``num_workers``)."""
        return name in self.keywords or (self.any_keyword and name not in self.positional)

    def default(self, name: str) -> Any:
        """The factory's default for parameter ``name`` (None when it has none)."""
        return dict(self.defaults).get(name)


def call_by_name(hook: Callable[..., Any], available: dict[str, Any]) -> Any:
    """Call a loader file's hook with the keywords it names among ``available`` (all of them when it
    takes ``**kwargs``, or when its signature cannot be read)."""
    try:
        params = inspect.signature(hook).parameters
    except (TypeError, ValueError):
        return hook(**available)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return hook(**available)
    return hook(**{k: v for k, v in available.items() if k in params})


def call_factory(factory: Callable[..., Any], available: dict[str, Any]) -> Any:
    """Build the loader; anything the factory raises becomes :class:`BadLoaderFile`."""
    from torch.utils.data import DataLoader

    kwargs = factory_kwargs(factory, available)
    name = getattr(factory, "__name__", "factory")
    try:
        loader = factory(**kwargs)
    except Exception as exc:
        if getattr(exc, "harness_error", False):  # e.g. --simulate refusing a collective
            raise
        raise BadLoaderFile(
            f"{name}() raised {type(exc).__name__}: {one_line(exception_text(exc), 300)}"
        ) from exc
    if (
        not issubclass(type(loader), DataLoader)
        and _wrapped_loader(loader) is None
        and not batch_iterable(loader)
    ):
        returned = type(loader).__name__
        raise BadLoaderFile(
            f"{name}() returned {returned}, not a torch DataLoader or a loader{_hint(loader)}"
        )
    return loader


def batch_iterable(obj: Any) -> bool:
    """A loader with no torch DataLoader underneath (torchdata.nodes' ``Loader``, a hand-written loader
    class): an object whose every ``iter()`` is a new epoch of batches. A one-pass iterator (a
    generator) or a plain container of batches is not one."""
    from collections.abc import Iterator

    if obj is None or isinstance(obj, (str, bytes, bytearray, list, tuple, dict, set, frozenset, Iterator)):
        return False
    return callable(getattr(type(obj), "__iter__", None))


def is_torch_loader(obj: Any) -> bool:
    """A torch DataLoader (a subclass counts), or a framework object that iterates one underneath."""
    from torch.utils.data import DataLoader

    return issubclass(type(obj), DataLoader) or _wrapped_loader(obj) is not None


def _hint(returned: Any) -> str:
    """A way forward for objects people return that hold several loaders."""
    if isinstance(getattr(returned, "flattened", None), list):  # Lightning's CombinedLoader
        return "; check each of its loaders (its .flattened list) with a factory of its own"
    from collections.abc import Iterator

    if isinstance(returned, Iterator):
        return "; an iterator (a generator) runs once: return an object whose iter() starts each epoch anew"
    if isinstance(returned, (list, tuple, dict)):
        return "; return one DataLoader, and check each of several with a factory of its own (--factory)"
    return ""


# where framework wrappers keep the DataLoader they iterate (dl: DeepSpeed's Ulysses adapter)
WRAPPER_ATTRIBUTES = ("base_dataloader", "_dataloader", "dataloader", "_loader", "loader", "dl")


def _wrapped_loader(obj: Any, depth: int = 3) -> Any:
    from torch.utils.data import DataLoader

    for _ in range(depth):
        inner = None
        for name in WRAPPER_ATTRIBUTES:
            try:
                inner = vars(obj).get(name)
            except TypeError:
                inner = None
            if inner is not None:
                break
        if inner is None:  # webdataset's WebLoader: a pipeline whose first stage is the DataLoader
            try:
                stages = vars(obj).get("pipeline")
            except TypeError:
                stages = None
            if isinstance(stages, list) and stages:
                inner = stages[0]
        if inner is None:
            return None
        if issubclass(type(inner), DataLoader):
            return inner if callable(getattr(type(obj), "__iter__", None)) else None
        obj = inner
    return None


def unwrap_loader(obj: Any) -> Any:
    """The torch DataLoader a framework object iterates underneath (the object itself when it is one).

    Accelerate's ``DataLoaderShard`` pretends to be a DataLoader through ``__class__`` but holds the
    real one in ``base_dataloader``; Lightning Fabric's loader holds it in ``_dataloader``; webdataset's
    ``WebLoader`` is a pipeline whose first stage is the DataLoader.
    """
    from torch.utils.data import DataLoader

    if issubclass(type(obj), DataLoader):
        return obj
    inner = _wrapped_loader(obj)
    return inner if inner is not None else obj


def optional_hook(module: ModuleType, name: str) -> Callable[..., Any] | None:
    hook = getattr(module, name, None)
    return hook if callable(hook) else None


def other_factories(spec: LoaderSpec) -> tuple[str, ...]:
    """The file's other loader factories: functions named ``make_*_loader`` beside ``spec.factory``
    (``make_valid_loader``, ``make_eval_loader``), read from the source without running it."""
    import re

    names = defined_names(spec.path)
    pattern = re.compile(r"make_\w+_loader")
    return tuple(sorted(n for n in names if pattern.fullmatch(n) and n != spec.factory))


def defined_names(path: str | Path) -> frozenset[str]:
    """Names a loader file binds at module level, read from its source without running it.

    Deciding from the source keeps files without hooks free of any extra process start.
    Functions, classes, assignments and imports count, also inside top-level ``if``/``try``/``with``.
    """
    try:  # bytes: Python's own reading, PEP 263 encoding declarations included
        tree = ast.parse(Path(path).read_bytes())
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return frozenset()
    names: set[str] = set()
    _collect_names(tree.body, names)
    return frozenset(names)


def _collect_names(body: Iterable[ast.stmt], names: set[str]) -> None:
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for part in ("body", "orelse", "finalbody"):
                _collect_names(getattr(node, part, []), names)
            for handler in getattr(node, "handlers", []):
                _collect_names(handler.body, names)
