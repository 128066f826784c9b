"""Naming the likely bug behind overlapping or missing items, shared by several checks.

Each bug leaves a distinct shape in the trace: a sampler that ignores the rank gives every rank the
same stream; a rank-dependent seed gives ranks unrelated permutations, so a large random share of
each rank's items shows up on another rank too while other items reach no rank at all; a rank-aware
dataset under a DistributedSampler splits the data twice, so the ranks together see only about 1/W
of it (each rank 1/W²).
"""

from __future__ import annotations

from ddpcheck.checks.context import Context, EpochView
from ddpcheck.checks.groups import repeat_seed_cause
from ddpcheck.checks.tally import Evidence
from ddpcheck.checks.wording import ranks_text

IGNORES_RANK = "the sampler ignores the rank (no DistributedSampler, or num_replicas/rank not passed)"
SAME_STREAM = f"every rank sees the same stream: {IGNORES_RANK}"
RANK_SEED = "ranks draw different permutations: the sampler's seed (or random state) depends on the rank"
SAME_SHARE = (
    "every rank sees the same stream, though each yields only its share of the epoch: the ranks take "
    "the same positions (the same rank passed on every rank) or, in a tiny epoch, their own orders "
    "happen to agree (a seed that depends on the rank)"
)
WHOLE_EPOCH = (
    f"every rank sees the whole epoch, each in its own order: {IGNORES_RANK}, "
    f"and the shuffle is not seeded the same on every rank"
)
BAD_SPLIT = (
    "the ranks' shards overlap: the sampler splits the epoch wrongly (check its num_replicas/rank arithmetic)"
)
PADS_TOO_MUCH = (
    "the sampler pads more than world_size - 1 (e.g. to whole batches): "
    "pad to a multiple of the world size only"
)
WITHIN_RANK = "a rank repeats samples within its own epoch (see worker_sharding)"
DROPS_TAIL = "the sampler drops the tail: pad or use fewer ranks"
LENGTH_BY_RANK = "the loader's length depends on the rank"
SHARDED_TWICE = (
    "sharded twice: the data is split by rank and then split again (a rank-aware dataset under a "
    "DistributedSampler, or a framework that shards a loader already sharded), so each rank sees about "
    "1/W² of the epoch"
)
GAPS = (
    "some samples reach no rank: the split between ranks leaves gaps "
    "(check the sampler's num_replicas/rank arithmetic)"
)

PER_NODE = (
    "the ranks fall into groups of {size} consecutive ranks ({first}) that each split one order, but the "
    "orders differ between groups: an index built separately on each node (a shuffle or sample index "
    "cached per node) differs between nodes"
)
SPLIT_DIFFERS = "the ranks' datasets differ: "
REFERENCE_PART = "the single-process run saw "
TOLD_REPLICAS = "the sampler splits the data among "
SPLIT_KINDS = {
    "Subset": "a Subset/random_split",
    "indices mapping": "an HF datasets split (train_test_split, shuffle, select)",
}

RANDOM_OVERLAP_SHARE = 0.1  # above this share of a rank's items also on another rank, the split looks random


def identical_streams(view: EpochView) -> list[int]:
    """The largest group (>= 2) of ranks with the same non-empty stream, else ``[]``."""
    return view.identical_streams()


def overlap_evidence(view: EpochView) -> Evidence | None:
    """The lowest rank with an over-shared item, the lowest other rank sharing one, and examples."""
    return view.overlap_evidence()


