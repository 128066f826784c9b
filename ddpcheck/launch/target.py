"""Name a callable so a rank can find it again: by module and qualified name, or by file path.

Ranks never receive pickled user callables: under ``spawn`` they re-import the module that defines
the target (from ``sys.modules`` name, or from the file when the module is not importable, e.g.
pytest's ``--import-mode=importlib`` or a loose ``loader.py``); under ``fork`` the same lookup hits
modules already in memory.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any


@dataclass(frozen=True)
class TargetRef:
    """Where a module-level callable lives; plain strings only, safe to send anywhere."""

    module: str
    qualname: str
    path: str | None = None

    @classmethod
    def of(cls, func: Callable[..., Any]) -> TargetRef:
        module = getattr(func, "__module__", None)
        qualname = getattr(func, "__qualname__", None)
        if not module or not qualname or "<locals>" in qualname or "<lambda>" in qualname:
            raise TypeError(
                f"{func!r} cannot run in a rank: pass a module-level function (ranks find it by name)"
            )
        mod = sys.modules.get(module)
        path = getattr(mod, "__file__", None) if mod is not None else None
        return cls(module, qualname, str(path) if path else None)

    def resolve(self) -> Callable[..., Any]:
        obj: Any = load_module(self.module, self.path)
        for part in self.qualname.split("."):
            obj = getattr(obj, part)
        return obj  # type: ignore[no-any-return]


def load_module(name: str, path: str | None = None) -> ModuleType:
    """The module called ``name``: already imported, importable, or loaded from ``path``."""
    if name in sys.modules:
        return sys.modules[name]
    if path is None:
        return importlib.import_module(name)
    try:
        return importlib.import_module(name)
    except ImportError:
        return load_file(Path(path), name)


def load_file(path: Path, name: str | None = None) -> ModuleType:
    """Execute a Python file as a module (registered in ``sys.modules`` so pickling by name works).

    Its directory goes first on ``sys.path``, as ``python FILE`` puts it: a loader file imports the
    modules beside it (``from mydata import build``)."""
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    mod_name = name or f"ddpcheck_user_{path.stem}_{abs(hash(str(path.resolve()))) % 10**8}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(mod_name, None)
        raise
    return module
