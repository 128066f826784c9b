"""Picture data for the HTML and Markdown reports: who saw which sample, steps per rank, reshuffling.

Verdicts keep a few example ids, not the whole picture, and reports never look at traces. So the
parent reduces the reference trace and one world size's trace to a small plain :class:`FigureData`
once, here, and reports draw from that alone. Above ``max_bins`` samples the x axis is aggregated into
bins (each bin says what share of its samples a rank saw), so a million-sample epoch costs kilobytes.

The x axis of a sample strip is the reference epoch's distinct samples in the order the single process
yields them: a correct DistributedSampler then draws regular stripes, and a bug breaks the pattern.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ddpcheck.trace import EpochTrace, IdArray, RankTrace, RunTrace, UnionIds

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    IntArray = npt.NDArray[np.signedinteger[Any]]  # int32 where it fits (memory at 10M samples), else int64

MAX_PICTURED = 1 << 24  # above this many samples an epoch, no sample strips (they would need every id)
MAX_RANK_STRIPS = 64  # above this many ranks, each strip is a group of consecutive ranks (rank_group)
LEVELS = 255  # shares are stored as bytes: 0 = none, 255 = all of the bin, any non-zero share >= 1
NO_RANK = -1  # owner value: no rank saw the sample
SEVERAL = -2  # owner value: more than one rank saw the sample
_SPARSE = 16  # a rank yielding under 1/16 of the epoch's samples is counted from its own samples


@dataclass(frozen=True)
class EpochFigure:
    """One epoch at one world size: a strip per shown rank over the reference epoch's samples.

    ``rank_share[i][b]``, ``missing[b]`` and ``duplicated[b]`` are shares of bin ``b`` (0..255, never 0
    when anything at all is there). The counts are exact, whatever the binning.
    """

    epoch: int
    samples: int  # distinct samples in the reference epoch: the x axis
    bins: int  # == samples when not aggregated
    rank_share: tuple[bytes, ...]  # per shown rank: share of each bin that rank saw
    missing: bytes  # share of each bin seen by no rank
    duplicated: bytes  # share of each bin seen more than once (by two ranks, or twice by one)
    missing_count: int
    duplicated_count: int
    extra_copies: int  # yields beyond the first of each sample (padding counts here)
    foreign: tuple[int, ...]  # per rank with a trace: yields of ids the reference epoch never yields
    yielded: tuple[int, ...]  # per rank: samples yielded
    steps: tuple[int, ...]  # per rank: batches yielded
    len_loader: tuple[int | None, ...]  # per rank: what len(loader) said
    reference_steps: int  # batches of the single-process epoch

    @property
    def binned(self) -> bool:
        return self.bins < self.samples


@dataclass(frozen=True)
class ReplicaGroup:
    """One replica group of a mesh (the ranks sharing a data-parallel rank), for its picture: how many
    steps its first epoch has, and where its replicas first differ (``epoch`` None: they never do)."""

    where: str  # its data-parallel coordinates, "dp=1"
    steps: int
    epoch: int | None = None
    step: int | None = None
    kind: str = ""  # ids | content | steps


@dataclass(frozen=True)
class FigureData:
    """Everything the pictures of one layout need; plain, picklable, a few kilobytes."""

    world_size: int
    ranks: tuple[int, ...]  # ranks with a trace, in order
    shown_ranks: int  # how many strips: one per rank, or per group of ``rank_group`` consecutive ranks
    max_bins: int
    epochs: tuple[EpochFigure, ...] = ()
    owner_samples: int = 0  # x axis of the assignment picture: reference epoch 0's samples
    owner_bins: int = 0  # columns: every sample, or above max_bins a fixed random subset of them
    owners: tuple[tuple[int, ...], ...] = ()  # per epoch, per column: the rank, NO_RANK or SEVERAL
    changed: tuple[float | None, ...] = ()  # per epoch after the first: share of samples that moved rank
    note: str = ""  # why a picture is missing or partial
    where: str = ""  # the layout, as titles name it: "world size 4", "mesh dp=2,tp=2"
    rank_noun: str = "rank"  # "dp rank" on a mesh: strips are drawn per data-parallel rank
    replicas: tuple[ReplicaGroup, ...] = ()  # a mesh's replica groups (empty on a plain world size)
    # work per shown rank over epoch 0's steps (steps summed into at most max_bins columns), its source,
    # how many steps each column holds, and each rank's epoch total (empty: work was not measured)
    work: tuple[tuple[float, ...], ...] = ()
    work_source: str = ""
    work_per_column: int = 1
    work_totals: tuple[float, ...] = ()
    packed_rows: bool = (
        False  # rows packed on each rank (:func:`rows_packed_per_rank`): no row is one process's
    )
    rank_group: int = 1  # ranks per strip (4096 ranks: 64 strips of 64 ranks, each what its ranks saw)

    def strip_ranks(self, strip: int) -> tuple[int, ...]:
        """The ranks one strip shows."""
        return self.ranks[strip * self.rank_group : (strip + 1) * self.rank_group]

    @property
    def binned(self) -> bool:
        return any(e.binned for e in self.epochs) or self.owner_bins < self.owner_samples


PACKED_SOURCE = "packed segments (position_ids)"  # work per packed segment (checker.work; "... squared")
PACKED_NOTE = (
    "rows are packed on each rank from its own documents, so no row is one of the single process's rows "
    "and this picture of rows shows nothing about coverage: coverage and single_process_equivalence are "
    "judged on the tokens"
)


def rows_packed_per_rank(reference: RunTrace, run: RunTrace) -> bool:
    """Each rank packs its own documents into rows, identified only by their content: the rule by which
    the checks judge tokens instead of rows (``ddpcheck.checks.packed``) and the pictures say so.

    Every batch of every rank, and of the single process, was measured as packed token segments
    (``position_ids`` restarting per document) and the ids are content hashes (no hook, no id field)."""
    if run.id_source != "content-hash" or reference.id_source != "content-hash" or not run.ranks:
        return False
    if any(not r.facts.work.startswith(PACKED_SOURCE) for r in (*run.ranks, *reference.ranks)):
        return False
    epochs = min(run.num_epochs, reference.num_epochs)
    return epochs > 0 and all(
        e.packing is not None and e.work is not None
        for trace in (run, reference)
        for r in trace.ranks
        for e in r.epochs[:epochs]
    )


def figure_data(reference: RunTrace, run: RunTrace, max_bins: int = 2000) -> FigureData:
    """The picture data of ``run`` against the single-process ``reference``. Pure; numpy-fast.

    Never raises on a broken run: ranks without a trace are left out and ``note`` says so.
    """
    if max_bins < 1:
        raise ValueError(f"max_bins must be at least 1, not {max_bins}")
    ranks = tuple(sorted(run.ranks, key=lambda r: r.rank))
    group = -(-len(ranks) // MAX_RANK_STRIPS) if len(ranks) > MAX_RANK_STRIPS else 1
    shown = -(-len(ranks) // group)
    base = FigureData(run.world_size, tuple(r.rank for r in ranks), shown, max_bins, rank_group=group)
    notes = []
    if run.skipped:
        return _with_note(base, f"not run: {run.skipped}")
    if not reference.ranks or reference.num_epochs == 0:
        return _with_note(base, "no reference trace to compare with")
    if not ranks:
        return _with_note(base, "no rank returned a trace")
    if len(ranks) < run.world_size:
        notes.append(f"only {len(ranks)} of {run.world_size} ranks returned a trace")
    if group > 1:
        notes.append(f"{len(ranks)} ranks in {shown} strips of {group} consecutive ranks each")
    window = next((r.facts.steps for r in ranks if getattr(r.facts, "steps", None)), None)
    if window:
        notes.append(f"each rank recorded only {window} batches per epoch: the rest shows as missing")
    packed = rows_packed_per_rank(reference, run)
    if packed:
        notes.append(PACKED_NOTE)
    epochs = min(reference.num_epochs, min(len(r.epochs) for r in ranks))
    ref_rank = reference.ranks[0]
    size = _size_hint(ref_rank.epochs[0].ids)
    if size > MAX_PICTURED:
        notes.append(
            f"the sample pictures are drawn for epochs of up to {MAX_PICTURED:,} samples; this one has "
            f"{size:,} (the checks' verdicts count every sample)"
        )
        counted = tuple(_counted(e, ranks, ref_rank.epochs[e]) for e in range(epochs))
        return replace(base, shown_ranks=0, epochs=counted, note="; ".join(notes))
    limit = ref_rank.facts.dataset_len if reference.id_source == "index" else None
    axis0 = _Axis(ref_rank.epochs[0].ids, limit)
    columns = _columns(axis0.n, max_bins)
    figures: list[EpochFigure] = []
    owners: list[tuple[int, ...]] = []  # per epoch, the owners of the pictured columns only
    changed: list[float | None] = []
    previous: IntArray | None = None  # the last epoch's owner of every sample: one held at a time
    for e in range(epochs):
        axis = axis0 if e == 0 else _Axis(ref_rank.epochs[e].ids, limit)
        figure, owner = _epoch(e, axis, ranks, group, max_bins, ref_rank.epochs[e])
        figures.append(figure)
        owner = owner if e == 0 else _to_axis(owner, axis, axis0)
        del axis
        owners.append(tuple((owner if columns is None else owner[columns]).tolist()))
        if previous is not None:
            changed.append(_changed(previous, owner))
        previous = owner
    del previous
    work, per_column, totals = _work(ranks[:MAX_RANK_STRIPS], max_bins)
    return FigureData(
        world_size=run.world_size,
        ranks=base.ranks,
        shown_ranks=shown,
        max_bins=max_bins,
        epochs=tuple(figures),
        owner_samples=axis0.n,
        owner_bins=min(axis0.n, max_bins),
        owners=tuple(owners),
        changed=tuple(changed),
        note="; ".join(notes),
        work=work,
        work_source=ranks[0].facts.work if work else "",
        work_per_column=per_column,
        work_totals=totals,
        packed_rows=packed,
        rank_group=group,
    )


def _size_hint(ids: Sequence[Hashable]) -> int:
    """The reference epoch's length, or a bound on it that costs nothing (a union of ranks: their sum)."""
    parts = getattr(ids, "parts", None)
    return sum(len(p) for p in parts) if isinstance(ids, UnionIds) and parts is not None else len(ids)


