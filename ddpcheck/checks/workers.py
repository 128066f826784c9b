"""worker_sharding: no rank yields a sample twice in one epoch unless one process does too.

The classic source is an IterableDataset that ignores ``get_worker_info()``: every DataLoader worker
replays the whole stream, so each sample arrives once per worker. Recorded worker ids per batch
tell that apart from a sampler that repeats itself.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from ddpcheck.checks.context import Context
from ddpcheck.checks.wording import epochs_text, few, ids_text
from ddpcheck.evidence import WorkerRepeats
from ddpcheck.messages import count_text
from ddpcheck.trace import EpochTrace, RunTrace
from ddpcheck.verdict import WORKER_SHARDING, Verdict, not_applicable, passed, skipped

WORKERS = "the iterable dataset is not split across DataLoader workers (use get_worker_info())"
REPEATS = (
    "a rank yields the same sample twice in one epoch: the sampler (or dataset) repeats samples within a rank"
)
REPLAYED_SHARE = 0.5  # an iterable stream where half the ids repeat across workers was replayed per worker


@dataclass(frozen=True)
class Repeat:
    """One rank's repeated samples in one epoch: id -> extra copies, and id -> workers that yielded it."""

    epoch: int
    rank: int
    extra: dict[Hashable, int]
    workers: dict[Hashable, set[int]]

    @property
    def copies(self) -> int:
        return sum(self.extra.values())

    @property
    def across_workers(self) -> bool:
        return any(len(w) > 1 for w in self.workers.values())


def _extra_copies(ids: Sequence[Hashable], allowed: Counter[Hashable] | None) -> dict[Hashable, int]:
    counts = Counter(ids)
    if allowed is None:
        return {x: c - 1 for x, c in counts.items() if c > 1}
    return {x: c - max(allowed.get(x, 0), 1) for x, c in counts.items() if c > max(allowed.get(x, 0), 1)}


def _workers(trace: EpochTrace, wanted: set[Hashable]) -> dict[Hashable, set[int]]:
    """For each wanted id, the workers whose batches held it (empty when worker ids were not recorded)."""
    if trace.worker_ids is None:
        return {}
    out: dict[Hashable, set[int]] = {}
    for batch, worker in zip(trace.batches(), trace.worker_ids, strict=False):
        for x in batch:
            if x in wanted:
                out.setdefault(x, set()).add(worker)
    return out


def _repeat(epoch: int, rank: int, trace: EpochTrace, allowed: Counter[Hashable] | None) -> Repeat | None:
    extra = _extra_copies(trace.ids, allowed)
    if not extra:
        return None
    return Repeat(epoch, rank, extra, _workers(trace, set(extra)))


def _replayed(trace: EpochTrace, distinct: int, rank: int, epoch: int, workers: int) -> Repeat | None:
    """An iterable stream replayed by every worker, even if one process replays it the same way.

    Most ids repeat, each at most once per worker; where worker ids were recorded, the copies must
    also come from different workers.
    """
    rep = _repeat(epoch, rank, trace, None)
    if rep is None or len(rep.extra) < REPLAYED_SHARE * distinct:
        return None
    if trace.worker_ids is not None:
        return rep if rep.across_workers else None
    return rep if max(rep.extra.values()) < workers else None


def check_worker_sharding(
    reference: RunTrace, run: RunTrace, rerun: RunTrace | None = None, *, ctx: Context | None = None
) -> Verdict:
    ctx = ctx or Context(reference, run, rerun)
    if ctx.unjudgeable:
        return skipped(WORKER_SHARDING, ctx.unjudgeable)
    iterable_workers = ctx.facts.dataset_kind == "iterable" and ctx.facts.num_workers > 1
    found: list[Repeat] = []
    same_in_reference = False
    for view in ctx.views():
        ref_ids = view.ref_trace.ids
        ref_distinct = len(set(ref_ids)) if view.batch_level else view.ref_distinct
        allowed = None if ref_distinct == len(ref_ids) else Counter(ref_ids)
        for r, trace in enumerate(view.rank_traces):
            if view.sample_within(r) == 0:
                continue
            distinct = len(trace.ids) - view.sample_within(r)
            resampling = allowed is not None and not ctx.stable  # with replacement: repeats are expected
            rep = None if resampling else _repeat(view.epoch, r, trace, allowed)
            if rep is None and iterable_workers:
                rep = _replayed(trace, distinct, r, view.epoch, ctx.facts.num_workers)
                same_in_reference = same_in_reference or rep is not None
            if rep is not None:
                found.append(rep)
    if not found:
        repeats = ctx.repeats_note()
        within = (
            f"no rank repeats a sample more often than the single-process loader does (up to "
            f"{ctx.ref_repeats} times per epoch: repeated sampling)"
            if repeats
            else "no rank yields a sample twice within an epoch"
        )
        if ctx.facts.num_workers == 0:
            return not_applicable(WORKER_SHARDING, f"no DataLoader workers (and {within})")
        return passed(WORKER_SHARDING, f"{within} ({ctx.num_epochs} epochs)")
    per_epoch = Counter[int]()
    for rep in found:
        per_epoch[rep.epoch] += rep.copies
    padding_room = ctx.world_size * ctx.facts.pad_unit - 1  # padded items; whole batches when batch-sharded
    if ctx.batch_level:
        padding_room = (ctx.world_size - 1) * max(
            (max(v.ref_trace.batch_sizes, default=1) for v in ctx.views()), default=1
        )
    if ctx.facts.padding is True and not same_in_reference and max(per_epoch.values()) <= padding_room:
        within = (
            f"ranks repeat at most {count_text(max(per_epoch.values()), ctx.noun)} an epoch, within the "
            f"padding (at most {padding_room})"
        )
        if ctx.facts.num_workers == 0:  # the same answer at every world size, padded or not
            return not_applicable(WORKER_SHARDING, f"no DataLoader workers (and {within})")
        return passed(WORKER_SHARDING, within)
    rep = found[0]
    workers = sorted(set().union(*rep.workers.values())) if rep.workers else []
    examples = few(rep.extra)
    iterable = ctx.facts.dataset_kind == "iterable"  # a map dataset's indices go to any worker anyway
    if iterable and (any(r.across_workers for r in found) or (iterable_workers and not rep.workers)):
        cause = WORKERS
    else:
        cause = REPEATS
    ranks = tuple(sorted({r.rank for r in found}))
    epochs = tuple(sorted(per_epoch))
    source = f" (from workers {', '.join(map(str, workers))})" if len(workers) > 1 else ""
    detail = (
        f"rank {rep.rank} yields {count_text(len(rep.extra), 'samples')} more than once in epoch {rep.epoch}"
        f"{source}: {ids_text(examples)}; {sum(per_epoch.values())} repeated copies on "
        f"{count_text(len(ranks), 'ranks')}, {epochs_text(list(epochs))}"
    )
    if same_in_reference:
        detail += "; the single-process loader repeats them the same way"
    return Verdict(
        WORKER_SHARDING,
        "fail",
        detail,
        cause,
        ranks[:8],
        epochs,
        examples,
        WorkerRepeats(sum(per_epoch.values()), len(ranks), len(workers)),
    )
