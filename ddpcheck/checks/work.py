"""``work_balance`` and ``packing``: the data bugs of language-model training, judged from what each rank
measured as its batches passed (``ddpcheck.checker.work``).

Work balance. A step lasts as long as its slowest rank. The *idle fraction* of an epoch is the share of
rank-steps spent waiting for the slowest rank, if time follows work: ``sum(max_s - w_rs) / (W * sum
max_s)`` over steps ``s`` and ranks ``r`` (a step a rank lacks counts as 0 work). Random batching of
variable-length data idles by chance too, so the check compares with that chance: the epoch's documents
re-dealt at random into the same (rank, step) slots, each slot keeping its number of documents (a
``batch_work`` hook gives one number per batch: then whole batches are re-dealt). The imbalance is
*systematic* when the observed idle fraction exceeds the 99th percentile of that re-dealing in every
recorded epoch; a single epoch above it happens about once in a hundred by chance. ``--max-idle``
adds an absolute limit. Which rank is the slowest, step by step, is reported, not judged: a sampler
that sorts each step's batches (transformers' ``group_by_length``) always makes rank 0 the slowest and
still idles less than random batching.

Packing. Batches with ``position_ids``: positions must restart at 0 at every document boundary that the
metadata names (``cu_seqlens``, ``cu_seq_lens_q``/``_k``, ``seq_idx``, ``seq_lens``, a document-id field),
the sources must agree with each other and with the positions, a document cut by a row end must carry its
positions on (a cut whose positions restart is not declared), and with a ``token_ids(batch)`` hook every
token of the single-process epoch must reach a data-parallel rank and no other token may appear.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ddpcheck.checks.context import Context
from ddpcheck.evidence import PackingCounts, WorkBalance
from ddpcheck.messages import count_text
from ddpcheck.trace import PADDED_WIDTH, EpochTrace, PackingTally, RunTrace
from ddpcheck.verdict import PACKING, PASS, WORK_BALANCE, Verdict, not_applicable, skipped

QUANTILE = 0.99
MAX_DRAWS = 200
FIRST_DRAWS = 25  # most epochs are decided after these: the observed idle is below several draws
SLOWEST_SHARE = 0.9  # one rank the slowest in this share of steps, every epoch: a fixed, ordered share

NO_WORK = (
    "batches carry no tokens (input_ids, attention_mask, position_ids) and the file defines no "
    "batch_work(batch): every sample counts the same, balanced when the steps are"
)
SORTED_SHARDS = (
    "one rank is the slowest in nearly every step, every epoch: each rank holds a fixed, ordered share "
    "of the data (contiguous shards of a length-sorted dataset)"
)
BUCKETS_PER_RANK = (
    "each step's batches are unlike each other though each rank's are alike: length buckets chosen on "
    "each rank separately (every rank picks its own bucket per step)"
)
TOKEN_BUDGET_PER_RANK = (
    "the ranks form different numbers of batches: a batch sampler that packs by tokens on each rank "
    "separately"
)
OVER_LIMIT = "the ranks would wait longer than the --max-idle limit allows"
PADDING_UNKNOWN = (
    "the work could not be measured: the batches' input_ids are padded to each batch's longest row, and "
    "nothing says which tokens are padding (no attention_mask, no pad token named by the collate "
    "function or the tokenizer, no labels -100 at the rows' tails), so every row would count as long as "
    "its batch's longest; return an attention_mask with the batch, or define batch_work(batch)"
)
WORK_FIXES = {
    SORTED_SHARDS: "shuffle before sharding (DistributedSampler(shuffle=True)), or deal sorted batches "
    "round-robin so every rank gets long and short ones",
    BUCKETS_PER_RANK: "choose the bucket once per step for every rank (lhotse: sync_buckets=True; a shared "
    "seed for the bucket choice)",
    TOKEN_BUDGET_PER_RANK: "form token-budget batches once over the global order and deal them to ranks, "
    "or agree on the step count",
    OVER_LIMIT: "balance the work per step across ranks (a token-aware batch sampler over the global "
    "order), or raise --max-idle",
}

POSITIONS_NOT_RESET = (
    "positions do not restart at document boundaries: attention and position embeddings run across "
    "packed documents"
)
METADATA_DISAGREE = (
    "the packing metadata disagree: the boundaries named by cu_seqlens / seq_idx / document ids and the "
    "position resets are not the same"
)
POSITION_JUMPS = "positions jump inside a document (neither +1 nor a restart at 0)"
MIXED_SEGMENTS = "a packed segment holds tokens of several documents: attention leaks across documents"
UNDECLARED_CUT = (
    "documents are cut into pieces whose positions restart at 0: the cut is not declared, so each piece "
    "trains as a document of its own (TRL's bfd_split does this by design: --allow packing if meant)"
)
PACKED_PER_RANK = (
    "the packed tokens differ from the single-process epoch's: packing runs on each rank's shard (and "
    "drops what does not fit), so tokens are lost or formed differently per world size"
)
PACKING_FIXES = {
    POSITIONS_NOT_RESET: "restart position_ids at 0 at every document start (and continue them across a "
    "declared cut)",
    METADATA_DISAGREE: "derive cu_seqlens / seq_idx from the same document starts as position_ids",
    POSITION_JUMPS: "give each document consecutive positions",
    MIXED_SEGMENTS: "start a new segment (a cu_seqlens boundary) at every document start",
    UNDECLARED_CUT: "continue a cut document's positions in the next row, or keep documents whole",
    PACKED_PER_RANK: "pack once, before sharding, and shard the packed rows",
}


# ----------------------------------------------------------------------------- work balance


def step_matrix(run: RunTrace, epoch: int) -> list[list[float]]:
    """Per step, each rank's work in ``epoch`` (0 for a step a rank lacks)."""
    per_rank = [_totals(r.epochs[epoch]) if epoch < len(r.epochs) else [] for r in run.ranks]
    steps = max((len(w) for w in per_rank), default=0)
    return [[w[s] if s < len(w) else 0.0 for w in per_rank] for s in range(steps)]


