"""Which dataset indices each batch holds, read where torch's DataLoader iterators hand them out.

A map-style batch is identified by the indices its (batch) sampler produced. Reading them off the
sampler from outside goes wrong as soon as the iterator prefetches (workers fetch ahead, and
``iter(loader)`` already dispatches ``prefetch_factor * num_workers`` batches), delivers out of order
(``in_order=False``), keeps workers across epochs, or fast-forwards after a restore. So the log is
kept inside the iterator itself: every index the iterator dispatches is appended in dispatch order,
and every batch it delivers is matched to its dispatch number (by the task index torch pairs with
the data). Frameworks that wrap a DataLoader (Accelerate, Lightning Fabric) still iterate a real
DataLoader underneath, so the same log sees their batches; the outer loop pops one entry per batch.

Private torch API (``_BaseDataLoaderIter._next_index``/``_reset``, the multiprocessing iterator's
``_get_data``/``_process_data``), stable since torch 1.x and mirrored by torchdata's stateful
iterators. Patches are installed once per rank process and do nothing for loaders without a log.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import Any

_ATTR = "_ddpcheck_index_log"


class IndexLog:
    """Filled by the loader's iterators: per delivered batch, (its indices or None, its worker or None)."""

    def __init__(self) -> None:
        self.ready: deque[tuple[list[Hashable] | None, int | None]] = deque()
        self.iterators = 0

    def clear(self) -> None:
        self.ready.clear()


def log_of(loader: Any) -> IndexLog:
    """The loader's log, attached on first use and kept for the loader's life: a persistent-workers
    iterator created in one epoch keeps logging in the next. Bypasses ``DataLoader.__setattr__``."""
    install()
    log = getattr(loader, _ATTR, None)
    if log is None:
        log = IndexLog()
        try:
            object.__setattr__(loader, _ATTR, log)
        except (AttributeError, TypeError):  # a loader with __slots__: no torch iterator to log anyway
            pass
    _drop_unlogged_initial_iterator(loader)
    return log


def adopt(loader: Any, early: IndexLog) -> None:
    """``early`` caught the iterators built while the factory ran (a loader that starts its one iterator
    in ``__init__``, as timm's ``MultiEpochsDataLoader`` does; Accelerate's stateful ``prepare``, whose
    ``state_dict()`` builds the iterator the first loop then reuses): it becomes the loader's log, so
    those iterators are used as training would use them, never rebuilt (with workers, building one
    already draws the epoch's order)."""
    if early.iterators and getattr(loader, _ATTR, None) is None:
        early.clear()  # what the factory itself iterated is no batch of the loop
        try:
            object.__setattr__(loader, _ATTR, early)
        except (AttributeError, TypeError):
            pass


def _drop_unlogged_initial_iterator(loader: Any) -> None:
    """torchdata's ``StatefulDataLoader.state_dict()`` on a loader not yet iterated builds the iterator
    that the first ``iter()`` then reuses (Accelerate's stateful ``prepare`` calls it). Built before
    the log, that iterator never logs; nothing has been taken from it, so the next ``iter()`` may as
    well build a fresh, logged one."""
    iterator = getattr(loader, "_iterator", None)
    if (
        iterator is not None
        and getattr(loader, "_initial_iter_for_state_dict", False)
        and getattr(iterator, "_ddpcheck_log", None) is None
    ):
        object.__setattr__(loader, "_iterator", None)
        object.__setattr__(loader, "_initial_iter_for_state_dict", False)


class Dispatched:
    """What one logged DataLoader iterator was sent so far: every index item, in dispatch order, and where
    its current pass starts (dispatch numbers, torch's task indices, restart at 0 with each ``_reset``)."""

    def __init__(self, items: list[Any], base: int) -> None:
        self.items, self.base = items, base

    def item(self, task: int) -> Any:
        """The index item of task ``task`` of the current pass."""
        return self.items[self.base + task]


def dispatched(iterator: Any, log: IndexLog) -> Dispatched | None:
    """What ``iterator`` dispatched, when it is a torch iterator that logs into ``log`` (None: it logs
    nowhere or elsewhere). The one reader of the attributes :func:`install` puts on iterators."""
    items = getattr(iterator, "_ddpcheck_sent", None)
    if items is None or getattr(iterator, "_ddpcheck_log", None) is not log:
        return None
    return Dispatched(items, iterator._ddpcheck_base)


def _indices(item: Any) -> list[Hashable] | None:
    if item is None:
        return None
    items = index_items(item)
    if all(type(i) is int for i in items):
        return items
    from ddpcheck.checker.identity import sampler_item_id

    return [sampler_item_id(i) for i in items]  # objects a sampler yields (lhotse's cuts), by their id