def _counted(epoch: int, ranks: Sequence[RankTrace], ref: EpochTrace) -> EpochFigure:
    """An epoch too large to picture sample by sample: what each rank yielded and stepped, no strips."""
    traces = [r.epochs[epoch] for r in ranks]
    return EpochFigure(
        epoch=epoch,
        samples=0,
        bins=0,
        rank_share=(),
        missing=b"",
        duplicated=b"",
        missing_count=0,
        duplicated_count=0,
        extra_copies=0,
        foreign=tuple(0 for _ in traces),
        yielded=tuple(len(t.ids) for t in traces),
        steps=tuple(t.num_batches for t in traces),
        len_loader=tuple(t.len_loader for t in traces),
        reference_steps=ref.num_batches,
    )


def _work(
    ranks: Sequence[RankTrace], max_bins: int
) -> tuple[tuple[tuple[float, ...], ...], int, tuple[float, ...]]:
    """Each rank's work per step of epoch 0, summed into at most ``max_bins`` columns."""
    epochs = [r.epochs[0] if r.epochs else None for r in ranks]
    if not epochs or any(e is None or e.work is None for e in epochs):
        return (), 1, ()
    per_step = [[float(sum(units)) for units in (e.work or ())] for e in epochs if e is not None]
    steps = max((len(w) for w in per_step), default=0)
    per_column = max(1, math.ceil(steps / max_bins)) if steps else 1
    columns = tuple(
        tuple(float(sum(w[c : c + per_column])) for c in range(0, steps, per_column)) for w in per_step
    )
    return columns, per_column, tuple(float(sum(w)) for w in per_step)


