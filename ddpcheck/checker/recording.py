"""The rank side of a check: build the user's loader, run epochs like a training loop, record ids.

Map-style datasets are recorded from the loader's (batch) sampler alone, without loading data, which
is what decides who sees what and costs microseconds per batch. ``load_data`` iterates the real
loader, workers and all; iterable datasets always do. The result is a :class:`RankRecording`: plain
data, no user objects.
"""

from __future__ import annotations

import contextlib
import copy
import operator
import sys
from array import array
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from itertools import islice
from typing import Any, cast

from ddpcheck.checker.identity import OBJECT_ITEMS, batch_digest, make_id_extractor, sampler_item_id
from ddpcheck.checker.index_log import adopt, catch_all, index_items, log_of
from ddpcheck.checker.loaderfile import (
    BadLoaderFile,
    LoaderSpec,
    call_by_name,
    call_factory,
    factory_kwargs,
    get_factory,
    is_torch_loader,
    load_module,
    optional_hook,
    unwrap_loader,
)
from ddpcheck.checker.mixture import SourceReader, source_reader
from ddpcheck.checker.work import TOKEN_HOOK, WORK_HOOK, Measured, WorkMeter, add_tally, looks_like_tokens
from ddpcheck.launch.rank import report_progress
from ddpcheck.layout import Layout
from ddpcheck.trace import EpochTrace, IdBuffer, LoaderFacts, RankTrace

MAX_ITEMS_PER_EPOCH = 50_000_000
Batch = tuple[list[Hashable], "int | None", "int | None", "Measured | None"]  # ids, worker, digest, work


@dataclass(frozen=True)
class RecordOptions:
    """How a rank runs the loader. Plain data: it travels to ranks."""

    epochs: int = 2
    load_data: bool = False
    set_epoch: bool = True
    patch: bool = False
    batch_size: int | None = None  # passed to factories that take ``batch_size``
    steps: int | None = None  # per rank per window: one continuing iterator, cut into ``epochs`` windows
    ids_from_data: bool = False  # map-style too: ids from the batches (a field), not dataset indices
    factory_args: tuple[tuple[str, Any], ...] = ()  # --factory-arg KEY=VALUE, passed by name
    layout: Layout | None = None  # the ranks' layout (a device mesh); None: a plain world size
    digest: bool = False  # digest every batch's content (replicas of a mesh must receive identical batches)
    work: bool = True  # measure each batch's work when batches carry tokens (ddpcheck.checker.work)
    work_cost: str = "tokens"  # "tokens" | "attention" (each document's length squared)
    mixture: bool = True  # read each sample's source when batches carry one (ddpcheck.checker.mixture)


@dataclass(frozen=True)
class RankRecording:
    trace: RankTrace
    id_source: str


MESH_DEVICE = {"nccl": "cuda"}  # the device type init_device_mesh takes for a backend (else cpu)


class _MeshWanted:
    """Stands in for ``mesh`` among a factory's keywords until it is known the factory takes it: a
    DeviceMesh creates process groups, which only a factory that uses one should pay for."""


def device_mesh(layout: Layout) -> Any:
    """A real ``DeviceMesh`` of ``layout`` over the initialised default group (its names, its shape)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    device = MESH_DEVICE.get(str(dist.get_backend()), "cpu") if dist.is_initialized() else "cpu"
    return init_device_mesh(device, layout.shape, mesh_dim_names=layout.names)


def layout_of(options: RecordOptions, world_size: int) -> Layout:
    """The layout this rank runs in; a mesh whose size is not the group's is bad input."""
    layout = options.layout or Layout.plain(world_size)
    if layout.world_size != world_size:
        raise BadLoaderFile(
            f"mesh {layout.spec} has {layout.world_size} ranks, but the process group has {world_size}"
        )
    return layout


