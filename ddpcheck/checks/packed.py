"""Rows packed on each rank from its own documents: ``coverage`` and ``single_process_equivalence`` on tokens.

A loader that splits documents by data-parallel rank and then packs each rank's documents into fixed
rows (torchtitan's text datasets, any ``split_dataset_by_node`` + packing pipeline) forms rows whose
boundaries differ from one process's, as they must: the rows themselves (identified by their content,
there being no other identity) can never match the single process's. What must match is the tokens:
every token of the single-process epoch reaches a data-parallel rank, once, and no other token appears.

Judged token by token where the file's ``token_ids(batch)`` names every token (``PackingTally.runs``:
``(document, first offset, length)``, as a multiset, so a document on two ranks counts twice); else by
the number of tokens, from the packed segments' lengths the ranks measured. Each rank, and the single
process, may drop its last partial row (fewer tokens than a row): that much may be lost, or appear on
the ranks only (the single process's own tail), never more.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass, replace

from ddpcheck.checks.context import Context
from ddpcheck.checks.wording import epochs_text
from ddpcheck.evidence import TokenCoverage
from ddpcheck.figures import rows_packed_per_rank
from ddpcheck.messages import count_text
from ddpcheck.trace import EpochTrace, RunTrace
from ddpcheck.verdict import COVERAGE, SINGLE_PROCESS_EQUIVALENCE, Verdict

TOKENS_LOST = (
    "documents reach no data-parallel rank: the split of documents by rank leaves some out before "
    "packing (each rank packs only what it was given)"
)
TOKENS_EXTRA = (
    "the ranks pack more tokens than one process: documents reach several data-parallel ranks (the split "
    "of documents by rank overlaps) or are made per rank"
)
PACKED_FIXES = {
    TOKENS_LOST: "split the documents once by the data-parallel rank, before packing: "
    "split_dataset_by_node(ds, rank=dp_rank, world_size=dp_world_size)",
    TOKENS_EXTRA: "split the documents once by the data-parallel rank, before packing, so each document "
    "reaches one rank: split_dataset_by_node(ds, rank=dp_rank, world_size=dp_world_size)",
}
HOW = {
    True: "compared token by token (token_ids)",
    False: "compared by token count: define token_ids(batch) to compare every token",
}


@dataclass(frozen=True)
class TokenGap:
    """One epoch over the data-parallel ranks against the single process, in tokens."""

    epoch: int
    expected: int  # tokens in the single-process epoch
    lost: int  # of those, how many no rank holds
    extra: int  # tokens beyond the single process's (copies, or tokens it never packs)
    copies: int  # of ``extra``, further copies of a token the single process holds (token by token only)
    room: int  # a partial row's worth, per rank: what a rank's (or the single process's) tail may drop
    exact: bool  # token by token; False: by count
    examples: tuple[object, ...] = ()  # (document, offset) of a few lost or extra tokens
    ranks: int = 1  # data-parallel ranks, each with a tail of its own

    @property
    def lost_allowed(self) -> int:
        return self.room * self.ranks

    @property
    def too_many(self) -> bool:
        """More than the single process's own tail could explain, or any token twice: a tail is never
        a copy of what another rank holds."""
        return self.extra > self.room or self.copies > 0


def _epochs(run: RunTrace, epoch: int) -> list[EpochTrace]:
    return [r.epochs[epoch] for r in run.ranks if epoch < len(r.epochs)]


def packed_rows(ctx: Context) -> bool:
    """The rows are packed on each rank and identified only by their content: judge tokens, not rows
    (the rule the pictures follow too: :func:`ddpcheck.figures.rows_packed_per_rank`)."""
    return rows_packed_per_rank(ctx.reference, ctx.run)


def _row_room(trace: RunTrace) -> int:
    """Tokens in a row, less one: the most a packer's tail may hold back (rows are full but the last)."""
    widest = 0
    for rank in trace.ranks:
        for e in rank.epochs:
            for units, size in zip(e.work or (), e.batch_sizes, strict=False):
                if size:
                    widest = max(widest, _segment_tokens(units, trace) // int(size))
    return max(widest - 1, 0)


def _tokens(epochs: list[EpochTrace]) -> Counter[tuple[Hashable, int]] | None:
    out: Counter[tuple[Hashable, int]] = Counter()
    for e in epochs:
        runs = e.packing.runs if e.packing is not None else None
        if runs is None:
            return None
        for doc, first, length in runs:
            out.update((doc, first + k) for k in range(length))
    return out


def _ordered(tokens: Counter[tuple[Hashable, int]]) -> tuple[object, ...]:
    try:
        return tuple(sorted(tokens))  # type: ignore[type-var]
    except TypeError:
        return tuple(sorted(tokens, key=repr))


def _segment_tokens(units: tuple[float, ...], trace: RunTrace) -> int:
    """Tokens in one batch's packed segments: their work, or its square root under --work-cost attention."""
    squared = bool(trace.ranks) and trace.ranks[0].facts.work.endswith("squared")
    return sum(round(math.sqrt(u)) if squared else round(u) for u in units)


def _count(epochs: list[EpochTrace], trace: RunTrace) -> int:
    return sum(_segment_tokens(units, trace) for e in epochs for units in e.work or ())


def token_gaps(ctx: Context) -> list[TokenGap]:
    """Every epoch both runs recorded, in tokens."""
    run, reference = ctx.run, ctx.reference
    room = max(_row_room(run), _row_room(reference))
    gaps = []
    for epoch in range(min(run.num_epochs, reference.num_epochs)):
        ranks, ref = _epochs(run, epoch), _epochs(reference, epoch)
        got, want = _tokens(ranks), _tokens(ref)
        if got is not None and want is not None:
            lost, extra = want - got, got - want
            copies = sum(n for token, n in extra.items() if token in want or n > 1)
            shown = _ordered(lost)[:5] or _ordered(extra)[:5]
            gap = TokenGap(
                epoch, want.total(), lost.total(), extra.total(), copies, room, True, shown, len(ranks)
            )
        else:
            have, expected = _count(ranks, run), _count(ref, reference)
            lost_n, extra_n = max(expected - have, 0), max(have - expected, 0)
            gap = TokenGap(epoch, expected, lost_n, extra_n, 0, room, False, (), len(ranks))
        gaps.append(gap)
    return gaps


def _lead(gaps: list[TokenGap]) -> str:
    return (
        "the rows are packed on each rank from its own documents (row boundaries differ from one "
        f"process's, as they must), so tokens are compared, not rows ({HOW[gaps[0].exact]})"
    )


def packed_coverage(ctx: Context) -> Verdict | None:
    """``coverage`` on tokens where the rows are packed per rank (None: not such a loader)."""
    if not packed_rows(ctx):
        return None
    gaps = token_gaps(ctx)
    if not gaps:
        return None
    bad = [g for g in gaps if g.lost > g.lost_allowed]
    counted = TokenCoverage(
        tokens=gaps[0].expected, exact=gaps[0].exact, tokens_lost=max(g.lost for g in gaps)
    )
    if not bad:
        worst = max(g.lost for g in gaps)
        detail = (
            f"{_lead(gaps)}: every epoch's {count_text(gaps[0].expected, 'tokens')} reach some rank "
            f"(at most {worst} lost, {gaps[0].lost_allowed} allowed: a partial row per rank)"
        )
        return Verdict(COVERAGE, "pass", detail, evidence=counted)
    g = bad[0]
    more = f" (also {epochs_text([b.epoch for b in bad[1:]])})" if len(bad) > 1 else ""
    detail = (
        f"{_lead(gaps)}: {count_text(g.lost, 'tokens')} of the single-process epoch's {g.expected} reach "
        f"no rank in epoch {g.epoch}{more}, at most {g.lost_allowed} may be lost (a partial row per rank)"
    )
    return Verdict(
        COVERAGE,
        "fail",
        detail,
        TOKENS_LOST,
        (),
        tuple(b.epoch for b in bad),
        g.examples,
        replace(counted, epochs_failing=len(bad)),
        PACKED_FIXES[TOKENS_LOST],
    )


def packed_equivalence(ctx: Context) -> Verdict | None:
    """``single_process_equivalence`` on tokens where the rows are packed per rank (None: not such a
    loader): nothing beyond the single process's tokens, nothing of them lost."""
    if not packed_rows(ctx):
        return None
    gaps = token_gaps(ctx)
    if not gaps:
        return None
    counted = TokenCoverage(
        tokens=gaps[0].expected,
        exact=gaps[0].exact,
        tokens_extra=max(g.extra for g in gaps),
        tokens_lost=max(g.lost for g in gaps),
    )
    extra = [g for g in gaps if g.too_many]
    short = [g for g in gaps if g.lost > g.lost_allowed]
    if not extra and not short:
        detail = (
            f"{_lead(gaps)}: the ranks together hold the single-process epoch's "
            f"{count_text(gaps[0].expected, 'tokens')} in all {count_text(len(gaps), 'epochs')} "
            f"(at most {max(g.lost for g in gaps)} lost, {max(g.extra for g in gaps)} extra)"
        )
        return Verdict(SINGLE_PROCESS_EQUIVALENCE, "pass", detail, evidence=counted)
    if extra:
        g, cause, bad = extra[0], TOKENS_EXTRA, extra
        said = (
            f"the ranks hold {count_text(g.extra, 'tokens')} beyond the single-process epoch's {g.expected} "
            f"in epoch {g.epoch}"
            + (
                f", {g.copies} of them copies of its tokens (a token may reach one rank only)"
                if g.copies
                else f", at most {g.room} may (one partial row)"
            )
        )
    else:
        g, cause, bad = short[0], TOKENS_LOST, short
        said = (
            f"{count_text(g.lost, 'tokens')} of the single-process epoch's {g.expected} reach no rank in "
            f"epoch {g.epoch}, at most {g.lost_allowed} may be lost (a partial row per rank)"
        )
    more = f" (also {epochs_text([b.epoch for b in bad[1:]])})" if len(bad) > 1 else ""
    return Verdict(
        SINGLE_PROCESS_EQUIVALENCE,
        "fail",
        f"{_lead(gaps)}: {said}{more}",
        cause,
        (),
        tuple(b.epoch for b in bad),
        g.examples,
        replace(counted, epochs_failing=len(bad)),
        PACKED_FIXES[cause],
    )
