"""Exact and elastic mid-epoch resume of DDPSamplerWrapper and of loaders from patch_dataloader_to_ddp.

Ranks are simulated with explicit ``num_replicas``/``rank`` (no process group). "Fresh" means what a
restarted job has: new objects built in another global RNG state, so the inner sampler's generator
starts elsewhere and only the loaded state can put it back. States go through ``torch.save`` /
``torch.load(weights_only=True)`` (and JSON for the wrapper's own state). Loaders run real
DataLoader worker processes where the case says so.
"""

from __future__ import annotations

import io
import json
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, SequentialSampler

try:
    from torchdata.stateful_dataloader import StatefulDataLoader
except ImportError:  # torchdata comes with the 'integrations' extra; the plain-DataLoader cases still run
    StatefulDataLoader = None

from ddpcheck.launch import GroupCall, run_ranks
from ddpcheck.reference.patch import ShardedBatchSampler, patch_dataloader_to_ddp
from ddpcheck.reference.sampler import DDPSamplerWrapper, per_rank_count
from tests.test_reference_sampler import KINDS, as_key, make_inner

FRESH_SEED = 4321  # the restarted job's global RNG state and inner-generator seed


def through_torch(state: Any) -> Any:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)


# --------------------------------------------------------------------------- the wrapper alone


def wrapper(
    kind: str, n: int, world: int, rank: int, inner_seed: int, **options: Any
) -> DDPSamplerWrapper[Any]:
    """Rank ``rank``'s wrapper over a fresh inner sampler whose generator is seeded ``inner_seed``."""
    inner = make_inner(kind, n, 3, False, inner_seed)
    return DDPSamplerWrapper(inner, num_replicas=world, rank=rank, **options)


def test_state_is_plain_data_that_round_trips() -> None:
    sampler = wrapper("random", 50, 4, 2, 1, shuffle_samples_between_gpus=True, seed=9)
    it = iter(sampler)
    next(it), next(it)
    state = sampler.state_dict()
    assert json.loads(json.dumps(state)) == state == through_torch(state)
    assert {k: state[k] for k in ("epoch", "num_replicas", "rank", "length", "start", "yielded")} == {
        "epoch": 0,
        "num_replicas": 4,
        "rank": 2,
        "length": 50,
        "start": 0,
        "yielded": 2,
    }
    assert state["consumed"] == 8 and (state["seed"], state["pad"], state["shuffle"]) == (9, True, True)
    assert isinstance(state["generator"], str)
    fresh = wrapper("random", 50, 4, 2, FRESH_SEED, shuffle_samples_between_gpus=True, seed=9)
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state, "a loaded, not yet iterated state is what state_dict returns"
    assert list(fresh) == list(it)


def test_state_before_and_after_an_epoch() -> None:
    sampler = wrapper("sequential", 10, 3, 0, 0)
    assert sampler.state_dict()["yielded"] == 0 and sampler.state_dict()["generator"] is None
    list(sampler)
    done = sampler.state_dict()
    assert (done["epoch"], done["yielded"], done["consumed"]) == (0, 4, 10), (
        "a finished epoch is all consumed"
    )
    sampler.set_epoch(1)
    assert (sampler.state_dict()["epoch"], sampler.state_dict()["yielded"]) == (1, 0)
    fresh = wrapper("sequential", 10, 3, 0, 0)
    fresh.load_state_dict(done)
    assert list(fresh) == [], "the rest of a finished epoch is nothing"
    reference = wrapper("sequential", 10, 3, 0, 0)
    list(reference)
    assert list(fresh) == list(reference) and fresh.epoch == 1, "then the next epoch, as uninterrupted"