def _totals(epoch: EpochTrace) -> list[float]:
    return [float(sum(units)) for units in (epoch.work or ())]


def idle_fraction(matrix: Sequence[Sequence[float]]) -> float:
    """The share of rank-steps spent waiting for each step's slowest rank (time following work)."""
    if not matrix:
        return 0.0
    width = len(matrix[0])
    busiest = sum(max(row) for row in matrix)
    if busiest <= 0 or width == 0:
        return 0.0
    return sum(max(row) - w for row in matrix for w in row) / (width * busiest)


def redealt_idle(run: RunTrace, epoch: int, observed: float, seed: int) -> tuple[float, int]:
    """The 99th percentile of the idle fraction when the epoch's documents are re-dealt at random into the
    same slots (each keeps its number of documents), and the draws made. Stops early when the observed
    idle is clearly inside the chance range (several of the first draws are at least as high)."""
    import numpy as np

    units: list[float] = []
    counts: list[int] = []
    slots: list[tuple[int, int]] = []
    for r, rank in enumerate(run.ranks):
        trace = rank.epochs[epoch] if epoch < len(rank.epochs) else None
        for s, batch in enumerate((trace.work or ()) if trace is not None else ()):
            units.extend(batch)
            counts.append(len(batch))
            slots.append((s, r))
    width = len(run.ranks)
    steps = 1 + max((s for s, _ in slots), default=-1)
    if not units or steps == 0:
        return 0.0, 0
    pool = np.asarray(units, dtype=np.float64)
    sizes = np.asarray(counts, dtype=np.int64)
    filled = sizes > 0
    offsets = np.concatenate(([0], np.cumsum(sizes)[:-1]))[filled]
    rows = np.asarray([s for s, _ in slots])[filled]
    cols = np.asarray([r for _, r in slots])[filled]
    rng = np.random.default_rng(seed)
    draws: list[float] = []
    while len(draws) < MAX_DRAWS:
        for _ in range(FIRST_DRAWS):
            dealt = np.add.reduceat(rng.permutation(pool), offsets)
            matrix = np.zeros((steps, width))
            matrix[rows, cols] = dealt
            busiest = matrix.max(axis=1)
            total = busiest.sum()
            draws.append(float((busiest[:, None] - matrix).sum() / (width * total)) if total > 0 else 0.0)
        if sum(d >= observed for d in draws) >= 3:
            break
    return float(np.quantile(draws, QUANTILE)), len(draws)


