"""batch_integrity: a custom batch sampler's batches reach the ranks whole, never re-cut.

Batch samplers that build batches on purpose (class-balanced, length-bucketed) lose their point when
DDP shards the *samples* underneath them: every rank then forms its own batches from a slice. A
seeded batch sampler forms the same batches under DDP as in one process, so batches are compared
exactly; only a run that changes between two seeded runs is judged by batch sizes alone.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from ddpcheck.checks.context import Context, batch_key, broken_reason, same_streams
from ddpcheck.checks.wording import epochs_text, ids_text
from ddpcheck.evidence import BatchShapes
from ddpcheck.trace import EpochTrace, LoaderFacts, RunTrace
from ddpcheck.verdict import BATCH_INTEGRITY, Verdict, not_applicable, passed, skipped

CAUSE = (
    "batches are split or re-formed across ranks: shard whole batches (wrap the batch sampler) instead "
    "of samples; where forming batches from each rank's own share is the design (a rank-aware batch "
    "sampler such as transformers' BatchRebalanceSampler), --allow batch_integrity"
)


def _custom(facts: LoaderFacts) -> bool:
    """Recording decides by behaviour (``checker.recording.plain_batching``): a batch sampler that
    only chunks its sampler into ``batch_size`` batches is plain, whatever its class."""
    return facts.batch_level


def _keys(trace: EpochTrace) -> set[tuple[Hashable, ...]]:
    return {batch_key(b) for b in trace.batches()}


def check_batch_integrity(
    reference: RunTrace, run: RunTrace, rerun: RunTrace | None = None, *, ctx: Context | None = None
) -> Verdict:
    ctx = ctx or Context(reference, run, rerun)
    if ctx.unjudgeable:
        return skipped(BATCH_INTEGRITY, ctx.unjudgeable)
    if not any(_custom(r.facts) for r in reference.ranks):
        if reference.ranks and reference.ranks[0].facts.dataset_kind == "iterable":
            return not_applicable(
                BATCH_INTEGRITY,
                "an iterable dataset has no batch sampler (no custom batch structure to preserve)",
            )
        return not_applicable(
            BATCH_INTEGRITY,
            "the single-process loader's batch sampler only chunks its sampler into batches "
            "(no custom batch structure to preserve)",
        )
    ref_epochs = reference.ranks[0].epochs[: ctx.num_epochs]
    per_rank = next((r.facts.per_rank_batches for r in run.ranks if r.facts.per_rank_batches), "")
    if per_rank and ctx.world_size > 1:
        return _grouped_per_rank(run, ref_epochs, per_rank, ctx.num_epochs)
    ref_keys = [_keys(t) for t in ref_epochs]
    random_run = rerun is not None and not broken_reason(rerun, "") and not same_streams(run, rerun)
    every = set().union(*ref_keys)
    sizes = {size for t in ref_epochs for size in t.batch_sizes}
    bad: list[tuple[int, int, tuple[Hashable, ...], int]] = []  # (epoch, rank, example batch, how many)
    sizes_only = False
    for e in range(ctx.num_epochs):
        for r, trace in enumerate(run.epoch(e)):
            foreign = [k for k in map(batch_key, trace.batches()) if k not in ref_keys[e]]
            if foreign and random_run:  # batches drawn afresh each run: judge their sizes only
                foreign = [k for k in foreign if k not in every]
                if foreign and all(len(k) in sizes for k in foreign):
                    sizes_only = True
                    foreign = []
            if foreign:
                bad.append((e, r, foreign[0], len(foreign)))
    if bad:
        e, r, example, _ = bad[0]
        ranks = tuple(sorted({b[1] for b in bad}))
        epochs = tuple(sorted({b[0] for b in bad}))
        total = sum(b[3] for b in bad)
        detail = (
            f"rank {r} yields a batch the single-process loader never forms in epoch {e}: "
            f"[{ids_text(example[:8])}{', ...' if len(example) > 8 else ''}] "
            f"({total} such batches on {len(ranks)} ranks, {epochs_text(list(epochs))})"
        )
        return Verdict(
            BATCH_INTEGRITY,
            "fail",
            detail,
            CAUSE,
            ranks[:8],
            epochs,
            (example,),
            BatchShapes(foreign_batches=total, ranks_affected=len(ranks)),
        )
    if sizes_only:
        return passed(
            BATCH_INTEGRITY,
            "batches change from run to run (see determinism), so only their sizes were compared "
            "with the single-process loader's; they match",
        )
    return passed(BATCH_INTEGRITY, "every rank's batches are whole batches of the single-process loader")


def _grouped_per_rank(run: RunTrace, ref_epochs: Sequence[EpochTrace], per_rank: str, epochs: int) -> Verdict:
    """A batch sampler that groups each rank's share forms other batches than one process by design;
    what still holds is that no batch outgrows the largest one the single process forms."""
    largest = max((size for t in ref_epochs for size in t.batch_sizes), default=0)
    for e in range(epochs):
        for r, trace in enumerate(run.epoch(e)):
            over = [size for size in trace.batch_sizes if size > largest]
            if over:
                detail = (
                    f"rank {r} yields a batch of {over[0]} samples in epoch {e}; one process never "
                    f"forms more than {largest} ({per_rank})"
                )
                cause = "batches grow under DDP: the batch size is not per rank"
                return Verdict(
                    BATCH_INTEGRITY, "fail", detail, cause, (r,), (e,), (), BatchShapes(largest=largest)
                )
    return passed(
        BATCH_INTEGRITY,
        f"batches are formed within each rank's share by {per_rank} (the grouping pattern of mmdet's "
        "AspectRatioBatchSampler and torchvision's GroupedBatchSampler), so they differ from one "
        f"process's by design; none is larger than one process's largest ({largest})",
    )