def group_position() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def build_loader(
    spec: LoaderSpec, options: RecordOptions, rank: int, world_size: int, *, fresh: bool = False
) -> tuple[Any, Any]:
    """Import the file, call the factory (patching when asked); returns (what it returned, module).

    What the factory returns may be a framework wrapper around a DataLoader (Accelerate's
    ``DataLoaderShard``, Lightning Fabric's loader): that object is what a training loop iterates.
    """
    module = load_module(spec, fresh=fresh)
    factory = get_factory(module, spec)
    layout = layout_of(options, world_size)
    available: dict[str, Any] = {
        "rank": rank,
        "world_size": world_size,
        "dp_rank": layout.dp_rank(rank),
        "dp_world_size": layout.dp_world_size,
        "mesh": _MeshWanted(),
    }
    if options.batch_size is not None:
        available["batch_size"] = options.batch_size
    if options.factory_args:
        accepted = factory_kwargs(factory, {k: v for k, v in options.factory_args} | available)
        refused = [k for k, _ in options.factory_args if k not in accepted]
        if refused:
            name = getattr(factory, "__name__", "factory")
            raise BadLoaderFile(f"{name}() takes no parameter {refused[0]!r} (given with --factory-arg)")
        available.update(options.factory_args)
    if isinstance(factory_kwargs(factory, available).get("mesh"), _MeshWanted):
        available["mesh"] = device_mesh(layout)
    else:
        del available["mesh"]
    with catch_all() as early:  # iterators the factory itself starts (one kept for every epoch)
        loader = call_factory(factory, available)
    adopt(unwrap_loader(loader), early)
    if options.patch:
        from ddpcheck.reference.patch import patch_dataloader_to_ddp

        replicas, replica = layout.dp_world_size, layout.dp_rank(rank)
        loader = patch_dataloader_to_ddp(unwrap_loader(loader), num_replicas=replicas, rank=replica)
    return loader, module


RESUME_HOOK = "resume_loader"
SAVE_HOOK = "save_state"  # what a rank writes to its checkpoint (scenarios.resume)
LOAD_HOOK = "load_state"  # what a rank restores from every old rank's checkpoint