def _with_note(data: FigureData, note: str) -> FigureData:
    return FigureData(data.world_size, data.ranks, data.shown_ranks, data.max_bins, note=note)


class _Axis:
    """The distinct samples of a reference epoch in first-yield order, and a fast id -> position map.

    Integer ids (``array('q')``, as recording stores them) are looked up in a direct table when
    they span a dense range (dataset indices always do), else by binary search; other ids by a dict.
    """

    DENSE = 4  # a table up to 4 slots per sample (plus a little) beats a binary search

    def __init__(self, ids: Sequence[Hashable], limit: int | None = None) -> None:
        import numpy as np

        self._dict: dict[Hashable, int] | None = None
        self._table: IntArray | None = None
        self._sorted: IntArray | None = None
        self._low = 0
        values = _int64(ids)
        if values is None:
            lookup: dict[Hashable, int] = {}
            for item in ids:
                lookup.setdefault(item, len(lookup))
            self._dict = lookup
            self.n = len(lookup)
            return
        span = int(values.max()) - int(values.min()) + 1 if len(values) else 0
        if len(values) and span <= self.DENSE * len(values) + 1024:
            self._low = int(values.min())
            table = np.full(span, -1, np.int32)  # positions fit: half the memory
            table[values - self._low] = np.arange(len(values), dtype=np.int64)
            if int((table >= 0).sum()) == len(values):  # no repeats: positions are yield positions
                self._table, self._ordered, self.n = table, values, len(values)
                return
        ordered_sorted, first = np.unique(values, return_index=True)
        order = np.argsort(first, kind="stable")
        position = np.empty(len(order), np.int64)
        position[order] = np.arange(len(order), dtype=np.int64)
        self._ordered, self.n = ordered_sorted[order], len(order)
        core = np.ones(len(ordered_sorted), np.bool_)
        if len(values) and span > self.DENSE * len(values) + 1024 and limit is not None:
            core = (ordered_sorted >= 0) & (ordered_sorted < limit)  # the dataset's indices; a few strays
            inside = ordered_sorted[core]
            self._low = int(inside[0]) if len(inside) else 0
            span = int(inside[-1]) - self._low + 1 if len(inside) else 0
        if len(values) and span <= self.DENSE * len(values) + 1024:
            table = np.full(span, -1, np.int32)
            table[ordered_sorted[core] - self._low] = position[core]
            self._table = table
            if not core.all():
                self._sorted, self._position = ordered_sorted[~core], position[~core]
        else:
            self._sorted, self._position = ordered_sorted, position

    def _search(self, values: IntArray) -> IntArray:
        """Positions by binary search among the ids the table does not cover (-1: not held)."""
        import numpy as np

        assert self._sorted is not None
        if not len(self._sorted):
            return np.full(len(values), -1, np.int64)
        at = np.minimum(np.searchsorted(self._sorted, values), len(self._sorted) - 1)
        return np.where(self._sorted[at] == values, self._position[at], -1)

    def ordered_ids(self) -> Any:
        """The axis's ids in order: an int64 numpy array for integer ids (no copy), else a list."""
        if self._dict is None:
            return self._ordered
        return list(self._dict)

    def lookup(self, ids: Any) -> IntArray:
        """The position of each id (a sequence, or an int64 numpy array), -1 where the reference epoch
        does not hold it."""
        import numpy as np

        if not len(ids) or not self.n:
            return np.full(len(ids), -1, np.int64)
        values = _int64(ids)
        if self._dict is None and values is not None:
            if self._table is not None:
                low, high = int(values.min()), int(values.max())
                if low >= self._low and high - self._low < len(self._table):
                    # every id in range: one gather, int32 positions (no offset array for indices from 0)
                    return self._table.take(values - self._low if self._low else values)
                offset = values - self._low
                inside = (offset >= 0) & (offset < len(self._table))
                out = np.full(len(values), -1, np.int64)
                out[inside] = self._table[offset[inside]]
                if self._sorted is not None and len(self._sorted):  # ids outside the table's range
                    out[~inside] = self._search(values[~inside])
                return out
            return self._search(values)
        if self._dict is None:  # integer reference, non-integer ids: compare as plain ints
            self._dict = {int(x): i for i, x in enumerate(self._ordered.tolist())}
        table = self._dict
        keys = ids.tolist() if isinstance(ids, np.ndarray) else ids
        return np.fromiter((table.get(x, -1) for x in keys), np.int64, len(keys))


