"""Shard an ``IterableDataset`` by DDP rank and DataLoader worker, with equal counts when it has a length.

A DataLoader over an iterable dataset has no sampler to wrap: every rank and every worker iterates
its own copy of the dataset, so without sharding each sample is seen ``W * num_workers`` times.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from typing import TypeVar

from torch.utils.data import IterableDataset, get_worker_info

from ddpcheck.reference.sampler import per_rank_count, plan_epoch, take_strided

_T = TypeVar("_T")


class ShardedIterableDataset(IterableDataset[_T]):
    """Every ``C``-th item of ``dataset`` (``C = W * num_workers`` consumers), one share per consumer.

    Consumer ``worker_id * W + rank`` (worker-major) takes positions ``c, c + C, c + 2C, ...`` of the
    stream. Worker-major numbering makes rank ``r``'s share, over all its workers, exactly positions
    ``r, r + W, r + 2W, ...``: the same as ``DDPSamplerWrapper``/``DistributedSampler``, independent of
    ``num_workers``. Every consumer reads the whole stream and keeps its share (the usual cost of
    sharding an iterable).

    Equal step counts:

    * The dataset has ``__len__`` (``n``): the epoch is laid out like ``DDPSamplerWrapper``'s,
      ``W * ceil(n / W)`` positions with ``pad=True`` (the last ones repeat the stream's first items
      as ``DistributedSampler`` pads, so no rank gets a second copy of its own item) or
      ``W * (n // W)`` with ``pad=False`` (the tail is dropped). Because that total is a multiple
      of W, worker ``w`` of every rank yields the same count, so every rank yields the same number
      of samples *and* of batches, also with ``num_workers > 1``. ``len()`` is the per-rank count.
    * No ``__len__``: nothing can be padded; per-rank counts can differ by one. Use
      ``drop_last=True`` with a count that is a multiple of W, or train under a join context
      (``DistributedDataParallel.join``) so the longer ranks do not hang in a collective.

    Pitfall: the dataset must yield the whole stream in every worker. One that already splits
    itself by ``get_worker_info()`` would be split twice and lose samples; shard such a dataset by
    rank inside it instead of wrapping it.

    ``set_epoch`` is forwarded to the dataset when it has one.
    """

    def __init__(self, dataset: Iterable[_T], num_replicas: int, rank: int, *, pad: bool = True) -> None:
        if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
            raise ValueError(f"num_replicas must be an int >= 1, got {num_replicas!r}")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < num_replicas:
            raise ValueError(f"rank must satisfy 0 <= rank < num_replicas={num_replicas}, got {rank!r}")
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.pad = bool(pad)

    def _length(self) -> int | None:
        try:
            return len(self.dataset)  # type: ignore[arg-type]
        except TypeError:
            return None

    def __len__(self) -> int:
        n = self._length()
        if n is None:
            raise TypeError(f"{type(self.dataset).__name__} has no len(), so neither has its shard")
        return per_rank_count(n, self.num_replicas, self.pad)

    def set_epoch(self, epoch: int) -> None:
        if callable(getattr(self.dataset, "set_epoch", None)):
            self.dataset.set_epoch(epoch)  # type: ignore[attr-defined]

    def __iter__(self) -> Iterator[_T]:
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        consumer = worker * self.num_replicas + self.rank
        consumers = self.num_replicas * workers
        src = iter(self.dataset)
        n = self._length()
        if n is None:
            return islice(src, consumer, None, consumers)
        plan = plan_epoch(src, n, self.num_replicas, self.pad)
        return take_strided(plan, consumer, consumers)


__all__ = ["ShardedIterableDataset"]