def length_by_rank(ctx: Context) -> tuple[str, tuple[int, ...]]:
    """A dataset whose ``len`` differs from the single process's on some rank, and those ranks.

    Such ranks shuffle or split a different ``range(len)``, so their shards cannot fit together.
    Iterable datasets are left out: one that shards itself has a per-rank length by design.
    """
    ref_len = ctx.ref_facts.dataset_len if ctx.facts.dataset_kind == "map" else None
    odd = [
        r
        for r in ctx.run.ranks
        if None not in (ref_len, r.facts.dataset_len) and r.facts.dataset_len != ref_len
    ]
    if not odd:
        return "", ()
    first = odd[0]
    why = (
        f"{LENGTH_BY_RANK}: the dataset has {first.facts.dataset_len} samples on rank {first.rank} "
        f"but {ref_len} in a single process"
    )
    if ctx.run.id_source == "index":
        why += (
            "; if each rank holds its own shard (e.g. datasets' split_dataset_by_node), its indices are "
            "local to the rank: identify samples with a sample_ids(batch) hook"
        )
    return why, tuple(r.rank for r in odd)


def split_cause(ctx: Context) -> str:
    """The ranks' datasets are drawn from one dataset differently on each rank (``random_split`` or an HF
    ``train_test_split`` without a seed): the one cause of every coverage, overlap and equivalence
    failure they lead to; "" when not so.

    Needs the ranks to say their dataset is a subset (``LoaderFacts.subset``) and either samples a single
    process never holds, or different subsets (their digests) together with samples on several ranks:
    manual Subset shards differ by design and overlap nowhere."""
    facts = [r.facts for r in ctx.run.ranks]
    if ctx.world_size < 2 or not facts or not all(f.subset for f in facts):
        return ""
    digests = {f.subset_digest for f in facts}
    if "" not in digests and len(digests) == 1:
        return ""  # the same subset on every rank
    differ = "" not in digests
    views = ctx.views()
    foreign = any(v.extras_count and v.ddp_set - ctx.ref_union for v in views)
    shared = differ and any(v.cross_excess > ctx.allowance(v).duplicates for v in views)
    if not (foreign or shared):
        return ""
    first = facts[0]
    what = f"the {first.subset_call}," if first.subset_call else SPLIT_KINDS.get(first.subset, "a subset")
    return (
        f"{SPLIT_DIFFERS}{what} drawn differently on each rank (no seeded generator): they train on "
        "samples the others hold out and miss some of their own"
    )


def reference_share(ctx: Context) -> str:
    """The single-process run's sampler splits among several ranks (it was given ``num_replicas`` > 1, from
    the script's configuration or a launcher variable rather than the process group), so the reference
    saw part of its dataset: the cause of every verdict held to it; "" when not so."""
    facts = ctx.ref_facts
    replicas = facts.sampler_replicas
    views = ctx.views()
    if replicas is None or replicas <= 1 or not views:
        return ""
    seen = views[0].ref_distinct
    size = facts.dataset_len if facts.dataset_kind == "map" else None
    if size is not None and seen >= size:
        return ""
    what = f"{seen} of {size}" if size is not None else str(seen)
    return (
        f"{REFERENCE_PART}{what} samples: the script believes it is one of {replicas} processes (its "
        f"{facts.sampler or 'sampler'} was given num_replicas={replicas}, rank={facts.sampler_rank}: a world "
        "size from the script's configuration or a launcher variable, not from the process group)"
    )


def replicas_cause(ctx: Context) -> str:
    """The sampler was given a number of ranks other than the run's: "" when it was not, or says nothing."""
    told = {r.facts.sampler_replicas for r in ctx.run.ranks}
    if ctx.world_size < 2 or len(told) != 1:
        return ""
    replicas = told.pop()
    if replicas is None or replicas == ctx.world_size:
        return ""
    return (
        f"{TOLD_REPLICAS}{replicas} ranks (num_replicas={replicas}), but {ctx.world_size} ranks split the "
        "data: take num_replicas and rank from the process group (dist.get_world_size(), dist.get_rank()), "
        "on a mesh from its data-parallel dimension"
    )


