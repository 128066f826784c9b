"""Which samples each batch holds: the real loader's batches with their ids, or the sampler's index
batches without loading data.

Both are small iterables that say, once iterated, how the samples were identified (``source``):
nothing is written into an argument the caller passed.
"""

from __future__ import annotations

import copy
from array import array
from collections.abc import Callable, Hashable, Iterator
from itertools import islice
from typing import Any, cast

from ddpcheck.checker.facts import as_indices, restored_rng
from ddpcheck.checker.identity import OBJECT_ITEMS, batch_digest, make_id_extractor, sampler_item_id
from ddpcheck.checker.index_log import index_items, log_of
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


class IdBatches:
    """The real loader's batches (workers, wrappers and all), each with its sample ids and worker.

    Ids: the ``sample_ids`` hook; for map-style datasets the indices the DataLoader iterator itself
    dispatched for that batch (:mod:`ddpcheck.checker.index_log`: exact with prefetching, out-of-order
    delivery and persistent workers); else a field or a content hash. ``source`` says which, as far as
    the iteration went ("index" before it starts; ``found``: None until it decided). One pass.
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
        collated = is_collated(self.loader)
        extract: Callable[[Any], list[Hashable]] | None = None
        indexed = 0
        base = base_indices(getattr(self.loader, "dataset", None)) if by_index else None
        for batch in self.outer:
            batch_ids, worker = log.ready.popleft() if log.ready else (None, None)
            if by_index and batch_ids is None:
                # No torch DataLoader iterator in this process handed this batch out (a loader that forms
                # batches itself; a framework whose rank 0 loads for every rank): the batch's own data
                # identifies it from here on, and the runner identifies every run that way.
                by_index = False
            if by_index and batch_ids is not None:
                indexed += 1
                self.found = "index"
                batch_ids = to_base(batch_ids, base)  # a Subset's positions as the samples they name
            else:
                if extract is None:
                    source, extract = make_id_extractor(self.hook, batch, collated)
                    self.found = MIXED_IDS if indexed else source
                batch_ids = extract(batch)
            yield batch, batch_ids, worker


def batches_with_ids(
    outer: Any,
    hook: Callable[[Any], Any] | None,
    facts: LoaderFacts,
    info: None = None,
    loader: Any = None,
    *,
    by_index: bool = True,
) -> IdBatches:
    """:class:`IdBatches` of ``outer`` (``info`` is no longer used: the result's ``source`` says it)."""
    del info
    return IdBatches(outer, hook, facts, loader, by_index=by_index)


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


def sampler_batches(loader: Any) -> SamplerBatches:
    return SamplerBatches(loader)


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
