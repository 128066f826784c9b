"""reshuffle: where one process reshuffles every epoch, DDP does too, across ranks and not only within.

A repeat is only called a bug when chance cannot explain it: with few items per rank a fresh
shuffle repeats an order often enough, so each finding carries the probability that an honest
uniform reshuffle would produce it, and only findings rarer than ``CHANCE`` fail.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ddpcheck.checks.context import Context, same_sequence
from ddpcheck.checks.tally import int_ids, unique, values_of
from ddpcheck.checks.wording import ranks_text
from ddpcheck.evidence import RepeatedOrder
from ddpcheck.messages import count_text
from ddpcheck.trace import LoaderFacts, RunTrace
from ddpcheck.verdict import RESHUFFLE, Verdict, passed, skipped

CHANCE = 1e-3  # a repeat rarer than this under an honest reshuffle is treated as a bug
REPEATS = "set_epoch is not called, or the generator is re-seeded every epoch"
NO_SET_EPOCH = "the sampler has no set_epoch, so it cannot change its order between epochs"
STALE_EPOCH = (
    "the next epoch's order is drawn before set_epoch reaches the sampler: an iterator kept across "
    "epochs (with prefetching workers) starts the next pass early; call set_epoch before that pass "
    "is drawn, or build a fresh iterator each epoch"
)
FROZEN_SHARDS = "the sample-to-rank assignment never changes: each rank only reorders its own shard"
LOOP_REPLAYS = (
    "the data loops without reshuffling: once a pass ends, the next one replays the first pass's order "
    "(a looping dataset that shuffled once, or re-seeds each pass the same)"
)
REPLAY_PROBES = 8  # first-id recurrences tried as the length of a pass
NOT_FORWARDED = (
    "the loader does not forward set_epoch to the {parts} it wraps: the training loop's set_epoch never "
    "reaches it, so it repeats its first epoch's order"
)


def evaluation_order(facts: LoaderFacts) -> str:
    """Why a repeated order is harmless here: the loop iterates the loader without gradients (an
    evaluation under ``torch.no_grad()``), so no update depends on its order; "" when it trains."""
    if facts.grad_enabled is not False:
        return ""
    return (
        "iterated without gradients (an evaluation under torch.no_grad()): its order repeats every epoch, "
        "which changes no result"
    )


def _log_falling(n: int, k: int) -> float:
    """log of n * (n-1) * ... * (n-k+1): the number of ordered draws of k items out of n."""
    k = min(k, n)
    return math.lgamma(n + 1) - math.lgamma(n - k + 1)


def _log_partitions(sizes: Sequence[int]) -> float:
    """log of the number of ways to deal sum(sizes) items into piles of these sizes."""
    return math.lgamma(sum(sizes) + 1) - sum(math.lgamma(k + 1) for k in sizes)


def _trim(sizes: Sequence[int], n: int) -> list[int]:
    """Pile sizes with padding copies taken off the last piles, so they deal out exactly n items."""
    out = list(sizes)
    extra = sum(out) - n
    for i in reversed(range(len(out))):
        take = min(max(extra, 0), out[i])
        out[i] -= take
        extra -= take
    return out


def _chance_text(log_p: float) -> str:
    return f"1 in {math.exp(-log_p):,.0f}" if log_p > -50 else "practically never"


def _stale_epoch(reference: RunTrace, ctx: Context) -> Verdict | None:
    """One process repeats its epoch although its sampler says it shuffles and the loop called
    ``set_epoch``: the next epoch's order was drawn before the call reached the sampler (an iterator
    kept across epochs that prefetches, as timm's ``MultiEpochsDataLoader`` with workers does)."""
    facts = ctx.facts
    if not (facts.shuffles and facts.has_set_epoch and reference.set_epoch and facts.steps is None):
        return None
    epoch = reference.ranks[0].epochs[0]
    n = len(set(epoch.ids)) if ctx.batch_level else ctx.view(0).ref_distinct
    log_p = -_log_falling(n, len(epoch.ids))  # an honest reshuffle repeating the whole order
    if log_p >= math.log(CHANCE):
        return None
    detail = (
        f"epoch 1 repeats epoch 0 in one process ({n} {ctx.noun}, {_chance_text(log_p)} by chance), although "
        f"its {facts.sampler or 'sampler'} shuffles and set_epoch was called before each epoch"
    )
    evidence = RepeatedOrder(ranks=ctx.world_size)
    return Verdict(RESHUFFLE, "fail", detail, STALE_EPOCH, (0,), (0, 1), (), evidence)


