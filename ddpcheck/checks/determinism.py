"""determinism: two runs with the same seed give every rank the same stream, batch for batch.

Without this, a crashed job cannot resume where it stopped and no result can be reproduced.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from ddpcheck.checks.context import Context, batch_key, broken_reason, paired_ranks, same_sequence
from ddpcheck.checks.tally import first_difference, int_ids
from ddpcheck.evidence import RunsDiffer
from ddpcheck.trace import EpochTrace, RunTrace
from ddpcheck.verdict import DETERMINISM, Verdict, passed, skipped

CAUSE = "the order changes from run to run: an unseeded generator or per-process random state"


def _first_difference(a: Sequence[Hashable], b: Sequence[Hashable]) -> int:
    if int_ids(a) and int_ids(b):
        return first_difference(a, b)
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def _plain(item: Hashable) -> Hashable:
    """An id as the report shows it: a numpy integer as a Python int."""
    kind = getattr(getattr(item, "dtype", None), "kind", "")
    return int(item) if kind and kind in "iu" else item  # type: ignore[call-overload]


def _describe(a: Sequence[Hashable], b: Sequence[Hashable], pos: int) -> str:
    said = str(_plain(a[pos])) if pos < len(a) else "nothing more"
    then = str(_plain(b[pos])) if pos < len(b) else "nothing more"
    return f"the run yields {said}, the rerun {then}"


def _batch_multiset(trace: EpochTrace) -> list[tuple[Hashable, ...]]:
    return sorted((batch_key(b) for b in trace.batches()), key=repr)


def _compare(
    one: EpochTrace, two: EpochTrace, ordered: bool = True
) -> tuple[str, int, tuple[object, ...]] | None:
    """Where two recordings of one rank's epoch part ways: (what, position, example ids).

    ``ordered`` False (``DataLoader(in_order=False)``): batches may arrive in any order by design,
    so the rank's batches are compared as a multiset.
    """
    if not ordered:
        a, b = _batch_multiset(one), _batch_multiset(two)
        if a == b:
            return None
        extra = sorted(set(a) - set(b), key=repr)[:1] or sorted(set(b) - set(a), key=repr)[:1]
        shown = tuple(extra[0][:5]) if extra else ()
        return "its set of batches (in_order=False: order is free, contents are not)", 0, shown
    if not same_sequence(one.ids, two.ids):
        pos = _first_difference(one.ids, two.ids)
        shown = tuple(_plain(x[pos]) for x in (one.ids, two.ids) if pos < len(x))
        return f"position {pos}: {_describe(one.ids, two.ids, pos)}", pos, shown
    if not same_sequence(one.batch_sizes, two.batch_sizes):
        pos = _first_difference(one.batch_sizes, two.batch_sizes)
        return f"batch {pos}: {_describe(one.batch_sizes, two.batch_sizes, pos)} ids in it", pos, ()
    return None


def check_determinism(
    reference: RunTrace, run: RunTrace, rerun: RunTrace | None = None, *, ctx: Context | None = None
) -> Verdict:
    ctx = ctx or Context(reference, run, rerun)
    if ctx.unjudgeable:
        return skipped(DETERMINISM, ctx.unjudgeable)
    if rerun is None:
        return skipped(
            DETERMINISM, "no second run with the same seed was recorded, so there is nothing to compare"
        )
    why = broken_reason(rerun, "the rerun")
    if why:
        return skipped(DETERMINISM, why)
    epochs = min(run.num_epochs, rerun.num_epochs)
    ordered = ctx.facts.in_order
    pairs = paired_ranks(run, rerun)
    for e in range(epochs):
        for one, two in pairs:
            found = _compare(one.epochs[e], two.epochs[e], ordered)
            if found is None:
                continue
            where, pos, examples = found
            r = one.rank
            differing = sum(1 for a, b in pairs if _compare(a.epochs[e], b.epochs[e], ordered) is not None)
            detail = f"rank {r}, epoch {e} differs between two runs with the same seed at {where}"
            if differing > 1:
                sampled = "sampled " if rerun.rank_sample else ""
                detail += f" ({differing} of {len(pairs)} {sampled}ranks differ)"
            return Verdict(
                DETERMINISM,
                "fail",
                detail,
                CAUSE,
                (r,),
                (e,),
                examples,
                RunsDiffer(r, e, pos, differing),
            )
    how = "exactly" if ordered else "batch for batch (in any order: in_order=False)"
    ranks = f"{run.world_size} ranks"
    if rerun.rank_sample:
        ranks = _sample_text(rerun.rank_sample, run.world_size)
    return passed(DETERMINISM, f"{ranks} x {epochs} epochs repeat {how} in a second run")


def _sample_text(sample: Sequence[int], world_size: int) -> str:
    """How a sampled rerun is described: it checks these ranks, not all of them (the report says so)."""
    return (
        f"a sample of {len(sample)} of {world_size} simulated ranks (the first, the last and evenly spaced "
        f"ones between; rerunning all would double the run)"
    )
