"""Device meshes: the data-parallel view of a run, and replica consistency.

On a mesh only the data-parallel dimensions split the data. Every check of the data path is judged over
the data-parallel world (one stream per data-parallel rank, :func:`data_parallel_view`); equal steps
over every rank, since a tensor-parallel peer with a batch fewer hangs its group; and
``replica_consistency`` asks that the ranks sharing a data-parallel rank receive the same batches, step
by step, with the same content (:func:`check_replica_consistency`). :func:`judge_layout` runs them all
for one layout; a plain world size is the mesh whose every rank is a replica group of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ddpcheck.checks.arrays import same_ints
from ddpcheck.checks.context import broken_reason
from ddpcheck.checks.fixes import with_fix
from ddpcheck.checks.registry import run_checks
from ddpcheck.checks.steps import check_equal_steps
from ddpcheck.checks.wording import few, ids_text
from ddpcheck.evidence import FirstDivergence, GroupDivergence, ReplicaGroups
from ddpcheck.layout import Layout
from ddpcheck.messages import count_text
from ddpcheck.trace import EpochTrace, RankTrace, RunTrace
from ddpcheck.verdict import (
    COVERAGE,
    EQUAL_STEPS,
    NO_OVERLAP,
    PACKING,
    PADDING_BOUND,
    REPLICA_CONSISTENCY,
    SINGLE_PROCESS_EQUIVALENCE,
    Verdict,
    not_applicable,
    skipped,
)

GLOBAL_RANK = (
    "the sampler uses the global rank where the data-parallel rank belongs: ranks that should share a "
    "data-parallel rank (tensor, context or pipeline peers) each train on a different shard"
)
SHARDED_TWICE_MESH = (
    "sharded twice: the data is split by the data-parallel rank and again by the global rank, so each "
    "data-parallel group sees about 1/(dp x tp) of the epoch"
)
PER_RANK_RANDOM = (
    "replicas draw from per-rank random state: the same samples arrive with different content "
    "(augmentation, noise or masks drawn in the loader from each rank's own generator)"
)
LAYOUT_MISMATCH = (
    "the loader's replica groups are not the mesh's: ranks that differ in a data coordinate get the same "
    "batches while the mesh's replicas get different ones (the framework lays ranks out in another order "
    "than the declared mesh: Megatron always orders tp-cp-ep-dp-pp, whatever the mesh says)"
)
REPLICA_STEPS = "a replica runs a different number of batches: its group's next collective hangs"
REPLICA_IDS = "replicas receive different samples: the loader's split depends on a non-data coordinate"
TOLD = "the sampler splits by "  # what the samplers were given, where it is not the data-parallel rank
TOLD_GLOBAL = f"{TOLD}the global rank: "
LOADER_GLOBAL = "the loader splits by the global rank: "  # seen in the data, where no sampler says so
MESH_FIXES = {
    GLOBAL_RANK: "shard by the data-parallel coordinate: DistributedSampler(num_replicas=dp_world_size, "
    "rank=dp_rank), or split_dataset_by_node(ds, rank=dp_rank, world_size=dp_world_size) as torchtitan's "
    "text datasets do (its ParallelAwareDataloader shards nothing: it keys its state by dp_rank)",
    SHARDED_TWICE_MESH: "shard once, by the data-parallel rank: drop the split by the global rank",
    PER_RANK_RANDOM: "seed the loader's random draws from the data-parallel rank (seed + dp_rank), or draw "
    "them on one replica and broadcast",
    REPLICA_STEPS: "build every replica's loader from dp_rank and dp_world_size only, so they run in step",
    REPLICA_IDS: "build every replica's loader from dp_rank and dp_world_size only",
    LAYOUT_MISMATCH: "declare the mesh in the order the framework builds its groups (or build the loader "
    "from the declared mesh's dp_rank)",
}
# the data-parallel view's failures that a mesh diagnosis (global rank, sharded twice) explains: samples
# (or packed tokens) that reach no data-parallel rank, or two
_EXPLAINED_CHECKS = (COVERAGE, NO_OVERLAP, PADDING_BOUND, SINGLE_PROCESS_EQUIVALENCE, PACKING)


def data_parallel_view(layout: Layout, run: RunTrace) -> RunTrace:
    """One stream per data-parallel rank (its first replica's), numbered by data-parallel rank."""
    if not layout.mesh and layout.replicas == 1:
        return run
    first = {rank: dp for dp, rank in enumerate(layout.representatives())}
    ranks = tuple(replace(r, rank=first[r.rank]) for r in run.ranks if r.rank in first)
    sample = tuple(sorted(first[r] for r in run.rank_sample if r in first)) if run.rank_sample else ()
    return replace(run, world_size=layout.dp_world_size, ranks=ranks, rank_sample=sample)


def judge_layout(reference: RunTrace, run: RunTrace, rerun: RunTrace | None, layout: Layout) -> list[Verdict]:
    """Every data check of one layout, in report order, ``replica_consistency`` after ``equal_steps``."""
    view = data_parallel_view(layout, run)
    verdicts = run_checks(reference, view, data_parallel_view(layout, rerun) if rerun is not None else None)
    if view is not run:  # a tensor-parallel peer with a batch fewer hangs its group: every rank counts
        full = check_equal_steps(reference, run, rerun)
        if full.failed and not any(v.failed for v in verdicts if v.check == EQUAL_STEPS):
            full = replace(full, cause=REPLICA_STEPS, fix=MESH_FIXES[REPLICA_STEPS])  # replicas, not shards
        verdicts = [with_fix(full) if v.check == EQUAL_STEPS else v for v in verdicts]
    replica = with_fix(check_replica_consistency(reference, run, layout))
    said = replica.evidence
    mesh_cause = said.mesh_cause or "" if isinstance(said, ReplicaGroups) else ""
    if mesh_cause:
        verdicts = [_explained(v, mesh_cause) for v in verdicts]
    at = next((i + 1 for i, v in enumerate(verdicts) if v.check == EQUAL_STEPS), len(verdicts))
    return [*verdicts[:at], replica, *verdicts[at:]]


def _explained(verdict: Verdict, cause: str) -> Verdict:
    """A data-parallel failure that follows from the mesh's own bug is named after that bug."""
    if verdict.failed and verdict.check in _EXPLAINED_CHECKS:
        return replace(verdict, cause=cause, fix=MESH_FIXES.get(cause, ""))
    return verdict


@dataclass(frozen=True)
class Divergence:
    """Where one replica first leaves its group's first rank: ``kind`` ids, content or steps."""

    dp_rank: int
    epoch: int
    step: int
    kind: str
    first: int  # the group's first rank
    other: int  # the replica that differs


def check_replica_consistency(reference: RunTrace, run: RunTrace, layout: Layout) -> Verdict:
    """Ranks that share a data-parallel rank get the same batches, in the same order, with the same
    content, and the same number of steps; ``n/a`` where there are no replicas."""
    why = broken_reason(run, f"mesh {layout.spec}" if layout.mesh else f"world size {run.world_size}")
    if why:
        return skipped(REPLICA_CONSISTENCY, why)
    if not layout.mesh:
        return not_applicable(
            REPLICA_CONSISTENCY,
            "a plain world size: every rank is a data replica of its own (give --mesh to check replicas)",
        )
    if layout.replicas == 1:
        return not_applicable(
            REPLICA_CONSISTENCY,
            f"mesh {layout.spec} has no non-data dimension larger than 1: every rank is its own replica",
        )
    by_rank = {r.rank: r for r in run.ranks}
    groups = layout.replica_groups()
    content = all(e.digests is not None for r in run.ranks for e in r.epochs)
    heads = [len(e.digests) for r in run.ranks for e in r.epochs if e.digests is not None]
    whole = content and all(len(e.digests or ()) == e.num_batches for r in run.ranks for e in r.epochs)
    found: list[Divergence] = []
    for dp, group in enumerate(groups):
        head = by_rank[group[0]]
        for other in group[1:]:
            # sequence-sharding peers hold their own slices: the same samples, not the same tensors
            same_slices = layout.sequence_coords(group[0]) == layout.sequence_coords(other)
            for epoch, (a, b) in enumerate(zip(head.epochs, by_rank[other].epochs, strict=False)):
                where = _first_difference(a, b, content=same_slices)
                if where is not None:
                    found.append(Divergence(dp, epoch, where[0], where[1], group[0], other))
                    break
    epochs = min((len(r.epochs) for r in run.ranks), default=0)
    compared = "ids and content" if content else "ids (content not recorded: batches were not loaded)"
    if content and not whole:
        compared = f"ids of every batch, content of the first {min(heads, default=0)} of each epoch"
    if content and layout.sequence_dims:
        compared += f" (content not across {', '.join(layout.sequence_dims)}, which slices every sequence)"
    counted = ReplicaGroups(
        groups=len(groups),
        replicas=layout.replicas,
        content=content,
        diverging_groups=len({d.dp_rank for d in found}),
        per_group=_per_group(layout, groups, by_rank, found),
    )
    if not found:
        return Verdict(
            REPLICA_CONSISTENCY,
            "pass",
            f"every replica group ({len(groups)} groups of {layout.replicas} ranks) receives the same "
            f"batches step by step in all {count_text(epochs, 'epochs')} (compared: {compared})",
            evidence=counted,
        )
    first = min(found, key=lambda d: (d.epoch, d.step, d.dp_rank))
    cause = _mesh_cause(reference, run, layout, found)
    counted = replace(
        counted,
        mesh_cause=cause if cause in (GLOBAL_RANK, SHARDED_TWICE_MESH, LAYOUT_MISMATCH) else "",
        first=FirstDivergence(first.dp_rank, first.epoch, first.step, first.kind),
    )
    one, two = by_rank[first.first].epochs[first.epoch], by_rank[first.other].epochs[first.epoch]
    detail = (
        f"{layout.data_coords(first.first)}: {layout.replica_coords(first.first)} and "
        f"{layout.replica_coords(first.other)} differ from step {first.step} of epoch {first.epoch} "
        f"({_what(first, one, two)})"
    )
    groups_bad = counted.diverging_groups
    if groups_bad != 1 or len(groups) > 1:
        detail += f"; {groups_bad} of {len(groups)} replica groups differ"
    return Verdict(
        REPLICA_CONSISTENCY,
        "fail",
        detail,
        cause,
        ranks=(first.first, first.other),
        epochs=tuple(sorted({d.epoch for d in found})),
        evidence=counted,
        fix=MESH_FIXES.get(cause, ""),
    )


def told_split(run: RunTrace, layout: Layout) -> str:
    """What the ranks' samplers were given (``num_replicas``, ``rank``), where it is not the data-parallel
    coordinate of a mesh: the global rank (``dist.get_rank()``) or another rank; "" where every sampler
    got its data-parallel rank, or a sampler does not say."""
    told = {r.rank: (r.facts.sampler_replicas, r.facts.sampler_rank) for r in run.ranks}
    if not told or any(n is None or k is None for n, k in told.values()):
        return ""
    dp, world = layout.dp_world_size, layout.world_size
    should = f'the data-parallel rank (mesh["dp"].get_local_rank(), 0..{dp - 1} of mesh["dp"].size() = {dp})'
    if all(given == (world, rank) for rank, given in told.items()):
        return (
            f"{TOLD_GLOBAL}it is given dist.get_rank() (0..{world - 1}) and dist.get_world_size() "
            f"({world}) where it needs {should}, so ranks that share a data-parallel rank each train on a "
            "different shard"
        )
    wrong = [rank for rank, given in sorted(told.items()) if given != (dp, layout.dp_rank(rank))]
    if not wrong:
        return ""
    rank = wrong[0]
    n, k = told[rank]
    return (
        f"{TOLD}another rank than the data-parallel one: on rank {rank} (dist.get_rank()) it is given "
        f"rank={k} of num_replicas={n}, where it needs {should}: {layout.dp_rank(rank)} there"
    )


def told_global(layout: Layout) -> str:
    """A split by the global rank seen in the data where no sampler said what it was given (a dataset split
    by ``split_dataset_by_node``, a stream sharded by hand): the global rank it took and the data-parallel
    rank that belongs there, for the first rank that is not its group's first."""
    dp, world = layout.dp_world_size, layout.world_size
    peer = next((g[1] for g in layout.replica_groups() if len(g) > 1), 0)
    return (
        f"{LOADER_GLOBAL}each of the {world} ranks reads a shard of its own, as a split given "
        f"dist.get_rank() (0..{world - 1}) and dist.get_world_size() ({world}) reads "
        "(split_dataset_by_node(ds, rank=dist.get_rank(), world_size=dist.get_world_size()), a "
        "DistributedSampler's defaults): rank "
        f"{peer} ({layout.data_coords(peer)},{layout.replica_coords(peer)}) reads shard {peer} of {world} "
        f'where data-parallel rank {layout.dp_rank(peer)} of {dp} belongs (mesh["dp"].get_local_rank(), '
        f'0..{dp - 1} of mesh["dp"].size() = {dp}), so ranks that share a data-parallel rank each train on '
        "a different shard"
    )


MAX_PICTURED_GROUPS = 64  # replica groups listed for the picture (the first ones)


def _per_group(
    layout: Layout, groups: list[list[int]], by_rank: dict[int, RankTrace], found: Sequence[Divergence]
) -> tuple[GroupDivergence, ...]:
    """For the replica picture: per group its steps in epoch 0 and where its replicas first differ."""
    first: dict[int, Divergence] = {}
    for found_one in sorted(found, key=lambda d: (d.epoch, d.step)):
        first.setdefault(found_one.dp_rank, found_one)
    out: list[GroupDivergence] = []
    for dp, group in enumerate(groups[:MAX_PICTURED_GROUPS]):
        head = by_rank[group[0]]
        d = first.get(dp)
        out.append(
            GroupDivergence(
                where=layout.data_coords(group[0]),
                steps=head.epochs[0].num_batches if head.epochs else 0,
                epoch=d.epoch if d else None,
                step=d.step if d else None,
                kind=d.kind if d else "",
                ranks=(group[0], d.other) if d else tuple(group),
            )
        )
    return tuple(out)


def _first_difference(a: EpochTrace, b: EpochTrace, *, content: bool = True) -> tuple[int, str] | None:
    """The first step where two replicas' epochs differ, and how; None when they agree. ``content``
    False compares ids and steps only (peers along a sequence-sharding dimension)."""
    if not content:
        a, b = replace(a, digests=None), replace(b, digests=None)
    sizes_a, sizes_b = list(a.batch_sizes), list(b.batch_sizes)
    same_ids = same_ints(a.ids, b.ids)
    if same_ids is None:
        same_ids = list(a.ids) == list(b.ids)
    same_content = a.digests is None or b.digests is None
    if not same_content:
        n = min(len(a.digests), len(b.digests))  # type: ignore[arg-type]
        same_content = _same(a.digests[:n], b.digests[:n])  # type: ignore[index]
    if same_ids and sizes_a == sizes_b and same_content:
        return None
    batches_a, batches_b = a.batches(), b.batches()
    digested = min(len(a.digests), len(b.digests)) if a.digests is not None and b.digests is not None else 0
    for step, (x, y) in enumerate(zip(batches_a, batches_b, strict=False)):
        if list(x) != list(y):
            return step, "ids"
        if step < digested and a.digests[step] != b.digests[step]:  # type: ignore[index]
            return step, "content"
    if len(batches_a) == len(batches_b) and sizes_a == sizes_b:
        return None  # the content that differs lies beyond the digested head (never both recorded)
    return min(len(batches_a), len(batches_b)), "steps"


def _same(x: Sequence[int], y: Sequence[int]) -> bool:
    same = same_ints(x, y)
    return same if same is not None else list(x) == list(y)


def _what(d: Divergence, a: EpochTrace, b: EpochTrace) -> str:
    if d.kind == "steps":
        return f"rank {d.first} yields {a.num_batches} batches, rank {d.other} yields {b.num_batches}"
    if d.kind == "content":
        return (
            f"the same samples with different content: batch {d.step} digests "
            f"{a.digests[d.step]:x} on rank {d.first}, {b.digests[d.step]:x} on rank {d.other}"  # type: ignore[index]
        )
    x, y = a.batches()[d.step], b.batches()[d.step]
    return f"rank {d.first} sees {ids_text(few(x, 4))}, rank {d.other} sees {ids_text(few(y, 4))}"


def _transposed(layout: Layout, run: RunTrace, epoch: int) -> bool:
    """The ranks fall into groups of identical streams as large as the mesh's replica groups, but not
    the same groups: the loader replicates along another dimension than the mesh declares."""
    streams: dict[tuple[object, ...], list[int]] = {}
    for r in run.ranks:
        if epoch < len(r.epochs):
            streams.setdefault(tuple(r.epochs[epoch].ids), []).append(r.rank)
    groups = sorted(sorted(g) for g in streams.values())
    return (
        len(groups) == layout.dp_world_size
        and all(len(g) == layout.replicas for g in groups)
        and groups != sorted(layout.replica_groups())
    )


def _mesh_cause(reference: RunTrace, run: RunTrace, layout: Layout, found: Sequence[Divergence]) -> str:
    """Name the pattern: steps only, content only, or which split of the ids."""
    kinds = {d.kind for d in found}
    if kinds == {"steps"}:
        return REPLICA_STEPS
    if kinds == {"content"}:
        return PER_RANK_RANDOM
    epoch = min(d.epoch for d in found if d.kind == "ids")
    if _transposed(layout, run, epoch):
        return LAYOUT_MISMATCH
    sets = [set(r.epochs[epoch].ids) for r in run.ranks if epoch < len(r.epochs)]
    union = set().union(*sets)
    # a sampler over the global world pads its epoch with fewer than W copies (DistributedSampler repeats
    # the first indices of its permutation): shards that share no more than that are still disjoint
    disjoint = sum(len(s) for s in sets) - len(union) < max(len(sets), 1)
    ref = (
        set(reference.ranks[0].epochs[epoch].ids)
        if reference.ranks and reference.num_epochs > epoch
        else union
    )
    if disjoint and ref and len(union & ref) >= 0.9 * len(ref):
        return GLOBAL_RANK
    # rows made per rank (packing) are not one process's rows: a shard of its own on every rank that
    # together hold as many as one process is the epoch split over the global world all the same
    if disjoint and ref and len(sets) == layout.world_size and sum(map(len, sets)) >= 0.9 * len(ref):
        return GLOBAL_RANK
    if disjoint and ref and len(union) <= 0.75 * len(ref):
        return SHARDED_TWICE_MESH
    return REPLICA_IDS
