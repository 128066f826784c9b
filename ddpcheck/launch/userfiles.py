"""Which files are the user's: not the standard library's, the installed packages' or ddpcheck's.

Below the rank side (which names a loader and an error by the user's line, :mod:`ddpcheck.checker.frames`)
and the launcher (which says where a hung rank's stack stands in the user's code): one rule for both.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

_LIBRARY_ROOTS: tuple[str, ...] = ()
_SHOWN_FROM: str = ""  # the folder paths are shown relative to ("": the working directory)


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


def show_paths_from(folder: str) -> None:
    """Name this process's files relative to ``folder`` (a script's rank: the script's folder, so a report
    reads the same wherever ddpcheck ran); "" goes back to the working directory."""
    global _SHOWN_FROM
    _SHOWN_FROM = os.path.realpath(folder) if folder else ""


def shown_path(filename: str) -> str:
    """``train.py`` relative to the folder paths are shown from (:func:`show_paths_from`, else the working
    directory) where it lies below it, else the whole path: never a ``../..`` climb out of it."""
    real = os.path.realpath(filename)
    root = _SHOWN_FROM or os.path.realpath(os.getcwd())
    return os.path.relpath(real, root) if real.startswith(root + os.sep) else real
