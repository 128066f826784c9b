"""Attributes ddpcheck replaces on torch, numpy and ``random`` for the step watcher, kept to be undone.

A rank process keeps its patches to the end; a test (or anything running the watcher in a process
that goes on) calls :func:`undo` and gets the originals back, exactly: a class attribute that was
inherited is deleted again, a ``staticmethod`` object is put back as it was.
"""

from __future__ import annotations

from typing import Any

_MISSING = object()
_saved: list[tuple[Any, str, Any]] = []
_handles: list[Any] = []


def replace(owner: Any, name: str, value: Any) -> None:
    """``setattr(owner, name, value)``, remembering what was there."""
    old = owner.__dict__.get(name, _MISSING) if isinstance(owner, type) else getattr(owner, name, _MISSING)
    _saved.append((owner, name, old))
    setattr(owner, name, value)


def keep_handle(handle: Any) -> None:
    """A hook handle (``.remove()``) to remove on :func:`undo`."""
    _handles.append(handle)


def undo() -> None:
    """Every replaced attribute back, last first; every kept hook removed."""
    while _saved:
        owner, name, old = _saved.pop()
        if old is _MISSING:
            try:
                delattr(owner, name)
            except AttributeError:
                pass
        else:
            setattr(owner, name, old)
    while _handles:
        _handles.pop().remove()
