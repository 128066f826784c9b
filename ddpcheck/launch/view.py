"""The fallback where no private mount namespace can be had: a *view* of the working directory.

A view is a fresh folder holding a copy of each small file at the top of the user's directory (the
script, its configs, a small checkpoint: :data:`COPY_BYTES` in all) and a symbolic link to every other
entry; a run's ranks start in it. What the script creates there (``gpt_snapshot.pt``, a new ``runs/``),
or writes into a copied file, stays in the view. Inside each rank the Python calls that change files
(``open`` for writing, ``os.open``, ``os.mkdir``, ``os.remove``, ``os.rename``, ``shutil.rmtree``...)
first make the path the view's own: a linked folder on the way becomes a real folder of links
(materialised lazily), a linked file opened to be changed is copied in first. What no Python call of
the rank does (a write from C code, such as ``torch.save``'s writer overwriting a large linked file, or
from a program that is not Python) still reaches the user's directory: the caller compares the
directory before and after each run and reports it.

Only the standard library, and nothing runs unless a rank installs it (:func:`install`).
"""

from __future__ import annotations

import builtins
import contextlib
import io
import os
import shutil
from collections.abc import Callable
from typing import Any

_ORIGINAL: dict[str, Any] = {}
COPY_BYTES = 64 << 20  # top-level files copied into a view, in all
COPY_FILES = 256


def build(real: str, view: str, copies: bool = False) -> None:
    """Fill the empty folder ``view`` with links to the entries of ``real``; with ``copies``, the smallest
    regular files are copied instead, within :data:`COPY_BYTES` and :data:`COPY_FILES`."""
    with os.scandir(real) as scanned:
        entries = [(_copy_size(entry) if copies else -1, entry.name) for entry in scanned]
    room, files = COPY_BYTES, COPY_FILES
    for size, name in sorted(entries):
        source, target = os.path.join(real, name), os.path.join(view, name)
        if 0 <= size <= room and files > 0:
            try:
                shutil.copy2(source, target)
                room, files = room - size, files - 1
                continue
            except OSError:  # unreadable: a link, as for the rest
                with contextlib.suppress(OSError):
                    os.unlink(target)
        os.symlink(source, target)


def _copy_size(entry: os.DirEntry[str]) -> int:
    """The size of a regular file worth copying, -1 for anything else."""
    try:
        return entry.stat(follow_symlinks=False).st_size if entry.is_file(follow_symlinks=False) else -1
    except OSError:
        return -1


class _View:
    def __init__(self, view: str, real: str) -> None:
        self.view, self.real = view, real

    def linked(self, path: str) -> str:
        """The user's path that view path ``path`` links to, when it is one of the view's links."""
        rel = os.path.relpath(path, self.view)
        target = os.path.join(self.real, rel)
        try:
            return target if os.readlink(path) == target and not os.path.islink(target) else ""
        except OSError:
            return ""

    def materialise(self, link: str, real: str) -> None:
        """Turn a linked folder into a folder of the view with links to its entries."""
        _ORIGINAL["unlink"](link)
        _ORIGINAL["mkdir"](link)
        build(real, link)

    def own(self, path: Any, last: str, dir_fd: int | None = None) -> None:
        """Make ``path`` the view's before a call changes it. ``last``: what becomes of the final entry:
        ``entry`` (the call acts on the entry itself), ``file`` (changed in place: copied in), ``new``
        (truncated: the link goes), ``folder`` (a linked folder is materialised)."""
        if dir_fd is not None or isinstance(path, int):
            return
        try:
            text = os.fsdecode(os.fspath(path))
        except TypeError:
            return
        full = os.path.abspath(text)
        if not full.startswith(self.view + os.sep):
            return
        parts = full[len(self.view) + 1 :].split(os.sep)
        here = self.view
        for name in parts[:-1]:
            here = os.path.join(here, name)
            real = self.linked(here)
            if real and os.path.isdir(real):
                self.materialise(here, real)
        final = os.path.join(here, parts[-1])
        real = self.linked(final)
        if not real or last == "entry":
            return
        if os.path.isdir(real):
            if last == "folder":
                self.materialise(final, real)
            return
        if last == "new":
            _ORIGINAL["unlink"](final)
        elif last == "file":
            _copy_in(real, final)


def _copy_in(real: str, final: str) -> None:
    part = f"{final}.ddpcheck-copy"
    with _ORIGINAL["builtin_open"](real, "rb") as source, _ORIGINAL["builtin_open"](part, "wb") as target:
        shutil.copyfileobj(source, target)
    shutil.copystat(real, part)
    _ORIGINAL["replace"](part, final)


def _open_last(mode: str) -> str:
    if "w" in mode:
        return "new"
    if "a" in mode or "+" in mode:
        return "file"
    return ""


def _flags_last(flags: int) -> str:
    if not flags & (os.O_WRONLY | os.O_RDWR):
        return ""
    return "new" if flags & os.O_TRUNC else "file"


def install(view: str, real: str) -> None:
    """Patch this process's file-changing calls so that they act on the view (see the module)."""
    if _ORIGINAL:
        return
    state = _View(os.path.realpath(view), os.path.realpath(real))
    for name in ("open", "mkdir", "unlink", "remove", "rmdir", "rename", "replace", "truncate", "utime"):
        _ORIGINAL[name] = getattr(os, name)
    _ORIGINAL["builtin_open"] = builtins.open
    _ORIGINAL["rmtree"] = shutil.rmtree
    original_open = builtins.open

    def py_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        last = _open_last(mode)
        if last:
            state.own(file, last)
        return original_open(file, mode, *args, **kwargs)

    def os_open(path: Any, flags: int, *args: Any, dir_fd: int | None = None, **kwargs: Any) -> int:
        last = _flags_last(flags)
        if last:
            state.own(path, last, dir_fd)
        return int(_ORIGINAL["open"](path, flags, *args, dir_fd=dir_fd, **kwargs))

    def acting(name: str, last: str, paths: int = 1) -> Callable[..., Any]:
        original = _ORIGINAL[name]

        def call(*args: Any, **kwargs: Any) -> Any:
            fds = (kwargs.get("dir_fd"), kwargs.get("src_dir_fd"), kwargs.get("dst_dir_fd"))
            for i, path in enumerate(args[:paths]):
                state.own(path, last, fds[0] if paths == 1 else fds[1 + i])
            return original(*args, **kwargs)

        return call

    def rmtree(path: Any, *args: Any, **kwargs: Any) -> Any:
        state.own(path, "folder", kwargs.get("dir_fd"))
        return _ORIGINAL["rmtree"](path, *args, **kwargs)

    rmtree.avoids_symlink_attacks = shutil.rmtree.avoids_symlink_attacks  # type: ignore[attr-defined]
    builtins.open = io.open = py_open  # type: ignore[assignment]
    os.open = os_open  # type: ignore[assignment]
    os.mkdir = acting("mkdir", "entry")  # type: ignore[assignment]
    os.unlink = acting("unlink", "entry")  # type: ignore[assignment]
    os.remove = acting("remove", "entry")  # type: ignore[assignment]
    os.rmdir = acting("rmdir", "folder")  # type: ignore[assignment]
    os.rename = acting("rename", "entry", 2)  # type: ignore[assignment]
    os.replace = acting("replace", "entry", 2)  # type: ignore[assignment]
    os.truncate = acting("truncate", "file")  # type: ignore[assignment]
    os.utime = acting("utime", "file")  # type: ignore[assignment]
    shutil.rmtree = rmtree  # type: ignore[assignment]
