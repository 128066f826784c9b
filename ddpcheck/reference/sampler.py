"""DDPSamplerWrapper: shard what any sampler or batch sampler yields across DDP ranks, streaming.

Names and defaults follow ``oml.ddp``'s ``DDPSamplerWrapper`` so OML code works by changing the
import. Unlike it (and Lightning's and Catalyst's wrappers) this one does not materialise the epoch
on every rank, and it notices when the inner sampler draws from per-rank random state, which makes
those wrappers silently overlap and drop samples.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import chain, cycle, islice, repeat
from operator import getitem
from typing import Any, Literal, Protocol, TypeVar

import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, Sampler

from ddpcheck.reference.dist import is_ddp

_T = TypeVar("_T")
_T_co = TypeVar("_T_co", covariant=True)

SyncOrder = Literal["auto", "always", "never"]
_SYNC_ORDERS = ("auto", "always", "never")

FINGERPRINT_WINDOW = 1024
"""Items of the inner epoch hashed to check that every rank's inner sampler agrees."""

_BLOCK_ITEMS = 8192  # items buffered per block when shuffling between GPUs

_ORDER_DIFFERS = (
    "DDPSamplerWrapper: the inner sampler's order differs across ranks (its random state is per-rank); "
    "using rank 0's order, broadcast to every rank (O(n) per epoch). Seed the inner sampler's generator "
    "identically on every rank to stream instead, or pass sync_order='always' to silence this."
)


