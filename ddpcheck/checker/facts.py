"""What a rank reads off its loader before iterating it: the :class:`~ddpcheck.trace.LoaderFacts`.

Read from the objects (the dataset, its (batch) sampler, the loader's settings), never by iterating the
loader: a probe that must run a sampler (:func:`plain_batching`) runs copies with every global random
state put back, so the stream a training loop would see is untouched. The small helpers that walk a
loader's parts (:func:`sampling_parts`, :func:`distinct`) live here too; setting the epoch and reading
ids use them.
"""

from __future__ import annotations

import copy
import operator
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import islice
from typing import Any

from ddpcheck.checker.index_log import index_items
from ddpcheck.checker.loaderfile import is_torch_loader, unwrap_loader
from ddpcheck.checker.subsets import base_indices, maps_indices
from ddpcheck.trace import LoaderFacts


def sampler_only_is_exact(outer: Any, loader: Any) -> bool:
    """True when the (batch) sampler's index stream is exactly what the training loop receives.

    That holds for ``torch.utils.data.DataLoader`` itself and for subclasses that do not override
    how iteration works; a wrapper object or an overridden ``__iter__``/``_get_iterator`` (Accelerate
    synchronises RNG there, torchdata restores state there) can change the stream.
    """
    from torch.utils.data import DataLoader

    if outer is not loader:
        return False
    cls = type(loader)
    return all(getattr(cls, name, None) is getattr(DataLoader, name) for name in _ITERATION_METHODS)


_ITERATION_METHODS = ("__iter__", "_get_iterator", "_index_sampler", "__len__")