def has_state(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def _usable_state(obj: Any) -> bool:
    """``state_dict``/``load_state_dict`` exist and ``state_dict()`` works on the fresh object.

    Accelerate's ``DataLoaderShard`` has both methods whatever its configuration, and they raise
    unless it was built with ``use_stateful_dataloader=True``: such a loader has no state to resume.
    """
    if not has_state(obj):
        return False
    try:
        obj.state_dict()
    except Exception:
        return False
    return True


def resume_mechanism(outer: Any, resume_hook: Any, save_hook: Any = None, load_hook: Any = None) -> str:
    """Where the data state lives, in the documented order (the resume check); "" when nowhere.

    "loader" (the loader or its framework wrapper, e.g. torchdata's ``StatefulDataLoader``),
    "batch_sampler", "sampler", "batch_sampler.sampler", "hook" (the file's ``resume_loader``) or
    "hooks" (the file's ``save_state`` and ``load_state`` carry a state no part of the loader has).
    A file that defines ``save_state``/``load_state`` says there is a state: a part whose fresh
    ``state_dict()`` raises (it reads a position set by ``__iter__``) then still holds it.
    """
    from torch.utils.data import DataLoader

    loader = unwrap_loader(outer)
    batch_sampler = getattr(loader, "batch_sampler", None)
    parts = (
        *(("loader", obj) for obj in (outer, loader) if type(obj) is not DataLoader),
        ("batch_sampler", batch_sampler),
        ("sampler", getattr(loader, "sampler", None)),
        ("batch_sampler.sampler", getattr(batch_sampler, "sampler", None)),
    )
    for name, part in parts:
        if part is not None and _usable_state(part):
            return name
    hooks = save_hook is not None or load_hook is not None
    for name, part in parts if hooks else ():
        if part is not None and has_state(part):
            return name
    if resume_hook is not None:
        return "hook"
    return "hooks" if save_hook is not None and load_hook is not None else ""


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


def record_rank(spec: LoaderSpec, options: RecordOptions) -> RankRecording:
    """Entry point inside a rank: rank and world size come from the initialised group."""
    rank, world_size = group_position()
    report_progress("building the loader")
    outer, module = build_loader(spec, options, rank, world_size)
    loader = unwrap_loader(outer)
    hook = optional_hook(module, "sample_ids")
    epoch_hook = optional_hook(module, SET_EPOCH_HOOK)
    unreached = first_set_epoch(outer, epoch_hook) if options.set_epoch else ""
    facts = read_facts(loader)
    meter = _work_meter(module, options, loader)
    reader = source_reader(module, loader, options.mixture, _peek)
    by_sampler = (
        facts.dataset_kind == "map"
        and hook is None
        and meter is None
        and reader is None
        and not options.load_data
        and not options.ids_from_data
        and not (options.digest and options.steps is not None)
        and sampler_only_is_exact(outer, loader)
    )
    if not by_sampler:
        log_of(loader)  # before the resume probe: a state_dict() call may already build the iterator
    facts = replace(
        facts,
        recorded="sampler" if by_sampler else "loader",
        steps=options.steps,
        resumable=resume_mechanism(
            outer,
            optional_hook(module, RESUME_HOOK),
            optional_hook(module, SAVE_HOOK),
            optional_hook(module, LOAD_HOOK),
        ),
        set_epoch_unreached=unreached,
    )
    stream = Stream(outer, loader, hook, facts, options, by_sampler, epoch_hook, meter, reader)
    epochs = [stream.record(epoch) for epoch in range(options.epochs)]
    if meter is not None and meter.source not in ("", "none"):
        facts = replace(facts, work=meter.source)
    return RankRecording(RankTrace(rank=rank, epochs=tuple(epochs), facts=facts), stream.info.source)


def _work_meter(module: Any, options: RecordOptions, loader: Any) -> WorkMeter | None:
    """A meter when this loader's work is measurable: the file has ``batch_work`` or ``token_ids``, or a
    sample carries token fields (then the real loader is iterated: tokens live in the data)."""
    if not options.work:
        return None
    hook, tokens = optional_hook(module, WORK_HOOK), optional_hook(module, TOKEN_HOOK)
    if hook is None and tokens is None and not _sample_has_tokens(loader):
        return None
    return WorkMeter(hook=hook, token_hook=tokens, cost=options.work_cost)


def _peek(dataset: Any) -> Any:
    """The first sample of a map-style dataset, read with every random state put back (None: none)."""
    with _restored_rng():
        try:
            return dataset[0] if len(dataset) > 0 else None
        except Exception:
            return None


def _sample_has_tokens(loader: Any) -> bool:
    """One sample of a map-style dataset (read with every random state put back) carries token fields;
    an iterable dataset is iterated anyway and measured from its first batch."""
    dataset = getattr(loader, "dataset", None)
    if dataset is None or not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        return dataset is not None  # iterable: decided by the first batch
    with _restored_rng():
        try:
            return len(dataset) > 0 and looks_like_tokens(dataset[0])
        except Exception:
            return False


class Stream:
    """One rank's batches, epoch by epoch (a fresh iterator each), or in windows of ``steps`` batches
    of one continuing iterator (what iteration-based trainers do; a new pass starts when it ends)."""

    def __init__(
        self,
        outer: Any,
        loader: Any,
        hook: Callable[[Any], Any] | None,
        facts: LoaderFacts,
        options: RecordOptions,
        by_sampler: bool,
        epoch_hook: Callable[..., Any] | None = None,
        meter: WorkMeter | None = None,
        reader: SourceReader | None = None,
    ) -> None:
        self.outer, self.loader, self.hook, self.facts = outer, loader, hook, facts
        self.meter, self.reader = meter, reader
        self.epoch_hook = epoch_hook
        self.options = options
        self.by_sampler = by_sampler
        self.info = StreamInfo()
        self.passes = 0
        self.head: list[int] | None = (
            None  # content of the epoch's first batches, when ids come from the sampler
        )
        self._iterator: Iterator[Batch] | None = None

    def _open(self, epoch: int) -> Iterator[Batch]:
        if self.options.set_epoch and epoch > 0:
            loop_set_epoch(self.outer, epoch, self.epoch_hook)
        if self.by_sampler:
            if self.options.digest:
                self.head = head_digests(self.loader, CONTENT_STEPS)
            return ((ids, worker, None, None) for ids, worker in _sampler_batches(self.loader, self.info))
        digest = self.options.digest
        meter, reader = self.meter, self.reader
        return (
            (
                ids if reader is None else reader.tap(batch, ids),
                worker,
                batch_digest(batch) if digest else None,
                meter.measure(batch) if meter else None,
            )
            for batch, ids, worker in batches_with_ids(
                self.outer,
                self.hook,
                self.facts,
                self.info,
                self.loader,
                by_index=not self.options.ids_from_data,
            )
        )

    def record(self, epoch: int) -> EpochTrace:
        steps = self.options.steps
        ids = IdBuffer()
        sizes: list[int] = []
        workers: list[int | None] = []
        digests: list[int] = []
        work: list[tuple[float, ...]] = []
        supervised: list[int] = []
        packing = None
        if steps is None:
            iterator = self._open(epoch)
            limit = None
        else:
            if self._iterator is None:
                self._iterator = self._open(0)
            iterator = self._iterator
            limit = steps
        guard = _EndlessGuard(self.facts.dataset_len, steps is not None)
        count = total = 0
        n = limit or _len_or_none(self.outer)  # once per epoch: len(loader) walks the samplers' __len__
        of = f"/{n}" if n else ""
        while limit is None or count < limit:
            report_progress(f"epoch {epoch}, batch {count + 1}{of if n and count < n else ''}")  # never 17/16
            try:
                batch_ids, worker, digest, measured = next(iterator)
            except StopIteration:
                if steps is None:
                    break
                self.passes += 1  # an iteration-based loop starts the next pass of the loader
                self._iterator = iterator = self._open(self.passes)
                try:
                    batch_ids, worker, digest, measured = next(iterator)
                except StopIteration:
                    break
            count += 1
            if digest is not None:
                digests.append(digest)
            if measured is not None:
                work.append(measured.units)
                if measured.supervised is not None:
                    supervised.append(measured.supervised)
                if measured.packing is not None:
                    packing = add_tally(packing, measured.packing, count - 1)
            ids.extend(batch_ids)
            size = len(batch_ids)
            sizes.append(size)
            workers.append(worker)
            total += size
            if total >= guard.due:  # the guard has nothing to say before then
                guard.check(ids)
        len_loader = None if steps is not None else _len_or_none(self.outer)
        known_workers = all(w is not None for w in workers) and bool(workers)
        return EpochTrace(
            epoch=epoch,
            ids=ids.ids(),
            batch_sizes=sizes,
            len_loader=len_loader,
            worker_ids=[w for w in workers if w is not None] if known_workers else None,
            digests=array("q", self.head if self.by_sampler and self.head is not None else digests)
            if self.options.digest
            else None,
            work=work if work and len(work) == count else None,
            supervised=supervised if supervised and len(supervised) == count else None,
            packing=packing,
            sources=self.reader.take() if self.reader is not None else None,
        )


CONTENT_STEPS = 8  # batches per epoch whose content is digested where ids come from the sampler alone


def head_digests(loader: Any, steps: int) -> list[int]:
    """The content digests of the first ``steps`` batches the loader would yield now, from a copy of it
    (same sampler state, dataset shared) iterated with every global random state put back afterwards:
    the loader itself, and so the recorded stream, is left exactly as a training loop would find it.
    Where ids come from the sampler, this is what a mesh's replicas compare of their content; loading
    every batch of every epoch only to digest it would cost a full data pass. A loader that cannot be
    copied has no such head: [] (replicas are then compared by ids)."""
    with _restored_rng():
        try:
            twin = copy.deepcopy(loader, {id(loader.dataset): loader.dataset})
            return [batch_digest(batch) for batch in islice(twin, steps)]
        except Exception:
            return []


class _EndlessGuard:
    """Stops an epoch that cannot end: it passed several times the dataset, or an absurd count."""

    def __init__(self, dataset_len: int | None, windowed: bool) -> None:
        self.dataset_len = dataset_len
        self.windowed = windowed
        self.next_probe = ENDLESS_PROBE
        self.due = 0  # the length below which :meth:`check` cannot raise or probe
        self._update_due()

    def _update_due(self) -> None:
        due = MAX_ITEMS_PER_EPOCH + 1
        if not self.windowed:
            due = min(due, self.next_probe)
            if self.dataset_len is not None:
                due = min(due, ENDLESS_FACTOR * self.dataset_len + ENDLESS_PROBE + 1)
        self.due = due

    def check(self, ids: IdBuffer) -> None:
        n = len(ids)
        if self.windowed:
            _guard_size(n)
            return
        if self.dataset_len is not None and n > ENDLESS_FACTOR * self.dataset_len + ENDLESS_PROBE:
            raise BadLoaderFile(
                f"the loader looks endless: one epoch passed {n:,} samples, more than {ENDLESS_FACTOR}x "
                f"its dataset's {self.dataset_len:,}; check it in windows with --steps N"
            )
        if n >= self.next_probe:
            self.next_probe = n * 2
            self._update_due()
            distinct = ids.distinct()
            if n > ENDLESS_FACTOR * distinct:
                raise BadLoaderFile(
                    f"the loader looks endless: one epoch passed {n:,} samples but only {distinct:,} "
                    "distinct ones; check it in windows with --steps N"
                )
        _guard_size(n)


ENDLESS_FACTOR = 4
ENDLESS_PROBE = 20_000


def _sampler_batches(
    loader: Any, info: StreamInfo | None = None
) -> Iterator[tuple[list[Hashable], int | None]]:
    """The (batch) sampler's items as index batches.

    torch's own samplers (exactly these classes, under torch's own ``BatchSampler``) yield plain
    ints by construction (``range``, ``tolist()``), so their batches become ``array('q')`` in one C
    pass; anything else goes through :func:`_as_indices`, item by item. A sampler of objects (lhotse's
    ``CutSet``s) is identified by them (:func:`~ddpcheck.checker.identity.sampler_item_id`), and
    ``info`` says so.
    """
    from array import array

    from torch.utils.data import (
        BatchSampler,
        DistributedSampler,
        RandomSampler,
        SequentialSampler,
        WeightedRandomSampler,
    )

    plain = (SequentialSampler, RandomSampler, DistributedSampler, WeightedRandomSampler)
    source = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
    if type(source) is BatchSampler and type(source.sampler) in plain:
        for item in source:
            yield cast("list[Hashable]", array("q", item)), None
        return
    for item in source:
        try:
            yield cast("list[Hashable]", _as_indices(item)), None
        except TypeError:
            if info is not None:
                info.source = OBJECT_ITEMS
            yield [sampler_item_id(i) for i in index_items(item)], None


def _distinct(*objects: Any) -> list[Any]:
    seen: list[Any] = []
    for obj in objects:
        if obj is not None and not any(obj is s for s in seen):
            seen.append(obj)
    return seen


def _inner_sampler(loader: Any) -> Any:
    batch_sampler = getattr(loader, "batch_sampler", None)
    return _inner_sampler_of(batch_sampler) if batch_sampler is not None else None


def _wrapped_batch_samplers(batch_sampler: Any) -> list[Any]:
    """Batch samplers inside a wrapper's ``.sampler`` chain (timm's repeating wrapper holds one)."""
    found: list[Any] = []
    inner: Any = getattr(batch_sampler, "sampler", None)
    while len(found) < 4 and hasattr(inner, "sampler") and hasattr(inner, "batch_size"):
        found.append(inner)
        inner = inner.sampler
    return found


def _inner_sampler_of(batch_sampler: Any) -> Any:
    """The sampler a batch sampler chunks, looking through wrappers around batch samplers."""
    wrapped = _wrapped_batch_samplers(batch_sampler)
    return getattr(wrapped[-1] if wrapped else batch_sampler, "sampler", None)


SET_EPOCH_HOOK = "set_epoch"  # loader file hook: set_epoch(loader, epoch), what the user's loop calls


def loop_set_epoch(outer: Any, epoch: int, hook: Callable[..., Any] | None = None) -> None:
    """What a training loop calls before an epoch, no more: the loader file's ``set_epoch(loader,
    epoch)`` hook when it defines one; else the loader's own ``set_epoch`` when it has one (a framework
    loader such as Accelerate's decides what it forwards); else ``set_epoch`` on the loader's sampler,
    its batch sampler and the sampler that one chunks (as Lightning and transformers' Trainer reach
    them), and its dataset. Reaching deeper would hide a loader that never forwards the call."""
    if hook is not None:
        call_by_name(hook, {"loader": outer, "epoch": epoch})
        return
    setter = getattr(outer, "set_epoch", None)
    if callable(setter):
        setter(epoch)
        return
    loader = unwrap_loader(outer)
    batch_sampler = getattr(loader, "batch_sampler", None)
    parts = (
        getattr(loader, "sampler", None),
        batch_sampler,
        getattr(batch_sampler, "sampler", None),
        getattr(loader, "dataset", None),
    )
    for part in _distinct(*parts):
        part_setter = getattr(part, "set_epoch", None)
        if callable(part_setter):
            part_setter(epoch)


def first_set_epoch(outer: Any, hook: Callable[..., Any] | None = None) -> str:
    """Epoch 0's :func:`loop_set_epoch`, watching every part of the loader that has a ``set_epoch``:
    returns the ones the call never reached (``"MyBatchSampler"``; "" when it reached all). Such a part
    keeps its first epoch's order whatever the loop does: the reshuffle check names it."""
    loader = unwrap_loader(outer)
    parts = [
        p
        for p in _distinct(*_sampling_parts(loader), getattr(loader, "dataset", None))
        if p is not outer and callable(getattr(p, "set_epoch", None))
    ]
    reached: list[Any] = []
    spied: list[Any] = []
    for part in parts:
        original = part.set_epoch

        def spy(epoch: int, *args: Any, _part: Any = part, _original: Any = original, **kwargs: Any) -> Any:
            reached.append(_part)
            return _original(epoch, *args, **kwargs)

        try:
            object.__setattr__(part, "set_epoch", spy)  # shadows the method on this instance only
            spied.append(part)
        except (AttributeError, TypeError):  # __slots__: cannot be watched, so not blamed either
            reached.append(part)
    try:
        loop_set_epoch(outer, 0, hook)
    finally:
        for part in spied:
            with contextlib.suppress(AttributeError, TypeError):
                object.__delattr__(part, "set_epoch")
    missed = [type(p).__name__ for p in parts if not any(p is r for r in reached)]
    return ", ".join(dict.fromkeys(missed))


def _sampling_parts(loader: Any) -> list[Any]:
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
    dataset_len = _len_or_none(dataset)
    batch_sampler = loader.batch_sampler
    custom_batches = batch_sampler is not None and not iterable and not plain_batching(batch_sampler, dataset)
    sampler = _inner_sampler(loader) if batch_sampler is not None else loader.sampler
    sampler = sampler if sampler is not None else loader.sampler
    padding = None
    pad_unit = 1
    for part in _distinct(sampler, batch_sampler, loader.sampler):
        if isinstance(part, DistributedSampler):
            padding = not part.drop_last
        elif hasattr(part, "pad_data_to_num_gpus"):
            padding = bool(part.pad_data_to_num_gpus)
        elif getattr(part, "even_batches", None) is True:  # Accelerate: pads the last batch from the start
            padding, pad_unit = True, _padded_batch(part)
    shard_unit = _iterable_shard_padding(dataset)
    if shard_unit:
        padding, pad_unit = True, shard_unit
    parts = _distinct(outer, *_sampling_parts(loader), dataset)
    batch_size, drop_last = _batching(loader, None if custom_batches else batch_sampler)
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
    )


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
    size = getattr(batch_sampler, "batch_size", None)
    for wrapped in _wrapped_batch_samplers(batch_sampler):
        size = size if size is not None else wrapped.batch_size
    inner = _inner_sampler_of(batch_sampler)
    if inner is None or not isinstance(size, int) or isinstance(size, bool) or size < 1:
        return False
    try:
        with _restored_rng():
            memo = {id(dataset): dataset}
            batches = [_as_indices(b) for b in islice(copy.deepcopy(batch_sampler, memo), PROBE_BATCHES)]
        with _restored_rng():
            memo = {id(dataset): dataset}
            items = [_as_indices(i) for i in islice(copy.deepcopy(inner, memo), PROBE_BATCHES * size)]
    except Exception:
        return False
    flat = [i for item in items for i in item]
    chunks = [flat[k : k + size] for k in range(0, len(flat), size)][: len(batches)]
    if getattr(batch_sampler, "drop_last", False) and chunks and len(chunks[-1]) < size:
        chunks = chunks[:-1]
    return bool(batches) and batches == chunks