@settings(max_examples=120, deadline=None)
@given(
    kind=st.sampled_from(KINDS),
    n=st.integers(1, 120),
    world=st.integers(1, 16),
    pad=st.booleans(),
    shuffle=st.booleans(),
    epoch=st.integers(0, 2),
    fraction=st.floats(0, 1),
    set_epoch_first=st.booleans(),
    via_json=st.booleans(),
)
def test_resume_at_the_same_world_size_is_the_uninterrupted_stream(
    kind: str,
    n: int,
    world: int,
    pad: bool,
    shuffle: bool,
    epoch: int,
    fraction: float,
    set_epoch_first: bool,
    via_json: bool,
) -> None:
    options = {"pad_data_to_num_gpus": pad, "shuffle_samples_between_gpus": shuffle, "seed": 5}
    for rank in range(world):
        reference = wrapper(kind, n, world, rank, 0, **options)
        epochs = [list(reference) for _ in range(epoch + 2)]
        k = round(fraction * len(epochs[epoch]))
        interrupted = wrapper(kind, n, world, rank, 0, **options)
        for _ in range(epoch):
            list(interrupted)
        before = list(islice(iter(interrupted), k))
        state = interrupted.state_dict()
        state = json.loads(json.dumps(state)) if via_json else through_torch(state)
        resumed = wrapper(kind, n, world, rank, FRESH_SEED, **options)
        if set_epoch_first:
            resumed.set_epoch(epoch)
        resumed.load_state_dict(state)
        if not set_epoch_first:
            resumed.set_epoch(epoch)
        assert before + list(resumed) == epochs[epoch], f"rank {rank}: not the rest of epoch {epoch}"
        assert list(resumed) == epochs[epoch + 1], f"rank {rank}: the following epoch changed"


def old_and_new(
    kind: str, n: int, old: int, new: int, epoch: int, k: int, **options: Any
) -> tuple[list[list[Any]], list[list[Any]], list[DDPSamplerWrapper[Any]], dict[str, Any]]:
    """Old ranks take ``k`` items of ``epoch`` in lockstep; new ranks load rank 0's state and finish."""
    olds = [wrapper(kind, n, old, r, 0, **options) for r in range(old)]
    for sampler in olds:
        for _ in range(epoch):
            list(sampler)
    before = [list(islice(iter(sampler), k)) for sampler in olds]
    state = through_torch(olds[0].state_dict())
    news = [wrapper(kind, n, new, r, FRESH_SEED, **options) for r in range(new)]
    for sampler in news:
        sampler.load_state_dict(state)
    return before, [list(sampler) for sampler in news], news, state


@settings(max_examples=120, deadline=None)
@given(
    kind=st.sampled_from([k for k in KINDS if k != "random-replacement"]),  # distinct items
    n=st.integers(1, 120),
    old=st.integers(1, 16),
    new=st.integers(1, 16),
    pad=st.booleans(),
    shuffle=st.booleans(),
    epoch=st.integers(0, 2),
    fraction=st.floats(0, 1),
)
def test_elastic_resume_sees_every_item_once_plus_new_padding(
    kind: str, n: int, old: int, new: int, pad: bool, shuffle: bool, epoch: int, fraction: float
) -> None:
    assume(old != new)
    options = {"pad_data_to_num_gpus": pad, "shuffle_samples_between_gpus": shuffle, "seed": 5}
    per_old = per_rank_count(len(make_inner(kind, n, 3, False, 0)), old, pad)
    k = round(fraction * per_old)
    before, after, news, state = old_and_new(kind, n, old, new, epoch, k, **options)
    reference = make_inner(kind, n, 3, False, 0)
    for e in range(epoch + 1):
        if hasattr(reference, "set_epoch"):
            reference.set_epoch(e)
        order = [as_key(x) for x in reference]
    length = len(order)
    consumed = length if 0 < per_old <= k else old * k
    assert state["consumed"] == consumed
    rest = order[consumed:]
    if consumed < length:  # mid-epoch: the old ranks took the first ``old * k`` items of the order
        assert Counter(as_key(x) for items in before for x in items) == Counter(order[:consumed])
    counts = {len(items) for items in after}
    assert counts == {per_rank_count(len(rest), new, pad)}, "new ranks take equal steps"
    seen_after = Counter(as_key(x) for items in after for x in items)
    if pad:
        assert set(seen_after) == set(rest), "an item the old ranks had not reached was lost"
        assert sum((seen_after - Counter(rest)).values()) == new * counts.pop() - len(rest) < new
    else:
        assert not seen_after - Counter(rest), "a repeat without padding"
        assert sum((Counter(rest) - seen_after).values()) == len(rest) % new
    for items in after:
        assert len(set(map(as_key, items))) == len(items), "padding gave a rank an item it already has"
    for rank, sampler in enumerate(news):  # the next epoch is the new world size's own
        reference_rank = wrapper(kind, n, new, rank, 0, **options)
        for _ in range(epoch + 1):
            list(reference_rank)
        assert list(sampler) == list(reference_rank)