def _stream(run: RunTrace, rank: int) -> Any:
    """One rank's windows, end to end: the continuing stream an iteration-based loop receives (an int64
    numpy array for integer ids, else a list)."""
    epochs = [e.ids for e in run.ranks[rank].epochs]
    if epochs and all(int_ids(ids) for ids in epochs):
        return np.concatenate([np.asarray(values_of(ids), np.int64) for ids in epochs])
    return [x for ids in epochs for x in ids]


def _replay(stream: Any) -> tuple[int, int] | None:
    """``(p, m)``: after a pass of ``p`` distinct ids the stream starts over in the same order, for ``m``
    ids at least (None: it never does, or its first pass was not shuffled: ascending ids replay by design)."""
    n = len(stream)
    if n < 4:
        return None
    numeric = isinstance(stream, np.ndarray)
    if numeric:
        starts = (np.flatnonzero(stream[2:] == stream[0]) + 2).tolist()
    else:
        starts = [p for p in range(2, n) if stream[p] == stream[0]]
    for p in starts[:REPLAY_PROBES]:
        m = min(n - p, p)
        head = stream[:p]
        if numeric:
            same = bool(np.array_equal(stream[p : p + m], stream[:m])) and len(unique(head)) == p
        else:
            same = list(stream[p : p + m]) == list(stream[:m]) and len(set(head)) == p
        if m >= 2 and same:
            return None if _ascending(head) else (p, m)
    return None


def _ascending(ids: Any) -> bool:
    if isinstance(ids, np.ndarray):
        return bool(np.all(ids[1:] > ids[:-1]))
    try:
        return all(a < b for a, b in itertools.pairwise(ids))
    except TypeError:
        return False


def _replayed_pass(ctx: Context) -> Verdict | None:
    """Windows of a continuing stream (``--steps``) in which some rank's data loops and replays its first
    pass in the same order, rarer than ``CHANCE`` under an honest reshuffle at every pass."""
    run = ctx.run
    if ctx.facts.steps is None or ctx.batch_level:
        return None
    found = [
        (r.rank, hit) for r in run.ranks if (hit := _replay(_stream(run, run.ranks.index(r)))) is not None
    ]
    found = [(rank, (p, m)) for rank, (p, m) in found if -_log_falling(p, m) < math.log(CHANCE)]
    if not found:
        return None
    rank, (p, m) = found[0]
    ranks = tuple(r for r, _ in found)
    where = "every rank" if len(ranks) == len(run.ranks) > 1 else ranks_text(list(ranks))
    detail = (
        f"the data loops after {count_text(p, ctx.noun)} on rank {rank} and the next pass replays the first "
        f"pass's order ({m:,} {ctx.noun} in the same order, {_chance_text(-_log_falling(p, m))} by chance; "
        f"{where})"
    )
    evidence = RepeatedOrder(pass_length=p, replayed=m, ranks=len(ranks))
    return Verdict(RESHUFFLE, "fail", detail, LOOP_REPLAYS, ranks[:8], (), (), evidence)


def check_reshuffle(
    reference: RunTrace, run: RunTrace, rerun: RunTrace | None = None, *, ctx: Context | None = None
) -> Verdict:
    ctx = ctx or Context(reference, run, rerun)
    if ctx.unjudgeable:
        return skipped(RESHUFFLE, ctx.unjudgeable)
    replayed = _replayed_pass(ctx)  # across the wrap of a looping stream, whatever the windows
    if replayed is not None:
        return replayed
    if ctx.num_epochs < 2:
        return skipped(RESHUFFLE, f"needs 2 epochs, got {ctx.num_epochs}")
    ref_epochs = reference.ranks[0].epochs
    pairs = [
        e for e in range(ctx.num_epochs - 1) if not same_sequence(ref_epochs[e].ids, ref_epochs[e + 1].ids)
    ]
    if not pairs:
        return _reference_keeps_its_order(reference, run, ctx)
    unclear: list[str] = []
    for e in pairs:
        for judge in (_repeated, _frozen):
            found = judge(ctx, run, e)
            if isinstance(found, Verdict):
                return found
            if found:
                unclear.append(found)
    detail = f"the order changes between epochs on every rank, as in one process ({len(pairs)} epoch pairs)"
    if unclear:
        detail = f"too few {ctx.noun} per rank to tell a repeat from chance: {'; '.join(unclear)}"
    if not run.set_epoch:
        detail += "; the loop did not call set_epoch" + (
            "" if unclear else ", and the order changed without it"
        )
    return passed(RESHUFFLE, detail)


