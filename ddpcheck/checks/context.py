"""One shared, lazily computed view of a reference run and a DDP run.

Nine checks look at the same sets and counts; computing them once per epoch keeps a million-sample
epoch at world size 1024 to a few set operations (all in C) instead of nine passes or per-id loops.
An *item* is a sample id, or a whole batch (its ids, sorted) when the loader shards whole batches.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import chain

import numpy as np

from ddpcheck.checks.arrays import (
    EpochCounts,
    as_int64,
    epoch_counts,
    same_id_set,
    same_ints,
    same_reference_ids,
)
from ddpcheck.checks.tally import (
    EpochTally,
    SharedPair,
    Strangers,
    distinct_ids,
    int_ids,
    same_ids,
    same_set,
    stream_sample,
    unique,
)
from ddpcheck.checks.wording import few
from ddpcheck.options import IGNORE_INDEX
from ddpcheck.trace import EpochTrace, LoaderFacts, RankTrace, RunTrace

Item = Hashable


def batch_key(batch: Iterable[Hashable]) -> tuple[Hashable, ...]:
    """A batch as a sorted tuple, so a batch is the same item whatever order its ids arrive in."""
    ids = list(batch)
    try:
        return tuple(sorted(ids))  # type: ignore[type-var]
    except TypeError:
        return tuple(sorted(ids, key=repr))


def items_of(trace: EpochTrace, batch_level: bool) -> Sequence[Item]:
    if not batch_level:
        return trace.ids
    return [batch_key(b) for b in trace.batches()]


def same_sequence(a: Sequence[Hashable], b: Sequence[Hashable]) -> bool:
    """Equal contents; an ``array`` never equals a tuple, so mixed types are compared as lists."""
    same = same_ints(a, b)  # array('q') ids: compared by numpy, not element by element
    if same is not None:
        return same
    if int_ids(a) and int_ids(b):  # integer arrays of any width, in memory or on disk: chunk by chunk
        return same_ids(a, b)
    if type(a) is type(b):
        return a == b
    return len(a) == len(b) and list(a) == list(b)


def paired_ranks(run: RunTrace, rerun: RunTrace) -> list[tuple[RankTrace, RankTrace]]:
    """The ranks both runs recorded, by rank number (a rerun may have recorded a sample of them)."""
    by_rank = {r.rank: r for r in run.ranks}
    return [(by_rank[r.rank], r) for r in rerun.ranks if r.rank in by_rank]


def same_streams(a: RunTrace, b: RunTrace) -> bool:
    """Every rank's ids and batch boundaries agree in every epoch both runs recorded."""
    pairs = paired_ranks(a, b)
    if len(pairs) != len(b.ranks) or (not b.rank_sample and len(a.ranks) != len(b.ranks)):
        return False
    for one, two in pairs:
        for x, y in zip(one.epochs, two.epochs, strict=False):
            if not (same_sequence(x.ids, y.ids) and same_sequence(x.batch_sizes, y.batch_sizes)):
                return False
    return True


def facts_of(run: RunTrace) -> LoaderFacts:
    return run.ranks[0].facts if run.ranks else LoaderFacts()


def broken_reason(run: RunTrace, what: str) -> str:
    """Why ``run`` cannot be judged ("" when it can): it was skipped, a rank failed or is missing."""
    if run.skipped:
        return f"{what} was not run: {run.skipped}"
    if run.failures:
        f = run.failures[0]
        more = f" (and {len(run.failures) - 1} more rank failures)" if len(run.failures) > 1 else ""
        return f"{what} broke, rank {f.rank} {f.kind}: {f.message}{more}; there is no trace to judge"
    expected = len(run.rank_sample) if run.rank_sample else run.world_size
    if len(run.ranks) != expected:
        return f"{what} recorded {len(run.ranks)} of {expected} ranks; there is no full trace to judge"
    return ""


