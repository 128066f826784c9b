"""coverage: every item of the single-process epoch reaches some rank, up to the documented drops."""

from __future__ import annotations

from dataclasses import dataclass

from ddpcheck.checks.context import Context, EpochView
from ddpcheck.checks.diagnose import missing_cause, reference_share
from ddpcheck.checks.packed import packed_coverage
from ddpcheck.checks.ranges import OVERFLOW, OVERFLOW_FIX, Overflow, find_overflow
from ddpcheck.checks.wording import epochs_text, few, ids_text, ranks_text
from ddpcheck.evidence import IndexOverflow, MissingSamples, ReferenceShare
from ddpcheck.messages import count_text
from ddpcheck.trace import RunTrace
from ddpcheck.verdict import COVERAGE, Verdict, passed, skipped


@dataclass(frozen=True)
class Gap:
    """One epoch's shortfall: ``missing`` items against ``allowed`` drops."""

    epoch: int
    missing: int
    allowed: int
    counted_only: bool = False  # the reference changes its items every epoch: only counts compared

    @property
    def ok(self) -> bool:
        return self.missing <= self.allowed


def gap(ctx: Context, view: EpochView) -> Gap:
    """Missing items in one epoch; falls back to counts when the reference resamples every epoch.

    A reference that draws a different subset each epoch (a random subset, sampling with replacement)
    gives no fixed id set to demand, so there only the number of items is held against the bound.
    """
    allowed = ctx.allowance(view).missing
    missing = view.missing_count
    if missing > allowed and not ctx.stable:
        return Gap(view.epoch, max(0, len(view.ref_items) - view.total), allowed, counted_only=True)
    return Gap(view.epoch, missing, allowed)


def drop_text(ctx: Context, view: EpochView, noun: str) -> str:
    """What an honest split may drop in an epoch, and why, in plain words (the bound a failure broke)."""
    allowance = ctx.allowance(view)
    if allowance.missing == 0:
        return f"an honest split drops no {noun} here (no drop_last, and the sampler pads)"
    why = []
    if allowance.loader_drop:
        per_rank = allowance.loader_drop // max(ctx.world_size, 1)
        why.append(f"drop_last drops up to {per_rank} (batch_size - 1) on each rank")
    if allowance.sampler_drop:
        why.append(f"an even split without padding drops up to {allowance.sampler_drop} (world size - 1)")
    return f"an honest split drops at most {count_text(allowance.missing, noun)} an epoch: {'; '.join(why)}"


def missing_examples(view: EpochView) -> tuple[object, ...]:
    return view.missing_examples()


def overflow_verdict(found: Overflow) -> Verdict:
    """``coverage`` failed by an index outside the dataset: the first bad position, named."""
    more = f" on {ranks_text(found.ranks)}" if len(found.ranks) > 1 else ""
    where = f"at position {found.position:,} of epoch {found.epoch}"
    detail = (
        f"rank {found.rank} yields index {found.value} {where}, outside the dataset's {found.limit:,} "
        f"samples ({found.what()}); {count_text(found.count, 'such ids')} in epoch {found.epoch}{more}, "
        "so the samples they should name reach no rank"
    )
    evidence = IndexOverflow(
        found.rank, found.epoch, found.position, found.value, found.count, found.negative, found.limit
    )
    return Verdict(
        COVERAGE,
        "fail",
        detail,
        OVERFLOW,
        found.ranks[:8],
        (found.epoch,),
        (found.value,),
        evidence,
        OVERFLOW_FIX,
    )


def check_coverage(
    reference: RunTrace, run: RunTrace, rerun: RunTrace | None = None, *, ctx: Context | None = None
) -> Verdict:
    ctx = ctx or Context(reference, run, rerun)
    if ctx.unjudgeable:
        return skipped(COVERAGE, ctx.unjudgeable)
    overflow = find_overflow(run)  # held against the dataset's length: no reference needed
    if overflow is not None:
        return overflow_verdict(overflow)
    on_tokens = packed_coverage(ctx)  # rows packed per rank: their boundaries differ, their tokens may not
    if on_tokens is not None:
        return on_tokens
    share = reference_share(ctx) if ctx.world_size == 1 else ""
    if share:
        return _part_of_dataset(ctx, share)
    gaps = [gap(ctx, v) for v in ctx.views()]
    bad = [g for g in gaps if not g.ok]
    noun = ctx.noun
    if not bad:
        worst = max(g.missing for g in gaps)
        n = len(ctx.view(0).ref_items)
        resampled = any(g.counted_only for g in gaps)
        counted = " (counts only: the reference resamples every epoch)" if resampled else ""
        distinct = ctx.view(0).ref_distinct
        size = f"{n} per epoch" if distinct == n else f"{n} per epoch, {distinct} distinct"
        return passed(
            COVERAGE,
            f"every epoch's {noun} reach some rank ({size}, at most {worst} dropped, "
            f"{gaps[0].allowed} allowed){counted}",
        )
    g = bad[0]
    view = ctx.view(g.epoch)
    examples = () if g.counted_only else missing_examples(view)
    more = f" (also {epochs_text([b.epoch for b in bad[1:]])})" if len(bad) > 1 else ""
    n = len(view.ref_items)
    if g.counted_only:
        detail = (
            f"the ranks together yield {view.total} {noun} in epoch {g.epoch}{more}, {g.missing} fewer than "
            f"the single process's {n}; {drop_text(ctx, view, noun)}"
        )
    else:
        detail = (
            f"{count_text(g.missing, noun)} of {n} are never seen by any rank in epoch {g.epoch}{more} "
            f"({drop_text(ctx, view, noun)})" + (f"; never seen: {ids_text(examples)}" if examples else "")
        )
    return Verdict(
        COVERAGE,
        "fail",
        detail,
        missing_cause(ctx, view, g.allowed),
        (),
        tuple(b.epoch for b in bad),
        examples,
        MissingSamples(g.missing, g.allowed, n, len(bad)),
    )


def _part_of_dataset(ctx: Context, cause: str) -> Verdict:
    """One process, whose sampler splits among several ranks, trains on part of its dataset every epoch."""
    views = ctx.views()
    size = ctx.ref_facts.dataset_len
    seen = views[0].ref_distinct
    of = f" of its dataset's {size}" if size is not None else ""
    examples: tuple[object, ...] = ()
    if size is not None and size <= 10**7:
        examples = few(i for i in range(size) if i not in views[0].ref_set)
    detail = (
        f"one process receives {seen}{of} samples per epoch, in all {count_text(len(views), 'epochs')}"
        + (f"; never seen: {ids_text(examples)}" if examples else "")
    )
    evidence = ReferenceShare(seen, size or seen, ctx.ref_facts.sampler_replicas or 0)
    return Verdict(COVERAGE, "fail", detail, cause, (), tuple(v.epoch for v in views), examples, evidence)
