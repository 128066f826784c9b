"""Rebuild a DataLoader so every rank gets its own share: ``patch_dataloader_to_ddp`` and friends.

Names follow ``oml.ddp.patching`` (``extract_loader_parameters``, ``patch_dataloader_to_ddp``,
``check_loaders_is_patched``) so OML code works by changing the import.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Mapping
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, IterableDataset, RandomSampler

from ddpcheck.reference.dist import is_ddp
from ddpcheck.reference.iterable import ShardedIterableDataset
from ddpcheck.reference.sampler import DDPSamplerWrapper, _resolve_world, mesh_world

_L = TypeVar("_L", bound=DataLoader)

_READABLE = (
    "dataset",
    "batch_size",
    "sampler",
    "batch_sampler",
    "num_workers",
    "collate_fn",
    "pin_memory",
    "drop_last",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
    "prefetch_factor",
    "persistent_workers",
    "pin_memory_device",
    "in_order",
)


def _dataloader_params() -> dict[str, inspect.Parameter]:
    params = dict(inspect.signature(DataLoader.__init__).parameters)
    params.pop("self", None)
    return params


def extract_loader_parameters(loader: DataLoader) -> dict[str, Any]:
    """Every ``DataLoader`` argument readable off ``loader``, such that ``DataLoader(**params)`` rebuilds it.

    Keys are the constructor's own names, limited to those this torch's ``DataLoader`` accepts.
    ``shuffle`` is not a key: it cannot be read back, and it lives on as the loader's
    ``RandomSampler`` under ``sampler``. A custom ``batch_sampler`` comes back with ``batch_size=1``
    and ``drop_last=False`` (what the constructor demands next to it); a loader that batched with
    ``batch_size`` comes back as ``sampler`` + ``batch_size`` + ``drop_last``.
    """
    if not isinstance(loader, DataLoader):
        raise TypeError(f"expected a torch.utils.data.DataLoader, got {type(loader).__name__}")
    values: dict[str, Any] = {name: getattr(loader, name, None) for name in _READABLE}
    if isinstance(loader.dataset, IterableDataset):
        values.update(sampler=None, batch_sampler=None)  # the constructor's dummy infinite sampler
    elif loader.batch_sampler is None:  # batch_size=None: no auto-batching
        values.update(batch_size=None, batch_sampler=None, drop_last=False)
    elif loader.batch_size is not None:  # the constructor built the BatchSampler itself
        values.update(batch_sampler=None)
    else:  # a batch sampler the caller passed in
        values.update(batch_size=1, sampler=None, drop_last=False)
    accepted = _dataloader_params()
    return {name: value for name, value in values.items() if name in accepted}


def _is_sharding(sampler: Any) -> bool:
    return isinstance(sampler, (DDPSamplerWrapper, DistributedSampler))


def check_loaders_is_patched(loader: DataLoader) -> bool:
    """True when ``loader`` already shards: its sampler or batch sampler (or the batch sampler's
    sampler) is a ``DDPSamplerWrapper`` or a ``DistributedSampler``, or its dataset is sharded."""
    if isinstance(loader.dataset, ShardedIterableDataset):
        return True
    batch_sampler = loader.batch_sampler
    return (
        _is_sharding(loader.sampler)
        or _is_sharding(batch_sampler)
        or _is_sharding(getattr(batch_sampler, "sampler", None))
    )


def _shared_seed(from_group: bool) -> int:
    """A seed equal on every rank: rank 0 draws from its global torch RNG and broadcasts it.

    Without collectives (explicit ``num_replicas``/``rank``) it is ``torch.initial_seed()``: equal in
    every process seeded alike and for every rank simulated in one process, and it consumes no
    random state.
    """
    if from_group and is_ddp():
        payload: list[Any] = [int(torch.empty((), dtype=torch.int64).random_().item())]
        dist.broadcast_object_list(payload, src=0)
        return int(payload[0])
    return torch.initial_seed()


def _with_shared_generator(sampler: Any, from_group: bool) -> Any:
    """A plain ``RandomSampler`` without a generator, re-made with one seeded identically on every rank.

    Without it every rank's ``RandomSampler`` seeds itself from its own global RNG each epoch; the
    wrapper would notice and broadcast rank 0's order every epoch (correct, but O(n) per epoch and
    a warning). A shared generator keeps the loader shuffling, lets the wrapper stream, and keeps
    the run's seed (rank 0's) in control of the order, as in a non-DDP run.
    """
    if type(sampler) is not RandomSampler or sampler.generator is not None:
        return sampler
    generator = torch.Generator()
    generator.manual_seed(_shared_seed(from_group))
    return RandomSampler(
        sampler.data_source,
        replacement=sampler.replacement,
        num_samples=getattr(sampler, "_num_samples", None),
        generator=generator,
    )


_NOT_BY_NAME = (
    inspect.Parameter.VAR_POSITIONAL,
    inspect.Parameter.VAR_KEYWORD,
    inspect.Parameter.POSITIONAL_ONLY,
)


class _CannotRebuild(Exception):
    pass


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:
        return False


def _subclass_kwargs(cls: type, loader: DataLoader, params: dict[str, Any]) -> dict[str, Any]:
    """Arguments for ``cls(...)``: ``params`` it accepts, plus its own parameters read off ``loader``."""
    signature = inspect.signature(cls)  # the constructor, without self
    own = dict(signature.parameters)
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in own.values())
    defaults = _dataloader_params()
    kwargs: dict[str, Any] = {}
    for name, value in params.items():
        if name in own or var_kw:
            kwargs[name] = value
        elif not _same(value, defaults[name].default):
            raise _CannotRebuild(f"its __init__ takes no {name}=")
    for name, param in own.items():
        if name in kwargs or name in defaults or param.kind in _NOT_BY_NAME:
            continue
        if hasattr(loader, name):
            kwargs[name] = getattr(loader, name)
        elif param.default is inspect.Parameter.empty:
            raise _CannotRebuild(f"its __init__ needs {name}=, which is not readable off the loader")
    return kwargs


def _rebuild(loader: DataLoader, params: dict[str, Any]) -> DataLoader:
    """``type(loader)(...)`` with ``params`` when that reproduces them exactly, else a plain DataLoader."""
    cls = type(loader)
    if cls is DataLoader:
        return DataLoader(**params)
    try:
        rebuilt = cls(**_subclass_kwargs(cls, loader, params))
        got = extract_loader_parameters(rebuilt)
        changed = sorted(k for k, v in params.items() if not _same(got.get(k), v))
        if changed:
            raise _CannotRebuild(f"its __init__ changed {', '.join(changed)}")
        return rebuilt
    except Exception as exc:
        warnings.warn(
            f"patch_dataloader_to_ddp: could not rebuild {cls.__name__} ({exc}); returning a plain "
            "DataLoader with the same arguments",
            stacklevel=3,
        )
        return DataLoader(**params)


class ShardedBatchSampler(BatchSampler):
    """A ``BatchSampler`` over a ``DDPSamplerWrapper`` that resumes: it forwards the wrapper's state.

    ``BatchSampler`` takes exactly ``batch_size`` items from its sampler per batch, so after ``k``
    batches the wrapper has yielded ``k * batch_size`` (the last batch: what was left), and its
    state is this batch sampler's state. It does not change ``__iter__``: anything that reads a plain
    ``BatchSampler`` reads this one the same way, and torchdata's ``StatefulDataLoader`` finds
    ``state_dict``/``load_state_dict`` on it.
    """

    sampler: DDPSamplerWrapper[Any]

    def __init__(self, sampler: DDPSamplerWrapper[Any], batch_size: int, drop_last: bool) -> None:
        super().__init__(sampler, batch_size, drop_last)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.sampler.load_state_dict(state)


def patch_dataloader_to_ddp(
    loader: _L,
    *,
    num_replicas: int | None = None,
    rank: int | None = None,
    shuffle_samples_between_gpus: bool = False,
    pad_data_to_num_gpus: bool = True,
    seed: int = 0,
    mesh: Any = None,
) -> _L | DataLoader:
    """Rebuild ``loader`` so this rank iterates only its share; every other argument is kept.

    On a device mesh pass ``mesh=``: the share is the data-parallel coordinate's (dimensions named
    ``dp*``), so tensor/context/pipeline peers iterate the same batches.

    * sampler + ``batch_size``: the sampler is wrapped in ``DDPSamplerWrapper``, and the loader
      batches it as before;
    * a plain ``BatchSampler`` passed as ``batch_sampler``: its sampler is wrapped and re-batched
      with the same ``batch_size``/``drop_last`` by a ``ShardedBatchSampler`` (which resumes);
    * any other batch sampler: whole batches are sharded (``DDPSamplerWrapper(batch_sampler)``);
    * ``batch_size=None``: the sampler is wrapped;
    * an ``IterableDataset``: the dataset is wrapped in ``ShardedIterableDataset`` (per rank and
      worker; see there for equal counts).

    ``shuffle_samples_between_gpus``, ``pad_data_to_num_gpus`` and ``seed`` go to the wrapper
    (``pad_data_to_num_gpus`` also to the iterable shard). As in OML, ranks are not shuffled
    between epochs by default: a loader with ``shuffle=False`` feeds every rank the same items in
    the same order every epoch, as it would one process. The wrapper is ``loader.sampler``,
    ``loader.batch_sampler`` or ``loader.batch_sampler.sampler``: call its ``set_epoch`` each epoch,
    and its ``state_dict``/``load_state_dict`` to resume mid-epoch (see ``DDPSamplerWrapper``;
    inside torchdata's ``StatefulDataLoader`` the loader's own ``state_dict`` carries it).

    A shuffling loader (a ``RandomSampler`` without a generator) gets a generator seeded equally on
    every rank, from rank 0's RNG, so the ranks agree on one permutation and the wrapper streams.
    The loader's class is kept when its constructor reproduces every argument; otherwise a plain
    ``DataLoader`` is returned with a warning. A loader that already shards is returned as is.
    Without a process group and without ``num_replicas``/``rank`` it warns and returns ``loader``
    unchanged (like OML). With a group every rank must call this together (it may broadcast once).
    """
    if not isinstance(loader, DataLoader):
        raise TypeError(f"expected a torch.utils.data.DataLoader, got {type(loader).__name__}")
    if mesh is not None:
        num_replicas, rank = mesh_world(mesh, num_replicas, rank)
    from_group = num_replicas is None and rank is None
    if from_group and not is_ddp():
        warnings.warn(
            "patch_dataloader_to_ddp: no process group is initialised and num_replicas/rank were not "
            "given; the loader is returned unchanged",
            stacklevel=2,
        )
        return loader
    world, this_rank = _resolve_world(num_replicas, rank)
    if check_loaders_is_patched(loader):
        return loader
    params = extract_loader_parameters(loader)
    options: dict[str, Any] = dict(
        shuffle_samples_between_gpus=shuffle_samples_between_gpus,
        pad_data_to_num_gpus=pad_data_to_num_gpus,
        num_replicas=num_replicas,
        rank=rank,
        seed=seed,
    )
    if isinstance(loader.dataset, IterableDataset):
        params["dataset"] = ShardedIterableDataset(loader.dataset, world, this_rank, pad=pad_data_to_num_gpus)
    elif params.get("batch_sampler") is not None:
        batch_sampler = params["batch_sampler"]
        if type(batch_sampler) is BatchSampler:
            inner = _with_shared_generator(batch_sampler.sampler, from_group)
            params["batch_sampler"] = ShardedBatchSampler(
                DDPSamplerWrapper(inner, **options), batch_sampler.batch_size, batch_sampler.drop_last
            )
        else:
            params["batch_sampler"] = DDPSamplerWrapper(batch_sampler, **options)
    else:
        inner = _with_shared_generator(params["sampler"], from_group)
        params["sampler"] = DDPSamplerWrapper(inner, **options)
    return _rebuild(loader, params)


__all__ = [
    "ShardedBatchSampler",
    "check_loaders_is_patched",
    "extract_loader_parameters",
    "patch_dataloader_to_ddp",
]