@dataclass(frozen=True)
class Allowance:
    """How much an honest DDP split may differ from the single process, for one epoch.

    ``duplicates``: padding may repeat up to ``world_size - 1`` items (never when the sampler is
    known not to pad). ``missing``: a sampler that drops its tail loses up to ``world_size - 1``
    items, and a DataLoader with ``drop_last`` loses up to ``batch_size - 1`` trailing samples on
    every rank. The reference's own drops are not subtracted: the ranks drop *different* samples
    whenever their order differs from the reference's, so only the full bound is sound.
    """

    duplicates: int
    sampler_drop: int
    loader_drop: int

    @property
    def missing(self) -> int:
        return self.sampler_drop + self.loader_drop


class EpochView:
    """The reference's epoch and every rank's epoch, as items, with the counts the checks share.

    Integer ids (any array of them, in memory or on disk) are counted by :class:`EpochTally` in memory
    that grows with the id range (N/8 bytes a bitmap), not with copies of the ids; anything else (ids
    that are not ints, whole batches as items, a reference that repeats ids) by sets and counters. Both
    answer every question below the same way, and the checks ask only these.
    """

    def __init__(
        self,
        epoch: int,
        reference: EpochTrace,
        ranks: Sequence[EpochTrace],
        batch_level: bool,
        same_reference: EpochView | None = None,
        limit: int | None = None,
    ):
        self.epoch = epoch
        self.ref_trace = reference
        self.rank_traces = list(ranks)
        self.batch_level = batch_level
        self._same = same_reference  # an earlier epoch whose reference ids are identical: share its sets
        self._limit = limit  # the dataset's length when ids are its indices: the bitmaps' range
        self._rank_sets: dict[int, set[Item]] = {}

    @cached_property
    def tally(self) -> EpochTally | None:
        """The bounded count; ``None`` where sets answer (see the class docstring)."""
        if self.batch_level:
            return None
        return EpochTally.of(self.ref_trace.ids, [t.ids for t in self.rank_traces], self._limit)

    @cached_property
    def ref_items(self) -> Sequence[Item]:
        if self._same is not None:
            return self._same.ref_items
        return items_of(self.ref_trace, self.batch_level)

    @cached_property
    def rank_items(self) -> list[Sequence[Item]]:
        return [items_of(t, self.batch_level) for t in self.rank_traces]

    @cached_property
    def ref_set(self) -> set[Item]:
        return self._same.ref_set if self._same is not None else set(self.ref_items)

    @cached_property
    def ref_counts(self) -> Counter[Item] | None:
        """Multiplicities when the reference repeats an item; ``None`` when every count is 1."""
        if self.tally is not None:
            return None
        if self._same is not None:
            return self._same.ref_counts
        if self.ref_distinct == len(self.ref_items):
            return None
        return Counter(self.ref_items)

    @cached_property
    def _counts(self) -> EpochCounts | None:
        """Counts from numpy when every epoch's ids are ``array('q')`` but the tally declined (the
        reference repeats ids). ``None`` otherwise: then sets answer everything."""
        if self.batch_level:
            return None
        ref = as_int64(self.ref_trace.ids)
        ranks = [as_int64(t.ids) for t in self.rank_traces]
        if ref is None or any(r is None for r in ranks):
            return None
        return epoch_counts(ref, [r for r in ranks if r is not None])

    @cached_property
    def ref_distinct(self) -> int:
        """How many distinct items the reference epoch holds."""
        if self.tally is not None:
            return self.tally.ref_distinct
        counts = self._counts
        return counts.ref_distinct if counts is not None else len(self.ref_set)

    @cached_property
    def ddp_distinct(self) -> int:
        """How many distinct items the ranks hold together."""
        if self.tally is not None:
            return self.tally.ddp_distinct
        counts = self._counts
        return counts.ddp_distinct if counts is not None else len(self.ddp_set)

    @cached_property
    def extras_count(self) -> int:
        """How many distinct items some rank sees and the reference never yields."""
        if self.tally is not None:
            return self.tally.extras
        counts = self._counts
        return counts.extras if counts is not None else len(self.extras)

    def same_ref_items(self, other: EpochView) -> bool:
        """This epoch's reference holds the same distinct items as ``other``'s."""
        if self.tally is not None and other.tally is not None:
            return self.tally.same_reference(other.tally)
        mine, theirs = self._counts, other._counts
        if mine is not None and theirs is not None:
            return same_reference_ids(mine, theirs)
        return self.ref_set == other.ref_set

    def same_rank_items(self, other: EpochView, rank: int) -> bool:
        """``rank`` holds the same distinct items in this epoch as in ``other``."""
        if not self.batch_level and not other.batch_level:
            a, b = self.rank_traces[rank].ids, other.rank_traces[rank].ids
            mine, theirs = as_int64(a), as_int64(b)
            if mine is not None and theirs is not None and len(mine) + len(theirs) <= 1 << 22:
                return same_id_set(mine, theirs)
            if int_ids(a) and int_ids(b):
                return same_set(a, b)
        return self.rank_set(rank) == other.rank_set(rank)

    def allowed(self, item: Item) -> int:
        """How many copies of ``item`` the epoch may hold (the reference's count, at least 1)."""
        counts = self.ref_counts
        return 1 if counts is None else max(counts.get(item, 0), 1)

    @cached_property
    def _union(self) -> tuple[set[Item], list[int]]:
        """All ranks' items in one set, and per rank how many of its items were not new to it.

        One pass into one set gives the union and, per rank, a shortfall that is zero unless the rank
        repeats something; only those ranks (padding: a handful) ever get a set of their own.
        """
        seen: set[Item] = set()
        short: list[int] = []
        for items in self.rank_items:
            before = len(seen)
            seen.update(items)
            short.append(len(items) - (len(seen) - before))
        return seen, short

    @cached_property
    def ddp_set(self) -> set[Item]:
        return self._union[0]

    def rank_set(self, rank: int) -> set[Item]:
        if rank not in self._rank_sets:
            self._rank_sets[rank] = set(self.rank_items[rank])
        return self._rank_sets[rank]

    @property
    def rank_sets(self) -> list[set[Item]]:
        """Every rank's set (built on demand: the evidence paths of the set path use these)."""
        return [self.rank_set(r) for r in range(len(self.rank_items))]

    def within(self, rank: int) -> int:
        """Copies a rank holds of items it already holds (its own repeats)."""
        if self.tally is not None:
            return self.tally.within(rank)
        counts = self._counts
        if counts is not None:
            return counts.within[rank]
        if self._union[1][rank] == 0:
            return 0
        return len(self.rank_items[rank]) - len(self.rank_set(rank))

    def distinct(self, rank: int) -> int:
        return len(self.rank_items[rank]) - self.within(rank)

    def sample_within(self, rank: int) -> int:
        """Like ``within``, counted in sample ids even when items are batches."""
        if not self.batch_level:
            return self.within(rank)
        ids = self.rank_traces[rank].ids
        return len(ids) - len(set(ids))

    @cached_property
    def total(self) -> int:
        return sum(len(items) for items in self.rank_items)

    @cached_property
    def ddp_counts(self) -> Counter[Item]:
        return Counter(chain.from_iterable(self.rank_items))

    @cached_property
    def rank_multiplicity(self) -> Counter[Item]:
        """For every item, how many ranks see it."""
        return Counter(chain.from_iterable(self.rank_sets))

    @cached_property
    def missing_count(self) -> int:
        """Reference items no rank sees (as a multiset when the reference repeats items)."""
        counts = self.ref_counts
        if counts is None:  # |ref - ddp| from the extras, which the checks need anyway: one set pass fewer
            return self.ref_distinct - (self.ddp_distinct - self.extras_count)
        seen = self.ddp_counts
        return sum(max(0, c - seen.get(x, 0)) for x, c in counts.items())

    def missing_items(self) -> list[Item]:
        """The missing items, in the reference's order (so a dropped tail shows up as a tail)."""
        counts = self.ref_counts
        if counts is None:
            seen = self.ddp_set
            return [x for x in self.ref_items if x not in seen]
        have = Counter(self.ddp_counts)
        out = []
        for x in self.ref_items:
            if have[x] > 0:
                have[x] -= 1
            else:
                out.append(x)
        return out

    def missing_examples(self) -> tuple[object, ...]:
        """The smallest few missing items."""
        if self.tally is not None:
            return self.tally.missing_examples()
        return few(self.missing_items())

    @cached_property
    def excess(self) -> int:
        """Copies beyond what the reference holds, summed over items (padding plus any overlap)."""
        if self.ref_counts is None:
            return self.total - self.ddp_distinct
        return sum(max(0, c - self.allowed(x)) for x, c in self.ddp_counts.items())

    @cached_property
    def cross_excess(self) -> int:
        """Extra ranks per item: an item on 3 ranks that the reference yields once counts 2."""
        if self.ref_counts is None and (self.tally is not None or self._counts is not None):
            # every rank's distinct items, less the union
            return sum(self.distinct(r) for r in range(len(self.rank_items))) - self.ddp_distinct
        if self.ref_counts is None:  # a rank's shortfall is its own repeats plus items earlier ranks had
            return sum(short - self.within(r) for r, short in enumerate(self._union[1]))
        return sum(max(0, c - self.allowed(x)) for x, c in self.rank_multiplicity.items())

    @cached_property
    def overlap_items(self) -> set[Item]:
        """Items seen by more ranks than the reference allows (the set path's; see ``overlap_count``)."""
        return {x for x, c in self.rank_multiplicity.items() if c > self.allowed(x)}

    @cached_property
    def overlap_count(self) -> int:
        """How many items are seen by more ranks than the reference allows."""
        if self.tally is not None:
            return self.tally.overlap_count
        return len(self.overlap_items)

    @cached_property
    def shared_holdings(self) -> int:
        """Over every rank, how many of its distinct items are over-shared (an item on k ranks counts k)."""
        if self.tally is not None:  # each over-shared item on k ranks adds k - 1 to cross_excess
            return self.cross_excess + self.overlap_count
        over = self.overlap_items
        return sum(len(s & over) for s in self.rank_sets)

    def in_reference(self, rank: int) -> int:
        """How many of a rank's distinct items the reference holds."""
        if self.tally is not None:
            return self.tally.in_reference(rank)
        return len(self.rank_set(rank) & self.ref_set)

    def overlap_evidence(self) -> SharedPair | None:
        """The lowest rank with an over-shared item, the lowest other rank sharing one, and examples."""
        return self._evidence

    @cached_property
    def _evidence(self) -> SharedPair | None:
        if self.tally is not None:
            return self.tally.overlap_evidence()
        over = self.overlap_items
        if not over:
            return None
        owners: dict[Item, list[int]] = {}
        for rank, items in enumerate(self.rank_sets):
            for item in items & over:
                owners.setdefault(item, []).append(rank)
        first = min(rs[0] for rs in owners.values())
        mine = [x for x, rs in owners.items() if rs[0] == first]
        second = min(r for x in mine for r in owners[x] if r != first)
        return SharedPair(first, second, few(x for x in mine if second in owners[x]))  # type: ignore[arg-type]

    def duplicated_examples(self) -> tuple[object, ...]:
        """The smallest few items the ranks hold more copies of than the reference allows."""
        if self.tally is not None:
            return self.tally.duplicated_examples()
        return few(x for x, c in self.ddp_counts.items() if c > self.allowed(x))

    def strangers(self, also: Sequence[EpochView] = (), indices: int | None = None) -> Strangers:
        """Items the ranks see and the reference never yields, less those of ``also``'s references and,
        with ``indices``, dataset indices (ints in ``[0, indices)``): how many, on which ranks, and the
        smallest few of the first such rank's."""
        if not self.extras_count:
            return Strangers(0, (), ())
        tallies = [v.tally for v in also]
        if self.tally is not None and all(t is not None for t in tallies):
            return self.tally.strangers([t for t in tallies if t is not None], indices)
        extra = self.extras - set().union(*(v.ref_set for v in also))
        if indices is not None:
            extra = {x for x in extra if not (type(x) is int and 0 <= x < indices)}
        ranks = tuple(r for r in range(len(self.rank_traces)) if not self.rank_set(r).isdisjoint(extra))
        examples = few(self.rank_set(ranks[0]) & extra) if ranks else ()
        return Strangers(len(extra), ranks, examples)  # type: ignore[arg-type]

    def union_size(self, ranks: Sequence[int]) -> int:
        """How many distinct items these ranks hold together."""
        if self.tally is not None:
            parts = [distinct_ids(self.rank_traces[r].ids) for r in ranks]
            return len(unique(np.concatenate(parts))) if parts else 0
        return len(set().union(*(self.rank_set(r) for r in ranks)))

    def identical_streams(self) -> list[int]:
        """The largest group (>= 2) of ranks with the same non-empty stream, else ``[]``."""
        return list(self._identical)

    @cached_property
    def _identical(self) -> list[int]:
        groups: dict[object, list[int]] = {}
        sampled = self.tally is not None
        for rank, items in enumerate(self.rank_items):
            if len(items):
                key = stream_sample(items) if sampled else _signature(items)
                groups.setdefault(key, []).append(rank)
        if sampled:  # equal at the sampled places: split by comparing id by id with each part's first
            parts: list[list[int]] = []
            for ranks in groups.values():
                while ranks:
                    lead = self.rank_items[ranks[0]]
                    same = [r for r in ranks if r == ranks[0] or same_ids(lead, self.rank_items[r])]
                    parts.append(same)
                    ranks = [r for r in ranks if r not in same]
            groups = dict(enumerate(sorted(parts)))
        best = max(groups.values(), key=len, default=[])
        return best if len(best) >= 2 else []

    @cached_property
    def extras(self) -> set[Item]:
        return self.ddp_set - self.ref_set