def _refuse_numbers(index: Any) -> None:
    """Raise BadLoaderFile when what the sampler yielded holds a number that is not an int index."""
    if type(index) is int:
        return
    items = index_items(index)
    if all(type(i) is int for i in items):
        return
    from ddpcheck.checker.identity import refuse_numeric_index

    for item in items:
        refuse_numeric_index(item.item() if hasattr(item, "item") and getattr(item, "ndim", 1) == 0 else item)


def indices_of(item: Any) -> list[Hashable] | None:
    """What one item of a (batch) sampler identifies: its indices, or the ids of the objects it yields."""
    return _indices(item)


def index_items(item: Any) -> list[Any]:
    """What a sampler yielded, as a list: one index (an int, a 0-d tensor or array) or a batch of them."""
    if isinstance(item, int):
        return [item]
    if hasattr(item, "tolist"):
        item = item.tolist()
        if isinstance(item, int):
            return [item]
    try:
        return list(item)
    except TypeError:
        return [item]


_installed = False
_catch_all: IndexLog | None = None  # while set, iterators of loaders without a log of their own log here


class catch_all:
    """Log every DataLoader iterator created meanwhile, also of loaders user code builds on the fly (a
    resume hook that rebuilds the loader and starts iterating it before returning). A loader with a log
    of its own (built under the script watchers, which give every loader one) logs into both."""

    def __init__(self) -> None:
        self.log = IndexLog()

    def __enter__(self) -> IndexLog:
        global _catch_all
        install()
        self._outer, _catch_all = _catch_all, self.log
        return self.log

    def __exit__(self, *exc: object) -> None:
        global _catch_all
        _catch_all = self._outer


def install() -> None:
    """Patch torch's base iterator once; the per-instance hooks are set up in its ``__init__``."""
    global _installed
    if _installed:
        return
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    original_init = _BaseDataLoaderIter.__init__
    original_reset = _BaseDataLoaderIter._reset
    original_next_index = _BaseDataLoaderIter._next_index

    def __init__(self: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
        own, caught = getattr(loader, _ATTR, None), _catch_all
        log = own or caught
        self._ddpcheck_log = log
        if log is not None:
            logs = (log,) if own is None or caught is None or caught is own else (own, caught)
            for each in logs:
                each.iterators += 1
            self._ddpcheck_sent = []
            self._ddpcheck_base = 0
            self._ddpcheck_pending = {}
            _hook_instance(self, logs)
        original_init(self, loader, *args, **kwargs)

    def _reset(self: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
        if getattr(self, "_ddpcheck_log", None) is not None:
            self._ddpcheck_base = len(self._ddpcheck_sent)  # dispatch numbers restart at 0
        original_reset(self, loader, *args, **kwargs)

    def _next_index(self: Any) -> Any:
        index = original_next_index(self)
        if getattr(self, "_ddpcheck_log", None) is not None:
            _refuse_numbers(index)  # before the fetch: a float index is bad input, not a dataset crash
            self._ddpcheck_sent.append(index)
        return index

    _BaseDataLoaderIter.__init__ = __init__  # type: ignore[method-assign]
    _BaseDataLoaderIter._reset = _reset  # type: ignore[method-assign]
    _BaseDataLoaderIter._next_index = _next_index  # type: ignore[method-assign]
    _installed = True


def _hook_instance(it: Any, logs: tuple[IndexLog, ...]) -> None:
    """Log each batch ``it`` delivers, with its indices and worker, into every one of ``logs``."""

    def ready(entry: tuple[list[Hashable] | None, int | None]) -> None:
        for log in logs:
            log.ready.append(entry)

    cls = type(it)
    multiprocess = hasattr(cls, "_process_data")
    if multiprocess:

        def get_data() -> Any:
            task, payload = cls._get_data(it)
            it._ddpcheck_pending[id(payload)] = (task, payload)
            if isinstance(payload, tuple) and len(payload) == 3:  # torchdata: (data, worker_id, state)
                it._ddpcheck_pending[id(payload[0])] = (task, payload[0])
            return task, payload

        def process_data(data: Any, worker: Any = None, *args: Any, **kwargs: Any) -> Any:
            entry = it._ddpcheck_pending.pop(id(data), None)
            task = entry[0] if entry is not None else it._rcvd_idx - 1
            position = it._ddpcheck_base + task
            sent = it._ddpcheck_sent
            ids = _indices(sent[position]) if 0 <= position < len(sent) else None
            ready((ids, worker if isinstance(worker, int) else None))
            return cls._process_data(it, data, worker, *args, **kwargs)

        it._get_data = get_data
        it._process_data = process_data
    else:

        def next_data() -> Any:
            before = len(it._ddpcheck_sent)
            data = cls._next_data(it)
            sent = it._ddpcheck_sent
            ready((_indices(sent[before]) if len(sent) > before else None, None))
            return data

        it._next_data = next_data