@contextmanager
def _restored_rng() -> Iterator[None]:
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


def _len_or_none(obj: Any) -> int | None:
    """``len(obj)``, or None for anything it raises: energon's datasets refuse ``len()`` with an
    AttributeError on purpose, and a loader that trains without ``len()`` must not crash a check."""
    try:
        return len(obj)
    except Exception:
        return None


def _as_indices(item: Any) -> list[int]:
    return [operator.index(i) for i in index_items(item)]


def record_indices(loader: Any, epoch: int) -> EpochTrace:
    """The index stream of the loader's (batch) sampler: who sees what, without loading data."""
    len_loader = _len_or_none(loader)
    ids = IdBuffer()
    sizes: list[int] = []
    for batch, _ in _sampler_batches(loader):
        ids.extend(batch)
        sizes.append(len(batch))
        _guard_size(len(ids))
    return EpochTrace(epoch=epoch, ids=ids.ids(), batch_sizes=sizes, len_loader=len_loader)


def _guard_size(n: int) -> None:
    if n > MAX_ITEMS_PER_EPOCH:
        raise BadLoaderFile(
            f"one epoch yielded more than {MAX_ITEMS_PER_EPOCH:,} items; the loader looks infinite "
            "(check it in windows with --steps N)"
        )


def is_collated(loader: Any) -> bool:
    """True when the loader yields batches; False for ``batch_size=None`` (one sample per item)."""
    loader = unwrap_loader(loader)
    if not is_torch_loader(loader):
        return True  # a loader of its own yields batches
    return loader.batch_size is not None or loader.batch_sampler is not None


