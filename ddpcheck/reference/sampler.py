"""DDPSamplerWrapper: shard what any sampler or batch sampler yields across DDP ranks, streaming.

Names and defaults follow ``oml.ddp``'s ``DDPSamplerWrapper`` so OML code works by changing the
import. Unlike it (and Lightning's and Catalyst's wrappers) this one does not materialise the epoch
on every rank, and it notices when the inner sampler draws from per-rank random state, which makes
those wrappers silently overlap and drop samples.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import chain, cycle, islice, repeat
from operator import getitem
from typing import Any, Literal, Protocol, TypeVar

import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, Sampler

from ddpcheck.reference.dist import data_parallel_rank, data_parallel_world_size, is_ddp

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
    ``head``, the others still unread in ``rest``. Padding is laid out as ``DistributedSampler``
    does, so no rank gets a second copy of its own item: position ``p`` past the real ones holds
    ``head[(p - real) % W]`` (the epoch's first items again, which land on the following ranks). An
    epoch of fewer than W items is ``exact``: ``head`` then holds all ``total`` positions, the few
    items cycled. An inner that yields fewer items than its ``len()`` is padded from the point where
    ``real`` says it should have ended, with the same filler per consumer.
    """

    head: list[Any]
    rest: Iterator[Any]
    real: int
    total: int
    exact: bool


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
    ``repeat(head[(start - real) % W])``: one position at most, never this consumer's own item.
    """
    count = len(range(start, plan.total, step))
    if plan.exact:
        return islice(plan.head, start, plan.total, step)
    width = len(plan.head)
    first = plan.head[start : start + 1]  # empty unless start < W
    following = start if start >= width else start + step
    stop = plan.real - width
    body = islice(plan.rest, following - width, stop, step) if following - width < stop else iter(())
    return islice(chain(first, body, repeat(plan.head[(start - plan.real) % width])), count)


def take_shuffled(plan: EpochPlan, num_replicas: int, rank: int, generator: torch.Generator) -> Iterator[Any]:
    """Rank ``rank``'s items when every step's W items are dealt to the ranks by a random permutation.

    Step ``k`` is positions ``kW .. kW+W-1``, grouped by ``zip`` (no per-item Python work). Every
    rank draws the same W keys per step (same generator), made distinct by ``key * W + slot``;
    rank ``r`` takes the slot equal to the number of the step's keys below key ``r``. Distinct keys
    make that a uniformly random bijection from ranks to slots, for one compare and a sum, no sort.
    Keys are drawn for ``_BLOCK_ITEMS`` items at a time (small enough to stay single-threaded).

    A padded last step holds ``q`` real items and then ``head[0 .. W-q-1]``, which step 0 dealt
    out: there every rank shifts its step-0 slot by one shift ``s != q`` drawn from the step's keys,
    a bijection that never hands a rank the copy of its own step-0 item (at slot ``q + slot_0``).
    """
    steps = plan.total // num_replicas
    last_real = plan.real - (steps - 1) * num_replicas  # real items in the last step
    padded_last = not plan.exact and 0 < last_real < num_replicas
    if plan.exact:
        source: Iterator[Any] = iter(plan.head)
    else:  # the tail repeats the head from position ``real``, as take_strided does
        body = islice(plan.rest, plan.real - num_replicas)
        source = chain(plan.head, body, cycle(plan.head))
    groups = zip(*[source] * num_replicas, strict=False)
    steps_per_block = max(1, _BLOCK_ITEMS // num_replicas)
    key_high = 1 << (62 - num_replicas.bit_length())
    slots = torch.arange(num_replicas)
    done = 0
    first_slot = 0
    while done < steps:
        count = min(steps_per_block, steps - done)
        keys = torch.randint(0, key_high, (count, num_replicas), generator=generator) * num_replicas + slots
        columns = (keys < keys[:, rank : rank + 1]).sum(dim=1).tolist()
        if done == 0:
            first_slot = columns[0]
        if padded_last and done + count == steps:
            shift = int(keys[-1, 0]) // num_replicas % (num_replicas - 1)
            shift += shift >= last_real
            columns[-1] = (first_slot + shift) % num_replicas
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


def _inner_generator(sampler: Any) -> torch.Generator | None:
    """The ``torch.Generator`` the inner order is drawn from, if it owns one (or its ``.sampler`` does)."""
    for candidate in (sampler, getattr(sampler, "sampler", None)):
        generator = getattr(candidate, "generator", None)
        if isinstance(generator, torch.Generator):
            return generator
    return None


def _generator_state(sampler: Any) -> str | None:
    generator = _inner_generator(sampler)
    if generator is None:
        return None
    return base64.b64encode(generator.get_state().numpy().tobytes()).decode("ascii")


STATE_VERSION = 1
"""Version of the ``DDPSamplerWrapper.state_dict()`` layout."""

_STATE_KEYS: dict[str, tuple[type, ...]] = {
    "version": (int,),
    "epoch": (int,),
    "num_replicas": (int,),
    "rank": (int,),
    "length": (int,),
    "start": (int,),
    "yielded": (int,),
    "consumed": (int,),
    "seed": (int,),
    "pad": (bool,),
    "shuffle": (bool,),
    "generator": (str, type(None)),
}


@dataclass(slots=True)
class _Cursor:
    """Where one iterator is: its epoch laid out from global position ``start``, ``yielded`` items out."""

    epoch: int
    length: int
    start: int
    yielded: int
    generator: str | None


def _check_state(state: Any) -> Mapping[str, Any]:
    if not isinstance(state, Mapping):
        raise ValueError(f"DDPSamplerWrapper state must be a dict, got {type(state).__name__}")
    for key, types in _STATE_KEYS.items():
        value = state.get(key, ...)
        if value is ... or not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
            raise ValueError(f"DDPSamplerWrapper state: {key!r} is missing or not {types[0].__name__}")
        if isinstance(value, int) and not isinstance(value, bool) and value < 0:
            raise ValueError(f"DDPSamplerWrapper state: {key!r} must be >= 0, got {value}")
    if state["version"] != STATE_VERSION:
        raise ValueError(f"DDPSamplerWrapper state version {state['version']} is not {STATE_VERSION}")
    if state["num_replicas"] < 1:
        raise ValueError("DDPSamplerWrapper state: 'num_replicas' must be >= 1")
    return state


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


def mesh_world(mesh: Any, num_replicas: int | None, rank: int | None) -> tuple[int | None, int | None]:
    """``(num_replicas, rank)`` from a ``DeviceMesh``'s data-parallel dimensions, when one is given."""
    if mesh is None:
        return num_replicas, rank
    if num_replicas is not None or rank is not None:
        raise ValueError("pass mesh= or num_replicas=/rank=, not both: the mesh names the data-parallel rank")
    return data_parallel_world_size(mesh), data_parallel_rank(mesh)


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
      positions repeat the epoch's first items, laid out as ``DistributedSampler`` pads (items, then
      the first ones again): a padded rank gets another rank's first item, never a second copy of
      one it already has (with fewer than W items the order is cycled).
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

    Resume: ``state_dict()`` is plain data saying how far this rank's current iterator got;
    ``load_state_dict(state)`` on a fresh wrapper makes the next ``__iter__`` yield exactly the rest
    of that epoch, and later epochs as if never interrupted. Every rank may load rank 0's state, also
    at another world size (elastic): the new ranks then share the items the old ranks had not
    reached, no item lost, repeats only from the new world size's padding. The inner order must be
    reproducible: deterministic given ``set_epoch``, or drawn from its own ``generator`` (the state
    carries that generator's state). The count is what the sampler handed out: exact with
    ``num_workers=0`` and inside torchdata's ``StatefulDataLoader`` (which snapshots it per batch);
    a plain DataLoader with workers pulls batches ahead, which a resume then skips.

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

    Device meshes (FSDP2/HSDP with tensor, context or pipeline parallelism): pass ``mesh=`` instead of
    ``num_replicas``/``rank``. The data-parallel coordinate (the dimensions named ``dp*``, flattened
    row-major as torchtitan does) is the rank and their product the replica count, so ranks that differ
    only in a tensor/context/pipeline coordinate yield the same items, step by step. The agreement
    check then runs over every rank of the default group, replicas included.

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
        mesh: Any = None,
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
        from_group = (num_replicas is None and rank is None) or mesh is not None
        num_replicas, rank = mesh_world(mesh, num_replicas, rank)
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
        self._cursor: _Cursor | None = None  # the latest iterator's position
        self._resume: _Cursor | None = None  # loaded by load_state_dict, taken by the next __iter__

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
        """Make the next iteration epoch ``epoch`` and forward it to the inner sampler.

        A resume loaded by ``load_state_dict`` survives only when ``epoch`` is the saved epoch; after
        a state saved at an epoch's end, ``set_epoch(saved + 1)`` starts the next epoch as the
        uninterrupted run would have.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative int, got {epoch!r}")
        self._epoch = epoch
        self._epoch_pending = True
        resume = self._resume
        if resume is not None and resume.epoch != epoch:
            self._resume = None
            if epoch == resume.epoch + 1 and self._finished(resume):
                # Restored at an epoch's end, the job starts the next epoch: the inner's generator
                # (restored to the finished epoch's start) draws that epoch once, as the run did.
                self._draw_inner()
        _forward_set_epoch(self._sampler, epoch)

    def __len__(self) -> int:
        return per_rank_count(len(self._sampler), self._num_replicas, self._pad)

    def __iter__(self) -> Iterator[_T]:
        if not self._epoch_pending:
            self._epoch += 1
            _forward_set_epoch(self._sampler, self._epoch)
        self._epoch_pending = False
        cursor, self._resume = self._resume, None
        if cursor is None:
            cursor = _Cursor(self._epoch, len(self._sampler), 0, 0, _generator_state(self._sampler))
        elif cursor.generator is not None:
            # Again, now: a DataLoader built with ``generator=`` shares it with its RandomSampler and
            # draws a base seed from it in ``iter(loader)``, after load_state_dict and before this.
            self._restore_generator(cursor.generator)
        self._cursor = cursor
        return self._iterate(cursor)

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        """Where this rank is in the epoch, as plain data (JSON and ``torch.load(weights_only=True)``).

        Keys: ``epoch``; ``num_replicas``/``rank`` of the saver; ``length`` (``len(sampler)``);
        ``start``, the global position the current layout began at (0, or where an elastic resume
        took over); ``yielded``, items the current iterator handed out (what the sampler gave away,
        not what training used: a DataLoader with workers pulls ahead, except torchdata's
        ``StatefulDataLoader``, which snapshots this state per batch); ``consumed``, the epoch's
        global position all ranks reached together: each item a rank yields is its share of one
        step of ``num_replicas`` consecutive positions (shuffling between GPUs only permutes a
        step), so ranks in lockstep that each yielded ``yielded`` items have consumed positions
        ``start .. start + yielded * num_replicas - 1`` of the inner order, and ``consumed`` is that
        end (``length`` once the layout is used up, its padding or dropped tail included). The
        saver's count stands for every rank's: ranks that stopped at other counts would lose or
        repeat the difference. Then ``seed``, ``pad``, ``shuffle``; ``generator``, the inner's
        ``torch.Generator`` state at the epoch's start (base64), so a fresh process reproduces the
        inner order.
        """
        cursor = self._resume or (None if self._epoch_pending else self._cursor)
        if cursor is None:  # nothing taken from the coming epoch yet
            cursor = _Cursor(self._epoch, len(self._sampler), 0, 0, _generator_state(self._sampler))
        world = self._num_replicas
        per_rank = per_rank_count(cursor.length - cursor.start, world, self._pad)
        if 0 < per_rank <= cursor.yielded:
            consumed = cursor.length
        else:
            consumed = min(cursor.start + cursor.yielded * world, cursor.length)
        return {
            "version": STATE_VERSION,
            "epoch": cursor.epoch,
            "num_replicas": world,
            "rank": self._rank,
            "length": cursor.length,
            "start": cursor.start,
            "yielded": cursor.yielded,
            "consumed": consumed,
            "seed": self._seed,
            "pad": self._pad,
            "shuffle": self._shuffle,
            "generator": cursor.generator,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next ``__iter__`` yield the rest of the saved epoch; later epochs are unchanged.

        Every rank loads the same state (rank 0's is enough). Saved at this world size, the epoch's
        layout is rebuilt and this rank skips the ``yielded`` items it had: exactly the uninterrupted
        stream. Saved at another world size, the inner items from ``consumed`` on are laid out as an
        epoch of their own at this world size (padded or cut like any epoch), so together the old and
        new ranks see every item once, plus this world size's padding. ``set_epoch`` with the saved
        epoch, before or after this, keeps the resume; another epoch drops it. ``len()`` stays the
        whole epoch's count. Raises ``ValueError`` for a malformed state or one saved for other data
        or options (``len(sampler)``, ``seed``, padding, shuffling).
        """
        state = _check_state(state)
        n = len(self._sampler)
        if state["length"] != n:
            raise ValueError(
                f"DDPSamplerWrapper state was saved for len(sampler)={state['length']}, this sampler has {n}"
            )
        for key, mine in (("seed", self._seed), ("pad", self._pad), ("shuffle", self._shuffle)):
            if state[key] != mine:
                raise ValueError(
                    f"DDPSamplerWrapper state was saved with {key}={state[key]!r}, this one has {mine!r}"
                )
        saved_world, start = state["num_replicas"], state["start"]
        if (
            start > n
            or state["consumed"] > n
            or state["yielded"] > per_rank_count(n - start, saved_world, self._pad)
        ):
            raise ValueError("DDPSamplerWrapper state is inconsistent: its positions lie past the epoch")
        self._epoch = state["epoch"]
        self._epoch_pending = True
        _forward_set_epoch(self._sampler, self._epoch)
        if state["generator"] is not None:
            self._restore_generator(state["generator"])
        if saved_world == self._num_replicas:
            cursor = _Cursor(self._epoch, n, start, state["yielded"], state["generator"])
        else:
            cursor = _Cursor(self._epoch, n, state["consumed"], 0, state["generator"])
        self._resume = cursor

    def _finished(self, cursor: _Cursor) -> bool:
        return per_rank_count(cursor.length - cursor.start, self._num_replicas, self._pad) <= cursor.yielded

    def _draw_inner(self) -> None:
        if _inner_generator(self._sampler) is not None:
            for _ in self._sampler:
                pass

    def _restore_generator(self, encoded: str) -> None:
        generator = _inner_generator(self._sampler)
        if generator is None:
            raise ValueError(
                "DDPSamplerWrapper state holds the inner sampler's generator state, but this inner sampler "
                "has no torch.Generator: build it as the saved one was built"
            )
        try:
            raw = bytearray(base64.b64decode(encoded, validate=True))
            generator.set_state(torch.frombuffer(raw, dtype=torch.uint8))
        except (binascii.Error, ValueError, RuntimeError) as exc:
            raise ValueError(f"DDPSamplerWrapper state: bad generator state ({exc})") from None

    def _iterate(self, cursor: _Cursor) -> Iterator[_T]:
        n, epoch, start = cursor.length, cursor.epoch, cursor.start
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
        if start:  # an elastic resume: the epoch's items from ``start`` on, laid out afresh
            src = islice(src, start, None)
        plan = plan_epoch(src, n - start, world, self._pad)
        stream: Iterator[Any]
        if self._shuffle and epoch > 0:
            generator = torch.Generator()
            generator.manual_seed(epoch_seed(self._seed, epoch))
            stream = take_shuffled(plan, world, rank, generator)
        else:
            stream = take_strided(plan, rank, world)
        done = cursor.yielded
        if done:  # a resume at the saved world size: the same stream, minus what was handed out
            stream = islice(stream, done, None)
        for item in stream:
            done += 1
            cursor.yielded = done
            yield item
        _drain(plan.rest, n)

    def _orders_agree(self, epoch: int, n: int, window: list[Any]) -> bool:
        """One ``all_gather_object`` of (epoch, n, digest); raises everywhere if epochs or lengths differ."""
        gathered: list[Any] = [None] * dist.get_world_size()  # every rank: on a mesh, replicas too
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
