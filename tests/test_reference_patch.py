"""patch_dataloader_to_ddp, extract_loader_parameters, check_loaders_is_patched, ShardedIterableDataset.

Simulated ranks (explicit ``num_replicas``/``rank``) in one process, and real gloo groups of 2 and 3
ranks whose loaders run 2 real worker processes each.
"""

from __future__ import annotations

import inspect
import math
import multiprocessing as mp
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
)

from ddpcheck.launch import GroupCall, run_ranks
from ddpcheck.reference.iterable import ShardedIterableDataset
from ddpcheck.reference.patch import (
    ShardedBatchSampler,
    check_loaders_is_patched,
    extract_loader_parameters,
    patch_dataloader_to_ddp,
)
from ddpcheck.reference.sampler import DDPSamplerWrapper

# --------------------------------------------------------------------------- module-level pieces
# (module level so forked ranks and their DataLoader workers find them)

_WORKER_TAG = -1


def init_worker(worker_id: int) -> None:
    global _WORKER_TAG
    _WORKER_TAG = worker_id


class IdDataset(Dataset[tuple[int, int]]):
    """Sample ``i`` is ``(i, the worker that loaded it)``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __getitem__(self, index: int) -> tuple[int, int]:
        return index, _WORKER_TAG

    def __len__(self) -> int:
        return self.n


def collate_ids(batch: list[tuple[int, int]]) -> dict[str, Any]:
    return {"ids": [i for i, _ in batch], "workers": [w for _, w in batch], "by": "collate_ids"}


class Stream(IterableDataset[tuple[int, int]]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[tuple[int, int]]:
        info = torch.utils.data.get_worker_info()
        worker = info.id if info is not None else -1
        return ((i, worker) for i in range(self.n))


class SizedStream(Stream):
    def __len__(self) -> int:
        return self.n


class UnevenBatches(Sampler[list[int]]):
    """Contiguous batches of sizes 1, 2, 3, 1, 2, 3, ... over ``range(n)``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def batches(self) -> list[list[int]]:
        out, start, size = [], 0, 1
        while start < self.n:
            out.append(list(range(start, min(start + size, self.n))))
            start += size
            size = size % 3 + 1
        return out

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches())

    def __len__(self) -> int:
        return len(self.batches())


