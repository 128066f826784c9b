"""The rank side of a check: build the user's loader, run epochs like a training loop, record ids.

Map-style datasets are recorded from the loader's (batch) sampler alone, without loading data, which
is what decides who sees what and costs microseconds per batch. ``load_data`` iterates the real
loader, workers and all; iterable datasets always do. The result is a :class:`RankRecording`: plain
data, no user objects.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any

from ddpcheck.identity import make_id_extractor
from ddpcheck.launch.rank import report_progress
from ddpcheck.loaderfile import (
    BadLoaderFile,
    LoaderSpec,
    call_factory,
    get_factory,
    load_module,
    optional_hook,
)
from ddpcheck.record import EpochTrace, LoaderFacts, RankTrace, compact_ids

MAX_ITEMS_PER_EPOCH = 50_000_000


@dataclass(frozen=True)
class RecordOptions:
    """How a rank runs the loader. Plain data: it travels to ranks."""

    epochs: int = 2
    load_data: bool = False
    set_epoch: bool = True
    patch: bool = False
    batch_size: int | None = None  # passed to factories that take ``batch_size``


@dataclass(frozen=True)
class RankRecording:
    trace: RankTrace
    id_source: str


def _group_position() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def build_loader(spec: LoaderSpec, options: RecordOptions, rank: int, world_size: int) -> tuple[Any, Any]:
    """Import the file, call the factory (patching when asked); returns (loader, module)."""
    module = load_module(spec)
    factory = get_factory(module, spec)
    available: dict[str, Any] = {"rank": rank, "world_size": world_size}
    if options.batch_size is not None:
        available["batch_size"] = options.batch_size
    loader = call_factory(factory, available)
    if options.patch:
        from ddpcheck.reference.patch import patch_dataloader_to_ddp

        loader = patch_dataloader_to_ddp(loader, num_replicas=world_size, rank=rank)
    return loader, module


def record_rank(spec: LoaderSpec, options: RecordOptions) -> RankRecording:
    """Entry point inside a rank: rank and world size come from the initialised group."""
    rank, world_size = _group_position()
    report_progress("building the loader")
    loader, module = build_loader(spec, options, rank, world_size)
    hook = optional_hook(module, "sample_ids")
    facts = read_facts(loader)
    epochs = []
    id_source = "index"
    for epoch in range(options.epochs):
        if options.set_epoch:
            set_epoch_everywhere(loader, epoch)
        if facts.dataset_kind == "map" and hook is None and not options.load_data:
            trace = record_indices(loader, epoch)
        else:
            trace, id_source = record_batches(loader, epoch, hook, facts)
        epochs.append(trace)
    return RankRecording(RankTrace(rank=rank, epochs=tuple(epochs), facts=facts), id_source)


def _distinct(*objects: Any) -> list[Any]:
    seen: list[Any] = []
    for obj in objects:
        if obj is not None and not any(obj is s for s in seen):
            seen.append(obj)
    return seen


def _inner_sampler(loader: Any) -> Any:
    batch_sampler = loader.batch_sampler
    return getattr(batch_sampler, "sampler", None) if batch_sampler is not None else None


def set_epoch_everywhere(loader: Any, epoch: int) -> None:
    """What a correct training loop does: ``set_epoch`` on every part that has one."""
    for part in _distinct(loader.sampler, loader.batch_sampler, _inner_sampler(loader), loader.dataset):
        setter = getattr(part, "set_epoch", None)
        if callable(setter):
            setter(epoch)


def read_facts(loader: Any) -> LoaderFacts:
    from torch.utils.data import BatchSampler, DistributedSampler, IterableDataset

    dataset = loader.dataset
    iterable = isinstance(dataset, IterableDataset)
    try:
        dataset_len: int | None = len(dataset)
    except TypeError:
        dataset_len = None
    batch_sampler = loader.batch_sampler
    custom_batches = batch_sampler is not None and type(batch_sampler) is not BatchSampler
    sampler = _inner_sampler(loader) if batch_sampler is not None else loader.sampler
    sampler = sampler if sampler is not None else loader.sampler
    padding = None
    for part in _distinct(sampler, batch_sampler, loader.sampler):
        if isinstance(part, DistributedSampler):
            padding = not part.drop_last
        elif hasattr(part, "pad_data_to_num_gpus"):
            padding = bool(part.pad_data_to_num_gpus)
    parts = _distinct(loader.sampler, batch_sampler, sampler, dataset)
    return LoaderFacts(
        dataset_kind="iterable" if iterable else "map",
        dataset_len=dataset_len,
        batch_size=loader.batch_size,
        drop_last=bool(loader.drop_last),
        sampler=type(sampler).__name__ if sampler is not None else None,
        batch_sampler=type(batch_sampler).__name__ if batch_sampler is not None else None,
        num_workers=int(loader.num_workers),
        padding=padding,
        batch_level=custom_batches and not iterable,
        has_set_epoch=any(callable(getattr(p, "set_epoch", None)) for p in parts),
    )


def _len_or_none(obj: Any) -> int | None:
    try:
        return len(obj)
    except TypeError:
        return None


def _as_indices(item: Any) -> list[int]:
    if isinstance(item, int):
        return [item]
    if hasattr(item, "tolist"):
        item = item.tolist()
        if isinstance(item, int):
            return [item]
    try:
        return [operator.index(i) for i in item]
    except TypeError:
        return [operator.index(item)]


def record_indices(loader: Any, epoch: int) -> EpochTrace:
    """The index stream of the loader's (batch) sampler: who sees what, without loading data."""
    source = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
    len_loader = _len_or_none(loader)
    ids: list[int] = []
    sizes: list[int] = []
    for item in source:
        batch = _as_indices(item)
        ids.extend(batch)
        sizes.append(len(batch))
        report_progress(f"epoch {epoch}, batch {len(sizes)} (sampler only)")
        _guard_size(len(ids))
    return EpochTrace(epoch=epoch, ids=compact_ids(ids), batch_sizes=sizes, len_loader=len_loader)