def overlap_cause(ctx: Context, view: EpochView) -> tuple[str, tuple[int, ...]]:
    """The likely bug behind items seen by too many ranks, and the ranks that show it."""
    split = split_cause(ctx) or replicas_cause(ctx)
    if split:
        return split, ()
    w = ctx.world_size
    same = identical_streams(view)
    if same:
        if len(same) == w:
            shares = all(len(items) < len(view.ref_items) for items in view.rank_items)
            return (SAME_SHARE if shares else SAME_STREAM), tuple(same)
        return f"{ranks_text(same)} see the same stream: {IGNORES_RANK}", tuple(same)
    seeded = repeat_seed_cause(ctx, view)
    if seeded:
        return seeded, ()
    why, odd = length_by_rank(ctx)
    if why:
        return why, odd
    n = view.ref_distinct
    if w > 1 and n and all(view.distinct(r) >= 0.9 * n and view.in_reference(r) >= 0.9 * n for r in range(w)):
        return WHOLE_EPOCH, tuple(range(w))
    size = node_groups(view)
    if size:
        return PER_NODE.format(size=size, first=f"ranks 0-{size - 1}, {size}-{2 * size - 1}, ..."), ()
    held = sum(view.distinct(r) for r in range(w))
    shared = view.shared_holdings
    if held and shared / held > RANDOM_OVERLAP_SHARE and view.missing_count:  # redrawn, not just repeated
        return RANK_SEED, ()
    return BAD_SPLIT, ()


def node_groups(view: EpochView) -> int:
    """The size of the groups of consecutive ranks that split one order each while the groups overlap one
    another (0: no such grouping). The shape of an index that every node builds for itself: within a node
    the ranks take disjoint shares of its order, across nodes the orders (and so the shares) disagree."""
    w = len(view.rank_traces)
    for size in (g for g in range(2, w // 2 + 1) if w % g == 0):
        blocks = [list(range(b, b + size)) for b in range(0, w, size)]
        # from the ids on several ranks, in one pass (4096 ranks: not thousands of sorts)
        split = view.tally.split_in_groups(size) if view.tally is not None else None
        if split is None:
            split = all(view.union_size(block) == sum(view.distinct(r) for r in block) for block in blocks)
        if split:
            return size if view.cross_excess else 0
    return 0


def duplicate_cause(ctx: Context, view: EpochView) -> tuple[str, tuple[int, ...]]:
    """The likely bug behind too many copies: padding gone too far, own repeats, or a bad split."""
    if identical_streams(view):
        return overlap_cause(ctx, view)
    if view.cross_excess == 0:
        return WITHIN_RANK, ()
    extra = view.excess
    padded = view.total - len(view.ref_items) == extra and view.missing_count == 0  # copies, nothing lost
    if padded and ctx.world_size <= extra < len(view.ref_items) and ctx.facts.padding is not False:
        return PADS_TOO_MUCH, ()
    return overlap_cause(ctx, view)


def missing_cause(ctx: Context, view: EpochView, allowed: int) -> str:
    """The likely bug behind reference items that no rank sees."""
    split = split_cause(ctx) or replicas_cause(ctx)
    if split:
        return split
    if view.cross_excess > ctx.allowance(view).duplicates:
        return overlap_cause(ctx, view)[0]
    seeded = repeat_seed_cause(ctx, view)
    if seeded:
        return seeded
    n = len(view.ref_items)
    w = ctx.world_size
    if w > 1 and n >= w * w and view.total * w <= n * 1.5:  # together about 1/W of the epoch
        return SHARDED_TWICE
    why, _ = length_by_rank(ctx)
    if why:
        return why
    counts = {len(items) for items in view.rank_items}
    step = max(ctx.facts.batch_size or 1, 1) if not ctx.batch_level else 1
    if len(counts) == 1 and view.missing_count < w * step + allowed:
        return DROPS_TAIL
    if len(counts) > 1:
        return f"{LENGTH_BY_RANK}: ranks yield between {min(counts)} and {max(counts)} {ctx.noun}"
    return GAPS