def _int64(ids: Any) -> IntArray | None:
    """Integer ids as one int64 numpy array (None: not integers in an array). Only for epochs small
    enough to picture (``MAX_PICTURED``): this holds them all."""
    import numpy as np

    if isinstance(ids, array):
        if ids.typecode != "q":
            return None
        return np.frombuffer(ids, dtype=np.int64) if len(ids) else np.zeros(0, np.int64)
    if isinstance(ids, UnionIds):
        if not ids.numeric():
            return None
        ordered = ids.ordered()  # over a bitmap of the ids' range: no sort of every stream together
        if ordered is not None:
            return ordered
        parts = [p for p in (_int64(part) for part in ids.parts) if p is not None]
        if not parts:
            return np.zeros(0, np.int64)
        joined = np.concatenate(parts)
        _, first = np.unique(joined, return_index=True)  # each id at its first yield
        return joined[np.sort(first)]
    values = ids.array() if isinstance(ids, IdArray) else ids
    kind = getattr(getattr(values, "dtype", None), "kind", "")
    if kind not in ("i", "u") or getattr(values, "ndim", 0) != 1 or values.dtype == np.uint64:
        return None
    return np.asarray(values, dtype=np.int64)


def _epoch(
    epoch: int, axis: _Axis, ranks: Sequence[RankTrace], group: int, max_bins: int, ref: EpochTrace
) -> tuple[EpochFigure, IntArray]:
    """One epoch's figure, and each sample's owner (rank, NO_RANK or SEVERAL) on ``axis``; a strip per
    ``group`` consecutive ranks."""
    import numpy as np

    n = axis.n
    bins = min(n, max_bins)
    starts = (np.arange(bins, dtype=np.int64) * n) // max(bins, 1)
    sizes = np.diff(np.append(starts, n))
    # Per sample only a byte (yields, counted up to 2) and the owner (2 bytes below 32,767 ranks): the
    # shares, counts and owners are all the pictures keep; at 10,000,000 samples these are the largest
    yields = np.zeros(n, np.uint8)
    owner = np.full(n, NO_RANK, _owner_type(ranks))
    shares: list[bytes] = []
    foreign: list[int] = []
    hits = 0  # yields of samples the axis holds, over every rank (for the extra copies)
    pending: list[IntArray] = []  # the positions the ranks of the current strip saw (group > 1)
    for i, rank in enumerate(ranks):
        last = i + 1 == len(ranks) or (i + 1) % group == 0
        trace = rank.epochs[epoch]
        where = axis.lookup(trace.ids)
        hit = where if not len(where) or int(where.min()) >= 0 else where[where >= 0]
        del where
        foreign.append(int(len(trace.ids) - len(hit)))
        hits += len(hit)
        if len(hit) * _SPARSE < n:
            # A rank of a large world holds a sliver of the epoch: work on its own samples only, so
            # W ranks cost O(samples), not O(W x samples).
            distinct, copies = _counts(hit)
            yields[distinct] = np.minimum(yields[distinct] + np.minimum(copies, 2), 2)
            owner[distinct] = np.where(owner[distinct] == NO_RANK, rank.rank, SEVERAL)
            if group == 1:
                shares.append(_sparse_shares(distinct, starts, sizes))
            else:
                pending.append(distinct)
                if last:
                    shares.append(_sparse_shares(_counts(np.concatenate(pending))[0], starts, sizes))
                    pending = []
            continue
        seen = np.zeros(n, np.bool_)
        seen[hit] = True
        np.add(yields, seen, out=yields, casting="unsafe")
        if int(np.count_nonzero(seen)) != len(hit):  # a sample twice on this rank
            ordered = np.sort(hit)
            yields[ordered[1:][ordered[1:] == ordered[:-1]]] = 2
            del ordered
        np.minimum(yields, 2, out=yields)
        several = seen & (owner != NO_RANK)
        owner[seen] = rank.rank
        owner[several] = SEVERAL
        del hit, several
        if group == 1:
            shares.append(_shares(seen, starts, sizes))
        else:
            pending.append(np.flatnonzero(seen))
            if last:
                shares.append(_sparse_shares(_counts(np.concatenate(pending))[0], starts, sizes))
                pending = []
    missing = yields == 0
    duplicated = yields > 1
    figure = EpochFigure(
        epoch=epoch,
        samples=n,
        bins=bins,
        rank_share=tuple(shares),
        missing=_shares(missing, starts, sizes),
        duplicated=_shares(duplicated, starts, sizes),
        missing_count=int(np.count_nonzero(missing)),
        duplicated_count=int(np.count_nonzero(duplicated)),
        extra_copies=hits - (n - int(np.count_nonzero(missing))),
        foreign=tuple(foreign),
        yielded=tuple(len(r.epochs[epoch].ids) for r in ranks),
        steps=tuple(r.epochs[epoch].num_batches for r in ranks),
        len_loader=tuple(r.epochs[epoch].len_loader for r in ranks),
        reference_steps=ref.num_batches,
    )
    return figure, owner


