"""DDPSamplerWrapper: properties over simulated ranks in one process, and real gloo groups of 2 and 3."""

from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Iterator
from itertools import islice
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch.utils.data import BatchSampler, DistributedSampler, RandomSampler, Sampler, SequentialSampler

from ddpcheck.launch import GroupCall, run_ranks
from ddpcheck.reference.sampler import FINGERPRINT_WINDOW, DDPSamplerWrapper

# --------------------------------------------------------------------------- inner samplers


class UnevenBatchSampler(Sampler[list[int]]):
    """Contiguous batches of sizes 1, 2, 3, 1, 2, 3, ...; ``set_epoch`` rotates the data by the epoch."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _batches(self) -> list[list[int]]:
        order = [(i + self.epoch) % self.n for i in range(self.n)]
        out, start, size = [], 0, 1
        while start < self.n:
            out.append(order[start : start + size])
            start += size
            size = size % 3 + 1
        return out

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._batches())

    def __len__(self) -> int:
        return len(self._batches())


class CountingSampler(Sampler[int]):
    """``range(n)`` that records how many items were drawn and whether the generator finished."""

    def __init__(self, n: int, actual: int | None = None) -> None:
        self.n = n
        self.actual = n if actual is None else actual
        self.drawn = 0
        self.finished = 0

    def __iter__(self) -> Iterator[int]:
        for i in range(self.actual):
            self.drawn += 1
            yield i
        self.finished += 1

    def __len__(self) -> int:
        return self.n


class NumpyGlobalSampler(Sampler[int]):
    """A permutation from numpy's global RNG: per-rank state when each rank seeds numpy itself."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(np.random.permutation(self.n).tolist())

    def __len__(self) -> int:
        return self.n


def make_inner(kind: str, n: int, batch_size: int, drop_last: bool, seed: int) -> Any:
    """A fresh inner sampler; two calls with equal arguments give samplers with equal random state."""
    if kind == "sequential":
        return SequentialSampler(range(n))
    if kind == "random":
        return RandomSampler(range(n), generator=torch.Generator().manual_seed(seed))
    if kind == "random-replacement":
        return RandomSampler(range(n), replacement=True, generator=torch.Generator().manual_seed(seed))
    if kind == "batch-sequential":
        return BatchSampler(SequentialSampler(range(n)), batch_size, drop_last)
    if kind == "batch-random":
        generator = torch.Generator().manual_seed(seed)
        return BatchSampler(RandomSampler(range(n), generator=generator), batch_size, drop_last)
    if kind == "uneven-batches":
        return UnevenBatchSampler(n)
    raise AssertionError(kind)


KINDS = ["sequential", "random", "random-replacement", "batch-sequential", "batch-random", "uneven-batches"]

# --------------------------------------------------------------------------- the spec, materialised


def expected_positions(order: list[Any], world: int, pad: bool) -> list[Any]:
    """The documented epoch layout: ``W * per_rank`` positions; padding repeats the start.

    As ``DistributedSampler`` pads: the items, then the first ``total - n`` items again, so the
    repeated head items land on the ranks after their own.
    """
    n = len(order)
    per_rank = math.ceil(n / world) if pad else n // world
    total = world * per_rank
    real = min(n, total)
    if n < world:
        return [order[p % n] for p in range(total)] if n else []
    return order[:real] + [order[p - real] for p in range(real, total)]


def as_key(item: Any) -> Any:
    return tuple(item) if isinstance(item, list) else item


def run_simulated(
    kind: str,
    n: int,
    world: int,
    *,
    pad: bool,
    shuffle: bool,
    epochs: int,
    batch_size: int = 3,
    drop_last: bool = False,
    seed: int = 0,
    wrapper_seed: int = 0,
) -> tuple[list[list[list[Any]]], list[list[Any]], list[int]]:
    """Every simulated rank's items per epoch, the inner's own order per epoch, and len() per rank."""
    wrappers = [
        DDPSamplerWrapper(
            make_inner(kind, n, batch_size, drop_last, seed),
            shuffle,
            pad,
            num_replicas=world,
            rank=r,
            seed=wrapper_seed,
        )
        for r in range(world)
    ]
    reference = make_inner(kind, n, batch_size, drop_last, seed)
    per_epoch, orders = [], []
    for epoch in range(epochs):
        if epoch and hasattr(reference, "set_epoch"):
            reference.set_epoch(epoch)  # the wrapper forwards its automatic epoch the same way
        orders.append(list(reference))
        per_epoch.append([list(w) for w in wrappers])
    return per_epoch, orders, [len(w) for w in wrappers]