class TaggedLoader(DataLoader):
    """A DataLoader subclass with one extra constructor argument, stored under its own name."""

    def __init__(self, dataset: Any, *, tag: str = "plain", **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self.tag = tag


class FixedLoader(DataLoader):
    """A subclass whose constructor fixes its arguments: it cannot be rebuilt with a new sampler."""

    def __init__(self, dataset: Any) -> None:
        super().__init__(dataset, batch_size=4)


def ids_of(batch: Any) -> list[int]:
    if isinstance(batch, dict):
        return list(batch["ids"])
    if isinstance(batch, (list, tuple)) and len(batch) == 2 and torch.is_tensor(batch[0]):
        return batch[0].tolist()  # default_collate of (id, worker) pairs
    if isinstance(batch, (list, tuple)) and len(batch) == 2 and isinstance(batch[0], int):
        return [batch[0]]  # batch_size=None: one (id, worker) sample
    raise AssertionError(f"unexpected batch {batch!r}")


def run_epochs(loader: DataLoader, epochs: int) -> list[list[list[int]]]:
    """Per epoch, the ids of every batch."""
    out = []
    for epoch in range(epochs):
        sampler = loader.batch_sampler if isinstance(loader.batch_sampler, DDPSamplerWrapper) else None
        sampler = sampler or (loader.sampler if isinstance(loader.sampler, DDPSamplerWrapper) else None)
        if sampler is not None:
            sampler.set_epoch(epoch)
        out.append([ids_of(b) for b in loader])
    return out


def assert_partition(per_rank_ids: list[list[int]], n: int, world: int, *, pad: bool = True) -> None:
    """Together the ranks saw every id; repeats only from padding (< W)."""
    union = Counter(i for ids in per_rank_ids for i in ids)
    if pad:
        assert set(union) == set(range(n)), "samples lost"
    assert sum(union.values()) - len(union) < world, "overlap beyond padding"


# --------------------------------------------------------------------------- extract_loader_parameters


LOADERS: dict[str, Callable[[], DataLoader]] = {
    "defaults": lambda: DataLoader(IdDataset(10)),
    "shuffle-batched": lambda: DataLoader(IdDataset(10), batch_size=3, shuffle=True, drop_last=True),
    "no-auto-batching": lambda: DataLoader(IdDataset(10), batch_size=None),
    "batch-sampler": lambda: DataLoader(IdDataset(10), batch_sampler=UnevenBatches(10)),
    "iterable": lambda: DataLoader(SizedStream(10), batch_size=2),
    "workers": lambda: DataLoader(
        IdDataset(10),
        batch_size=2,
        num_workers=1,
        collate_fn=collate_ids,
        pin_memory=False,
        timeout=30,
        worker_init_fn=init_worker,
        multiprocessing_context="fork",
        generator=torch.Generator().manual_seed(3),
        prefetch_factor=3,
        persistent_workers=True,
        in_order=False,
    ),
}


@pytest.mark.parametrize("name", sorted(LOADERS))
def test_extract_rebuilds_an_equal_loader(name: str) -> None:
    loader = LOADERS[name]()
    params = extract_loader_parameters(loader)
    assert set(params) == set(inspect.signature(DataLoader.__init__).parameters) - {"self", "shuffle"}
    rebuilt = DataLoader(**params)
    again = extract_loader_parameters(rebuilt)
    for key, value in params.items():
        assert again[key] is value or again[key] == value, key
    assert rebuilt.batch_size == loader.batch_size and rebuilt.drop_last == loader.drop_last
    if name != "shuffle-batched":
        assert [ids_of_any(b) for b in rebuilt] == [ids_of_any(b) for b in loader]


def ids_of_any(batch: Any) -> Any:
    return batch["ids"] if isinstance(batch, dict) else repr(batch)


def test_extract_reads_what_was_passed() -> None:
    generator = torch.Generator()
    loader = LOADERS["workers"]()
    params = extract_loader_parameters(loader)
    assert params["collate_fn"] is collate_ids and params["worker_init_fn"] is init_worker
    assert (params["num_workers"], params["prefetch_factor"], params["timeout"]) == (1, 3, 30)
    assert params["persistent_workers"] is True and params["in_order"] is False
    assert params["multiprocessing_context"] is mp.get_context("fork")
    shuffled = DataLoader(IdDataset(5), shuffle=True, generator=generator)
    params = extract_loader_parameters(shuffled)
    assert isinstance(params["sampler"], RandomSampler) and params["generator"] is generator
    with pytest.raises(TypeError, match="DataLoader"):
        extract_loader_parameters([1, 2])  # type: ignore[arg-type]


# --------------------------------------------------------------------------- simulated ranks


def simulated(make: Callable[[], DataLoader], world: int, epochs: int = 2, **options: Any) -> list[Any]:
    """Every simulated rank's patched loader's batches (ids), per epoch."""
    loaders = [patch_dataloader_to_ddp(make(), num_replicas=world, rank=r, **options) for r in range(world)]
    return [run_epochs(loader, epochs) for loader in loaders]


SHAPES: dict[str, Callable[[], DataLoader]] = {
    "shuffle-no-generator": lambda: DataLoader(IdDataset(23), batch_size=4, shuffle=True),
    "sequential-drop-last": lambda: DataLoader(IdDataset(23), batch_size=4, drop_last=True),
    "no-auto-batching": lambda: DataLoader(IdDataset(23), batch_size=None, shuffle=True),
    "plain-batch-sampler": lambda: DataLoader(
        IdDataset(23), batch_sampler=BatchSampler(RandomSampler(range(23)), 4, False)
    ),
    "uneven-batch-sampler": lambda: DataLoader(IdDataset(23), batch_sampler=UnevenBatches(23)),
}


@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_simulated_ranks_partition_every_epoch(shape: str, world: int) -> None:
    runs = simulated(SHAPES[shape], world)
    for epoch in range(2):
        batches = [r[epoch] for r in runs]
        assert len({len(b) for b in batches}) == 1, "every rank takes the same number of steps"
        if shape == "uneven-batch-sampler":  # whole batches are the unit: padding repeats batches
            whole = [tuple(b) for b in UnevenBatches(23).batches()]
            seen = Counter(tuple(b) for bs in batches for b in bs)
            assert set(seen) == set(whole), "a batch was split or lost"
            assert sum(seen.values()) - len(whole) < world
        else:
            ids = [[i for b in bs for i in b] for bs in batches]
            assert_partition(ids, 23, world, pad=shape != "sequential-drop-last")  # drop_last drops a tail
    if shape == "shuffle-no-generator":  # the patched RandomSampler's shared generator still shuffles
        assert runs[0][0] != runs[0][1]


UNSHUFFLED: dict[str, Callable[[int, int], DataLoader]] = {
    "batch-size": lambda n, b: DataLoader(IdDataset(n), batch_size=b, shuffle=False),
    "no-auto-batching": lambda n, b: DataLoader(IdDataset(n), batch_size=None),
    "plain-batch-sampler": lambda n, b: DataLoader(
        IdDataset(n), batch_sampler=BatchSampler(SequentialSampler(range(n)), b, False)
    ),
}


@settings(max_examples=80, deadline=None)
@given(
    shape=st.sampled_from(sorted(UNSHUFFLED)),
    world=st.integers(1, 16),
    steps=st.integers(0, 6),
    remainder=st.integers(0, 15),
    batch_size=st.integers(1, 5),
    set_epoch=st.booleans(),
)
def test_an_unshuffled_loader_feeds_each_rank_the_same_order_every_epoch(
    shape: str, world: int, steps: int, remainder: int, batch_size: int, set_epoch: bool
) -> None:
    """As OML patches (``shuffle_samples_between_gpus=False``): every epoch rank r gets what
    ``DistributedSampler(shuffle=False)`` gives it, in that order; padding never repeats its own."""
    n = world * steps + remainder % world
    assume(n > 0)
    for rank in range(world):
        loader = patch_dataloader_to_ddp(UNSHUFFLED[shape](n, batch_size), num_replicas=world, rank=rank)
        wrapper = the_wrapper(loader)
        epochs = []
        for epoch in range(3):
            if set_epoch:
                wrapper.set_epoch(epoch)
            epochs.append([i for b in loader for i in ids_of(b)])
        expected = list(DistributedSampler(range(n), world, rank, shuffle=False))  # type: ignore[arg-type]
        assert epochs == [expected] * 3, f"rank {rank}"
        assert len(set(expected)) == len(expected)


def the_wrapper(loader: DataLoader) -> DDPSamplerWrapper[Any]:
    for candidate in (loader.sampler, loader.batch_sampler, getattr(loader.batch_sampler, "sampler", None)):
        if isinstance(candidate, DDPSamplerWrapper):
            return candidate
    raise AssertionError("no DDPSamplerWrapper in the patched loader")


def test_shuffling_between_gpus_is_still_available() -> None:
    n, world = 40, 4
    loader = patch_dataloader_to_ddp(
        DataLoader(IdDataset(n), batch_size=2), num_replicas=world, rank=1, shuffle_samples_between_gpus=True
    )
    epochs = run_epochs(loader, 2)
    assert epochs[0] != epochs[1]
    assert not the_wrapper(
        patch_dataloader_to_ddp(DataLoader(IdDataset(n)), num_replicas=2, rank=0)
    ).shuffle_samples_between_gpus


def test_a_plain_batch_sampler_becomes_a_resumable_one() -> None:
    loader = DataLoader(IdDataset(20), batch_sampler=BatchSampler(SequentialSampler(range(20)), 3, True))
    patched = patch_dataloader_to_ddp(loader, num_replicas=2, rank=0)
    batch_sampler = patched.batch_sampler
    assert type(batch_sampler) is ShardedBatchSampler
    assert (batch_sampler.batch_size, batch_sampler.drop_last) == (3, True)
    assert [ids_of(b) for b in patched] == [[0, 2, 4], [6, 8, 10], [12, 14, 16]]
    assert batch_sampler.state_dict()["yielded"] == 10, "the whole share was drawn; drop_last cut the tail"


def test_the_patched_loader_keeps_its_class_and_arguments() -> None:
    generator = torch.Generator().manual_seed(5)
    loader = TaggedLoader(
        IdDataset(12), tag="mine", batch_size=2, shuffle=True, collate_fn=collate_ids, generator=generator
    )
    patched = patch_dataloader_to_ddp(loader, num_replicas=2, rank=1)
    assert type(patched) is TaggedLoader and patched.tag == "mine"
    assert patched.collate_fn is collate_ids and patched.generator is generator and patched.batch_size == 2
    assert isinstance(patched.sampler, DDPSamplerWrapper)
    assert patched.sampler.sampler is loader.sampler, "a RandomSampler with a generator is kept as is"
    assert check_loaders_is_patched(patched) and not check_loaders_is_patched(loader)
    assert patch_dataloader_to_ddp(patched, num_replicas=2, rank=1) is patched, "already sharded"


def test_a_subclass_that_cannot_be_rebuilt_falls_back_with_a_warning() -> None:
    with pytest.warns(UserWarning, match="could not rebuild FixedLoader"):
        patched = patch_dataloader_to_ddp(FixedLoader(IdDataset(10)), num_replicas=2, rank=0)
    assert type(patched) is DataLoader and patched.batch_size == 4
    assert [ids_of(b) for b in patched] == [[0, 2, 4, 6], [8]], "rank 0's share, still batched by 4"


def test_without_a_group_it_warns_and_returns_the_loader() -> None:
    loader = DataLoader(IdDataset(4))
    with pytest.warns(UserWarning, match="no process group is initialised"):
        assert patch_dataloader_to_ddp(loader) is loader
    with pytest.raises(ValueError, match="num_replicas= and rank="):
        patch_dataloader_to_ddp(loader, rank=0)
    with pytest.raises(TypeError, match="DataLoader"):
        patch_dataloader_to_ddp([1])  # type: ignore[type-var]


def test_check_loaders_is_patched_sees_every_sharding() -> None:
    data = IdDataset(8)
    assert not check_loaders_is_patched(DataLoader(data, batch_size=2))
    assert check_loaders_is_patched(DataLoader(data, sampler=DistributedSampler(data, 2, 0)))
    assert check_loaders_is_patched(
        DataLoader(data, batch_sampler=BatchSampler(DistributedSampler(data, 2, 0), 2, False))
    )
    wrapped = DDPSamplerWrapper(UnevenBatches(8), num_replicas=2, rank=0)
    assert check_loaders_is_patched(DataLoader(data, batch_sampler=wrapped))
    assert check_loaders_is_patched(DataLoader(ShardedIterableDataset(Stream(8), 2, 0)))


# --------------------------------------------------------------------------- iterable datasets


def iterable_ids(loader: DataLoader) -> tuple[list[int], list[int]]:
    """All ids, and the size of every batch."""
    ids, sizes = [], []
    for batch in loader:
        ids.extend(batch[0].tolist())
        sizes.append(len(batch[0]))
    return ids, sizes


@pytest.mark.parametrize("pad", [True, False])
@pytest.mark.parametrize("n", [0, 2, 23, 24])
def test_iterable_with_len_gives_equal_counts_per_rank_and_worker(n: int, pad: bool) -> None:
    world = 3
    shards = [ShardedIterableDataset(SizedStream(n), world, r, pad=pad) for r in range(world)]
    ranks = [[i for i, _ in shard] for shard in shards]
    per_rank = math.ceil(n / world) if pad else n // world
    assert [len(ids) for ids in ranks] == [len(s) for s in shards] == [per_rank] * world
    assert_partition(ranks, n, world, pad=pad)
    if not pad:
        assert sorted(i for ids in ranks for i in ids) == list(range(world * per_rank))


def test_iterable_padding_is_distributed_samplers_layout() -> None:
    for world in range(1, 17):
        for n in range(1, 2 * world + 2):
            for rank in range(world):
                got = [i for i, _ in ShardedIterableDataset(SizedStream(n), world, rank)]
                assert got == list(DistributedSampler(range(n), world, rank, shuffle=False))  # type: ignore[arg-type]


def test_iterable_without_len_differs_by_at_most_one() -> None:
    shards = [ShardedIterableDataset(Stream(23), 3, r) for r in range(3)]
    ranks = [[i for i, _ in shard] for shard in shards]
    assert sorted(i for ids in ranks for i in ids) == list(range(23))
    assert [len(ids) for ids in ranks] == [8, 8, 7]
    with pytest.raises(TypeError, match="no len"):
        len(shards[0])


def test_iterable_is_sharded_across_real_workers_in_one_process() -> None:
    world, n = 2, 29
    runs = []
    for rank in range(world):
        loader = DataLoader(SizedStream(n), batch_size=3, num_workers=2)
        patched = patch_dataloader_to_ddp(loader, num_replicas=world, rank=rank)
        assert isinstance(patched.dataset, ShardedIterableDataset)
        runs.append(iterable_ids(patched))
    assert_partition([ids for ids, _ in runs], n, world)
    assert runs[0][1] == runs[1][1], "equal batch sizes per rank, worker by worker"


def test_bad_shard_arguments() -> None:
    with pytest.raises(ValueError, match="0 <= rank < num_replicas=2"):
        ShardedIterableDataset(Stream(3), 2, 2)
    with pytest.raises(ValueError, match="num_replicas must be an int >= 1"):
        ShardedIterableDataset(Stream(3), 0, 0)


# --------------------------------------------------------------------------- real process groups


def _rank() -> int:
    import torch.distributed as dist

    torch.set_num_threads(1)  # a forked rank must not start its own OpenMP pool (see test_reference_sync)
    return dist.get_rank()


def _map_loader_in_group(n: int, with_generator: bool) -> dict[str, Any]:
    rank = _rank()
    torch.manual_seed(100 + rank)  # per-rank global RNG: a naive RandomSampler would disagree
    generator = torch.Generator().manual_seed(7) if with_generator else None
    loader = TaggedLoader(
        IdDataset(n),
        tag="mine",
        batch_size=4,
        shuffle=True,
        num_workers=2,
        collate_fn=collate_ids,
        worker_init_fn=init_worker,
        generator=generator,
        persistent_workers=True,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        patched = patch_dataloader_to_ddp(loader)
        epochs, workers, collated = [], set(), set()
        sampler = patched.sampler
        assert isinstance(sampler, DDPSamplerWrapper)
        for epoch in range(2):
            sampler.set_epoch(epoch)
            ids = []
            for batch in patched:
                ids.extend(batch["ids"])
                workers.update(batch["workers"])
                collated.add(batch["by"])
            epochs.append(ids)
    return {
        "epochs": epochs,
        "workers": sorted(workers),
        "collated": sorted(collated),
        "facts": [
            type(patched).__name__,
            getattr(patched, "tag", None),
            patched.worker_init_fn is init_worker,
            patched.persistent_workers,
            patched.num_workers,
            patched.generator is generator,
            type(patched.sampler).__name__,
        ],
        # the wrapper's own warnings; not Python 3.12's "multi-threaded ... fork()" DeprecationWarning,
        # which DataLoader workers forked from any DDP rank raise (gloo runs threads in every rank)
        "warnings": [str(w.message) for w in caught if not issubclass(w.category, DeprecationWarning)],
    }


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("with_generator", [False, True])
def test_patched_loader_with_real_workers_partitions(world: int, with_generator: bool) -> None:
    n = 25
    result = run_ranks(
        GroupCall(_map_loader_in_group, world_size=world, kwargs={"n": n, "with_generator": with_generator})
    )
    result.raise_for_failures()
    values = result.values
    for epoch in range(2):
        per_rank = [v["epochs"][epoch] for v in values]
        assert {len(ids) for ids in per_rank} == {math.ceil(n / world)}
        assert_partition(per_rank, n, world)
    assert values[0]["epochs"][0] != values[0]["epochs"][1], "still shuffles between epochs"
    for v in values:
        assert v["workers"] == [0, 1], "worker_init_fn ran in both real workers"
        assert v["collated"] == ["collate_ids"]
        assert v["facts"] == ["TaggedLoader", "mine", True, True, 2, True, "DDPSamplerWrapper"]
        assert v["warnings"] == [], "the shared generator lets the wrapper stream without a broadcast"


def _batch_sampler_in_group(n: int) -> list[list[int]]:
    _rank()
    loader = DataLoader(IdDataset(n), batch_sampler=UnevenBatches(n), num_workers=2, collate_fn=collate_ids)
    patched = patch_dataloader_to_ddp(loader)
    assert isinstance(patched.batch_sampler, DDPSamplerWrapper)
    return [batch["ids"] for batch in patched]


@pytest.mark.parametrize("world", [2, 3])
def test_custom_batch_sampler_batches_stay_whole_across_ranks(world: int) -> None:
    n = 31
    result = run_ranks(GroupCall(_batch_sampler_in_group, world_size=world, kwargs={"n": n}))
    result.raise_for_failures()
    whole = [tuple(b) for b in UnevenBatches(n).batches()]
    seen = Counter(tuple(b) for batches in result.values for b in batches)
    assert set(seen) == set(whole), "every batch reached some rank, none was split"
    assert sum(seen.values()) - len(whole) < world
    assert len({len(batches) for batches in result.values}) == 1


def _iterable_in_group(n: int, sized: bool) -> dict[str, Any]:
    _rank()
    dataset = SizedStream(n) if sized else Stream(n)
    loader = DataLoader(dataset, batch_size=3, num_workers=2)
    patched = patch_dataloader_to_ddp(loader)
    ids, workers, sizes = [], set(), []
    for batch in patched:
        ids.extend(batch[0].tolist())
        workers.update(batch[1].tolist())
        sizes.append(len(batch[0]))
    return {"ids": ids, "workers": sorted(workers), "sizes": sizes}


@pytest.mark.parametrize("sized", [True, False])
def test_iterable_dataset_sharded_over_2_ranks_by_2_workers(sized: bool) -> None:
    n = 23
    result = run_ranks(GroupCall(_iterable_in_group, world_size=2, kwargs={"n": n, "sized": sized}))
    result.raise_for_failures()
    per_rank = [v["ids"] for v in result.values]
    assert all(v["workers"] == [0, 1] for v in result.values), "both real workers produced samples"
    if sized:
        assert_partition(per_rank, n, 2)
        assert [len(ids) for ids in per_rank] == [12, 12]
        assert result.values[0]["sizes"] == result.values[1]["sizes"], "same batches per rank"
    else:
        assert sorted(i for ids in per_rank for i in ids) == list(range(n)), "no duplicates, nothing lost"
        assert abs(len(per_rank[0]) - len(per_rank[1])) <= 1