def _slowest_shares(matrix: Sequence[Sequence[float]]) -> list[float]:
    """Per rank, the share of steps where it alone is the slowest."""
    if not matrix:
        return []
    width = len(matrix[0])
    wins = [0] * width
    for row in matrix:
        top = max(row)
        if top > 0 and sum(1 for w in row if w == top) == 1:
            wins[row.index(top)] += 1
    return [w / len(matrix) for w in wins]


def _seed(run: RunTrace, epoch: int) -> int:
    return zlib.crc32(f"work:{len(run.ranks)}:{epoch}".encode())


def check_work_balance(
    reference: RunTrace, run: RunTrace, rerun: RunTrace | None = None, *, ctx: Context | None = None
) -> Verdict:
    """Idle time from the work per rank and step against random batching of the same documents."""
    ctx = ctx or Context(reference, run, rerun)
    if ctx.unjudgeable:
        return skipped(WORK_BALANCE, ctx.unjudgeable)
    measured = [r for r in run.ranks if r.epochs and all(e.work is not None for e in r.epochs)]
    if not run.ranks or len(measured) != len(run.ranks):
        return not_applicable(WORK_BALANCE, NO_WORK)
    source = run.ranks[0].facts.work or "tokens"
    epochs = min(len(r.epochs) for r in run.ranks)
    if len(run.ranks) == 1:
        total = sum(sum(_totals(e)) for e in run.ranks[0].epochs[:epochs])
        return not_applicable(
            WORK_BALANCE,
            f"one data-parallel rank waits for no one ({_num(total)} of work from {source} over "
            f"{count_text(epochs, 'epochs')})",
        )
    if padded_widths(run):
        return skipped(WORK_BALANCE, PADDING_UNKNOWN)
    idle, chance, draws, totals, shares, supervised = [], [], [], [], [], []
    for epoch in range(epochs):
        matrix = step_matrix(run, epoch)
        observed = idle_fraction(matrix)
        p99, n = redealt_idle(run, epoch, observed, _seed(run, epoch))
        idle.append(round(observed, 4))
        chance.append(round(p99, 4))
        draws.append(n)
        totals.append([_num(sum(_totals(r.epochs[epoch]))) for r in run.ranks])
        shares.append([round(x, 3) for x in _slowest_shares(matrix)])
        counted = [r.epochs[epoch].supervised for r in run.ranks]
        supervised.append(
            [int(sum(c or ())) for c in counted] if all(c is not None for c in counted) else None
        )
    steps = tuple(tuple(len(r.epochs[e].batch_sizes) for r in run.ranks) for e in range(epochs))
    balance = WorkBalance(
        source,
        tuple(idle),
        tuple(chance),
        tuple(draws),
        tuple(tuple(t) for t in totals),
        tuple(tuple(s) for s in shares),
        tuple(tuple(s) if s is not None else None for s in supervised),
        steps,
    )
    shown = ", ".join(f"{x:.0%}" for x in idle)
    baseline = ", ".join(f"{x:.0%}" for x in chance)
    rank_text = "/".join(str(t) for t in totals[0])
    summary = (
        f"idle {shown} of rank-steps by epoch (random batching of the same data: 99th percentile "
        f"{baseline}); epoch 0 work per rank {rank_text} ({source})"
    )
    ordered = _ordered_rank(shares)
    if ordered is not None:
        summary += (
            f"; rank {ordered} is the slowest in {min(s[ordered] for s in shares):.0%} of steps or more, "
            "every epoch"
        )
    if all(i > c for i, c in zip(idle, chance, strict=True)):
        if any(len(set(c)) > 1 for c in steps):
            cause = TOKEN_BUDGET_PER_RANK
        elif ordered is not None:
            cause = SORTED_SHARDS
        else:
            cause = BUCKETS_PER_RANK
        detail = f"the ranks wait systematically: {summary}"
        epochs_seen = tuple(range(epochs))
        return Verdict(
            WORK_BALANCE, "fail", detail, cause, epochs=epochs_seen, evidence=balance, fix=WORK_FIXES[cause]
        )
    return Verdict(WORK_BALANCE, "pass", summary, evidence=balance)


