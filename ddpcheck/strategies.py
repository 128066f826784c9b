"""Hypothesis strategies for property tests of DDP samplers, and an in-process checker to run them.

A library author tests their own sampler against every ddpcheck data check in three lines::

    @given(config=loader_configs())
    def test_my_sampler(config):
        assert_sampler_ok(lambda rank, world_size, seed: MySampler(..., rank=rank, num_replicas=world_size,
                                                                   seed=seed), config)

:func:`check_sampler` simulates the ranks in this process (explicit ``rank``/``world_size``, no
process group, no processes): it builds one sampler per rank, iterates it epoch by epoch as a
training loop would (``set_epoch`` first), records the index stream as a ``ddpcheck.trace`` trace
and runs the pure checks against the same factory at world size 1. Samplers that need collectives
cannot be judged this way; check those with the full checker (``ddpcheck.pytest_plugin``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

try:
    from hypothesis import strategies as st
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "ddpcheck.strategies needs hypothesis: pip install 'ddpcheck[test]' (or pip install hypothesis)"
    ) from exc

# Imported here, not on first use: the first hypothesis example must not pay for importing torch
# (it would blow hypothesis's deadline and make that example look flaky).
from torch.utils.data import BatchSampler, DataLoader

from ddpcheck.checker.recording import read_facts, record_indices, set_epoch_everywhere
from ddpcheck.checks import run_checks
from ddpcheck.trace import RankTrace, RunTrace

if TYPE_CHECKING:
    from ddpcheck.checks.verdict import Verdict

T = TypeVar("T")
SamplerFactory = Callable[[int, int, int], Any]
"""``factory(rank, world_size, seed)`` -> a sampler, a batch sampler or a DataLoader for that rank.

