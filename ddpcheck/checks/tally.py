"""One epoch counted in bounded memory: packed bitmaps by id range, streamed rank by rank.

The checks ask of an epoch how many distinct ids the reference and the ranks hold, how many the ranks
hold that the reference never yields, how often each rank repeats itself and which ids reach two ranks;
on a failure, a few ids and ranks by name. Python sets of a billion ids take tens of GB; here the ids
are read one rank at a time, a few million at a time, and what is kept is one bit per id of their range
(``seen``, ``cross``: on two ranks or more, ``twice``: yielded twice or more, ``ref``: in the reference),
N/8 bytes each. Ids outside that range (negative, wrapped, beyond the dataset, sparse keys) are few by
nature and are counted exactly by sorting. The evidence a failure names comes from a second pass over
the ranks (:meth:`EpochTally.overlap_evidence`, :meth:`EpochTally.strangers`).

Everything here equals the set arithmetic it replaces: ``tests/test_scale.py`` compares the verdicts.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from ddpcheck.trace import IdArray, UnionIds

IntArray = npt.NDArray[np.int64]
CHUNK = 1 << 22  # ids read at a time: 32 MB as int64
BLOCK = 1 << 24  # bitmap bytes scanned at a time
EXAMPLES = 5
SLACK = 1 << 23  # a bitmap over this many ids (1 MB) is always fine, however few the ids
BYTE_SPAN = 1 << 27  # up to this many ids, a byte per id (128 MB a bitmap); a bit per id beyond
PER_ID = 16  # else a bitmap spans at most this many ids per id held (2 bytes per id per bitmap)
_ONE = np.uint8(1)
_BITWISE_COUNT = getattr(np, "bitwise_count", None)  # NumPy 2.0 and later; pyproject allows 1.24
CROSS_PAIRS = 1 << 24  # (id, rank) holdings of ids on several ranks listed at most (256 MB)


def int_ids(ids: object) -> bool:
    """Ids held as integers in one array: ``array('q')``, a 1-d integer numpy array, an :class:`IdArray`
    (unsigned 64-bit ids are not: they do not all fit the int64 the checks count in)."""
    if type(ids) is array:
        return ids.typecode == "q"
    if isinstance(ids, IdArray):
        return np.dtype(ids.dtype).kind in "iu" and np.dtype(ids.dtype) != np.uint64
    return isinstance(ids, np.ndarray) and ids.ndim == 1 and ids.dtype.kind in "iu" and ids.dtype != np.uint64


def values_of(ids: Any) -> Any:
    """A numpy view of integer ids (no copy; a fresh memory map for a file)."""
    if type(ids) is array:
        return np.frombuffer(ids, dtype=np.int64) if len(ids) else np.zeros(0, np.int64)
    if isinstance(ids, IdArray):
        return ids.array()
    return ids


def chunks(ids: Any, size: int = CHUNK) -> Iterator[tuple[int, IntArray]]:
    """``(start, ids[start:start + size] as int64)`` over integer ids (a file read part by part)."""
    if isinstance(ids, IdArray) and ids.path and len(ids):
        yield from _file_chunks(ids, size)
        return
    values = values_of(ids)
    for start in range(0, len(values), size):
        part = values[start : start + size]
        yield start, part if part.dtype == np.int64 else part.astype(np.int64)


def _file_chunks(ids: IdArray, size: int) -> Iterator[tuple[int, IntArray]]:
    """A file's ids read with plain reads, never mapped: a memory map's pages stayed counted in the
    judging process until the map was dropped (at 1e8 ids, 0.4 GB of a simulated world's peak)."""
    mapped = ids.array()  # reads the header once: the ids' type and where they start
    offset, dtype = int(mapped.offset), mapped.dtype
    del mapped
    with open(ids.path, "rb") as f:
        f.seek(offset)
        for start in range(0, len(ids), size):
            part = np.fromfile(f, dtype=dtype, count=min(size, len(ids) - start))
            if not len(part):
                raise ValueError(f"{ids.path} ends after {start} of its {len(ids)} ids")
            yield start, part if part.dtype == np.int64 else part.astype(np.int64)


def bounds(ids: Any) -> tuple[int, int]:
    """(smallest, largest) id; ``hi < lo`` when there are none. Free for an :class:`IdArray`."""
    if isinstance(ids, IdArray):
        return ids.lo, ids.hi
    if not len(ids):
        return 0, -1
    values = values_of(ids)
    return int(values.min()), int(values.max())


def same_ids(a: Any, b: Any) -> bool:
    """Equal sequences of integer ids, compared a chunk at a time."""
    if len(a) != len(b):
        return False
    x, y = values_of(a), values_of(b)
    return all(bool(np.array_equal(x[i : i + CHUNK], y[i : i + CHUNK])) for i in range(0, len(x), CHUNK))


def first_difference(a: Any, b: Any) -> int:
    """The first position where two integer id sequences differ (the shorter length if one is a prefix)."""
    x, y = values_of(a), values_of(b)
    n = min(len(x), len(y))
    for i in range(0, n, CHUNK):
        differs = np.flatnonzero(x[i : min(i + CHUNK, n)] != y[i : min(i + CHUNK, n)])
        if len(differs):
            return i + int(differs[0])
    return n


def mix(x: Any) -> Any:
    """splitmix64's finaliser on uint64 values: every input bit reaches every output bit."""
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z


def stream_hash(ids: Any) -> int:
    """A 64-bit hash of an id sequence that depends on its order (equal sequences, equal hashes)."""
    total = np.uint64(len(ids))
    with np.errstate(over="ignore"):
        for start, part in chunks(ids):
            at = np.arange(start, start + len(part), dtype=np.uint64) * np.uint64(0xD1342543DE82EF95)
            total += mix(mix(part.view(np.uint64)) ^ at).sum(dtype=np.uint64)
    return int(total)


SAMPLED = 64  # places of a stream read for its key (streams equal there are compared id by id)


def stream_sample(ids: Any) -> tuple[int, ...]:
    """A key equal for equal id sequences: the length and the ids at ``SAMPLED`` evenly spaced places
    (a few pages of a file, where a hash reads all of it). Equal keys do not make equal streams: the
    caller compares them whole."""
    n = len(ids)
    if not n:
        return (0,)
    places = np.unique(np.linspace(0, n - 1, min(n, SAMPLED)).astype(np.int64))
    return (n, *values_of(ids)[places].tolist())


def popcount(words: Any) -> int:
    """The set bits of a bitmap block: ``np.bitwise_count`` where NumPy has it (2.0+), else the block's
    bytes unpacked (NumPy 1.24, the floor pyproject declares: eight times the block's bytes, once)."""
    if _BITWISE_COUNT is not None:
        return int(_BITWISE_COUNT(words).sum(dtype=np.int64))
    return int(np.unpackbits(np.ascontiguousarray(words).view(np.uint8)).sum(dtype=np.int64))


class Bits:
    """A flag per id of ``[base, base + span)``; offsets (``id - base``) index it.

    Packed (a bit per id) over a large range; a byte per id over a small one (up to ``BYTE_SPAN``
    ids), where setting and testing cost a plain numpy gather or scatter.
    """

    def __init__(self, base: int, span: int) -> None:
        self.base, self.span = base, span
        self.packed = span > BYTE_SPAN
        self.words = np.zeros((span + 7) >> 3, np.uint8) if self.packed else np.zeros(span, np.bool_)

    def test(self, k: IntArray) -> npt.NDArray[np.bool_]:
        if not self.packed:
            return np.asarray(self.words[k], np.bool_)
        return (self.words[k >> 3] & np.left_shift(_ONE, (k & 7).astype(np.uint8))) != 0

    def set(self, k: IntArray) -> None:
        if not len(k):
            return
        if not self.packed:
            self.words[k] = True
            return
        units, bits = k >> 3, np.left_shift(_ONE, (k & 7).astype(np.uint8))
        step = units[1:] != units[:-1]
        if len(k) > 1 and bool((units[1:] >= units[:-1]).all()):  # sorted (the counting pass): an OR a byte
            starts = np.flatnonzero(step) + 1
            starts = np.concatenate((np.zeros(1, starts.dtype), starts))
            self.words[units[starts]] |= np.bitwise_or.reduceat(bits, starts)
        else:
            np.bitwise_or.at(self.words, units, bits)

    def _ones(self, w: Any) -> int:
        return popcount(w) if self.packed else int(np.count_nonzero(w))

    def count(self) -> int:
        w = self.words
        return sum(self._ones(w[i : i + BLOCK]) for i in range(0, len(w), BLOCK))

    def blocks(self, *others: tuple[Bits, bool]) -> Iterator[tuple[int, Any]]:
        """``(first unit, units)`` of this bitmap, each ANDed with the others (``True``: their complement)."""
        for i in range(0, len(self.words), BLOCK):
            w = self.words[i : i + BLOCK].copy()
            for other, negate in others:
                part = other.words[i : i + BLOCK]
                w &= ~part if negate else part
            yield i, w

    def offsets(self, first: int, w: Any) -> IntArray:
        """The offsets flagged in ``w``, a block of this bitmap's units starting at unit ``first``."""
        at = np.flatnonzero(w)
        if not self.packed or not len(at):
            return (at + first).astype(np.int64)
        bits = np.unpackbits(w[at][:, None], axis=1, bitorder="little")
        rows, cols = np.nonzero(bits)
        return ((first + at[rows]) * 8 + cols).astype(np.int64)

    def count_with(self, *others: tuple[Bits, bool]) -> int:
        return sum(self._ones(w) for _, w in self.blocks(*others))

    def smallest(self, limit: int, *others: tuple[Bits, bool]) -> list[int]:
        """The ``limit`` smallest ids set here (and in/out of the others)."""
        found: list[int] = []
        for first, w in self.blocks(*others):
            nonzero = np.flatnonzero(w)[:limit]
            if len(nonzero):
                found += (self.offsets(first, w[: int(nonzero[-1]) + 1]) + self.base).tolist()
            if len(found) >= limit:
                break
        return found[:limit]


def _distinct(sorted_values: IntArray) -> tuple[IntArray, IntArray]:
    """(distinct values, values repeated) of a sorted array."""
    if len(sorted_values) < 2:
        return sorted_values, sorted_values[:0]
    again = sorted_values[1:] == sorted_values[:-1]
    if not again.any():
        return sorted_values, sorted_values[:0]
    keep = np.empty(len(sorted_values), np.bool_)
    keep[0] = True
    np.logical_not(again, out=keep[1:])
    return sorted_values[keep], sorted_values[1:][again]


def unique(values: IntArray) -> IntArray:
    """Distinct values, sorted (by sorting: numpy's own unique is far slower on large shuffled ints)."""
    return _distinct(np.sort(values))[0]


def _sorted(values: IntArray, span: int) -> IntArray:
    """``values`` sorted; offsets that fit 32 bits sort as such (twice as fast)."""
    if span <= 1 << 32:
        return np.sort(values.astype(np.uint32)).astype(np.int64)
    return np.sort(values)


def _isin(values: IntArray, sorted_set: IntArray) -> npt.NDArray[np.bool_]:
    if not len(sorted_set) or not len(values):
        return np.zeros(len(values), np.bool_)
    at = np.minimum(np.searchsorted(sorted_set, values), len(sorted_set) - 1)
    return np.asarray(sorted_set[at] == values)


def _merged_smallest(limit: int, *parts: Sequence[int]) -> list[int]:
    return list(heapq.nsmallest(limit, (x for p in parts for x in p)))


@dataclass(frozen=True)
class OutOfRange:
    """The first id of a stream outside ``[0, limit)`` and how many there are."""

    position: int
    value: int
    count: int
    negative: int  # of ``count``, how many are negative


@dataclass(frozen=True)
class SharedPair:
    """Two ranks that share items too many ranks hold, and a few of them (smallest first)."""

    first: int
    second: int
    shared: tuple[object, ...]


@dataclass(frozen=True)
class Strangers:
    """Ids some rank yields and the reference never does: how many, which ranks, a few of the first's."""

    count: int
    ranks: tuple[int, ...]
    examples: tuple[object, ...]


class EpochTally:
    """The reference's epoch and every rank's, counted in one pass each (see the module's docstring).

    ``limit``: the dataset's length when ids are its indices; the bitmaps then cover ``[0, limit)`` and
    anything outside is an id no index can be. ``None`` from :meth:`of` when the reference repeats ids
    (the per-id counts that needs are the exact path's).
    """

    def __init__(self, reference: Any, ranks: Sequence[Any], limit: int | None = None) -> None:
        self.reference, self.ranks, self.limit = reference, list(ranks), limit
        self.union = _union_of(reference, self.ranks)  # the stand-in reference: the ranks' ids together
        self.ref_len = 0 if self.union else len(reference)
        self.lengths = [len(r) for r in self.ranks]
        self.total = sum(self.lengths)
        self.base, self.span = self._window()
        self.ref = Bits(self.base, self.span)
        self.seen = Bits(self.base, self.span)
        self.cross = Bits(self.base, self.span)
        self.twice = Bits(self.base, self.span)
        self.ref_out = np.zeros(0, np.int64)
        self.ref_repeats = False if self.union else self._count_reference()
        self.distinct: list[int] = []
        self._outside: list[tuple[IntArray, int]] = []  # (distinct ids outside the window, rank)
        self._rank_twice_out: list[IntArray] = []
        if self.ref_repeats:  # declined (see ``of``): the ranks are not counted
            self._merge_outside()
            return
        mine = Bits(self.base, self.span) if any(n > CHUNK for n in self.lengths) else None
        for r, ids in enumerate(self.ranks):
            self.distinct.append(self._count_rank(r, ids, mine if len(ids) > CHUNK else None))
        self._merge_outside()
        if self.union:  # the reference is what the ranks saw, each id once
            self.ref, self.ref_out, self.ref_len = self.seen, self.seen_out, self.ddp_distinct
            reference.settle(self.ref_len)

    @classmethod
    def of(cls, reference: Any, ranks: Sequence[Any], limit: int | None = None) -> EpochTally | None:
        if not ((int_ids(reference) or _union_of(reference, ranks)) and all(int_ids(r) for r in ranks)):
            return None
        tally = cls(reference, ranks, limit)
        return None if tally.ref_repeats else tally

    # --- the counting pass ---------------------------------------------------------------------------

    def _window(self) -> tuple[int, int]:
        """The id range the bitmaps cover: every id where they are dense, else the dataset's indices."""
        spans = [bounds(ids) for ids in ([] if self.union else [self.reference]) + self.ranks]
        spans = [(lo, hi) for lo, hi in spans if hi >= lo]
        if not spans:
            return 0, 0
        lo, hi = min(s[0] for s in spans), max(s[1] for s in spans)
        if self.limit is not None:
            lo, hi = max(lo, 0), min(hi, self.limit - 1)
        span = hi - lo + 1
        if span <= 0 or span > PER_ID * (self.total + self.ref_len) + SLACK:
            return 0, 0
        return lo, span

    def _split(self, part: IntArray) -> tuple[IntArray, IntArray]:
        """(offsets of the ids inside the window, ids outside it)."""
        k = part - self.base if self.base else part
        inside = (k >= 0) & (k < self.span)
        if inside.all():
            return k, part[:0]
        return k[inside], part[~inside]

    def _count_reference(self) -> bool:
        """Fill ``ref`` and ``ref_out``; True when the reference repeats an id."""
        repeats = False
        outside: list[IntArray] = []
        for _, part in chunks(self.reference):
            k, out = self._split(part)
            u, again = _distinct(_sorted(k, self.span))
            was = self.ref.test(u)
            repeats = repeats or bool(len(again)) or bool(was.any())
            self.ref.set(u)
            if len(out):
                outside.append(out)
        if outside:
            values, again = _distinct(np.sort(np.concatenate(outside)))
            self.ref_out, repeats = values, repeats or bool(len(again))
        return repeats

    def _count_rank(self, rank: int, ids: Any, mine: Bits | None) -> int:
        """One rank's pass: its distinct ids, marking ``seen``, ``cross`` and ``twice``."""
        distinct = 0
        outside: list[IntArray] = []
        if mine is not None:
            mine.words.fill(0)
        for _, part in chunks(ids):
            k, out = self._split(part)
            u, again = _distinct(_sorted(k, self.span))
            self.twice.set(again)
            if mine is not None:
                held = mine.test(u)
                if held.any():
                    self.twice.set(u[held])
                    u = u[~held]
                mine.set(u)
            was = self.seen.test(u)
            self.seen.set(u)
            if was.any():
                self.cross.set(u[was])
                self.twice.set(u[was])
            distinct += len(u)
            if len(out):
                outside.append(out)
        if outside:
            values, again = _distinct(np.sort(np.concatenate(outside)))
            self._outside.append((values, rank))
            self._rank_twice_out.append(unique(again))
            distinct += len(values)
        return distinct

    def _merge_outside(self) -> None:
        """Outside ids over all ranks: which are seen, on two ranks, yielded twice."""
        if not self._outside:
            self.seen_out = self.cross_out = self.twice_out = np.zeros(0, np.int64)
            return
        values = np.concatenate([v for v, _ in self._outside])
        ordered = np.sort(values)
        self.seen_out, again = _distinct(ordered)
        self.cross_out = unique(again)
        self.twice_out = unique(np.concatenate([self.cross_out, *self._rank_twice_out]))

    # --- counts --------------------------------------------------------------------------------------

    @cached_property
    def ref_distinct(self) -> int:
        return self.ref.count() + len(self.ref_out)

    @cached_property
    def ddp_distinct(self) -> int:
        return self.seen.count() + len(self.seen_out)

    @cached_property
    def extras(self) -> int:
        """Distinct ids some rank yields and the reference never does."""
        return self.seen.count_with((self.ref, True)) + int(
            np.count_nonzero(~_isin(self.seen_out, self.ref_out))
        )

    @cached_property
    def overlap_count(self) -> int:
        """Distinct ids on two ranks or more."""
        return self.cross.count() + len(self.cross_out)

    def within(self, rank: int) -> int:
        return self.lengths[rank] - self.distinct[rank]

    # --- evidence (second passes) --------------------------------------------------------------------

    def missing_examples(self, limit: int = EXAMPLES) -> tuple[int, ...]:
        """The smallest reference ids no rank yields."""
        inside = self.ref.smallest(limit, (self.seen, True))
        outside = self.ref_out[~_isin(self.ref_out, self.seen_out)][:limit].tolist()
        return tuple(_merged_smallest(limit, inside, outside))

    def duplicated_examples(self, limit: int = EXAMPLES) -> tuple[int, ...]:
        """The smallest ids the ranks yield more than once in all."""
        return tuple(_merged_smallest(limit, self.twice.smallest(limit), self.twice_out[:limit].tolist()))

    def _members(self, ids: Any, bits: Bits, out: IntArray) -> IntArray:
        """The distinct ids of ``ids`` that are set in ``bits`` or listed in ``out`` (sorted)."""
        found: list[IntArray] = []
        for _, part in chunks(ids):
            k, rest = self._split(part)
            hit = k[bits.test(k)] + self.base if len(k) else k
            found += [hit, rest[_isin(rest, out)]]
        return unique(np.concatenate(found)) if found else np.zeros(0, np.int64)

    @cached_property
    def cross_holders(self) -> tuple[IntArray, IntArray] | None:
        """``(ids, ranks)``: every rank holding an id that is on two ranks or more, one entry per (id, rank),
        sorted by id then rank (None: more than ``CROSS_PAIRS`` entries, where a loader spreads most ids
        over many ranks). One pass over the ranks; what the split of ranks into groups is judged on."""
        if not self.overlap_count:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        found: list[IntArray] = []
        owners: list[IntArray] = []
        held = 0
        for r, ids in enumerate(self.ranks):
            mine = self._members(ids, self.cross, self.cross_out)
            held += len(mine)
            if held > CROSS_PAIRS:
                return None
            found.append(mine)
            owners.append(np.full(len(mine), r, np.int64))
        ids, ranks = np.concatenate(found), np.concatenate(owners)
        order = np.lexsort((ranks, ids))
        return ids[order], ranks[order]

    def split_in_groups(self, size: int) -> bool | None:
        """No id is on two ranks of one group of ``size`` consecutive ranks (None: the holders are too
        many to list; ask the ranks' unions instead)."""
        holders = self.cross_holders
        if holders is None:
            return None
        ids, ranks = holders
        groups = ranks // size
        return not bool(((ids[1:] == ids[:-1]) & (groups[1:] == groups[:-1])).any())

    def overlap_evidence(self) -> SharedPair | None:
        """The lowest rank holding an id on two ranks, the lowest other rank sharing one of its ids, and
        a few of the ids they share."""
        if not self.overlap_count:
            return None
        holders = self.cross_holders
        if holders is not None and len(holders[0]):
            ids, ranks = holders
            first = int(ranks.min())
            mine = ids[ranks == first]
            others = _isin(ids, mine) & (ranks != first)
            if others.any():
                second = int(ranks[others].min())
                shared = ids[(ranks == second) & _isin(ids, mine)]
                return SharedPair(first, second, tuple(shared[:EXAMPLES].tolist()))
        held = ((r, self._members(ids, self.cross, self.cross_out)) for r, ids in enumerate(self.ranks))
        first, mine = next(((r, m) for r, m in held if len(m)), (-1, None))
        if mine is None:
            return None
        for second in range(first + 1, len(self.ranks)):
            shared = mine[_isin(mine, distinct_ids(self.ranks[second]))]
            if len(shared):
                return SharedPair(first, second, tuple(shared[:EXAMPLES].tolist()))
        return None

    def in_reference(self, rank: int) -> int:
        """How many of a rank's distinct ids the reference holds."""
        return len(self._members(self.ranks[rank], self.ref, self.ref_out))

    def strangers(self, also: Sequence[EpochTally] = (), indices: int | None = None) -> Strangers:
        """Ids the ranks yield and the reference never does, less any in ``also``'s references and, with
        ``indices``, any in ``[0, indices)`` (an index the dataset has)."""
        bits = Bits(self.base, self.span)
        same = [(t.ref, True) for t in also if (t.base, t.span) == (self.base, self.span)]
        apart = [t for t in also if (t.base, t.span) != (self.base, self.span)]
        for first, w in self.seen.blocks((self.ref, True), *same):
            bits.words[first : first + len(w)] = w
            if apart:
                k = bits.offsets(first, w)
                drop = np.zeros(len(k), np.bool_)
                for t in apart:
                    drop |= _contains(t, k + self.base)
                _unset(bits, k[drop])
        out = self.seen_out[~_isin(self.seen_out, self.ref_out)]
        for t in also:
            out = out[~_contains(t, out)]
        if indices is not None:
            lo, hi = max(0, -self.base), min(self.span, indices - self.base)
            if hi > lo:
                _clear(bits, lo, hi)
            out = out[(out < 0) | (out >= indices)]
        count = bits.count() + len(out)
        if not count:
            return Strangers(0, (), ())
        ranks: list[int] = []
        examples: tuple[object, ...] = ()
        for r, ids in enumerate(self.ranks):
            held = self._members(ids, bits, out)
            if len(held):
                ranks.append(r)
                examples = examples or tuple(held[:EXAMPLES].tolist())
        return Strangers(count, tuple(ranks), examples)

    def same_reference(self, other: EpochTally) -> bool:
        """The two epochs' references hold the same distinct ids."""
        if self.ref_distinct != other.ref_distinct:
            return False
        if (self.base, self.span) == (other.base, other.span):
            return bool(
                np.array_equal(self.ref_out, other.ref_out)
                and np.array_equal(self.ref.words, other.ref.words)
            )
        if not _contains(other, self.ref_out).all():
            return False
        return all(
            _contains(other, self.ref.offsets(first, w) + self.base).all() for first, w in self.ref.blocks()
        )

    def streams(self) -> list[tuple[int, int]]:
        """Per rank (length, order-dependent hash): equal streams have equal keys."""
        return [(len(ids), stream_hash(ids)) for ids in self.ranks]


def _union_of(reference: Any, ranks: Sequence[Any]) -> bool:
    """``reference`` is the union of exactly these ranks' ids (a launch judged without a reference)."""
    if not isinstance(reference, UnionIds) or len(reference.parts) != len(ranks):
        return False
    return all(p is r for p, r in zip(reference.parts, ranks, strict=True)) and reference.numeric()


def _contains(tally: EpochTally, values: IntArray) -> npt.NDArray[np.bool_]:
    """Which ``values`` the tally's reference holds."""
    k = values - tally.base
    inside = (k >= 0) & (k < tally.span)
    found = np.zeros(len(values), np.bool_)
    found[inside] = tally.ref.test(k[inside])
    found[~inside] = _isin(values[~inside], tally.ref_out)
    return found


def _clear(bits: Bits, lo: int, hi: int) -> None:
    """Clear offsets ``[lo, hi)``."""
    if not bits.packed:
        bits.words[lo:hi] = False
        return
    first, last = (lo + 7) >> 3, hi >> 3
    if first < last:
        bits.words[first:last] = 0
    _unset(bits, np.array([*range(lo, min(first * 8, hi)), *range(max(last * 8, lo), hi)], np.int64))


def _unset(bits: Bits, k: IntArray) -> None:
    if not bits.packed:
        bits.words[k] = False
    elif len(k):
        np.bitwise_and.at(bits.words, k >> 3, ~np.left_shift(_ONE, (k & 7).astype(np.uint8)))


def distinct_ids(ids: Any) -> IntArray:
    """A rank's distinct ids, sorted (for comparing two ranks' sets exactly)."""
    parts = [unique(part) for _, part in chunks(ids)]
    return unique(np.concatenate(parts)) if len(parts) > 1 else (parts[0] if parts else np.zeros(0, np.int64))


def same_set(a: Any, b: Any) -> bool:
    """``set(a) == set(b)`` for integer ids: by sorting when small, by bitmaps over their range when large."""
    (alo, ahi), (blo, bhi) = bounds(a), bounds(b)
    if ahi < alo or bhi < blo:
        return (ahi < alo) == (bhi < blo)
    if (alo, ahi) != (blo, bhi):
        return False
    span = ahi - alo + 1
    if len(a) + len(b) <= 2 * CHUNK or span > PER_ID * (len(a) + len(b)) + SLACK:
        return bool(np.array_equal(distinct_ids(a), distinct_ids(b)))
    x, y = Bits(alo, span), Bits(alo, span)
    for ids, bits in ((a, x), (b, y)):
        for _, part in chunks(ids):
            bits.set(part - alo)
    return bool(np.array_equal(x.words, y.words))