def padded_widths(run: RunTrace) -> bool:
    """The work was read off padded widths: measured from ``input_ids`` whose padding nothing tells (a
    training script's recorder names no source: its batches show the same signature), every batch of
    several rows has one length on every row, and those lengths differ between batches. A batch padded
    to its longest row looks so; fixed-length blocks (the same width everywhere) are real work."""
    source = run.ranks[0].facts.work if run.ranks else ""
    if source not in (PADDED_WIDTH, ""):
        return False
    widths: set[float] = set()
    for rank in run.ranks:
        for epoch in rank.epochs:
            for units in epoch.work or ():
                if len(units) > 1:
                    if len(set(units)) > 1:
                        return False  # rows of one batch differ: real lengths, not a padded width
                    widths.add(units[0])
    return len(widths) > 1


def _ordered_rank(shares: Sequence[Sequence[float]]) -> int | None:
    """The rank that is the slowest in nearly every step of every epoch, if one is."""
    if not shares or not shares[0]:
        return None
    first = max(range(len(shares[0])), key=lambda r: shares[0][r])
    return first if all(s[first] >= SLOWEST_SHARE for s in shares) else None


def with_max_idle(verdict: Verdict, max_idle: float | None) -> Verdict:
    """``work_balance`` failed also when an epoch's idle fraction exceeds the user's limit."""
    balance = verdict.evidence
    if max_idle is None or verdict.check != WORK_BALANCE or verdict.status != PASS:
        return verdict
    idle = [float(x) for x in balance.idle] if isinstance(balance, WorkBalance) else []
    if not idle or max(idle) <= max_idle:
        return verdict
    detail = f"idle {max(idle):.0%} exceeds --max-idle {max_idle:.0%}: {verdict.detail}"
    return replace(verdict, status="fail", detail=detail, cause=OVER_LIMIT, fix=WORK_FIXES[OVER_LIMIT])


def _num(value: float) -> int | float:
    return int(value) if float(value).is_integer() else round(value, 2)


# ----------------------------------------------------------------------------- packing


def _tallies(run: RunTrace) -> list[PackingTally]:
    return [e.packing for r in run.ranks for e in r.epochs if e.packing is not None]


def _tokens(run: RunTrace, epoch: int) -> set[tuple[Any, int]] | None:
    out: set[tuple[Any, int]] = set()
    for rank in run.ranks:
        tally = rank.epochs[epoch].packing if epoch < len(rank.epochs) else None
        if tally is None or tally.runs is None:
            return None
        for doc, first, length in tally.runs:
            out.update((doc, first + k) for k in range(length))
    return out


