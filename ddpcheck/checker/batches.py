"""Which samples each batch holds: the real loader's batches with their ids, or the sampler's index
batches without loading data.

Both are small iterables that say, once iterated, how the samples were identified (``source``):
nothing is written into an argument the caller passed.
"""

from __future__ import annotations

import copy
from array import array
from collections.abc import Callable, Hashable, Iterable, Iterator
from itertools import islice
from typing import Any, cast

from ddpcheck.checker.facts import as_indices, restored_rng
from ddpcheck.checker.identity import OBJECT_ITEMS, batch_digest, make_id_extractor, sampler_item_id
from ddpcheck.checker.index_log import IndexLog, index_items, log_of
from ddpcheck.checker.loaderfile import is_torch_loader, unwrap_loader
from ddpcheck.checker.subsets import base_indices, to_base
from ddpcheck.trace import LoaderFacts

MIXED_IDS = "mixed"  # a stream identified by index, then by data: only a rerun by data compares
CONTENT_STEPS = 8  # batches per epoch whose content is digested where ids come from the sampler alone

IdBatch = tuple[Any, list[Hashable], "int | None"]  # (batch, its sample ids, the worker that loaded it)


def is_collated(loader: Any) -> bool:
    """True when the loader yields batches; False for ``batch_size=None`` (one sample per item)."""
    loader = unwrap_loader(loader)
    if not is_torch_loader(loader):
        return True  # a loader of its own yields batches
    return loader.batch_size is not None or loader.batch_sampler is not None


class BatchIds:
    """Decides each batch's sample ids, batch by batch, for one pass of a loader: the one id step of
    pulling (:class:`IdBatches`) and pushing (a training script's recorder).

    :meth:`ids_of` takes the batch and the indices the index log says its DataLoader iterator
    dispatched for it (None: none, or not to be used): those indices, mapped through ``base`` (a
    ``Subset``'s or an HF indices mapping's positions as the samples they name); else the
    ``sample_ids`` hook, a field or a content hash, picked on the first such batch. ``found`` says the
    source so far (None: no batch yet; :data:`MIXED_IDS`: by data after some batch by index, in this
    pass or, through ``indexed``, an earlier one); ``indexed``: some batch was identified by index.
    """

    def __init__(
        self,
        hook: Callable[[Any], Any] | None,
        collated: bool,
        base: array[int] | None = None,
        *,
        indexed: bool = False,
    ) -> None:
        self.hook, self.collated, self.base = hook, collated, base
        self.indexed = indexed
        self.found: str | None = None
        self._extract: Callable[[Any], list[Hashable]] | None = None

    @property
    def by_data(self) -> bool:
        """Some batch of this pass was identified by its data (``found`` is then that source)."""
        return self._extract is not None

    def ids_of(self, batch: Any, dispatched: list[Hashable] | None) -> list[Hashable]:
        if dispatched is not None:
            self.indexed = True
            if self.found is None:
                self.found = "index"
            return to_base(dispatched, self.base)
        if self._extract is None:
            source, self._extract = make_id_extractor(self.hook, batch, self.collated)
            self.found = MIXED_IDS if self.indexed else source
        return self._extract(batch)


class IdBatches:
    """The real loader's batches (workers, wrappers and all), each with its sample ids and worker.

    Ids (:class:`BatchIds`): the ``sample_ids`` hook; for map-style datasets the indices the DataLoader
    iterator itself dispatched for that batch (:mod:`ddpcheck.checker.index_log`: exact with
    prefetching, out-of-order delivery and persistent workers); else a field or a content hash.
    ``source`` says which, as far as the iteration went ("index" before it starts; ``found``: None
    until it decided). One pass.
    """

    def __init__(
        self,
        outer: Any,
        hook: Callable[[Any], Any] | None,
        facts: LoaderFacts,
        loader: Any = None,
        *,
        by_index: bool = True,
    ) -> None:
        self.outer, self.hook = outer, hook
        self.loader = loader if loader is not None else unwrap_loader(outer)
        self.by_index = by_index and facts.dataset_kind == "map" and hook is None
        self.found: str | None = None

    @property
    def source(self) -> str:
        return self.found or "index"

    def __iter__(self) -> Iterator[IdBatch]:
        log = log_of(self.loader)
        log.clear()
        by_index = self.by_index
        base = base_indices(getattr(self.loader, "dataset", None)) if by_index else None
        step = BatchIds(self.hook, is_collated(self.loader), base)
        for batch in self.outer:
            dispatched, worker = log.ready.popleft() if log.ready else (None, None)
            if dispatched is None:
                # No torch DataLoader iterator in this process handed this batch out (a loader that forms
                # batches itself; a framework whose rank 0 loads for every rank): the batch's own data
                # identifies it from here on, and the runner identifies every run that way.
                by_index = False
            batch_ids = step.ids_of(batch, dispatched if by_index else None)
            self.found = step.found
            yield batch, batch_ids, worker


