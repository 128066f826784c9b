"""Synthetic traces for check tests: per-rank id lists in, RunTraces out, no processes involved.

The split helpers mirror what torch's DistributedSampler does (pad by repeating the start of the
order, or drop the tail, then stride), so a "correct" trace here is what a correct loader records.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence
from dataclasses import replace
from typing import Any

from ddpcheck.trace import EpochTrace, LoaderFacts, RankFailure, RankTrace, RunTrace, compact_ids

Ids = Sequence[Hashable]
AUTO = -1


def cut(n: int, batch_size: int, drop_last: bool = False) -> list[int]:
    """Batch sizes for ``n`` samples: full batches, then the remainder unless ``drop_last``."""
    sizes = [batch_size] * (n // batch_size)
    if n % batch_size and not drop_last:
        sizes.append(n % batch_size)
    return sizes


def epoch(
    index: int,
    ids: Ids,
    batch_size: int = 4,
    *,
    drop_last: bool = False,
    batch_sizes: Sequence[int] | None = None,
    len_loader: int | None = AUTO,
    worker_ids: Sequence[int] | None = None,
) -> EpochTrace:
    """One epoch; ``drop_last`` trims the ids to whole batches as a DataLoader would."""
    sizes = list(batch_sizes) if batch_sizes is not None else cut(len(ids), batch_size, drop_last)
    kept = list(ids)[: sum(sizes)]
    n_len = len(sizes) if len_loader == AUTO else len_loader
    return EpochTrace(index, compact_ids(kept), tuple(sizes), n_len, worker_ids)


def run(
    per_rank: Sequence[Sequence[Ids]],
    *,
    batch_size: int = 4,
    drop_last: bool = False,
    facts: LoaderFacts | None = None,
    set_epoch: bool = True,
    **fact_overrides: Any,
) -> RunTrace:
    """A run from ``per_rank[rank][epoch] -> ids`` (world size = number of ranks)."""
    base = facts or LoaderFacts(batch_size=batch_size, drop_last=drop_last, batch_sampler="BatchSampler")
    base = replace(base, **fact_overrides)
    ranks = tuple(
        RankTrace(
            r, tuple(epoch(e, ids, batch_size, drop_last=drop_last) for e, ids in enumerate(epochs)), base
        )
        for r, epochs in enumerate(per_rank)
    )
    return RunTrace(len(per_rank), "gloo", ranks, set_epoch=set_epoch)


def reference(epochs: Sequence[Ids], **kwargs: Any) -> RunTrace:
    """The single-process run: one rank, one id list per epoch."""
    kwargs.setdefault("dataset_len", len(epochs[0]) if epochs else 0)
    return run([list(epochs)], **kwargs)


def batch_run(per_rank: Sequence[Sequence[Sequence[Sequence[Hashable]]]], **fact_overrides: Any) -> RunTrace:
    """A run that shards whole batches: ``per_rank[rank][epoch] -> list of batches``."""
    facts = LoaderFacts(batch_size=None, batch_sampler="BalanceSampler", batch_level=True)
    facts = replace(facts, **fact_overrides)
    ranks = []
    for r, epochs in enumerate(per_rank):
        traces = tuple(
            epoch(e, [x for b in batches for x in b], batch_sizes=[len(b) for b in batches])
            for e, batches in enumerate(epochs)
        )
        ranks.append(RankTrace(r, traces, facts))
    return RunTrace(len(per_rank), "gloo", tuple(ranks))


def strided(order: Sequence[Hashable], world_size: int, pad: bool = True) -> list[list[Hashable]]:
    """DistributedSampler's split: pad to a multiple of the world size by cycling the start, or drop."""
    items = list(order)
    if pad:
        total = -(-len(items) // world_size) * world_size
        while items and len(items) < total:
            items += items[: total - len(items)]
    else:
        items = items[: len(items) // world_size * world_size]
    return [items[r::world_size] for r in range(world_size)]


def permutations(n: int, epochs: int, seed: int, shuffle: bool = True) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(epochs):
        order = list(range(n))
        if shuffle:
            rng.shuffle(order)
        out.append(order)
    return out


def ddp_run(
    orders: Sequence[Sequence[Hashable]],
    world_size: int,
    *,
    pad: bool = True,
    batch_size: int = 4,
    drop_last: bool = False,
    **fact_overrides: Any,
) -> RunTrace:
    """A correct DDP run: each epoch's order split as DistributedSampler does."""
    splits = [strided(order, world_size, pad) for order in orders]
    shards = [[split[r] for split in splits] for r in range(world_size)]
    fact_overrides.setdefault("padding", pad)
    fact_overrides.setdefault("has_set_epoch", True)
    return run(shards, batch_size=batch_size, drop_last=drop_last, **fact_overrides)


def per_rank(trace: RunTrace) -> list[list[list[Any]]]:
    """``[rank][epoch] -> ids`` of a run, for tests that perturb a correct run."""
    return [[list(e.ids) for e in r.epochs] for r in trace.ranks]


def rebuild(trace: RunTrace, ids: Sequence[Sequence[Ids]], batch_size: int = 4) -> RunTrace:
    """``trace`` with new per-rank ids, same facts; batches re-cut at ``batch_size``."""
    facts = trace.ranks[0].facts
    return run(
        ids, batch_size=batch_size, drop_last=bool(facts.drop_last), facts=facts, set_epoch=trace.set_epoch
    )


def broken(
    trace: RunTrace, rank: int = 1, kind: str = "hang", message: str = "stuck in all_reduce"
) -> RunTrace:
    return replace(trace, failures=(RankFailure(rank, kind, message),))