@pytest.mark.parametrize(("hops", "pad"), [((4, 3, 2), True), ((2, 5, 3), True), ((3, 2, 4), False)])
def test_elastic_resume_twice(hops: tuple[int, int, int], pad: bool) -> None:
    n, first, second, third = 101, *hops
    options = {"pad_data_to_num_gpus": pad, "shuffle_samples_between_gpus": True, "seed": 3}
    order = list(make_inner("random", n, 3, False, 0))
    olds = [wrapper("random", n, first, r, 0, **options) for r in range(first)]
    seen = [x for s in olds for x in islice(iter(s), 7)]
    state = olds[0].state_dict()
    middles = [wrapper("random", n, second, r, FRESH_SEED, **options) for r in range(second)]
    for sampler in middles:
        sampler.load_state_dict(state)
    seen += [x for s in middles for x in islice(iter(s), 5)]
    state = middles[0].state_dict()
    assert (state["start"], state["yielded"], state["consumed"]) == (7 * first, 5, 7 * first + 5 * second)
    lasts = [wrapper("random", n, third, r, FRESH_SEED + 1, **options) for r in range(third)]
    for sampler in lasts:
        sampler.load_state_dict(state)
    seen += [x for s in lasts for x in s]
    union = Counter(seen)
    rest = n - 7 * first - 5 * second
    if pad:
        assert set(union) == set(order) and sum(union.values()) - n < third
    else:
        assert max(union.values()) == 1 and n - len(union) == rest % third


def test_a_resume_for_another_epoch_is_dropped() -> None:
    sampler = wrapper("sequential", 12, 2, 1, 0, shuffle_samples_between_gpus=False)
    it = iter(sampler)
    next(it)
    state = sampler.state_dict()
    fresh = wrapper("sequential", 12, 2, 1, 0, shuffle_samples_between_gpus=False)
    fresh.load_state_dict(state)
    fresh.set_epoch(3)
    assert list(fresh) == [1, 3, 5, 7, 9, 11] and fresh.epoch == 3


@pytest.mark.parametrize("kind", ["random", "batch-random", "sequential"])
@pytest.mark.parametrize("world", [1, 3])
def test_a_state_saved_at_an_epochs_end_restores_into_either_next_epoch_reading(
    kind: str, world: int
) -> None:
    """Saved after the epoch's last item: a loop that finishes the stopped epoch (nothing left) and a
    job that starts the next epoch at once (Lightning, HF Trainer) both get the uninterrupted next
    epoch. A RandomSampler's generator is restored to the finished epoch's start, so the second reading
    needs the finished epoch drawn once more (it gave epoch 0's order again before)."""
    for rank in range(world):
        sampler = wrapper(kind, 20, world, rank, 7, seed=3)
        sampler.set_epoch(0)
        list(sampler)
        state = through_torch(sampler.state_dict())
        sampler.set_epoch(1)
        expected = [as_key(i) for i in sampler]
        finishing = wrapper(kind, 20, world, rank, FRESH_SEED, seed=3)
        finishing.load_state_dict(state)
        finishing.set_epoch(0)
        assert list(finishing) == []
        finishing.set_epoch(1)
        assert [as_key(i) for i in finishing] == expected
        starting = wrapper(kind, 20, world, rank, FRESH_SEED, seed=3)
        starting.load_state_dict(state)
        starting.set_epoch(1)
        assert [as_key(i) for i in starting] == expected


def test_bad_states_say_what_is_wrong() -> None:
    sampler = wrapper("random", 20, 2, 0, 0)
    good = sampler.state_dict()
    cases: list[tuple[Any, str]] = [
        ([1, 2], "must be a dict"),
        ({**good, "yielded": -1}, "'yielded' must be >= 0"),
        ({**good, "epoch": "1"}, "'epoch' is missing or not int"),
        ({k: v for k, v in good.items() if k != "consumed"}, "'consumed' is missing"),
        ({**good, "pad": 1}, "'pad' is missing or not bool"),
        ({**good, "version": 99}, "version 99"),
        ({**good, "length": 21}, r"len\(sampler\)=21"),
        ({**good, "seed": 1}, "seed=1"),
        ({**good, "yielded": 11}, "inconsistent"),
        ({**good, "generator": "not base64!"}, "bad generator state"),
        ({**good, "generator": "AAAA"}, "bad generator state"),
    ]
    for state, message in cases:
        with pytest.raises(ValueError, match=message):
            wrapper("random", 20, 2, 0, 0).load_state_dict(state)
    with pytest.raises(ValueError, match=r"has no torch\.Generator"):
        wrapper("sequential", 20, 2, 0, 0).load_state_dict(good)


