"""How to fix what a cause names: one line a user can act on, attached to the verdict (``Verdict.fix``).

Causes say what went wrong; a fix says what to change. Kept in one table, keyed by the cause texts the
checks produce, so every report shows the same advice for the same cause.
"""

from __future__ import annotations

from dataclasses import replace

from ddpcheck.checks.determinism import CAUSE as NONDETERMINISTIC
from ddpcheck.checks.diagnose import (
    BAD_SPLIT,
    DROPS_TAIL,
    GAPS,
    LENGTH_BY_RANK,
    PADS_TOO_MUCH,
    RANK_SEED,
    REFERENCE_PART,
    SAME_SHARE,
    SAME_STREAM,
    SHARDED_TWICE,
    SPLIT_DIFFERS,
    TOLD_REPLICAS,
    WHOLE_EPOCH,
)
from ddpcheck.checks.equivalence import DEPENDS_ON_RANK
from ddpcheck.checks.groups import FIXES as GROUP_FIXES
from ddpcheck.checks.groups import RANK_SEEDED as REPEAT_SEEDED
from ddpcheck.checks.mixture import MIXTURE_FIXES
from ddpcheck.checks.reshuffle import FROZEN_SHARDS, LOOP_REPLAYS, NO_SET_EPOCH, NOT_FORWARDED
from ddpcheck.checks.reshuffle import REPEATS as ORDER_REPEATS
from ddpcheck.checks.steps import UNEVEN, UNEVEN_BATCHES, UNEVEN_ITERABLE
from ddpcheck.checks.workers import WORKERS
from ddpcheck.verdict import Verdict

SAME_DATASET = "build the same dataset on every rank and let the sampler pick each rank's share"
EVEN_STEPS = "give every rank the same number of batches: pad the shards or drop the remainder"
CHECK_SPLIT = "check the sampler's num_replicas/rank arithmetic, or use DistributedSampler"
SHARD_WITH_DISTRIBUTED_SAMPLER = (
    "give each rank its share with DistributedSampler(dataset, num_replicas=world_size, rank=rank) "
    "(or ddpcheck.patch_dataloader_to_ddp(loader))"
)

# (cause text or its start, fix); the first entry that matches wins
FIXES: tuple[tuple[str, str], ...] = (
    (
        SPLIT_DIFFERS,
        "draw the split the same on every rank: random_split(data, lengths, "
        "generator=torch.Generator().manual_seed(0)) (HF datasets: train_test_split(..., seed=0)), or split "
        "once and share the indices",
    ),
    (
        REFERENCE_PART,
        "let the sampler take the number of processes from the process group: DistributedSampler(dataset) "
        "(num_replicas=dist.get_world_size(), rank=dist.get_rank()), not from a configuration or a "
        "launcher variable",
    ),
    (TOLD_REPLICAS, "DistributedSampler(dataset) reads num_replicas and rank from the process group"),
    (SHARDED_TWICE, "shard once: split the dataset by rank or let the sampler split it, not both"),
    (RANK_SEED, "seed the sampler the same on every rank (seed=0, not seed=rank)"),
    (REPEAT_SEEDED, GROUP_FIXES[REPEAT_SEEDED]),
    (SAME_SHARE, "pass each rank its own rank (and num_replicas) to the sampler"),
    (SAME_STREAM, SHARD_WITH_DISTRIBUTED_SAMPLER),
    (WHOLE_EPOCH, SHARD_WITH_DISTRIBUTED_SAMPLER),
    (PADS_TOO_MUCH, "pad each epoch to a multiple of the world size only (DistributedSampler does)"),
    (DROPS_TAIL, "pad the last round (drop_last=False), or --allow coverage when dropping is meant"),
    (BAD_SPLIT, CHECK_SPLIT),
    (GAPS, CHECK_SPLIT),
    (LENGTH_BY_RANK, SAME_DATASET),
    (DEPENDS_ON_RANK, SAME_DATASET),
    (ORDER_REPEATS, "call sampler.set_epoch(epoch) before every epoch, and seed the generator once"),
    (
        NOT_FORWARDED.split("{")[0],
        "call the wrapped part's set_epoch in the loop, or define set_epoch(loader, epoch) in the loader "
        "file to say what your loop calls",
    ),
    (NO_SET_EPOCH, "give the sampler set_epoch(epoch); draw each epoch's order from seed + epoch"),
    (FROZEN_SHARDS, "shuffle the whole epoch before splitting it (DistributedSampler(shuffle=True))"),
    (LOOP_REPLAYS, "reshuffle at every pass of the loop: draw each pass's order from seed + pass number"),
    (NONDETERMINISTIC, "seed every generator the loader draws from (sampler seed, DataLoader generator)"),
    (WORKERS, "split the stream by torch.utils.data.get_worker_info() inside __iter__"),
    (UNEVEN, EVEN_STEPS),
    (UNEVEN_ITERABLE, EVEN_STEPS),
    (UNEVEN_BATCHES, "give every rank the same number of batches: pad or drop whole batches"),
    *MIXTURE_FIXES.items(),  # mixture: same mixing RNG, exhausted source, worker-scaled weights, ...
)


def fix_for(cause: str) -> str:
    """The fix for ``cause`` ("" when none is known)."""
    for text, fix in FIXES:
        if cause == text or cause.startswith(text):
            return fix
    return ""


def with_fix(verdict: Verdict) -> Verdict:
    """``verdict`` with its cause's fix (failed or allowed verdicts that name no fix of their own)."""
    if verdict.status not in ("fail", "allowed") or not verdict.cause or verdict.fix:
        return verdict
    fix = fix_for(verdict.cause)
    return replace(verdict, fix=fix) if fix else verdict
