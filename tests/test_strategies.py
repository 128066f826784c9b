"""ddpcheck.strategies: valid examples, and check_sampler judging real samplers in simulated ranks."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, DistributedSampler

from ddpcheck.strategies import (
    LoaderConfig,
    SamplerCheckFailed,
    assert_sampler_ok,
    batch_shapes,
    batch_sizes,
    check_sampler,
    dataset_lengths,
    loader_configs,
    world_sizes,
)
from ddpcheck.verdict import DATA_CHECKS, EQUAL_STEPS, NO_OVERLAP

# Deterministic example streams: a property test that fails must fail on every run, not one in a while.
STEADY = settings(max_examples=60, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
# Searching for a planted bug: default example budget, no database, no (slow) explain phase.
SEARCH = settings(database=None, phases=[Phase.generate, Phase.shrink])


def distributed(config: LoaderConfig, seed_offset_per_rank: int = 0):  # type: ignore[no-untyped-def]
    """torch's DistributedSampler as the config describes it (``seed_offset_per_rank`` plants a bug)."""

    def factory(rank: int, world_size: int, seed: int) -> DistributedSampler[int]:
        return DistributedSampler(
            range(config.dataset_len),  # type: ignore[arg-type]
            num_replicas=world_size,
            rank=rank,
            shuffle=config.shuffle,
            seed=seed + seed_offset_per_rank * rank,
            drop_last=not config.pad,
        )

    return factory


class ShardedBatches:
    """A batch sampler that keeps batches whole: cut by ``shapes``, shuffled per epoch, dealt to ranks."""

    def __init__(self, shapes: list[int], rank: int, world_size: int, seed: int, pad: bool = True) -> None:
        self.shapes, self.rank, self.world_size, self.seed, self.pad = shapes, rank, world_size, seed, pad
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _mine(self) -> list[list[int]]:
        batches, start = [], 0
        for size in self.shapes:
            batches.append(list(range(start, start + size)))
            start += size
        random.Random(self.seed + self.epoch).shuffle(batches)
        if self.pad and batches:
            batches += [batches[i % len(batches)] for i in range(-len(batches) % self.world_size)]
        return batches[self.rank :: self.world_size]

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._mine())

    def __len__(self) -> int:
        return len(self._mine())


class UnseededShards:
    """Shards a permutation drawn from an unseeded generator: every run deals differently."""

    def __init__(self, n: int, rank: int, world_size: int) -> None:
        self.n, self.rank, self.world_size = n, rank, world_size

    def __iter__(self) -> Iterator[int]:
        order = list(range(self.n))
        random.Random().shuffle(order)
        return iter(order[self.rank :: self.world_size])


# --- the strategies ------------------------------------------------------------------------------


@settings(max_examples=100)
@given(config=loader_configs())
def test_loader_configs_are_valid(config: LoaderConfig) -> None:
    assert isinstance(config, LoaderConfig)
    assert 1 <= config.dataset_len <= 200
    assert 1 <= config.world_size <= 16
    assert 1 <= config.batch_size <= 32
    assert 0 <= config.seed <= 2**32 - 1
    assert all(isinstance(getattr(config, f), bool) for f in ("drop_last", "shuffle", "pad"))


@settings(max_examples=30)
@given(config=loader_configs(world_size=4, dataset_len=st.integers(5, 6), shuffle=False))
def test_loader_configs_take_fixed_values_and_strategies(config: LoaderConfig) -> None:
    assert config.world_size == 4
    assert config.dataset_len in (5, 6)
    assert config.shuffle is False


@settings(max_examples=50)
@given(
    n=dataset_lengths(min_value=3, max_value=9),
    ws=world_sizes(min_value=2, max_value=5),
    bs=batch_sizes(max_value=4),
)
def test_scalar_strategies_respect_bounds(n: int, ws: int, bs: int) -> None:
    assert 3 <= n <= 9 and 2 <= ws <= 5 and 1 <= bs <= 4


