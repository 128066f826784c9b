"""no_overlap and padding_bound: ranks split the epoch instead of sharing it; padding stays small.

Both measure copies beyond what the single-process epoch holds. ``no_overlap`` counts an item once
per extra *rank* that sees it and names who shares what; ``padding_bound`` counts every extra copy
(padding included) against the ``world_size - 1`` a padding sampler can add.
"""

from __future__ import annotations

from dataclasses import replace

from ddpcheck.checks.context import Context, EpochView
from ddpcheck.checks.diagnose import duplicate_cause, identical_streams, overlap_evidence
from ddpcheck.checks.wording import epochs_text, ids_text
from ddpcheck.evidence import PaddingCost, SharedSamples
from ddpcheck.messages import count_text, singular
from ddpcheck.trace import RunTrace
from ddpcheck.verdict import NO_OVERLAP, PADDING_BOUND, Verdict, passed, skipped

MAX_RANKS = 8


def _resampling(ctx: Context, view: EpochView) -> bool:
    """The reference draws with replacement and differently every epoch: repeats are expected."""
    return view.ref_counts is not None and not ctx.stable


def _overlaps(ctx: Context, view: EpochView) -> bool:
    if view.cross_excess <= ctx.allowance(view).duplicates:
        return False
    if _resampling(ctx, view):
        same = identical_streams(view)
        return bool(same) and len(view.rank_items[same[0]]) >= 2
    return True


def check_no_overlap(
    reference: RunTrace, run: RunTrace, rerun: RunTrace | None = None, *, ctx: Context | None = None
) -> Verdict:
    ctx = ctx or Context(reference, run, rerun)
    if ctx.unjudgeable:
        return skipped(NO_OVERLAP, ctx.unjudgeable)
    views = ctx.views()
    bad = [v for v in views if _overlaps(ctx, v)]
    noun = ctx.noun
    if not bad:
        pad = max(v.cross_excess for v in views)
        allowed = max(ctx.allowance(v).duplicates for v in views)
        if pad == 0:
            repeats = ctx.repeats_note()
            if repeats:
                spread = max((max(v.rank_multiplicity.values(), default=1) for v in views), default=1)
                return passed(
                    NO_OVERLAP,
                    f"{repeats}; ranks hold no more copies than that (a {singular(noun)} reaches up to "
                    f"{count_text(spread, 'ranks')}) in any of {len(views)} epochs",
                )
            return passed(
                NO_OVERLAP, f"no {singular(noun)} is seen by two ranks in any of {len(views)} epochs"
            )
        if any(_resampling(ctx, v) and v.cross_excess > allowed for v in views):
            return passed(
                NO_OVERLAP,
                f"ranks share up to {pad} {noun}, but the single-process loader samples with replacement "
                f"and differently every epoch, so repeats are expected",
            )
        return passed(NO_OVERLAP, f"ranks share only {count_text(pad, 'padding copies')} (at most {allowed})")
    view = bad[0]
    allowed = ctx.allowance(view).duplicates
    cause, group = duplicate_cause(ctx, view)
    evidence = overlap_evidence(view)
    assert evidence is not None  # an over-shared item exists whenever cross_excess > allowed
    more = f" (also {epochs_text([v.epoch for v in bad[1:]])})" if len(bad) > 1 else ""
    shown = f"{noun if len(evidence.shared) > 1 else singular(noun)} {ids_text(evidence.shared)}"
    why = "as padding" if allowed else "since the sampler does not pad"
    detail = (
        f"rank {evidence.first} and rank {evidence.second} both see {shown} "
        f"in epoch {view.epoch}{more}; {count_text(view.overlap_count, noun)} reach more than one "
        f"rank ({view.cross_excess} extra copies, at most {allowed} allowed {why})"
    )
    ranks = group[:MAX_RANKS] if group else (evidence.first, evidence.second)
    return Verdict(
        NO_OVERLAP,
        "fail",
        detail,
        cause,
        ranks,
        tuple(v.epoch for v in bad),
        evidence.shared,
        SharedSamples(view.cross_excess, allowed, view.overlap_count, len(bad)),
    )


def _extra_copies(ctx: Context, view: EpochView) -> int:
    if _resampling(ctx, view):  # no per-id truth: count the surplus over the reference instead
        return max(0, view.total - len(view.ref_items))
    return view.excess


def check_padding_bound(
    reference: RunTrace, run: RunTrace, rerun: RunTrace | None = None, *, ctx: Context | None = None
) -> Verdict:
    ctx = ctx or Context(reference, run, rerun)
    if ctx.unjudgeable:
        return skipped(PADDING_BOUND, ctx.unjudgeable)
    views = ctx.views()
    copies = [_extra_copies(ctx, v) for v in views]
    unit = ctx.facts.pad_unit
    bound = ctx.world_size * unit - 1 if ctx.facts.padding is not False else 0
    bad = [(v, c) for v, c in zip(views, copies, strict=True) if c > bound]
    # what padding costs (reports show it when it passes): the most copies in any epoch, of how many
    cost = PaddingCost(copies=max(copies), samples=views[0].ref_distinct, noun=ctx.noun)
    if not bad:
        detail = f"at most {count_text(max(copies), 'duplicated ' + ctx.noun)} per epoch (bound {bound})"
        return Verdict(PADDING_BOUND, "pass", detail, evidence=cost)
    view, extra = bad[0]
    if ctx.facts.padding is False:
        limit = "but the sampler does not pad, so none are allowed"
    else:
        limit = (
            f"but padding adds at most world_size - 1 = {bound}"
            if unit == 1
            else f"but padding whole batches of {unit} adds at most world_size * {unit} - 1 = {bound}"
        )
    more = f" (also {epochs_text([v.epoch for v, _ in bad[1:]])})" if len(bad) > 1 else ""
    detail = f"{count_text(extra, 'duplicated ' + ctx.noun)} in epoch {view.epoch}{more}, {limit}"
    cause, group = duplicate_cause(ctx, view)
    return Verdict(
        PADDING_BOUND,
        "fail",
        detail,
        cause,
        group[:MAX_RANKS],
        tuple(v.epoch for v, _ in bad),
        view.duplicated_examples(),
        replace(cost, duplicates=extra, bound=bound, epochs_failing=len(bad)),
    )