# --------------------------------------------------------------------------- loaders
# (module level so DataLoader worker processes find them)


class Ids(Dataset[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __getitem__(self, index: int) -> int:
        return index

    def __len__(self) -> int:
        return self.n


class UnevenBatches(torch.utils.data.Sampler[list[int]]):
    """Contiguous batches of sizes 1, 2, 3, 1, ... of a permutation that ``set_epoch`` rotates."""

    def __init__(self, n: int) -> None:
        self.n, self.epoch = n, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        order = [(i * 7 + self.epoch) % self.n for i in range(self.n)]
        start, size = 0, 1
        while start < self.n:
            yield order[start : start + size]
            start, size = start + size, size % 3 + 1

    def __len__(self) -> int:
        return sum(1 for _ in iter(self))


N = 37
BATCH = 3

SHAPES: dict[str, Callable[..., DataLoader]] = {
    # shuffle=True without a generator: patched, it draws from a generator seeded from the global state
    "batch-size": lambda cls, **kw: cls(Ids(N), batch_size=BATCH, shuffle=True, **kw),
    "batch-sampler": lambda cls, **kw: cls(
        Ids(N), batch_sampler=BatchSampler(RandomSampler(Ids(N)), BATCH, False), **kw
    ),
    "custom-batches": lambda cls, **kw: cls(Ids(N), batch_sampler=UnevenBatches(N), **kw),
}

RUNNERS = {  # loader class, real worker processes (persistent: started once per loader)
    "plain": (DataLoader, 0),
    "stateful": (StatefulDataLoader, 0),
    "stateful-workers": (StatefulDataLoader, 2),
}


def the_wrapper(loader: DataLoader) -> DDPSamplerWrapper[Any]:
    for candidate in (loader.sampler, loader.batch_sampler, getattr(loader.batch_sampler, "sampler", None)):
        if isinstance(candidate, DDPSamplerWrapper):
            return candidate
    raise AssertionError("no DDPSamplerWrapper in the patched loader")


def build(shape: str, runner: str, world: int, rank: int, global_seed: int) -> DataLoader:
    cls, workers = RUNNERS[runner]
    if cls is None:
        pytest.skip("torchdata is not installed: it comes with the 'integrations' extra")
    torch.manual_seed(global_seed)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="patch_dataloader_to_ddp")  # the class must be kept
        warnings.filterwarnings("ignore", message="'set_vital' is deprecated")  # torchdata on this torch
        made = SHAPES[shape](cls, num_workers=workers, persistent_workers=workers > 0)
        loader = patch_dataloader_to_ddp(made, num_replicas=world, rank=rank)
    assert type(loader) is cls
    return loader


def ids(batch: Any) -> list[int]:
    return batch.tolist()


def run_epoch(loader: DataLoader, epoch: int) -> list[list[int]]:
    the_wrapper(loader).set_epoch(epoch)
    return [ids(b) for b in loader]


def save(loader: DataLoader, runner: str) -> bytes:
    """The checkpoint a job writes: the loader's state under torchdata, else the (batch) sampler's."""
    if runner == "plain":
        holder = loader.batch_sampler if hasattr(loader.batch_sampler, "state_dict") else loader.sampler
        state = holder.state_dict()
    else:
        state = loader.state_dict()  # type: ignore[attr-defined]
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def restore(loader: DataLoader, runner: str, checkpoint: bytes, epoch: int, set_epoch_first: bool) -> None:
    state = torch.load(io.BytesIO(checkpoint), weights_only=True)
    if set_epoch_first:
        the_wrapper(loader).set_epoch(epoch)
    if runner == "plain":
        holder = loader.batch_sampler if hasattr(loader.batch_sampler, "state_dict") else loader.sampler
        holder.load_state_dict(state)
    else:
        loader.load_state_dict(state)  # type: ignore[attr-defined]
    if not set_epoch_first:
        the_wrapper(loader).set_epoch(epoch)


def interrupted(
    shape: str, runner: str, world: int, rank: int, epoch: int, k: int
) -> tuple[list[Any], bytes]:
    """A job that ran ``epoch`` epochs, then ``k`` steps of the next, and checkpointed."""
    loader = build(shape, runner, world, rank, 0)
    for e in range(epoch):
        run_epoch(loader, e)
    the_wrapper(loader).set_epoch(epoch)
    it = iter(loader)
    before = [ids(next(it)) for _ in range(k)]
    checkpoint = save(loader, runner)
    del it  # shuts its workers down
    return before, checkpoint


def steps_to_test(length: int) -> list[int]:
    """First, middle and last step (the last: before and after it)."""
    return sorted({1, length // 2, length - 1, length} - {0})


def checkpointed_run(shape: str, runner: str, world: int, rank: int) -> tuple[list[Any], dict[Any, bytes]]:
    """Epochs 0..2 of one job that checkpoints after the first, middle and last steps of epochs 0 and 1.

    Taking a checkpoint does not disturb the run, so the run is also the uninterrupted reference;
    a job that dies right after a checkpoint leaves exactly that checkpoint behind.
    """
    loader = build(shape, runner, world, rank, 0)
    epochs, checkpoints = [], {}
    for epoch in range(3):
        the_wrapper(loader).set_epoch(epoch)
        wanted = steps_to_test(len(loader)) if epoch < 2 else []
        batches = []
        for batch in loader:
            batches.append(ids(batch))
            if len(batches) in wanted:
                checkpoints[epoch, len(batches)] = save(loader, runner)
        epochs.append(batches)
    return epochs, checkpoints


@pytest.mark.parametrize("runner", sorted(RUNNERS))
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_interrupted_loader_resumes_exactly(world: int, runner: str) -> None:
    shapes = ["batch-size"] if runner == "stateful-workers" else sorted(SHAPES)  # workers: the slow case
    for shape in shapes:
        for rank in range(world):
            epochs, checkpoints = checkpointed_run(shape, runner, world, rank)
            assert sorted({e for e, _ in checkpoints}) == [0, 1] and len(checkpoints) >= 4
            for (epoch, k), checkpoint in checkpoints.items():
                resumed = build(shape, runner, world, rank, FRESH_SEED)
                restore(resumed, runner, checkpoint, epoch, set_epoch_first=k % 2 == 0)
                where = f"{shape}, rank {rank}, epoch {epoch}, after step {k}"
                assert epochs[epoch][:k] + [ids(b) for b in resumed] == epochs[epoch], where
                assert run_epoch(resumed, epoch + 1) == epochs[epoch + 1], f"{where}: next epoch"


@pytest.mark.parametrize("world", [2, 3])
def test_a_truly_interrupted_loader_resumes_exactly(world: int) -> None:
    """The job stops mid-epoch (its workers with it); a fresh loader finishes the epoch."""
    for runner in ("plain", "stateful-workers"):
        epochs, _ = checkpointed_run("batch-size", runner, world, world - 1)
        for epoch in (0, 1):
            k = len(epochs[epoch]) // 2
            before, checkpoint = interrupted("batch-size", runner, world, world - 1, epoch, k)
            resumed = build("batch-size", runner, world, world - 1, FRESH_SEED)
            restore(resumed, runner, checkpoint, epoch, set_epoch_first=True)
            assert before + [ids(b) for b in resumed] == epochs[epoch], f"{runner}, epoch {epoch}"


@pytest.mark.parametrize("runner", ["plain", "stateful-workers"])
@pytest.mark.parametrize(("old", "new"), [(4, 2), (2, 4), (3, 2)])
def test_elastic_loader_resume_covers_the_epoch(old: int, new: int, runner: str) -> None:
    shapes = ["batch-size"] if runner == "stateful-workers" else ["batch-size", "batch-sampler"]
    for shape in shapes:  # the sample is the unit
        references = [checkpointed_run(shape, runner, new, rank)[0] for rank in range(new)]
        for epoch in (0, 1):
            k = len(build(shape, "plain", old, 0, 0)) // 2
            olds = [interrupted(shape, runner, old, r, epoch, k) for r in range(old)]
            seen = Counter(i for before, _ in olds for batch in before for i in batch)
            checkpoint = olds[0][1]
            rests, nexts = [], []
            for rank in range(new):
                resumed = build(shape, runner, new, rank, FRESH_SEED + rank)
                restore(resumed, runner, checkpoint, epoch, set_epoch_first=True)
                rests.append([i for b in resumed for i in ids(b)])
                nexts.append(run_epoch(resumed, epoch + 1))
            where = f"{shape}, {old} -> {new} ranks, epoch {epoch}"
            union = seen + Counter(i for rest in rests for i in rest)
            assert set(union) == set(range(N)), f"{where}: samples lost"
            assert sum(union.values()) - N < new, f"{where}: repeats beyond the new padding"
            assert len({len(rest) for rest in rests}) == 1, f"{where}: unequal steps"
            for rank in range(new):
                assert nexts[rank] == references[rank][epoch + 1], f"{where}: rank {rank}'s next epoch"


def test_the_patched_batch_sampler_carries_the_state() -> None:
    loader = build("batch-sampler", "plain", 2, 1, 0)
    assert type(loader.batch_sampler) is ShardedBatchSampler
    batch_sampler = loader.batch_sampler
    batch_sampler.set_epoch(4)
    assert the_wrapper(loader).epoch == 4
    it = iter(loader)
    next(it), next(it)
    assert batch_sampler.state_dict() == the_wrapper(loader).state_dict()
    assert batch_sampler.state_dict()["yielded"] == 2 * BATCH


def test_sequential_inner_needs_no_generator() -> None:
    loaders = [
        patch_dataloader_to_ddp(DataLoader(Ids(10), batch_size=2), num_replicas=3, rank=r) for r in range(3)
    ]
    wrapper_ = the_wrapper(loaders[0])
    assert isinstance(wrapper_.sampler, SequentialSampler) and wrapper_.state_dict()["generator"] is None


# --------------------------------------------------------------------------- a real process group


def _resume_in_group(n: int, k: int) -> dict[str, Any]:
    import torch.distributed as dist

    torch.set_num_threads(1)  # a forked rank must not start its own OpenMP pool (see test_reference_sync)
    rank = dist.get_rank()

    def make(seed: int) -> DDPSamplerWrapper[Any]:  # ranks and world size from the group
        return DDPSamplerWrapper(RandomSampler(range(n), generator=torch.Generator().manual_seed(seed)))

    reference = make(0)
    epochs = [list(reference) for _ in range(3)]
    job = make(0)
    list(job)
    before = list(islice(iter(job), k))
    payload: list[Any] = [through_torch(job.state_dict())]
    dist.broadcast_object_list(payload, src=0)  # one data-state checkpoint: rank 0's
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = make(100 + rank)  # per-rank generator seeds: only the loaded state reconciles them
        resumed.load_state_dict(payload[0])
        after, following = list(resumed), list(resumed)
    return {
        "resumed": before + after == epochs[1],
        "following": following == epochs[2],
        "warnings": [str(w.message) for w in caught if "DDPSamplerWrapper" in str(w.message)],
    }


def test_resume_under_a_real_group_streams_without_a_broadcast() -> None:
    result = run_ranks(GroupCall(_resume_in_group, world_size=2, kwargs={"n": 41, "k": 9}, timeout=60))
    result.raise_for_failures()
    assert result.values == [{"resumed": True, "following": True, "warnings": []}] * 2


def test_a_loader_generator_shared_with_its_random_sampler_resumes_exactly() -> None:
    """``DataLoader(shuffle=True, generator=g)`` gives g to its RandomSampler *and* draws a base seed
    from it in ``iter(loader)``, after ``load_state_dict``: the saved generator state must be put back
    when the wrapper starts iterating, not when the state is loaded."""

    def build() -> DataLoader:
        data = list(range(97))
        plain = DataLoader(data, batch_size=6, shuffle=True, generator=torch.Generator().manual_seed(11))
        return patch_dataloader_to_ddp(plain, num_replicas=2, rank=1)

    loader = build()
    uninterrupted, saved = [], {}
    for epoch in range(2):
        loader.sampler.set_epoch(epoch)
        batches = []
        for step, batch in enumerate(loader, 1):
            batches.append(batch.tolist())
            if step == 3:
                buffer = io.BytesIO()
                torch.save(loader.sampler.state_dict(), buffer)
                saved[epoch] = buffer.getvalue()
        uninterrupted.append(batches)
    for epoch in range(2):
        torch.manual_seed(epoch + 1000)  # a restarted process: other global RNG state
        fresh = build()
        fresh.sampler.load_state_dict(torch.load(io.BytesIO(saved[epoch]), weights_only=True))
        fresh.sampler.set_epoch(epoch)
        assert [b.tolist() for b in fresh] == uninterrupted[epoch][3:]
