"""Watching torch's DataLoader in a training script's rank: every loader built and every ``iter()``.

:func:`install` wraps ``DataLoader.__init__`` (name the loader, give it an index log before its first
iterator) and ``__iter__`` of DataLoader and of every subclass that overrides it (when an instance is
made), and spies on ``set_epoch`` of the loaders' sampling parts. What is seen goes to the active
:class:`Watcher` (:func:`watching`), through its three methods only; with none active the wrappers
do what the originals do.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, Protocol

from ddpcheck.checker.frames import call_at, user_site
from ddpcheck.checker.index_log import log_of


class Watcher(Protocol):
    """What the watchers tell the recorder of a script."""

    def name_for(self, loader: Any, frame: FrameType | None) -> str:
        """The name of a loader built (or first iterated) with ``frame`` as the caller."""
        ...

    def open_epoch(
        self, loader: Any, name: str, inner: Iterator[Any], caller: FrameType | None
    ) -> Iterator[Any]:
        """``iter(loader)``, called from ``caller``, returned ``inner``: the iterator the script receives
        instead."""
        ...

    def set_epoch_seen(self, name: str) -> None:
        """A ``set_epoch`` call reached a sampling part of the loader ``name``."""
        ...


_active: Watcher | None = None
_installed = False
_ITER_ATTR = "_ddpcheck_original_iter"
_NAME_ATTR = "_ddpcheck_loader_name"
_SPIED_ATTR = "_ddpcheck_set_epoch_spy"
_LOADERS_ATTR = "_ddpcheck_loaders"
_DRAWN_ATTR = "_ddpcheck_drawn_at"
SPLIT_CALLS = ("random_split", "Subset")  # the calls a Subset is drawn with, as the user wrote them
DISPATCHERS = ("accelerate.data_loader.DataLoaderDispatcher",)


@contextmanager
def watching(watcher: Watcher) -> Iterator[None]:
    """``watcher`` receives what the watchers see while the block runs (one at a time per process)."""
    global _active
    install()
    _active = watcher
    try:
        yield
    finally:
        _active = None


def loader_name(loader: Any) -> str | None:
    """The name given to ``loader`` when it was built under a watcher (None: none)."""
    return getattr(loader, _NAME_ATTR, None)


def install() -> None:
    """Install the watchers once per process. An ``__iter__`` called from a DataLoader's own method
    (``super().__iter__()``, timm's iterator built in ``__init__``) is the loader's inner business and
    is not recorded again."""
    global _installed
    if _installed:
        return
    from torch.utils.data import DataLoader

    original_init = DataLoader.__init__

    # wraps: the original's signature (inspect follows __wrapped__). Lightning re-creates a loader from
    # the arguments its __init__ was given, matched by name against inspect.signature(__init__);
    # behind a bare (*args, **kwargs) a positional dataset is lost ("no attribute '__dataset'").
    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        log_of(self)  # before the original: an iterator the constructor starts logs too
        original_init(self, *args, **kwargs)
        watcher = _active
        if watcher is not None:
            wrap_iter(type(self))
            caller = sys._getframe(1)
            while caller.f_back is not None and caller.f_locals.get("self") is self:
                caller = caller.f_back  # a subclass's own __init__ (super().__init__): its caller built it
            name = watcher.name_for(self, caller)
            object.__setattr__(self, _NAME_ATTR, name)
            mark_parts(self, name)
            _watch_dispatcher(sys._getframe(1).f_locals.get("self"))

    DataLoader.__init__ = __init__  # type: ignore[method-assign]
    wrap_iter(DataLoader)
    _watch_set_epoch()
    _watch_subsets()
    _installed = True


def _watch_subsets() -> None:
    """Tag every ``Subset`` built under a watcher with the user's call that drew it (``random_split(data,
    [0.9, 0.1]) at train.py:17``), so a cause can name the split a rank drew differently."""
    from torch.utils.data import Subset

    original = Subset.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if _active is None:
            return
        caller = sys._getframe(1)
        site, _ = user_site(caller)
        if site == "<unknown>":
            return
        try:
            object.__setattr__(self, _DRAWN_ATTR, f"{call_at(caller, SPLIT_CALLS)} at {site}")
        except (AttributeError, TypeError):
            pass

    Subset.__init__ = __init__  # type: ignore[method-assign]


def drawn_at(dataset: Any) -> str:
    """The user's call that drew ``dataset`` or the first Subset below it ("" where none was seen)."""
    for _ in range(8):  # Subsets of Subsets, as deep as anyone nests them
        if dataset is None:
            return ""
        found = getattr(dataset, _DRAWN_ATTR, "")
        if found:
            return str(found)
        dataset = getattr(dataset, "dataset", None)
    return ""