def _guard_size(n: int) -> None:
    if n > MAX_ITEMS_PER_EPOCH:
        raise BadLoaderFile(
            f"one epoch yielded more than {MAX_ITEMS_PER_EPOCH:,} items; the loader looks infinite"
        )


class _TeeIndices:
    """Wraps a DataLoader iterator's sampler iterator, remembering the indices it hands out."""

    def __init__(self, inner: Iterator[Any], taken: list[list[int]]) -> None:
        self.inner, self.taken = inner, taken

    def __iter__(self) -> _TeeIndices:
        return self

    def __next__(self) -> Any:
        item = next(self.inner)
        self.taken.append(_as_indices(item))
        return item


def is_collated(loader: Any) -> bool:
    """True when the loader yields batches; False for ``batch_size=None`` (one sample per item)."""
    return loader.batch_size is not None or loader.batch_sampler is not None


@dataclass
class StreamInfo:
    """Filled in while :func:`batches_with_ids` runs: the id source and, per batch, its worker."""

    source: str = "index"
    workers: list[int] | None = None


def batches_with_ids(
    loader: Any, hook: Callable[[Any], Any] | None, facts: LoaderFacts, info: StreamInfo | None = None
) -> Iterator[tuple[Any, list[Hashable]]]:
    """The real loader's batches (workers and all), each with its sample ids.

    Ids: the ``sample_ids`` hook; for map-style datasets the indices the sampler handed out (read
    where the iterator takes them, so nothing is loaded twice); else a field or a content hash.
    """
    info = info if info is not None else StreamInfo()
    iterator = iter(loader)
    taken: list[list[int]] = []
    tee_indices = facts.dataset_kind == "map" and hook is None and hasattr(iterator, "_sampler_iter")
    if tee_indices:
        iterator._sampler_iter = _TeeIndices(iterator._sampler_iter, taken)  # private, stable since 1.x
    info.workers = _tag_workers(iterator)
    collated = is_collated(loader)
    extract: Callable[[Any], list[Hashable]] | None = None
    for count, batch in enumerate(iterator, start=1):
        if tee_indices:
            batch_ids: list[Hashable] = list(taken[count - 1])
        else:
            if extract is None:
                info.source, extract = make_id_extractor(hook, batch, collated)
            batch_ids = extract(batch)
        yield batch, batch_ids


def record_batches(
    loader: Any, epoch: int, hook: Callable[[Any], Any] | None, facts: LoaderFacts
) -> tuple[EpochTrace, str]:
    """Iterate the real loader (workers and all) and record its ids per batch."""
    len_loader = _len_or_none(loader)
    info = StreamInfo()
    ids: list[Hashable] = []
    sizes: list[int] = []
    for count, (_, batch_ids) in enumerate(batches_with_ids(loader, hook, facts, info), start=1):
        ids.extend(batch_ids)
        sizes.append(len(batch_ids))
        report_progress(f"epoch {epoch}, batch {count}")
        _guard_size(len(ids))
    workers = info.workers
    trace = EpochTrace(
        epoch=epoch,
        ids=compact_ids(ids),
        batch_sizes=sizes,
        len_loader=len_loader,
        worker_ids=workers if workers is not None and len(workers) == len(sizes) else None,
    )
    return trace, info.source


def _tag_workers(iterator: Any) -> list[int] | None:
    """Which worker produced each batch, read where the multiprocessing iterator hands batches over.

    Private API (``_process_data(data, worker_idx)``, stable since torch 1.x); where it is absent
    (no workers, or a future torch), worker ids are simply not recorded.
    """
    original = getattr(iterator, "_process_data", None)
    if original is None:
        return None
    workers: list[int] = []

    def tagged(data: Any, *args: Any, **kwargs: Any) -> Any:
        worker = args[0] if args else kwargs.get("worker_idx")
        if isinstance(worker, int):
            workers.append(worker)
        return original(data, *args, **kwargs)

    iterator._process_data = tagged
    return workers