def _iterable_shard_padding(dataset: Any) -> int:
    """Accelerate's ``IterableDatasetShard`` without ``drop_last`` completes the epoch's last round of
    batches with samples from its start, as ``even_batches`` does for map datasets: returns the
    per-rank batch it pads in (0 when the dataset does not pad that way)."""
    names = ("num_processes", "process_index", "batch_size", "drop_last")
    if not all(hasattr(dataset, name) for name in names) or dataset.drop_last:
        return 0
    size, processes = dataset.batch_size, dataset.num_processes
    if not (isinstance(size, int) and isinstance(processes, int) and size > 0 and processes > 0):
        return 0
    return max(size // processes, 1) if getattr(dataset, "split_batches", False) else size


def _padded_batch(part: Any) -> int:
    """Per-rank batch size of a batch sampler that pads whole batches (1 when unknown)."""
    inner = getattr(part, "batch_sampler", part)
    size = getattr(inner, "batch_size", None)
    if not isinstance(size, int) or size < 1:
        return 1
    if getattr(part, "split_batches", False):
        size //= max(int(getattr(part, "num_processes", 1)), 1)
    return max(size, 1)


def read_facts(outer: Any) -> LoaderFacts:
    from torch.utils.data import DistributedSampler, IterableDataset

    loader = unwrap_loader(outer)
    if not is_torch_loader(loader):
        return _own_loader_facts(outer)
    dataset = loader.dataset
    iterable = isinstance(dataset, IterableDataset)
    dataset_len = len_or_none(dataset)
    batch_sampler = loader.batch_sampler
    custom_batches = batch_sampler is not None and not iterable and not plain_batching(batch_sampler, dataset)
    sampler = _inner_sampler(loader) if batch_sampler is not None else loader.sampler
    sampler = sampler if sampler is not None else loader.sampler
    padding = None
    pad_unit = 1
    for part in distinct(sampler, batch_sampler, loader.sampler):
        if isinstance(part, DistributedSampler):
            padding = not part.drop_last
        elif hasattr(part, "pad_data_to_num_gpus"):
            padding = bool(part.pad_data_to_num_gpus)
        elif getattr(part, "even_batches", None) is True:  # Accelerate: pads the last batch from the start
            padding, pad_unit = True, _padded_batch(part)
    shard_unit = _iterable_shard_padding(dataset)
    if shard_unit:
        padding, pad_unit = True, shard_unit
    parts = distinct(outer, *sampling_parts(loader), dataset)
    batch_size, drop_last = _batching(loader, None if custom_batches else batch_sampler)
    replicas, place = _rank_split(sampling_parts(loader))
    subset, digest = subset_of(dataset)
    return LoaderFacts(
        dataset_kind="iterable" if iterable else "map",
        dataset_len=dataset_len,
        batch_size=batch_size,
        drop_last=drop_last,
        sampler=type(sampler).__name__ if sampler is not None else None,
        batch_sampler=type(batch_sampler).__name__ if batch_sampler is not None else None,
        num_workers=int(loader.num_workers),
        padding=padding,
        pad_unit=pad_unit,
        batch_level=custom_batches,
        per_rank_batches=_per_rank_batches(batch_sampler, sampler) if custom_batches else "",
        has_set_epoch=any(callable(getattr(p, "set_epoch", None)) for p in parts),
        shuffles=_declared_shuffle(sampler),
        in_order=bool(getattr(loader, "in_order", True)) or int(loader.num_workers) == 0,
        index_space=None if iterable or maps_indices(dataset) else dataset_len,
        sampler_replicas=replicas,
        sampler_rank=place,
        subset=subset,
        subset_digest=digest,
        grad_enabled=_grad_enabled(),
    )


def _grad_enabled() -> bool | None:
    import torch

    return bool(torch.is_grad_enabled())


def _rank_split(parts: list[Any]) -> tuple[int | None, int | None]:
    """What the first rank-splitting part (``DistributedSampler``, or any sampler holding integer
    ``num_replicas`` and ``rank``) was told: the number of ranks and this rank's place."""
    for part in parts:
        replicas, rank = getattr(part, "num_replicas", None), getattr(part, "rank", None)
        if type(replicas) is int and type(rank) is int:
            return replicas, rank
    return None, None


def subset_of(dataset: Any) -> tuple[str, str]:
    """("Subset" | "indices mapping", a digest of the samples it holds in order), or ("", "").

    ``random_split`` without a seeded generator draws a different Subset on every rank; the digest
    lets a judge see that the ranks' datasets differ without carrying the indices."""
    import hashlib

    from torch.utils.data import Subset

    kind = "Subset" if isinstance(dataset, Subset) else ""
    if not kind and type(dataset).__module__ == "datasets.arrow_dataset":
        kind = "indices mapping" if getattr(dataset, "_indices", None) is not None else ""
    if not kind:
        return "", ""
    indices = base_indices(dataset)
    if indices is None:
        return kind, ""
    return kind, hashlib.blake2b(indices.tobytes(), digest_size=8).hexdigest()


def _batching(loader: Any, plain_batch_sampler: Any) -> tuple[int | None, bool]:
    """Batch size and ``drop_last``. Given ``batch_sampler=BatchSampler(sampler, B, drop_last=True)``,
    torch keeps them on the batch sampler and sets its own to None and False, yet every rank still
    drops its last partial batch, as with ``DataLoader(batch_size=B, drop_last=True)``."""
    if loader.batch_size is None and plain_batch_sampler is not None:
        for part in (plain_batch_sampler, *_wrapped_batch_samplers(plain_batch_sampler)):
            size = getattr(part, "batch_size", None)
            if isinstance(size, int) and not isinstance(size, bool) and size > 0:
                return size, getattr(part, "drop_last", False) is True
    return loader.batch_size, bool(loader.drop_last)


def _own_loader_facts(loader: Any) -> LoaderFacts:
    """A loader with no torch DataLoader underneath (torchdata.nodes' ``Loader``): nothing to read off
    but what it says of itself; its samples are identified by their data, as an iterable dataset's."""
    return LoaderFacts(
        dataset_kind="iterable",
        sampler=None,
        batch_sampler=None,
        has_set_epoch=callable(getattr(loader, "set_epoch", None)),
        drop_last=None,
    )


def _per_rank_batches(batch_sampler: Any, sampler: Any) -> str:
    """A custom batch sampler that groups the stream of a rank-aware sampler (mmdet's
    ``AspectRatioBatchSampler`` over ``DefaultSampler``, torchvision's ``GroupedBatchSampler`` over
    ``DistributedSampler``, Lightning re-creating a batch sampler over one): it forms its batches from
    each rank's share by design. Named as "Grouping over DistributedSampler"; "" otherwise."""
    from torch.utils.data import DistributedSampler

    rank_aware = isinstance(sampler, DistributedSampler) or (
        hasattr(sampler, "rank") and (hasattr(sampler, "num_replicas") or hasattr(sampler, "world_size"))
    )
    return f"{type(batch_sampler).__name__} over {type(sampler).__name__}" if rank_aware else ""


def _declared_shuffle(sampler: Any) -> bool | None:
    """What the sampler says of its order: True for a reshuffling one, None where it says nothing."""
    from torch.utils.data import RandomSampler, SequentialSampler

    if isinstance(sampler, RandomSampler):
        return True
    if isinstance(sampler, SequentialSampler):
        return False
    shuffle = getattr(sampler, "shuffle", None)
    return shuffle if isinstance(shuffle, bool) else None


PROBE_BATCHES = 4


def plain_batching(batch_sampler: Any, dataset: Any) -> bool:
    """Does this batch sampler only chunk its ``.sampler`` into ``batch_size`` batches?

    Decided by behaviour, not type: torch's ``BatchSampler`` is plain; so is any subclass that does
    not override ``__iter__``; otherwise (torchdata's resumable ``BatchSampler``, bucketing samplers)
    copies of the batch sampler and of its sampler are run from the same random state and compared
    over the first batches. The copies share the dataset and every global RNG is restored afterwards,
    so the probe leaves the loader's stream untouched. Anything that cannot be probed is custom.
    """
    from torch.utils.data import BatchSampler

    cls = type(batch_sampler)
    plain_type = isinstance(batch_sampler, BatchSampler) and cls.__iter__ is BatchSampler.__iter__
    if cls is BatchSampler or plain_type:
        return True
    held = getattr(batch_sampler, "batch_sampler", None)
    if held is not None and held is not batch_sampler and _passes_through(batch_sampler, held, dataset):
        return plain_batching(held, dataset)
    size = getattr(batch_sampler, "batch_size", None)
    for wrapped in _wrapped_batch_samplers(batch_sampler):
        size = size if size is not None else wrapped.batch_size
    inner = inner_sampler_of(batch_sampler)
    if inner is None or not isinstance(size, int) or isinstance(size, bool) or size < 1:
        return False
    try:
        with restored_rng():
            memo = {id(dataset): dataset}
            batches = [as_indices(b) for b in islice(copy.deepcopy(batch_sampler, memo), PROBE_BATCHES)]
        with restored_rng():
            memo = {id(dataset): dataset}
            items = [as_indices(i) for i in islice(copy.deepcopy(inner, memo), PROBE_BATCHES * size)]
    except Exception:
        return False
    flat = [i for item in items for i in item]
    chunks = [flat[k : k + size] for k in range(0, len(flat), size)][: len(batches)]
    if getattr(batch_sampler, "drop_last", False) and chunks and len(chunks[-1]) < size:
        chunks = chunks[:-1]
    return bool(batches) and batches == chunks


def _passes_through(outer: Any, held: Any, dataset: Any) -> bool:
    """A batch sampler holding another as ``.batch_sampler`` (Accelerate's ``BatchSamplerShard`` with one
    process, as ms-swift wraps a ``BatchSampler`` over a ``DistributedSampler``) that yields exactly the
    held one's first batches: it batches as the held one does. Probed on copies, RNG put back."""
    try:
        with restored_rng():
            mine = [
                as_indices(b) for b in islice(copy.deepcopy(outer, {id(dataset): dataset}), PROBE_BATCHES)
            ]
        with restored_rng():
            theirs = [
                as_indices(b) for b in islice(copy.deepcopy(held, {id(dataset): dataset}), PROBE_BATCHES)
            ]
    except Exception:
        return False
    return bool(mine) and mine == theirs


@contextmanager
def restored_rng() -> Iterator[None]:
    import random

    import torch

    py_state = random.getstate()
    torch_state = torch.random.get_rng_state()
    numpy = sys.modules.get("numpy")
    np_state = numpy.random.get_state() if numpy is not None else None
    try:
        yield
    finally:
        random.setstate(py_state)
        torch.random.set_rng_state(torch_state)
        if numpy is not None:
            numpy.random.set_state(np_state)


def len_or_none(obj: Any) -> int | None:
    """``len(obj)``, or None for anything it raises: energon's datasets refuse ``len()`` with an
    AttributeError on purpose, and a loader that trains without ``len()`` must not crash a check."""
    try:
        return len(obj)
    except Exception:
        return None


def as_indices(item: Any) -> list[int]:
    return [operator.index(i) for i in index_items(item)]


def distinct(*objects: Any) -> list[Any]:
    seen: list[Any] = []
    for obj in objects:
        if obj is not None and not any(obj is s for s in seen):
            seen.append(obj)
    return seen


def _inner_sampler(loader: Any) -> Any:
    batch_sampler = getattr(loader, "batch_sampler", None)
    return inner_sampler_of(batch_sampler) if batch_sampler is not None else None


def _wrapped_batch_samplers(batch_sampler: Any) -> list[Any]:
    """Batch samplers inside a wrapper's ``.sampler`` chain (timm's repeating wrapper holds one)."""
    found: list[Any] = []
    inner: Any = getattr(batch_sampler, "sampler", None)
    while len(found) < 4 and hasattr(inner, "sampler") and hasattr(inner, "batch_size"):
        found.append(inner)
        inner = inner.sampler
    return found


def inner_sampler_of(batch_sampler: Any) -> Any:
    """The sampler a batch sampler chunks, looking through wrappers around batch samplers."""
    wrapped = _wrapped_batch_samplers(batch_sampler)
    return getattr(wrapped[-1] if wrapped else batch_sampler, "sampler", None)


def sampling_parts(loader: Any) -> list[Any]:
    """The loader's sampler and batch sampler and whatever they wrap, through ``.sampler`` and
    ``.batch_sampler`` (Accelerate's ``BatchSamplerShard`` holds the user's batch sampler in
    ``.batch_sampler``; a Trainer calls that one's ``set_epoch`` itself), each once, a few levels deep."""
    found: list[Any] = []
    level = [getattr(loader, "sampler", None), getattr(loader, "batch_sampler", None)]
    for _ in range(4):
        nested = []
        for part in level:
            if part is None or any(part is seen for seen in found):
                continue
            found.append(part)
            nested += [getattr(part, "sampler", None), getattr(part, "batch_sampler", None)]
        level = nested
    return found