def _owner_type(ranks: Sequence[RankTrace]) -> Any:
    """The narrowest signed type that holds every rank and NO_RANK/SEVERAL."""
    import numpy as np

    return np.int16 if max((r.rank for r in ranks), default=0) < np.iinfo(np.int16).max else np.int32


def _counts(values: Any) -> tuple[Any, Any]:
    """(distinct values, how often each occurs), by sorting (numpy's unique hashes: slow on shuffled ints)."""
    import numpy as np

    ordered = np.sort(values)
    if not len(ordered):
        return ordered, np.zeros(0, np.int64)
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    return ordered[starts], np.diff(np.append(starts, len(ordered)))


def _shares(flags: Any, starts: Any, sizes: Any) -> bytes:
    """Per bin, the share of flagged samples as 0..255, rounded up so that one sample shows."""
    import numpy as np

    if not len(sizes):
        return b""
    counts = np.add.reduceat(flags.view(np.uint8), starts, dtype=np.int64)  # no 8-byte copy of the flags
    levels = np.ceil(counts * LEVELS / sizes).astype(np.uint8)
    return bytes(levels.tobytes())


def _sparse_shares(positions: Any, starts: Any, sizes: Any) -> bytes:
    """:func:`_shares` of the flags set at ``positions`` (distinct), without an array of every sample."""
    import numpy as np

    if not len(sizes):
        return b""
    counts = np.bincount(np.searchsorted(starts, positions, side="right") - 1, minlength=len(sizes))
    levels = np.ceil(counts * LEVELS / sizes).astype(np.uint8)
    return bytes(levels.tobytes())