MIXED_IDS = "mixed"  # a stream identified by index, then by data: only a rerun by data compares


@dataclass
class StreamInfo:
    """Filled in while :func:`batches_with_ids` runs: the id source."""

    source: str = "index"


def batches_with_ids(
    outer: Any,
    hook: Callable[[Any], Any] | None,
    facts: LoaderFacts,
    info: StreamInfo | None = None,
    loader: Any = None,
    *,
    by_index: bool = True,
) -> Iterator[tuple[Any, list[Hashable], int | None]]:
    """The real loader's batches (workers, wrappers and all), each with its sample ids and worker.

    Ids: the ``sample_ids`` hook; for map-style datasets the indices the DataLoader iterator itself
    dispatched for that batch (:mod:`ddpcheck.checker.index_log`: exact with prefetching, out-of-order
    delivery and persistent workers); else a field or a content hash.
    """
    info = info if info is not None else StreamInfo()
    loader = loader if loader is not None else unwrap_loader(outer)
    log = log_of(loader)
    log.clear()
    by_index = by_index and facts.dataset_kind == "map" and hook is None
    collated = is_collated(loader)
    extract: Callable[[Any], list[Hashable]] | None = None
    indexed = 0
    for batch in outer:
        batch_ids, worker = log.ready.popleft() if log.ready else (None, None)
        if by_index and batch_ids is None:
            # No torch DataLoader iterator in this process handed this batch out (a loader that forms
            # batches itself; a framework whose rank 0 loads for every rank): the batch's own data
            # identifies it from here on, and the runner identifies every run that way.
            by_index = False
        if by_index and batch_ids is not None:
            indexed += 1
            info.source = "index"
        else:
            if extract is None:
                source, extract = make_id_extractor(hook, batch, collated)
                info.source = MIXED_IDS if indexed else source
            batch_ids = extract(batch)
        yield batch, batch_ids, worker
