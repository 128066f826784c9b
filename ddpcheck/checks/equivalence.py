"""single_process_equivalence: the ranks together see exactly what one process sees.

``coverage`` only asks that nothing goes missing; this also refuses anything the single-process
loader never yields, which is how a dataset that builds itself from the rank gives itself away.
"""

from __future__ import annotations

from ddpcheck.checks.context import Context, EpochView
from ddpcheck.checks.coverage import drop_text, gap, missing_examples
from ddpcheck.checks.diagnose import missing_cause, reference_share, split_cause
from ddpcheck.checks.packed import packed_equivalence
from ddpcheck.checks.tally import Strangers
from ddpcheck.checks.wording import epochs_text, ids_text
from ddpcheck.evidence import ForeignSamples, MissingSamples
from ddpcheck.messages import count_text
from ddpcheck.trace import RunTrace
from ddpcheck.verdict import SINGLE_PROCESS_EQUIVALENCE as CHECK
from ddpcheck.verdict import Verdict, passed, skipped

DEPENDS_ON_RANK = "the dataset depends on the rank: under DDP it yields samples a single process never does"


def _index_limit(ctx: Context) -> int | None:
    """The dataset's length when an id in ``[0, length)`` could be one of its indices (else None)."""
    n = ctx.ref_facts.dataset_len
    if ctx.reference.id_source == "index" and n is not None and not ctx.batch_level:
        return n
    return None


def _extras(ctx: Context, view: EpochView) -> Strangers:
    """Items no rank should see; a resampling reference is judged against all its epochs together."""
    if not view.extras_count:  # counted without building the set: the passing path
        return Strangers(0, (), ())
    also: list[EpochView] = []
    indices = None
    if not ctx.stable:
        also, indices = ctx.views(), _index_limit(ctx)
    if ctx.ref_facts.drop_last:
        # The single process dropped its own last partial batch: a dataset index it never reached is no
        # stranger (DistributedSampler's padding moves another index into a full batch). Ids outside the
        # dataset, or not indices at all, still are.
        indices = _index_limit(ctx)
    return view.strangers(also, indices)


def check_single_process_equivalence(
    reference: RunTrace, run: RunTrace, rerun: RunTrace | None = None, *, ctx: Context | None = None
) -> Verdict:
    ctx = ctx or Context(reference, run, rerun)
    if ctx.unjudgeable:
        return skipped(CHECK, ctx.unjudgeable)
    on_tokens = packed_equivalence(ctx)  # rows packed per rank: judged on the tokens they hold
    if on_tokens is not None:
        return on_tokens
    noun = ctx.noun
    views = ctx.views()
    strangers = [(v, _extras(ctx, v)) for v in views]
    bad = [(v, x) for v, x in strangers if x.count]
    if bad:
        view, extra = bad[0]
        ranks = extra.ranks
        rank = ranks[0]
        examples = extra.examples
        more = f" (also {epochs_text([v.epoch for v, _ in bad[1:]])})" if len(bad) > 1 else ""
        detail = (
            f"rank {rank} sees ids the single-process loader never yields: {ids_text(examples)} "
            f"({count_text(extra.count, noun)} in epoch {view.epoch}{more})"
        )
        return Verdict(
            CHECK,
            "fail",
            detail,
            reference_share(ctx) or split_cause(ctx) or DEPENDS_ON_RANK,
            ranks[:8],
            tuple(v.epoch for v, _ in bad),
            examples,
            ForeignSamples(extra.count, len(bad)),
        )
    gaps = [gap(ctx, v) for v in views]
    short = [g for g in gaps if not g.ok]
    if short:
        g = short[0]
        view = ctx.view(g.epoch)
        examples = () if g.counted_only else missing_examples(view)
        more = f" (also {epochs_text([s.epoch for s in short[1:]])})" if len(short) > 1 else ""
        n = len(view.ref_items)
        detail = (
            f"the ranks together see {n - g.missing} of the {n} {noun} of single-process epoch {g.epoch}"
            f"{more} ({drop_text(ctx, view, noun)})"
            + (f"; never seen: {ids_text(examples)}" if examples else "")
        )
        return Verdict(
            CHECK,
            "fail",
            detail,
            missing_cause(ctx, view, g.allowed),
            (),
            tuple(s.epoch for s in short),
            examples,
            MissingSamples(g.missing, g.allowed, n, len(short)),
        )
    n = len(views[0].ref_items)
    distinct = views[0].ref_distinct
    # the ids, not their counts: extra copies are padding_bound's and no_overlap's to judge
    size = f"{n} {noun}" if distinct == n else f"{n} {noun}, {distinct} distinct: every one of them"
    dropped = max(g.missing for g in gaps)
    return passed(
        CHECK,
        f"the ranks together see the single-process epoch ({size}, at most {dropped} dropped, "
        f"nothing extra) in all {len(views)} epochs",
    )
