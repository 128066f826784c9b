"""Checking a sampler in this process: simulated ranks, the pure checks, a failing assert.

A library author tests their own sampler against every ddpcheck data check, with hypothesis drawing the
configurations (:mod:`ddpcheck.strategies`)::

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
from typing import TYPE_CHECKING, Any

from torch.utils.data import BatchSampler, DataLoader

from ddpcheck.checker.epochs import loop_set_epoch
from ddpcheck.checker.facts import read_facts
from ddpcheck.checker.running import record_indices
from ddpcheck.checks import run_checks
from ddpcheck.trace import RankTrace, RunTrace

if TYPE_CHECKING:
    from ddpcheck.verdict import Verdict

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
            loop_set_epoch(loader, epoch)
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