def settled_ids(
    iterable: Iterable[Any],
    hook: Callable[[Any], Any] | None,
    facts: LoaderFacts,
    loader: Any,
    log: IndexLog,
    *,
    by_index: bool = True,
    on_batch: Callable[[int], None] | None = None,
) -> list[list[Hashable]]:
    """Every batch's ids of one pass of ``iterable``, what a restored loop iterates (the loader, or what
    a resume hook returned), through the same step as :class:`IdBatches` (:class:`BatchIds`). Index
    identity is settled when the pass ends: a restored iterator fast-forwards, and a hook's iterable may
    skip (``islice``), batches its DataLoader delivered and ``log`` logged, so the yielded ones are the
    log's last entries. ``on_batch(count)`` runs after each batch, the iterator alive (a state saved
    there is saved as training saves it)."""
    log.clear()
    by_index = by_index and facts.dataset_kind == "map" and hook is None
    base = base_indices(getattr(loader, "dataset", None)) if by_index else None
    step = BatchIds(hook, is_collated(iterable), base)
    out: list[list[Hashable]] = []
    count = 0
    for batch in iterable:
        count += 1
        if not by_index:
            out.append(step.ids_of(batch, None))
        if on_batch is not None:
            on_batch(count)
    if not by_index:
        return out
    entries = list(log.ready)[-count:] if count else []
    if len(entries) < count or any(ids is None for ids, _ in entries):
        raise RuntimeError("cannot tell which indices the resumed loader yielded; define sample_ids(batch)")
    return [step.ids_of(None, ids or []) for ids, _ in entries]


class SamplerBatches:
    """The (batch) sampler's items as index batches, each with worker None (no data is loaded).

    torch's own samplers (exactly these classes, under torch's own ``BatchSampler``) yield plain
    ints by construction (``range``, ``tolist()``), so their batches become ``array('q')`` in one C
    pass; anything else goes item by item. A sampler of objects (lhotse's ``CutSet``s) is identified
    by them (:func:`~ddpcheck.checker.identity.sampler_item_id`), and ``source`` then says so
    (``found``: None until then).
    """

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.found: str | None = None

    @property
    def source(self) -> str:
        return self.found or "index"

    def __iter__(self) -> Iterator[tuple[list[Hashable], int | None]]:
        from torch.utils.data import (
            BatchSampler,
            DistributedSampler,
            RandomSampler,
            SequentialSampler,
            WeightedRandomSampler,
        )

        plain = (SequentialSampler, RandomSampler, DistributedSampler, WeightedRandomSampler)
        loader = self.loader
        source = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
        base = base_indices(getattr(loader, "dataset", None))
        if type(source) is BatchSampler and type(source.sampler) in plain:
            for item in source:
                if base is not None:
                    item = [base[i] for i in item]
                yield cast("list[Hashable]", array("q", item)), None
            return
        for item in source:
            try:
                yield to_base(cast("list[Hashable]", as_indices(item)), base), None
            except TypeError:
                self.found = OBJECT_ITEMS
                yield [sampler_item_id(i) for i in index_items(item)], None

    def whole(self) -> tuple[Any, array[int]] | None:
        """The epoch as one numpy array of indices and its batch sizes, where the sampler is one that
        ``--simulate`` reads as arrays at scale (:func:`~ddpcheck.launch.shared_work.epoch_array`) under
        torch's own ``BatchSampler``; None otherwise (the epoch is then iterated)."""
        from torch.utils.data import BatchSampler

        from ddpcheck.launch.shared_work import epoch_array

        loader = self.loader
        source = loader.batch_sampler
        if type(source) is not BatchSampler or base_indices(getattr(loader, "dataset", None)) is not None:
            return None
        ids = epoch_array(source.sampler)
        if ids is None:
            return None
        size = int(source.batch_size)
        full, rest = divmod(len(ids), size)
        sizes = array("q", [size]) * full
        if rest and source.drop_last:
            ids = ids[: full * size]
        elif rest:
            sizes.append(rest)
        return ids, sizes


def head_digests(loader: Any, steps: int = CONTENT_STEPS) -> list[int]:
    """The content digests of the first ``steps`` batches the loader would yield now, from a copy of it
    (same sampler state, dataset shared) iterated with every global random state put back afterwards:
    the loader itself, and so the recorded stream, is left exactly as a training loop would find it.
    Where ids come from the sampler, this is what a mesh's replicas compare of their content; loading
    every batch of every epoch only to digest it would cost a full data pass. A loader that cannot be
    copied has no such head: [] (replicas are then compared by ids)."""
    with restored_rng():
        try:
            twin = copy.deepcopy(loader, {id(loader.dataset): loader.dataset})
            return [batch_digest(batch) for batch in islice(twin, steps)]
        except Exception:
            return []