def _reference_keeps_its_order(reference: RunTrace, run: RunTrace, ctx: Context) -> Verdict:
    """No epoch of the single process differs from the next: a stale epoch, or nothing to compare."""
    stale = _stale_epoch(reference, ctx)
    if stale is not None:
        return stale
    detail = "reference keeps its order (no shuffle); nothing to compare"
    if ctx.facts.shuffles is False:
        detail += f"; its {ctx.facts.sampler or 'sampler'} does not shuffle, so set_epoch changes nothing"
    elif not (run.set_epoch and reference.set_epoch) and ctx.facts.has_set_epoch:
        detail += (
            "; the loop did not call set_epoch, which this loader has, so the order may be fixed by that"
        )
    return passed(RESHUFFLE, detail)


def _repeated(ctx: Context, run: RunTrace, e: int) -> Verdict | str:
    """Epoch ``e + 1`` repeats epoch ``e`` on some rank: a failure when chance cannot explain it, else
    what was seen ("" nothing)."""
    w = ctx.world_size
    before, after = ctx.view(e), ctx.view(e + 1)
    n = max(before.ref_distinct, 1)
    sizes = [len(items) for items in after.rank_items]
    judged = [r for r in range(w) if sizes[r] >= 2]
    repeated = [r for r in judged if same_sequence(before.rank_items[r], after.rank_items[r])]
    if not repeated:
        return ""
    if len(repeated) == len(judged):  # one event: the whole epoch repeats
        log_p = -_log_falling(n, sum(sizes[r] for r in judged))
    else:  # some rank repeats by chance: at most w times any one rank's chance
        log_p = math.log(w) - min(_log_falling(n, sizes[r]) for r in repeated)
    if log_p >= math.log(CHANCE):
        return f"epoch {e + 1} repeats epoch {e} on {ranks_text(repeated)}, {_chance_text(log_p)} by chance"
    cause = REPEATS if ctx.facts.has_set_epoch or ctx.facts.dataset_kind == "iterable" else NO_SET_EPOCH
    if run.set_epoch and ctx.facts.set_epoch_unreached:
        cause = NOT_FORWARDED.format(parts=ctx.facts.set_epoch_unreached)
    if not run.set_epoch:
        cause = f"{cause} (the loop did not call set_epoch, and the order depends on it)"
    who = "every rank repeats" if len(repeated) == w else f"{ranks_text(repeated)} repeat"
    if len(repeated) == 1 < w:
        who = f"rank {repeated[0]} repeats"
    detail = (
        f"epoch {e + 1} repeats epoch {e} on rank {repeated[0]}: {REPEATS} "
        f"({who} the order; one process reshuffles)"
    )
    evidence = RepeatedOrder(repeated_ranks=len(repeated), ranks=w)
    return Verdict(RESHUFFLE, "fail", detail, cause, tuple(repeated[:8]), (e, e + 1), (), evidence)


def _frozen(ctx: Context, run: RunTrace, e: int) -> Verdict | str:
    """Every rank keeps its samples from epoch ``e`` into ``e + 1``, only reordered: a failure when
    chance cannot explain it, else what was seen ("" nothing)."""
    w = ctx.world_size
    before, after = ctx.view(e), ctx.view(e + 1)
    n = max(before.ref_distinct, 1)
    judged = [r for r in range(w) if len(after.rank_items[r]) >= 2]
    frozen = w > 1 and judged and all(before.same_rank_items(after, r) for r in range(w))
    if not frozen:
        return ""
    shards = [after.distinct(r) for r in range(w)]
    if sum(shards) >= n + w:  # not a partition (padding aside); shared items are no_overlap's
        return ""
    log_p = -_log_partitions(_trim(shards, n))
    if log_p >= math.log(CHANCE):
        return f"ranks keep their {ctx.noun} into epoch {e + 1}, {_chance_text(log_p)} by chance"
    detail = (
        f"every rank sees the same {ctx.noun} in epoch {e + 1} as in epoch {e}, only reordered, "
        f"while one process reshuffles across the whole epoch"
    )
    set_epoch_note = "" if run.set_epoch else "; the loop did not call set_epoch"
    evidence = RepeatedOrder(ranks=w, epoch=e + 1)
    return Verdict(RESHUFFLE, "fail", detail + set_epoch_note, FROZEN_SHARDS, (), (e, e + 1), (), evidence)
