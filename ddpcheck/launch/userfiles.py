"""Which files are the user's: not the standard library's, the installed packages' or ddpcheck's.

Below the rank side (which names a loader and an error by the user's line, :mod:`ddpcheck.checker.frames`)
and the launcher (which says where a hung rank's stack stands in the user's code): one rule for both.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

_LIBRARY_ROOTS: tuple[str, ...] = ()


def library_roots() -> tuple[str, ...]:
    """The directories whose files are not the user's (read once)."""
    global _LIBRARY_ROOTS
    if not _LIBRARY_ROOTS:
        import sysconfig

        roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
        roots |= {p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages"))}
        roots.add(str(Path(__file__).resolve().parents[1]))  # ddpcheck itself
        _LIBRARY_ROOTS = tuple(sorted(os.path.realpath(r) + os.sep for r in roots))
    return _LIBRARY_ROOTS


def is_user_file(filename: str) -> bool:
    """A real file outside the standard library, the installed packages and ddpcheck."""
    if not filename or filename.startswith("<"):
        return False
    real = os.path.realpath(filename)
    return not real.startswith(library_roots())


def shown_path(filename: str) -> str:
    """``train.py`` relative to the working directory where it lies below it, else as given."""
    real = os.path.realpath(filename)
    cwd = os.path.realpath(os.getcwd())
    return os.path.relpath(real, cwd) if real.startswith(cwd + os.sep) else real