def _least(strategy: st.SearchStrategy[int], at_least: int = 0) -> int:
    """The smallest example of ``strategy`` that is at least ``at_least`` (what hypothesis shrinks to)."""
    return find(strategy, lambda n: n >= at_least, settings=SEARCH)


@pytest.mark.parametrize("strategy", [world_sizes, batch_sizes])
def test_bounds_are_named_as_hypothesis_names_them(strategy) -> None:  # type: ignore[no-untyped-def]
    """min_value/max_value as st.integers takes them: the same keywords for every integer strategy."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new names warn about nothing
        assert _least(strategy(min_value=3, max_value=7), 5) == 5
        assert _least(strategy(min_value=3, max_value=7)) == 3  # shrinks to min_value
        assert _least(strategy(min_value=3, max_value=7), 7) == 7
        assert _least(dataset_lengths(min_value=2, max_value=4)) == 2


@pytest.mark.parametrize("strategy", [world_sizes, batch_sizes])
def test_old_size_keywords_still_work_with_a_deprecation_warning(strategy) -> None:  # type: ignore[no-untyped-def]
    with pytest.deprecated_call(match="pass min_value= and max_value="):
        old = strategy(max_size=7, min_size=3)
    assert _least(old) == 3 and _least(old, 7) == 7
    with pytest.deprecated_call(match=r"max_size=7\)"):
        positional = strategy(7)  # the old positional order: (max_size, min_size)
    assert _least(positional) == 1 and _least(positional, 7) == 7
    with pytest.raises(TypeError, match="not both"):
        strategy(max_value=7, max_size=7)


@settings(max_examples=60)
@given(data=st.data(), total=st.integers(0, 120))
def test_batch_shapes_cover_the_total_exactly(data: st.DataObject, total: int) -> None:
    shapes = data.draw(batch_shapes(total, max_batch_size=7))
    assert sum(shapes) == total
    assert all(1 <= s <= 7 for s in shapes)


@settings(max_examples=50)
@given(shapes=batch_shapes(max_batch_size=5, max_batches=6))
def test_batch_shapes_without_total(shapes: list[int]) -> None:
    assert 1 <= len(shapes) <= 6
    assert all(1 <= s <= 5 for s in shapes)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"dataset_len": 10, "world_size": 0}, "world_size must be an integer >= 1"),
        ({"dataset_len": -1, "world_size": 2}, "dataset_len must be an integer >= 0"),
        ({"dataset_len": 10, "world_size": True}, "world_size must be an integer"),
        ({"dataset_len": 10, "world_size": 2, "pad": 1}, "pad must be True or False"),
    ],
)
def test_loader_config_rejects_bad_values(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LoaderConfig(**fields)  # type: ignore[arg-type]


def test_strategies_reject_bad_bounds() -> None:
    with pytest.raises(ValueError, match="min <= max"):
        dataset_lengths(5, 2)
    with pytest.raises(ValueError, match="min_value must be at least 1"):
        world_sizes(min_value=0, max_value=4)
    with pytest.raises(ValueError, match="min <= max"):
        batch_sizes(min_value=5, max_value=2)
    with pytest.raises(ValueError, match="max_batch_size"):
        batch_shapes(10, max_batch_size=0)
    with pytest.raises(ValueError, match="total must be a non-negative integer"):
        batch_shapes(-3)


# --- check_sampler on correct samplers -------------------------------------------------------------


@STEADY
@given(config=loader_configs(pad=True))
def test_distributed_sampler_passes_when_padding(config: LoaderConfig) -> None:
    verdicts = assert_sampler_ok(distributed(config), config)
    assert [v.check for v in verdicts] == list(DATA_CHECKS)


@STEADY
@given(config=loader_configs(pad=False))
def test_distributed_sampler_passes_when_dropping_the_tail(config: LoaderConfig) -> None:
    assert_sampler_ok(distributed(config), config)


@STEADY
@given(data=st.data())
def test_whole_batch_sampler_passes(data: st.DataObject) -> None:
    config = data.draw(loader_configs())
    shapes = data.draw(batch_shapes(config.dataset_len))
    assert_sampler_ok(lambda rank, ws, seed: ShardedBatches(shapes, rank, ws, seed), config)


def test_dataloader_factory_and_only() -> None:
    config = LoaderConfig(dataset_len=23, world_size=3, batch_size=4, shuffle=True, seed=5)

    def factory(rank: int, world_size: int, seed: int) -> DataLoader[int]:
        sampler = distributed(config)(rank, world_size, seed)
        return DataLoader(range(23), batch_size=4, sampler=sampler)  # type: ignore[arg-type]

    verdicts = check_sampler(factory, config, only=[NO_OVERLAP, EQUAL_STEPS])
    assert [(v.check, v.status) for v in verdicts] == [(NO_OVERLAP, "pass"), (EQUAL_STEPS, "pass")]


def test_tensor_batches_are_recognised_as_batches() -> None:
    config = LoaderConfig(dataset_len=12, world_size=2, batch_size=5)

    def factory(rank: int, world_size: int, seed: int) -> list[torch.Tensor]:
        return [torch.arange(start, start + 3) for start in range(3 * rank, 12, 3 * world_size)]

    verdicts = assert_sampler_ok(factory, config)
    assert all(v.status != "fail" for v in verdicts)


# --- check_sampler finds planted bugs -------------------------------------------------------------


def test_find_locates_a_rank_dependent_seed() -> None:
    def broken(config: LoaderConfig) -> bool:
        return any(v.failed for v in check_sampler(distributed(config, seed_offset_per_rank=1), config))

    found = find(loader_configs(), broken, settings=SEARCH)
    assert found.world_size >= 2 and found.shuffle, found  # the bug needs two ranks and shuffling
    with pytest.raises(SamplerCheckFailed, match="no_overlap") as info:
        assert_sampler_ok(distributed(found, seed_offset_per_rank=1), found)
    assert info.value.config == found
    assert "likely cause" in str(info.value)
    # the diagnosis must be true of the shrunk example, whose bug is a per-rank seed
    assert "drops the tail" not in str(info.value)
    assert "seed" in str(info.value) and "depends on the rank" in str(info.value)


def test_given_test_fails_for_a_rank_dependent_seed() -> None:
    @SEARCH
    @given(config=loader_configs())
    def property_test(config: LoaderConfig) -> None:
        assert_sampler_ok(distributed(config, seed_offset_per_rank=1), config)

    with pytest.raises(SamplerCheckFailed):
        property_test()


def test_uneven_batch_split_fails_equal_steps() -> None:
    @st.composite
    def setups(draw: st.DrawFn) -> tuple[LoaderConfig, list[int]]:
        config = draw(loader_configs(dataset_len=dataset_lengths(1, 30), world_size=world_sizes(max_value=4)))
        return config, draw(batch_shapes(config.dataset_len, max_batch_size=4))

    def broken(setup: tuple[LoaderConfig, list[int]]) -> bool:
        config, shapes = setup
        verdicts = check_sampler(lambda r, w, s: ShardedBatches(shapes, r, w, s, pad=False), config)
        return any(v.failed and v.check == EQUAL_STEPS for v in verdicts)

    config, shapes = find(setups(), broken, settings=SEARCH)
    assert len(shapes) % config.world_size != 0


def test_unseeded_sampler_fails_determinism() -> None:
    config = LoaderConfig(dataset_len=40, world_size=2, batch_size=4)
    verdicts = check_sampler(lambda rank, ws, seed: UnseededShards(40, rank, ws), config)
    failed = {v.check for v in verdicts if v.failed}
    assert "determinism" in failed


def test_check_sampler_rejects_bad_arguments() -> None:
    config = LoaderConfig(dataset_len=4, world_size=2)
    with pytest.raises(TypeError, match="LoaderConfig"):
        check_sampler(distributed(config), {"dataset_len": 4})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="epochs"):
        check_sampler(distributed(config), config, epochs=0)