class SizedIterable(Protocol[_T_co]):
    """What the wrapper needs from the inner sampler: ``len()`` and iteration."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[_T_co]: ...


def per_rank_count(n: int, num_replicas: int, pad: bool) -> int:
    """Items each rank yields for an epoch of ``n``: ``ceil(n / W)`` with padding, ``n // W`` without."""
    return -(-n // num_replicas) if pad else n // num_replicas


def epoch_seed(seed: int, epoch: int) -> int:
    """A 63-bit generator seed for ``(seed, epoch)``, the same in every process (no salted ``hash``)."""
    digest = hashlib.blake2b(f"{seed}:{epoch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def fingerprint(items: Iterable[Any]) -> str:
    """A stable digest of items by ``repr`` (ints, lists of ints, tensors): equal across processes."""
    return hashlib.blake2b(repr(list(items)).encode(), digest_size=16).hexdigest()


@dataclass
class EpochPlan:
    """One epoch laid out as positions ``0 .. total-1``: inner items, then padding.

    Positions below ``real = min(n, total)`` are the inner's items: the first W buffered in
    ``head``, the others still unread in ``rest``. Position ``p`` past them (and past the end of an
    inner that yields fewer items than its ``len()``) holds ``head[p % W]``: padding repeats the
    epoch's first items, and rank ``r`` (every position of which is ``r`` modulo W) repeats its own
    first item. An epoch of fewer than W items is ``exact``: ``head`` then holds all ``total``
    positions, the few items cycled.
    """

    head: list[Any]
    rest: Iterator[Any]
    real: int
    total: int
    exact: bool

    def filler(self, position: int) -> Any:
        return self.head[position % len(self.head)]


def plan_epoch(src: Iterator[Any], n: int, num_replicas: int, pad: bool) -> EpochPlan:
    """Lay out an epoch of ``src`` (whose ``len()`` is ``n``) as ``W * per_rank_count`` positions.

    Reads only the first W items. Raises ``RuntimeError`` when the epoch needs items but ``src``
    yields none.
    """
    total = num_replicas * per_rank_count(n, num_replicas, pad)
    real = min(n, total)
    if total == 0:
        return EpochPlan([], src, 0, 0, True)
    head = list(islice(src, min(num_replicas, real)))
    if not head:
        raise RuntimeError(f"the wrapped sampler or dataset yielded nothing, but its len() is {n}")
    if len(head) < num_replicas:  # a tiny epoch: cycle it to fill every rank
        return EpochPlan([head[p % len(head)] for p in range(total)], src, real, total, True)
    return EpochPlan(head, src, real, total, False)


def take_strided(plan: EpochPlan, start: int, step: int) -> Iterator[Any]:
    """Positions ``start, start + step, ...`` (below ``total``) of the plan; ``step`` is a multiple of W.

    One ``islice`` touches every inner item, the rest only this consumer's: about the cost of
    consuming the inner sampler. Every position taken is ``start`` modulo W, so the padded tail is
    ``repeat(head[start % W])``.
    """
    count = len(range(start, plan.total, step))
    if plan.exact:
        return islice(plan.head, start, plan.total, step)
    width = len(plan.head)
    first = plan.head[start : start + 1]  # empty unless start < W
    following = start if start >= width else start + step
    stop = plan.real - width
    body = islice(plan.rest, following - width, stop, step) if following - width < stop else iter(())
    return islice(chain(first, body, repeat(plan.head[start % width])), count)


def take_shuffled(plan: EpochPlan, num_replicas: int, rank: int, generator: torch.Generator) -> Iterator[Any]:
    """Rank ``rank``'s items when every step's W items are dealt to the ranks by a random permutation.

    Step ``k`` is positions ``kW .. kW+W-1``, grouped by ``zip`` (no per-item Python work). Every
    rank draws the same W keys per step (same generator), made distinct by ``key * W + slot``;
    rank ``r`` takes the slot equal to the number of the step's keys below key ``r``. Distinct keys
    make that a uniformly random bijection from ranks to slots, for one compare and a sum, no sort.
    Keys are drawn for ``_BLOCK_ITEMS`` items at a time (small enough to stay single-threaded).
    """
    steps = plan.total // num_replicas
    if plan.exact:
        source: Iterator[Any] = iter(plan.head)
    else:  # the tail repeats the head from position ``real``, as take_strided does
        body = islice(plan.rest, plan.real - num_replicas)
        source = chain(plan.head, body, islice(cycle(plan.head), plan.real % num_replicas, None))
    groups = zip(*[source] * num_replicas, strict=False)
    steps_per_block = max(1, _BLOCK_ITEMS // num_replicas)
    key_high = 1 << (62 - num_replicas.bit_length())
    slots = torch.arange(num_replicas)
    done = 0
    while done < steps:
        count = min(steps_per_block, steps - done)
        keys = torch.randint(0, key_high, (count, num_replicas), generator=generator) * num_replicas + slots
        columns = (keys < keys[:, rank : rank + 1]).sum(dim=1).tolist()
        yield from map(getitem, groups, columns)
        done += count


def _drain(src: Iterator[Any], bound: int) -> None:
    """Read ``src`` to its end (at most ``bound`` more items), so the inner generator runs to completion.

    Every rank then consumes the inner epoch alike, which keeps generators it owns (a shared
    ``RandomSampler`` generator, say) in step across ranks for the next epoch.
    """
    for _ in islice(src, bound + 1):
        pass


def _forward_set_epoch(sampler: Any, epoch: int) -> None:
    if callable(getattr(sampler, "set_epoch", None)):
        sampler.set_epoch(epoch)
    elif isinstance(sampler, BatchSampler) and callable(getattr(sampler.sampler, "set_epoch", None)):
        inner: Any = sampler.sampler
        inner.set_epoch(epoch)


def _resolve_world(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    if num_replicas is None or rank is None:
        if not is_ddp():
            raise ValueError(
                "no process group is initialised: call torch.distributed.init_process_group() first, "
                "or pass both num_replicas= and rank="
            )
        num_replicas = dist.get_world_size() if num_replicas is None else num_replicas
        rank = dist.get_rank() if rank is None else rank
    for name, value in (("num_replicas", num_replicas), ("rank", rank)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
    if not 0 <= rank < num_replicas:
        raise ValueError(f"rank must satisfy 0 <= rank < num_replicas={num_replicas}, got {rank}")
    return num_replicas, rank


def _group_has_peers() -> bool:
    """False under torch's ``fake`` backend (simulated ranks): there is no one to agree with."""
    import torch.distributed as dist

    return not (is_ddp() and dist.get_backend() == "fake")


class DDPSamplerWrapper(Sampler[_T]):
    """Shard what any ``Sampler``, ``BatchSampler`` or custom batch sampler yields across DDP ranks.

    Items are whatever ``sampler`` yields: indices, or whole batches (a batch is never split). Of the
    epoch's order ``s_0, s_1, ...`` (``n = len(sampler)`` items), rank ``r`` takes ``s_r, s_{r+W},
    s_{r+2W}, ...`` (W = ``num_replicas``). It streams: a rank buffers the first W items (the first
    ``FINGERPRINT_WINDOW`` while checking agreement, one block of about 8192 while shuffling),
    never the epoch, and costs about as much as consuming the inner sampler once. Every rank yields
    exactly ``len(self)`` items, so every rank takes the same number of steps:

    * ``pad_data_to_num_gpus=True``: ``ceil(n / W)`` items; the ``W * ceil(n / W) - n`` (< W) padded
      positions repeat items from the start of the epoch: a padded rank repeats its own first item
      (with fewer than W items the order is cycled).
    * ``pad_data_to_num_gpus=False``: ``n // W`` items; the last ``n % W`` items are dropped.

    ``len(sampler)`` is trusted: if the inner yields fewer items the missing ones are padded the
    same way, if more the extra are ignored, so equal counts hold either way.

    ``shuffle_samples_between_gpus=True`` changes, from epoch 1 on, which rank gets which item, so a
    deterministic inner sampler (``SequentialSampler``, a fixed batch sampler) does not feed rank r
    the same items every epoch. Epoch 0 is the non-DDP order: step k of all ranks together is
    ``s_{kW} .. s_{kW+W-1}`` in rank order. Later epochs deal each step's W items to the ranks by a
    random permutation drawn from a generator seeded with ``(seed, epoch)``: each global step
    still holds exactly the items of the non-DDP order's step (so length-bucketed or curriculum
    order survives, and ranks in a step get items of similar cost), only their assignment to ranks
    changes. Same seed and epoch, same stream, on every run.

    Epochs: ``set_epoch(e)`` makes the next ``__iter__`` epoch ``e`` (resume-safe) and forwards ``e``
    to the inner sampler's ``set_epoch`` (for a ``BatchSampler``, to its ``.sampler``'s). Without it,
    every further ``__iter__`` starts the next epoch (``e + 1``) and forwards that too, so an
    unattended loop still reshuffles. ``epoch`` is the epoch of the last (or next, after
    ``set_epoch``) iteration.

    Ranks whose inner samplers disagree: a ``RandomSampler`` without a generator, or a sampler
    drawing from numpy's global RNG, orders the epoch differently on every rank that seeded
    differently, and plain striding would then overlap and drop samples. With ``sync_order="auto"``
    (default) and ``num_replicas``/``rank`` taken from the default process group, each epoch starts
    with one small ``all_gather_object`` of (epoch, ``len(sampler)``, a hash of the first
    ``FINGERPRINT_WINDOW`` items). Equal: stream. Different: warn once, and rank 0 materialises its
    epoch and broadcasts it (``broadcast_object_list``), every rank shards that. Different epochs
    or lengths across ranks raise ``RuntimeError`` on every rank. ``"always"`` broadcasts rank 0's
    order every epoch without checking; ``"never"`` trusts the inner. The check only sees the first
    window: an order that diverges later needs ``"always"``. Items are compared by ``repr``, so
    items whose ``repr`` holds a memory address always look different (correct, but broadcast);
    broadcast items must pickle. Passing ``num_replicas`` or ``rank`` explicitly disables the check
    (no collective ever happens, with or without a group): the caller then guarantees that every
    rank's inner sampler yields the same order.

    Pitfall: with a process group, every rank must iterate together (as DDP training does); the
    first item of each epoch runs a collective. The object collectives use the default group; with
    NCCL set the CUDA device first, as DDP already requires.

    Example::

        >>> sampler = DDPSamplerWrapper(RandomSampler(dataset, generator=torch.Generator().manual_seed(0)))
        >>> loader = DataLoader(dataset, batch_size=32, sampler=sampler)
        >>> for epoch in range(start_epoch, n_epochs):
        ...     sampler.set_epoch(epoch)  # optional, but makes resumed runs reproduce
        ...     for batch in loader:
        ...         train_step(batch)

    Wrap a batch sampler to shard whole batches::

        >>> loader = DataLoader(dataset, batch_sampler=DDPSamplerWrapper(MyBucketBatchSampler(...)))
    """

    def __init__(
        self,
        sampler: SizedIterable[_T],
        shuffle_samples_between_gpus: bool = True,
        pad_data_to_num_gpus: bool = True,
        *,
        num_replicas: int | None = None,
        rank: int | None = None,
        seed: int = 0,
        sync_order: SyncOrder = "auto",
    ) -> None:
        super().__init__()
        if not callable(getattr(sampler, "__len__", None)) or not callable(
            getattr(sampler, "__iter__", None)
        ):
            raise TypeError(
                f"sampler must be iterable and have len() (a Sampler or batch sampler), "
                f"got {type(sampler).__name__}"
            )
        if sync_order not in _SYNC_ORDERS:
            raise ValueError(f"sync_order must be one of {_SYNC_ORDERS}, got {sync_order!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        from_group = num_replicas is None and rank is None
        self._num_replicas, self._rank = _resolve_world(num_replicas, rank)
        if sync_order == "always" and not is_ddp():
            raise ValueError(
                "sync_order='always' broadcasts rank 0's order: initialise a process group first"
            )
        self._sampler = sampler
        self._shuffle = bool(shuffle_samples_between_gpus)
        self._pad = bool(pad_data_to_num_gpus)
        self._seed = seed
        self._sync_order: SyncOrder = sync_order
        self._check_order = (
            sync_order == "auto" and from_group and self._num_replicas > 1 and _group_has_peers()
        )
        self._epoch = 0
        self._epoch_pending = True  # the next __iter__ uses self._epoch as it is
        self._warned = False

    # ------------------------------------------------------------------ read-only attributes
    @property
    def sampler(self) -> SizedIterable[_T]:
        return self._sampler

    @property
    def num_replicas(self) -> int:
        return self._num_replicas

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def shuffle_samples_between_gpus(self) -> bool:
        return self._shuffle

    @property
    def pad_data_to_num_gpus(self) -> bool:
        return self._pad

    @property
    def sync_order(self) -> SyncOrder:
        return self._sync_order

    # ------------------------------------------------------------------ sampler protocol
    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch`` and forward it to the inner sampler."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative int, got {epoch!r}")
        self._epoch = epoch
        self._epoch_pending = True
        _forward_set_epoch(self._sampler, epoch)

    def __len__(self) -> int:
        return per_rank_count(len(self._sampler), self._num_replicas, self._pad)

    def __iter__(self) -> Iterator[_T]:
        if not self._epoch_pending:
            self._epoch += 1
            _forward_set_epoch(self._sampler, self._epoch)
        self._epoch_pending = False
        return self._iterate(self._epoch)

    def _iterate(self, epoch: int) -> Iterator[_T]:
        n = len(self._sampler)
        src: Iterator[Any] = iter(self._sampler)
        world, rank = self._num_replicas, self._rank
        if self._sync_order == "always":
            src = self._broadcast_order(src)
        elif self._check_order:
            window = list(islice(src, FINGERPRINT_WINDOW))
            if self._orders_agree(epoch, n, window):
                src = chain(window, src)
            else:
                if not self._warned:
                    warnings.warn(_ORDER_DIFFERS, stacklevel=2)
                    self._warned = True
                src = self._broadcast_order(chain(window, src))
        plan = plan_epoch(src, n, world, self._pad)
        if self._shuffle and epoch > 0:
            generator = torch.Generator()
            generator.manual_seed(epoch_seed(self._seed, epoch))
            yield from take_shuffled(plan, world, rank, generator)
        else:
            yield from take_strided(plan, rank, world)
        _drain(plan.rest, n)

    def _orders_agree(self, epoch: int, n: int, window: list[Any]) -> bool:
        """One ``all_gather_object`` of (epoch, n, digest); raises everywhere if epochs or lengths differ."""
        gathered: list[Any] = [None] * self._num_replicas
        dist.all_gather_object(gathered, (epoch, n, fingerprint(window)))
        epochs = sorted({g[0] for g in gathered})
        if len(epochs) > 1:
            raise RuntimeError(
                f"DDPSamplerWrapper: ranks are at different epochs {epochs}; call set_epoch(epoch) with the "
                "same epoch on every rank, or on none"
            )
        lengths = sorted({g[1] for g in gathered})
        if len(lengths) > 1:
            raise RuntimeError(
                f"DDPSamplerWrapper: len(sampler) differs across ranks {lengths}; every rank must wrap "
                "a sampler over the same data"
            )
        return len({g[2] for g in gathered}) == 1

    def _broadcast_order(self, src: Iterator[Any]) -> Iterator[Any]:
        """Rank 0's whole epoch, materialised there and broadcast to every rank."""
        payload: list[Any] = [list(src) if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(payload, src=0)
        return iter(payload[0])


__all__ = [
    "FINGERPRINT_WINDOW",
    "DDPSamplerWrapper",
    "SizedIterable",
    "SyncOrder",
    "per_rank_count",
]