Called positionally, once per rank and run, so every call must build a fresh object. ``seed`` is
``LoaderConfig.seed``: pass it to the sampler so that equal seeds give equal streams.
"""

MAX_SEED = 2**32 - 1


@dataclass(frozen=True)
class LoaderConfig:
    """One DDP data setup to check a sampler under.

    ``dataset_len`` samples (indices ``0 .. dataset_len - 1``) split over ``world_size`` ranks.
    ``batch_size`` and ``drop_last`` are the DataLoader's: :func:`check_sampler` cuts a sampler's
    index stream into batches with them (a batch sampler's own batches are kept). ``shuffle``,
    ``seed`` and ``pad`` are for the sampler the factory builds: ``pad=True`` means it pads every
    rank to the same length by repeating samples (``DistributedSampler(drop_last=False)``),
    ``pad=False`` that it drops the tail instead (``DistributedSampler(drop_last=True)``).
    """

    dataset_len: int
    world_size: int
    batch_size: int = 1
    drop_last: bool = False
    shuffle: bool = True
    seed: int = 0
    pad: bool = True

    def __post_init__(self) -> None:
        for name, low in (("dataset_len", 0), ("world_size", 1), ("batch_size", 1), ("seed", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"LoaderConfig.{name} must be an integer >= {low}, got {value!r}")
        for name in ("drop_last", "shuffle", "pad"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"LoaderConfig.{name} must be True or False, got {getattr(self, name)!r}")


def _positive_range(name: str, low: int, high: int) -> None:
    if (
        not isinstance(low, int)
        or not isinstance(high, int)
        or isinstance(low, bool)
        or isinstance(high, bool)
    ):
        raise TypeError(f"{name}: bounds must be integers, got {low!r} and {high!r}")
    if low < 0 or high < low:
        raise ValueError(f"{name}: need 0 <= min <= max, got min={low}, max={high}")


def dataset_lengths(min_value: int = 1, max_value: int = 200) -> st.SearchStrategy[int]:
    """Dataset sizes in ``[min_value, max_value]``; shrinks towards ``min_value``.

    The default range holds the sizes where DDP bugs show (fewer samples than ranks, sizes that do
    not divide by the world size or batch size) while keeping every example cheap to check.
    """
    _positive_range("dataset_lengths", min_value, max_value)
    return st.integers(min_value=min_value, max_value=max_value)


def world_sizes(max_size: int = 16, min_size: int = 1) -> st.SearchStrategy[int]:
    """Numbers of ranks in ``[min_size, max_size]``; shrinks towards ``min_size``."""
    _positive_range("world_sizes", min_size, max_size)
    if min_size < 1:
        raise ValueError(f"world_sizes: min_size must be at least 1, got {min_size}")
    return st.integers(min_value=min_size, max_value=max_size)


def batch_sizes(max_size: int = 32, min_size: int = 1) -> st.SearchStrategy[int]:
    """DataLoader batch sizes in ``[min_size, max_size]``; shrinks towards ``min_size``."""
    _positive_range("batch_sizes", min_size, max_size)
    if min_size < 1:
        raise ValueError(f"batch_sizes: min_size must be at least 1, got {min_size}")
    return st.integers(min_value=min_size, max_value=max_size)


def _strategy(value: T | st.SearchStrategy[T] | None, default: st.SearchStrategy[T]) -> st.SearchStrategy[T]:
    if value is None:
        return default
    if isinstance(value, st.SearchStrategy):
        return value
    return st.just(value)


def loader_configs(
    *,
    dataset_len: int | st.SearchStrategy[int] | None = None,
    world_size: int | st.SearchStrategy[int] | None = None,
    batch_size: int | st.SearchStrategy[int] | None = None,
    drop_last: bool | st.SearchStrategy[bool] | None = None,
    shuffle: bool | st.SearchStrategy[bool] | None = None,
    seed: int | st.SearchStrategy[int] | None = None,
    pad: bool | st.SearchStrategy[bool] | None = None,
) -> st.SearchStrategy[LoaderConfig]:
    """:class:`LoaderConfig` examples; each field is drawn from its default strategy unless given.

    A field may be fixed (``world_size=4``) or drawn from any strategy (``world_size=world_sizes(64)``).
    Defaults: :func:`dataset_lengths`, :func:`world_sizes`, :func:`batch_sizes`, booleans for
    ``drop_last``, ``shuffle`` and ``pad``, and seeds in ``[0, 2**32 - 1]``. Shrinks towards one
    sample, one rank, batch size 1, no shuffle and seed 0.
    """
    return st.builds(
        LoaderConfig,
        dataset_len=_strategy(dataset_len, dataset_lengths()),
        world_size=_strategy(world_size, world_sizes()),
        batch_size=_strategy(batch_size, batch_sizes()),
        drop_last=_strategy(drop_last, st.booleans()),
        shuffle=_strategy(shuffle, st.booleans()),
        seed=_strategy(seed, st.integers(min_value=0, max_value=MAX_SEED)),
        pad=_strategy(pad, st.booleans()),
    )


@st.composite
def _shapes_summing_to(draw: st.DrawFn, total: int, max_batch_size: int) -> list[int]:
    shapes: list[int] = []
    left = total
    while left > 0:
        size = draw(st.integers(min_value=1, max_value=min(max_batch_size, left)))
        shapes.append(size)
        left -= size
    return shapes


def batch_shapes(
    total: int | st.SearchStrategy[int] | None = None,
    *,
    max_batch_size: int = 16,
    max_batches: int = 32,
) -> st.SearchStrategy[list[int]]:
    """Lists of batch sizes, for building custom batch samplers: ``[4, 4, 3, 1]``.

    With ``total`` (a number or a strategy for one) the sizes add up to exactly ``total`` samples, so
    cutting ``range(total)`` by them uses every index once (``total=0`` gives ``[]``); without it, 1 to
    ``max_batches`` batches. Every size is in ``[1, max_batch_size]``; shrinks towards few, small batches.
    """
    if not isinstance(max_batch_size, int) or max_batch_size < 1:
        raise ValueError(f"batch_shapes: max_batch_size must be a positive integer, got {max_batch_size!r}")
    if total is None:
        if not isinstance(max_batches, int) or max_batches < 1:
            raise ValueError(f"batch_shapes: max_batches must be a positive integer, got {max_batches!r}")
        return st.lists(st.integers(min_value=1, max_value=max_batch_size), min_size=1, max_size=max_batches)
    totals = total if isinstance(total, st.SearchStrategy) else st.just(total)
    if isinstance(total, int) and (isinstance(total, bool) or total < 0):
        raise ValueError(f"batch_shapes: total must be a non-negative integer, got {total!r}")
    return totals.flatmap(lambda n: _shapes_summing_to(n, max_batch_size))


# --- checking a sampler in simulated ranks ------------------------------------------------------


def _looks_batched(first: Any) -> bool:
    """A batch sampler yields sequences of indices; a sampler yields single indices."""
    if isinstance(first, int):
        return False
    shape = getattr(first, "shape", None)
    if shape is not None:
        return len(shape) > 0
    return isinstance(first, Collection) and not isinstance(first, (str, bytes))


def _as_loader(obj: Any, config: LoaderConfig, batched: bool) -> Any:
    """The factory's product as a DataLoader, so recording reads it exactly as it reads a real one."""
    if isinstance(obj, DataLoader):
        return obj
    dataset = range(config.dataset_len)
    if batched:
        return DataLoader(dataset, batch_sampler=obj)  # type: ignore[arg-type]
    return DataLoader(
        dataset,  # type: ignore[arg-type]
        sampler=obj,
        batch_size=config.batch_size,
        drop_last=config.drop_last,
    )


def _is_batched(factory: SamplerFactory, config: LoaderConfig, batches: bool | None) -> bool:
    if batches is not None:
        return batches
    probe = factory(0, 1, config.seed)  # a throwaway instance: peeking must not disturb the real ones
    if isinstance(probe, DataLoader):
        return False
    if isinstance(probe, BatchSampler):
        return True
    first = next(iter(probe), None)
    return first is not None and _looks_batched(first)


def record_simulated(
    sampler_factory: SamplerFactory,
    config: LoaderConfig,
    world_size: int,
    *,
    epochs: int = 2,
    batches: bool | None = None,
) -> RunTrace:
    """Every rank's index stream at ``world_size``, recorded in this process as a ``RunTrace``."""
    batched = _is_batched(sampler_factory, config, batches)
    ranks = []
    for rank in range(world_size):
        loader = _as_loader(sampler_factory(rank, world_size, config.seed), config, batched)
        facts = read_facts(loader)
        traces = []
        for epoch in range(epochs):
            set_epoch_everywhere(loader, epoch)
            traces.append(record_indices(loader, epoch))
        ranks.append(RankTrace(rank=rank, epochs=tuple(traces), facts=facts))
    return RunTrace(world_size=world_size, backend="simulated", ranks=tuple(ranks))


def check_sampler(
    sampler_factory: SamplerFactory,
    config: LoaderConfig,
    *,
    epochs: int = 2,
    batches: bool | None = None,
    only: Collection[str] | None = None,
) -> list[Verdict]:
    """Judge a sampler at ``config.world_size`` against itself at world size 1; one Verdict per check.

    ``sampler_factory(rank, world_size, seed)`` builds the object one rank would iterate: a sampler
    of indices (batched here by ``config.batch_size`` / ``config.drop_last``, as a DataLoader does),
    a batch sampler of index lists (its batches are the unit the checks judge), or a DataLoader. It
    is called for the reference (rank 0 of 1), then for every rank twice (the second run checks
    determinism), plus once to see whether it yields batches unless ``batches`` says so. Each epoch
    calls ``set_epoch(epoch)`` where the object has one. ``only`` narrows the checks to these ids.
    Exceptions raised by the factory or the sampler propagate unchanged.
    """
    if not isinstance(config, LoaderConfig):
        raise TypeError(f"config must be a LoaderConfig (see loader_configs()), got {type(config).__name__}")
    if not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a positive integer, got {epochs!r}")
    if not callable(sampler_factory):
        raise TypeError("sampler_factory must be callable as sampler_factory(rank, world_size, seed)")
    reference = record_simulated(sampler_factory, config, 1, epochs=epochs, batches=batches)
    world = config.world_size
    run = (
        reference
        if world == 1
        else record_simulated(sampler_factory, config, world, epochs=epochs, batches=batches)
    )
    rerun = record_simulated(sampler_factory, config, world, epochs=epochs, batches=batches)
    return run_checks(reference, run, rerun, only=only)


class SamplerCheckFailed(AssertionError):
    """A sampler failed a check under a :class:`LoaderConfig`; ``verdicts`` holds every judgement."""

    def __init__(self, config: LoaderConfig, verdicts: list[Verdict]) -> None:
        self.config = config
        self.verdicts = verdicts
        failed = [v for v in verdicts if v.failed]
        lines = [f"sampler fails {len(failed)} of {len(verdicts)} checks under {config}:"]
        for v in failed:
            lines.append(f"  {v.check}: {v.detail}")
            if v.cause:
                lines.append(f"    likely cause: {v.cause}")
        super().__init__("\n".join(lines))


def assert_sampler_ok(
    sampler_factory: SamplerFactory,
    config: LoaderConfig,
    *,
    epochs: int = 2,
    batches: bool | None = None,
    only: Collection[str] | None = None,
) -> list[Verdict]:
    """:func:`check_sampler`, raising :class:`SamplerCheckFailed` (an AssertionError) on any failed check.

    Returns the verdicts when all pass (skipped checks are not failures).
    """
    __tracebackhide__ = True
    verdicts = check_sampler(sampler_factory, config, epochs=epochs, batches=batches, only=only)
    if any(v.failed for v in verdicts):
        raise SamplerCheckFailed(config, verdicts)
    return verdicts