# --------------------------------------------------------------------------- properties


@settings(max_examples=100, deadline=None)
@given(
    kind=st.sampled_from(KINDS),
    n=st.one_of(st.integers(0, 20), st.integers(0, 300)),
    world=st.integers(1, 16),
    pad=st.booleans(),
    shuffle=st.booleans(),
    batch_size=st.integers(1, 5),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_every_epoch_is_the_documented_layout(
    kind: str, n: int, world: int, pad: bool, shuffle: bool, batch_size: int, drop_last: bool, seed: int
) -> None:
    assume(n > 0 or "random" not in kind)  # RandomSampler refuses an empty data source
    per_epoch, orders, lengths = run_simulated(
        kind,
        n,
        world,
        pad=pad,
        shuffle=shuffle,
        epochs=3,
        batch_size=batch_size,
        drop_last=drop_last,
        seed=seed,
    )
    for epoch, (ranks, order) in enumerate(zip(per_epoch, orders, strict=True)):
        positions = expected_positions(order, world, pad)
        counts = {len(items) for items in ranks}
        assert counts == {len(positions) // world}, "every rank yields the same number of items"
        assert set(lengths) == counts, "len() is what __iter__ yields"
        for step in range(len(positions) // world):
            got = [ranks[r][step] for r in range(world)]
            want = positions[step * world : (step + 1) * world]
            if epoch == 0 or not shuffle:
                assert got == want, f"epoch {epoch} step {step}: not the inner order in rank order"
            else:  # the step's items (batches intact), dealt to ranks in some order
                assert Counter(map(as_key, got)) == Counter(map(as_key, want))
        union = Counter(as_key(x) for items in ranks for x in items)
        everything = Counter(map(as_key, order))
        if pad:
            assert set(union) == set(everything), "padding loses nothing"
            extra = union - everything
            assert sum(extra.values()) == len(positions) - len(order) < world
            assert set(extra) <= {as_key(x) for x in order[:world]}, "padding repeats the start"
        else:
            dropped = everything - union
            assert sum(dropped.values()) == len(order) % world
            assert not union - everything, "no duplicates without padding"


@settings(max_examples=30, deadline=None)
@given(world=st.integers(2, 16), extra=st.integers(0, 200), seed=st.integers(0, 1000))
def test_shuffling_changes_the_assignment_between_epochs(world: int, extra: int, seed: int) -> None:
    n = 64 * world + extra  # >= 64 steps: an unchanged assignment has probability <= 2**-64
    per_epoch, _, _ = run_simulated(
        "sequential", n, world, pad=True, shuffle=True, epochs=3, wrapper_seed=seed
    )
    assert per_epoch[0] != per_epoch[1] != per_epoch[2] != per_epoch[0]
    again, _, _ = run_simulated("sequential", n, world, pad=True, shuffle=True, epochs=3, wrapper_seed=seed)
    assert again == per_epoch, "same seed and epoch, same stream"
    other, _, _ = run_simulated(
        "sequential", n, world, pad=True, shuffle=True, epochs=3, wrapper_seed=seed + 1
    )
    assert other[0] == per_epoch[0], "epoch 0 is always the inner order"
    assert other[1] != per_epoch[1]


def test_without_shuffle_every_epoch_is_the_inner_order() -> None:
    per_epoch, _, _ = run_simulated("sequential", 10, 3, pad=True, shuffle=False, epochs=3)
    # padding as DistributedSampler lays it out: the padded ranks get the next ranks' first items
    assert per_epoch[0] == per_epoch[1] == per_epoch[2] == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]


def test_set_epoch_then_automatic_epochs() -> None:
    inner = UnevenBatchSampler(40)
    wrapper = DDPSamplerWrapper(inner, num_replicas=4, rank=1, seed=7)
    assert wrapper.epoch == 0
    list(wrapper)
    list(wrapper)
    assert (wrapper.epoch, inner.epoch) == (1, 1), "a further __iter__ starts the next epoch and forwards it"
    wrapper.set_epoch(5)
    assert (wrapper.epoch, inner.epoch) == (5, 5)
    at5 = list(wrapper)
    at6 = list(wrapper)
    assert (wrapper.epoch, inner.epoch) == (6, 6)
    fresh = DDPSamplerWrapper(UnevenBatchSampler(40), num_replicas=4, rank=1, seed=7)
    fresh.set_epoch(6)
    assert list(fresh) == at6 != at5


def test_set_epoch_reaches_a_batch_samplers_sampler() -> None:
    class EpochSampler(SequentialSampler):
        epoch = -1

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

    inner = EpochSampler(range(10))
    wrapper = DDPSamplerWrapper(BatchSampler(inner, 2, False), num_replicas=2, rank=0)
    wrapper.set_epoch(3)
    assert inner.epoch == 3
    with pytest.raises(ValueError, match="non-negative"):
        wrapper.set_epoch(-1)


def test_read_only_attributes() -> None:
    inner = SequentialSampler(range(5))
    wrapper = DDPSamplerWrapper(inner, False, False, num_replicas=3, rank=2, seed=11)
    assert (wrapper.num_replicas, wrapper.rank, wrapper.seed, wrapper.epoch) == (3, 2, 11, 0)
    assert wrapper.sampler is inner
    assert (wrapper.shuffle_samples_between_gpus, wrapper.pad_data_to_num_gpus) == (False, False)
    with pytest.raises(AttributeError):
        wrapper.rank = 0  # type: ignore[misc]


@pytest.mark.parametrize("rank", [0, 3, 7])
@pytest.mark.parametrize("epoch", [0, 1])
def test_streams_instead_of_materialising(rank: int, epoch: int) -> None:
    inner = CountingSampler(100_000)
    wrapper = DDPSamplerWrapper(inner, num_replicas=8, rank=rank)
    wrapper.set_epoch(epoch)
    it = iter(wrapper)
    next(it)
    assert inner.drawn <= 8 * 1024 + 8, "the first item must not cost the whole epoch"
    rest = list(it)
    assert len(rest) + 1 == len(wrapper) == 12_500
    assert (inner.drawn, inner.finished) == (100_000, 1), "the inner epoch is run to its end"


@pytest.mark.parametrize(("n", "world", "pad"), [(100, 5, False), (100, 5, True), (65, 3, True)])
def test_ranks_consume_a_shared_generator_alike(n: int, world: int, pad: bool) -> None:
    # RandomSampler(replacement=True) draws 32 indices at a time from its generator: a rank that
    # stopped reading at its last item would skip the final draw and start the next epoch from
    # another generator state than its peers.
    per_epoch, orders, _ = run_simulated("random-replacement", n, world, pad=pad, shuffle=True, epochs=3)
    for ranks, order in zip(per_epoch, orders, strict=True):
        assert Counter(x for items in ranks for x in items) == Counter(expected_positions(order, world, pad))


@pytest.mark.parametrize("actual", [0, 5, 37, 41, 60])
@pytest.mark.parametrize("pad", [True, False])
def test_a_lying_len_still_gives_equal_counts(actual: int, pad: bool) -> None:
    world, n = 4, 41
    ranks = []
    for r in range(world):
        wrapper = DDPSamplerWrapper(
            CountingSampler(n, actual), num_replicas=world, rank=r, pad_data_to_num_gpus=pad
        )
        if actual == 0:
            with pytest.raises(RuntimeError, match="yielded nothing"):
                list(wrapper)
            continue
        ranks.append(list(wrapper) + list(wrapper))  # epoch 0 (strided) and 1 (shuffled)
    if actual:
        per_rank = math.ceil(n / world) if pad else n // world
        assert {len(x) for x in ranks} == {2 * per_rank}
        assert max(x for items in ranks for x in items) < min(actual, n), "extra items are ignored"


def test_bad_arguments_say_what_to_do() -> None:
    inner = SequentialSampler(range(4))
    with pytest.raises(ValueError, match=r"init_process_group.*num_replicas= and rank="):
        DDPSamplerWrapper(inner)
    with pytest.raises(ValueError, match="init_process_group"):
        DDPSamplerWrapper(inner, num_replicas=2)
    with pytest.raises(ValueError, match=r"0 <= rank < num_replicas=2"):
        DDPSamplerWrapper(inner, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="num_replicas must be >= 1"):
        DDPSamplerWrapper(inner, num_replicas=0, rank=0)
    with pytest.raises(TypeError, match="num_replicas must be an int"):
        DDPSamplerWrapper(inner, num_replicas=2.0, rank=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sync_order"):
        DDPSamplerWrapper(inner, num_replicas=2, rank=0, sync_order="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="process group"):
        DDPSamplerWrapper(inner, num_replicas=2, rank=0, sync_order="always")
    with pytest.raises(TypeError, match="have len"):
        DDPSamplerWrapper(iter(range(4)), num_replicas=2, rank=0)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- real process groups


def _rank() -> tuple[int, int]:
    import torch.distributed as dist

    torch.set_num_threads(1)  # a forked rank must not start its own OpenMP pool (see test_reference_sync)
    return dist.get_rank(), dist.get_world_size()


def _epochs_under_group(inner: Any, epochs: int, **options: Any) -> dict[str, Any]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wrapper = DDPSamplerWrapper(inner, **options)
        items = [list(wrapper) for _ in range(epochs)]
    return {
        "items": items,
        "len": len(wrapper),
        "warnings": [str(w.message) for w in caught if "DDPSamplerWrapper" in str(w.message)],
    }


def _per_rank_state(kind: str, n: int, sync_order: str) -> dict[str, Any]:
    rank, _ = _rank()
    if kind == "torch-global":
        torch.manual_seed(rank)
        inner: Any = RandomSampler(range(n))  # seeds itself from the per-rank global RNG
    else:
        np.random.seed(rank)
        inner = NumpyGlobalSampler(n)
    return _epochs_under_group(inner, 3, sync_order=sync_order)


def _assert_partition(values: list[dict[str, Any]], n: int, world: int, epochs: int) -> None:
    per_rank = math.ceil(n / world)
    for epoch in range(epochs):
        ranks = [v["items"][epoch] for v in values]
        assert [len(x) for x in ranks] == [per_rank] * world == [v["len"] for v in values]
        union = Counter(x for items in ranks for x in items)
        assert set(union) == set(range(n)), f"epoch {epoch}: samples lost"
        assert sum(union.values()) - n == per_rank * world - n, f"epoch {epoch}: overlap beyond padding"


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("kind", ["torch-global", "numpy-global"])
def test_per_rank_random_state_still_partitions_and_warns_once(world: int, kind: str) -> None:
    n = 50
    result = run_ranks(
        GroupCall(_per_rank_state, world_size=world, kwargs={"kind": kind, "n": n, "sync_order": "auto"})
    )
    result.raise_for_failures()
    _assert_partition(result.values, n, world, epochs=3)
    for value in result.values:
        assert len(value["warnings"]) == 1 and "differs across ranks" in value["warnings"][0]


def test_sync_order_always_partitions_without_a_warning() -> None:
    result = run_ranks(
        GroupCall(
            _per_rank_state, world_size=3, kwargs={"kind": "numpy-global", "n": 31, "sync_order": "always"}
        )
    )
    result.raise_for_failures()
    _assert_partition(result.values, 31, 3, epochs=3)
    assert all(v["warnings"] == [] for v in result.values)


def _shared_state(n: int) -> dict[str, Any]:
    _rank()
    torch.manual_seed(1234)  # the same global state on every rank: RandomSampler agrees everywhere
    inner = CountingSampler(n)
    shuffled = RandomSampler(range(n))
    wrapper = DDPSamplerWrapper(inner)
    it = iter(wrapper)
    next(it)
    drawn_at_first_item = inner.drawn
    list(it)
    out = _epochs_under_group(shuffled, 2)
    out["drawn_at_first_item"] = drawn_at_first_item
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_agreeing_ranks_stream_without_broadcast(world: int) -> None:
    n = 5000
    result = run_ranks(GroupCall(_shared_state, world_size=world, kwargs={"n": n}))
    result.raise_for_failures()
    _assert_partition(result.values, n, world, epochs=2)
    for value in result.values:
        assert value["warnings"] == []
        # rank 0 would have drawn all n items to broadcast them
        assert value["drawn_at_first_item"] <= FINGERPRINT_WINDOW + world


def _mismatched_epochs() -> str:
    rank, _ = _rank()
    wrapper = DDPSamplerWrapper(SequentialSampler(range(20)))
    wrapper.set_epoch(rank)
    try:
        list(wrapper)
    except RuntimeError as exc:
        return str(exc)
    return "no error"


def test_ranks_at_different_epochs_fail_together() -> None:
    result = run_ranks(GroupCall(_mismatched_epochs, world_size=2))
    result.raise_for_failures()
    assert all("different epochs [0, 1]" in v for v in result.values)


def _explicit_world_never_communicates(n: int) -> list[list[int]]:
    rank, world = _rank()
    if rank != 0:
        return []  # a collective on rank 0 would now wait for a peer that never joins, and fail
    wrappers = [
        DDPSamplerWrapper(SequentialSampler(range(n)), num_replicas=world, rank=r) for r in range(world)
    ]
    return [list(islice(w, 3)) for w in wrappers]


def test_explicit_world_inside_a_group_runs_no_collective() -> None:
    result = run_ranks(
        GroupCall(_explicit_world_never_communicates, world_size=2, kwargs={"n": 12}, timeout=30)
    )
    result.raise_for_failures()
    assert result.values == [[[0, 2, 4], [1, 3, 5]], []]


# ------------------------------------------------------------------- padding, as DistributedSampler pads


@pytest.mark.parametrize("pad", [True, False])
def test_every_padding_case_is_distributed_samplers_layout(pad: bool) -> None:
    """World sizes 1..16, every remainder ``n mod W`` (and epochs shorter than W): the strided epochs
    are exactly ``DistributedSampler(shuffle=False)``'s, and no rank ever holds an item twice."""
    for world in range(1, 17):
        for n in range(1, 2 * world + 2):
            expected = [
                list(DistributedSampler(range(n), world, r, shuffle=False, drop_last=not pad))  # type: ignore[arg-type]
                for r in range(world)
            ]
            for shuffle in (False, True):
                per_epoch, _, _ = run_simulated("sequential", n, world, pad=pad, shuffle=shuffle, epochs=3)
                for epoch, ranks in enumerate(per_epoch):
                    if epoch == 0 or not shuffle:
                        assert ranks == expected, f"W={world} n={n} epoch {epoch}"
                    for rank, items in enumerate(ranks):
                        assert len(set(items)) == len(items), f"W={world} n={n} epoch {epoch} rank {rank}"


@settings(max_examples=150, deadline=None)
@given(
    kind=st.sampled_from(["sequential", "random", "batch-sequential", "batch-random", "uneven-batches"]),
    world=st.integers(1, 16),
    steps=st.integers(0, 40),
    remainder=st.integers(0, 15),
    pad=st.booleans(),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_padding_never_gives_a_rank_a_second_copy(
    kind: str, world: int, steps: int, remainder: int, pad: bool, shuffle: bool, seed: int
) -> None:
    n = world * steps + remainder % world
    assume(n > 0)
    per_epoch, orders, _ = run_simulated(
        kind, n, world, pad=pad, shuffle=shuffle, epochs=3, seed=seed, wrapper_seed=seed
    )
    for epoch, (ranks, order) in enumerate(zip(per_epoch, orders, strict=True)):
        for rank, items in enumerate(ranks):
            keys = [as_key(x) for x in items]
            assert len(set(keys)) == len(keys), f"epoch {epoch}: rank {rank} holds an item twice"
        if not shuffle:  # not shuffled between GPUs: each rank's share is the same every epoch
            assert ranks == [expected_positions(order, world, pad)[r::world] for r in range(world)]