def _signature(items: Sequence[Hashable]) -> object:
    tobytes = getattr(items, "tobytes", None)
    return (type(items).__name__, tobytes()) if callable(tobytes) else tuple(items)


class Context:
    """Everything the checks share about one (reference, run, rerun) triple, computed on demand."""

    def __init__(
        self,
        reference: RunTrace,
        run: RunTrace,
        rerun: RunTrace | None = None,
        *,
        ignore_index: int = IGNORE_INDEX,
    ):
        if reference.world_size != 1:
            raise ValueError(
                f"reference must be the single-process run (world size 1), got world size "
                f"{reference.world_size}; record the same loader factory with world_size=1"
            )
        if run.world_size < 1:
            raise ValueError(f"run has world size {run.world_size}; a run needs at least one rank")
        if rerun is not None and rerun.world_size != run.world_size:
            raise ValueError(
                f"rerun has world size {rerun.world_size} but run has {run.world_size}; "
                f"rerun the same world size with the same seed"
            )
        self.reference = reference
        self.run = run
        self.rerun = rerun
        self.ignore_index = ignore_index  # the label value the ranks' supervised counts left out
        self.world_size = run.world_size
        self._views: dict[int, EpochView] = {}

    @cached_property
    def facts(self) -> LoaderFacts:
        return facts_of(self.run)

    @cached_property
    def ref_facts(self) -> LoaderFacts:
        return facts_of(self.reference)

    @cached_property
    def batch_level(self) -> bool:
        """Judge whole batches as items: the loader shards batches, and they arrive intact.

        When a custom batch sampler's batches are re-formed on the ranks (batch_integrity's finding),
        batch identity means nothing, so coverage and overlap fall back to sample ids.
        """
        if not any(r.facts.batch_level for r in self.reference.ranks):
            return False
        ref_epochs = self.reference.ranks[0].epochs if self.reference.ranks else ()
        for e in range(self.num_epochs):
            known = {batch_key(b) for b in ref_epochs[e].batches()}
            for trace in self.run.epoch(e):
                if any(batch_key(b) not in known for b in trace.batches()):
                    return False
        return True

    @cached_property
    def index_limit(self) -> int | None:
        """The dataset's length when the ids are its indices (map-style, identified by index), else None."""
        facts = self.ref_facts
        if self.reference.id_source != "index" or facts.dataset_kind != "map":
            return None
        return facts.dataset_len

    @property
    def noun(self) -> str:
        return "batches" if self.batch_level else "samples"

    @cached_property
    def unjudgeable(self) -> str:
        """Why no check can judge this pair ("" when they can)."""
        why = broken_reason(self.reference, "the single-process reference run")
        if why:
            return why
        why = broken_reason(self.run, f"world size {self.run.world_size}")
        if why:
            return why
        if self.num_epochs == 0:
            return "no epoch was recorded, so there is nothing to compare"
        return ""

    @cached_property
    def num_epochs(self) -> int:
        return min(self.reference.num_epochs, self.run.num_epochs)

    def view(self, epoch: int) -> EpochView:
        if epoch not in self._views:
            ref = self.reference.ranks[0].epochs[epoch]
            before = self.view(epoch - 1) if epoch else None
            if before is not None and not same_sequence(before.ref_trace.ids, ref.ids):
                before = None
            self._views[epoch] = EpochView(
                epoch, ref, self.run.epoch(epoch), self.batch_level, before, self.index_limit
            )
        return self._views[epoch]

    def views(self) -> list[EpochView]:
        return [self.view(e) for e in range(self.num_epochs)]

    @cached_property
    def ref_repeats(self) -> int:
        """The most copies of one item any reference epoch holds (1: it repeats nothing).

        Repeated augmentation (timm's ``RepeatAugSampler``) repeats samples on purpose; pass texts
        must then not claim that no sample reaches two ranks.
        """
        most = 1
        for view in self.views():
            counts = view.ref_counts
            if counts:
                most = max(most, max(counts.values()))
        return most

    def repeats_note(self) -> str:
        """``""``, or a clause saying the single-process loader itself repeats items."""
        k = self.ref_repeats
        if k <= 1:
            return ""
        noun = self.noun
        return f"the single-process loader itself yields {noun} up to {k} times per epoch (repeated sampling)"

    @cached_property
    def stable(self) -> bool:
        """True when the reference yields the same items (as a multiset) in every epoch."""
        views = self.views()
        if not views:
            return True
        head = views[0]
        for v in views[1:]:
            if len(v.ref_items) != len(head.ref_items) or not v.same_ref_items(head):
                return False
            if (v.ref_counts is None) != (head.ref_counts is None) or v.ref_counts != head.ref_counts:
                return False
        return True

    @cached_property
    def ref_union(self) -> set[Item]:
        return set().union(*(v.ref_set for v in self.views()))

    def allowance(self, view: EpochView) -> Allowance:
        w = self.world_size
        padding = self.facts.padding
        duplicates = w * self.facts.pad_unit - 1 if padding is not False else 0
        pads = padding is True or (padding is None and view.excess > 0)
        sampler_drop = 0 if pads else w - 1
        loader_drop = 0
        size = self.facts.batch_size
        if not self.batch_level and self.facts.drop_last and size:
            loader_drop = w * (size - 1)
        return Allowance(duplicates, sampler_drop, loader_drop)