def _to_axis(owner: IntArray, axis: _Axis, target: _Axis) -> IntArray:
    """Owners indexed by ``axis`` positions, re-indexed by ``target`` positions (NO_RANK elsewhere)."""
    import numpy as np

    out = np.full(target.n, NO_RANK, owner.dtype)
    where = target.lookup(axis.ordered_ids())
    hit = where >= 0
    out[where[hit]] = owner[hit]
    return out


def _columns(samples: int, max_bins: int) -> IntArray | None:
    """The sample positions the assignment picture shows: all of them, or a fixed random subset.

    Not bins: a bin's majority owner is a tie under a correct split (every rank owns the same share),
    which would paint identical rows and read as "no reshuffle". Not a regular stride either: a stride
    that is a multiple of the world size would always land on the same rank.
    """
    import numpy as np

    if samples <= max_bins:
        return None
    return np.sort(np.random.default_rng(0).choice(samples, size=max_bins, replace=False))


def _changed(before: IntArray, after: IntArray) -> float | None:
    """The share of samples owned by one rank in both epochs whose rank differs; None if there are none."""
    both = (before >= 0) & (after >= 0)
    total = int(both.sum())
    if not total:
        return None
    share = int(((before != after) & both).sum()) / total
    return share if math.isfinite(share) else None