def wrap_iter(cls: type) -> None:
    """Record the epochs of every DataLoader class in ``cls``'s MRO that defines its own ``__iter__``."""
    from torch.utils.data import DataLoader

    for klass in cls.__mro__:
        if not (isinstance(klass, type) and issubclass(klass, DataLoader)):
            continue
        _wrap_own_iter(klass)


def _wrap_own_iter(klass: type) -> None:
    """Record the epochs of ``klass.__iter__`` where the class defines one (once)."""
    own = klass.__dict__.get("__iter__")
    if own is not None and getattr(own, _ITER_ATTR, None) is None:
        klass.__iter__ = _iter_wrapper(own)  # type: ignore[method-assign,attr-defined]


def _watch_dispatcher(owner: Any) -> None:
    """Record a dispatching adapter where the model meets it. Accelerate's ``DataLoaderDispatcher``
    (its default for an ``IterableDataset``) iterates the DataLoader it builds on rank 0 alone and
    hands every rank a slice of each batch; the DataLoader's own stream is no rank's data. Adapters
    that pass their DataLoader's batches through (``DataLoaderShard``) stay recorded at the DataLoader,
    by its indices."""
    kind = type(owner)
    if owner is None or f"{kind.__module__}.{kind.__qualname__}" not in DISPATCHERS:
        return
    _wrap_own_iter(kind)


def _recorded_outside(inside: Any) -> bool:
    """``inside`` (the object whose method called ``__iter__``) is a loader recorded itself: what it
    iterates is its inner business."""
    from torch.utils.data import DataLoader

    if inside is None:
        return False
    kind = type(inside)
    wrapped = getattr(kind.__dict__.get("__iter__"), _ITER_ATTR, None) is not None
    return issubclass(kind, DataLoader) or wrapped


def _iter_wrapper(original: Callable[[Any], Iterator[Any]]) -> Callable[[Any], Iterator[Any]]:
    def __iter__(self: Any) -> Iterator[Any]:
        watcher = _active
        caller = sys._getframe(1)
        if watcher is None or _recorded_outside(caller.f_locals.get("self")):
            return original(self)
        inner = original(self)
        name = loader_name(self) or watcher.name_for(self, caller)
        return watcher.open_epoch(self, name, inner, caller)

    setattr(__iter__, _ITER_ATTR, original)
    __iter__.__doc__ = original.__doc__
    return __iter__


def _watch_set_epoch() -> None:
    """Count ``set_epoch`` calls that reach a recorded loader's sampler, batch sampler or dataset, so
    a cause can say the loop never called it (torch's samplers; other classes when a loader opens)."""
    from torch.utils.data import DistributedSampler

    _spy_class(DistributedSampler)


def _spy_class(cls: type) -> None:
    original = cls.__dict__.get("set_epoch")
    if original is None or getattr(original, _SPIED_ATTR, False):
        return

    def set_epoch(self: Any, epoch: int, *args: Any, **kwargs: Any) -> Any:
        watcher = _active
        if watcher is not None:
            for name in getattr(self, _LOADERS_ATTR, ()):
                watcher.set_epoch_seen(name)
        return original(self, epoch, *args, **kwargs)

    setattr(set_epoch, _SPIED_ATTR, True)
    cls.set_epoch = set_epoch  # type: ignore[attr-defined]


def mark_parts(loader: Any, name: str) -> None:
    """Tag the loader's sampling parts with its name, so their set_epoch calls are counted for it."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    parts = (
        loader,
        getattr(loader, "sampler", None),
        batch_sampler,
        getattr(batch_sampler, "sampler", None),
        getattr(batch_sampler, "batch_sampler", None),
        getattr(loader, "dataset", None),
    )
    for part in parts:
        if part is None or not callable(getattr(part, "set_epoch", None)):
            continue
        _spy_class(type(part))
        names = getattr(part, _LOADERS_ATTR, ())
        if name not in names:
            try:
                object.__setattr__(part, _LOADERS_ATTR, (*names, name))
            except (AttributeError, TypeError):
                pass