def _packing_problems(total: PackingTally) -> list[tuple[str, str]]:
    """What the tally of every batch's segments says is wrong: (cause, what was counted) each."""
    problems = []
    if total.no_reset:
        problems.append(
            (POSITIONS_NOT_RESET, f"{count_text(total.no_reset, 'document boundaries')} without a reset")
        )
    if total.disagree or total.reset_inside:
        problems.append(
            (
                METADATA_DISAGREE,
                f"{count_text(total.disagree, 'batches')} whose sources disagree, "
                f"{count_text(total.reset_inside, 'resets')} inside a segment",
            )
        )
    if total.jumps:
        problems.append((POSITION_JUMPS, count_text(total.jumps, "position jumps")))
    if total.mixed:
        problems.append((MIXED_SEGMENTS, count_text(total.mixed, "segments") + " mixing documents"))
    if total.cut_restarted:
        problems.append(
            (UNDECLARED_CUT, count_text(total.cut_restarted, "cut documents") + " restart positions")
        )
    return problems


TokenCounts = tuple[int | None, int | None]  # tokens lost, unexpected over the epochs compared (None: none)


def _token_coverage(reference: RunTrace, run: RunTrace) -> tuple[tuple[str, str] | str, TokenCounts]:
    """Every token of each single-process epoch reaches exactly the ranks' tokens: the first epoch where
    not as a problem (cause, text), else what was checked ("" nothing could be); and the counts so far."""
    checked_tokens = ""
    lost_total: int | None = None
    unexpected_total: int | None = None
    epochs = min((len(r.epochs) for r in run.ranks), default=0)
    for epoch in range(min(epochs, min((len(r.epochs) for r in reference.ranks), default=0))):
        seen, expected = _tokens(run, epoch), _tokens(reference, epoch)
        if seen is None or expected is None:
            break
        lost, unexpected = len(expected - seen), len(seen - expected)
        lost_total = (lost_total or 0) + lost
        unexpected_total = (unexpected_total or 0) + unexpected
        checked_tokens = (
            f"; {count_text(len(expected), 'tokens')} of the single-process epoch each reach a rank"
        )
        if lost or unexpected:
            problem = (
                PACKED_PER_RANK,
                f"epoch {epoch}: {count_text(lost, 'tokens')} of the single-process epoch reach no rank, "
                f"{count_text(unexpected, 'tokens')} appear only here",
            )
            return problem, (lost_total, unexpected_total)
    return checked_tokens, (lost_total, unexpected_total)


def check_packing(
    reference: RunTrace, run: RunTrace, rerun: RunTrace | None = None, *, ctx: Context | None = None
) -> Verdict:
    """Positions restart at every document, the metadata agree, cuts are declared, tokens are covered."""
    ctx = ctx or Context(reference, run, rerun)
    if ctx.unjudgeable:
        return skipped(PACKING, ctx.unjudgeable)
    tallies = _tallies(run)
    if not tallies:
        return not_applicable(PACKING, "no batch carries position_ids: nothing is packed")
    total = PackingTally()
    for tally in tallies:
        total.add(tally)
    problems = _packing_problems(total)
    covered, (lost, unexpected) = _token_coverage(reference, run)
    counted = PackingCounts(
        tuple(total.sources),
        total.batches,
        total.segments,
        total.no_reset,
        total.reset_inside,
        total.disagree,
        total.jumps,
        total.mixed,
        total.cut_continued,
        total.cut_restarted,
        lost,
        unexpected,
    )
    checked_tokens = ""
    if isinstance(covered, tuple):
        problems.append(covered)
    else:
        checked_tokens = covered
    named = "+".join(total.sources) or "positions only"
    where = f"{count_text(total.segments, 'segments')} in {count_text(total.batches, 'batches')} ({named})"
    if not problems:
        cuts = (
            f", {count_text(total.cut_continued, 'cut documents')} continued" if total.cut_continued else ""
        )
        detail = f"positions restart at every document boundary: {where}{cuts}{checked_tokens}"
        return Verdict(PACKING, "pass", detail, evidence=counted)
    cause, first = problems[0]
    more = "; ".join(text for _, text in problems[1:])
    detail = f"{first}: {where}" + (f"; also {more}" if more else "")
    return Verdict(PACKING, "fail", detail, cause, evidence=counted, fix=PACKING_FIXES[cause])
