"""Set algebra on integer id arrays: the counts the checks need, without a Python set of the ids.

A ten-million-sample epoch as a Python set costs seconds and gigabytes; as an ``array('q')`` it is
80 MB, and numpy answers "how many distinct", "how many the reference never yields" and "how many
copies a rank holds of its own items" in a few passes. Ids in a compact range (dataset indices) are
counted in a table indexed by id; sparse ids are first mapped to their rank among the distinct ids
(one sort), which gives the same table. Everything here equals the set arithmetic it replaces: the
property tests in ``tests/test_checks.py`` compare the two.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

DENSE_SLACK = 1 << 16  # a table this long is always fine, however few the ids


def as_int64(ids: Sequence[Any]) -> IntArray | None:
    """A zero-copy numpy view of ``array('q')`` ids; ``None`` for any other container."""
    if type(ids) is not array or ids.typecode != "q":
        return None
    if not len(ids):
        return np.zeros(0, np.int64)
    return np.frombuffer(ids, dtype=np.int64)


def same_ints(a: Sequence[Any], b: Sequence[Any]) -> bool | None:
    """Equal contents of two ``array('q')`` (``None`` when either is not one)."""
    x, y = as_int64(a), as_int64(b)
    if x is None or y is None:
        return None
    return len(x) == len(y) and bool(np.array_equal(x, y))


def _dense(span: int, total: int, per_id: int = 2) -> bool:
    """A table of ``span`` entries is worth it for ``total`` ids (``per_id`` entries each, at most)."""
    return span <= per_id * total + DENSE_SLACK


def _distinct_sorted(a: IntArray) -> IntArray:
    """``np.unique`` by sorting (numpy's hash-based unique is far slower on large shuffled ints)."""
    ordered = np.sort(a)
    if len(ordered) < 2:
        return ordered
    keep = np.empty(len(ordered), np.bool_)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


@dataclass(frozen=True)
class EpochCounts:
    """One epoch's counts: the reference against the ranks together, and every rank's own repeats.

    Ids are positions in a table: ``id - lo`` when ``values`` is ``None``, else the index of the id
    in the sorted ``values``.
    """

    lo: int
    values: IntArray | None
    ref_seen: BoolArray  # the reference holds this id
    ref_distinct: int
    ddp_distinct: int
    extras: int  # distinct ids some rank sees and the reference never yields
    within: tuple[int, ...]  # per rank: copies of ids it already holds

    def ref_ids(self) -> IntArray:
        """The reference's distinct ids, sorted."""
        at = np.flatnonzero(self.ref_seen)
        return at + self.lo if self.values is None else self.values[at]


def epoch_counts(reference: IntArray, ranks: Sequence[IntArray]) -> EpochCounts:
    arrays = [reference, *ranks]
    total = sum(len(a) for a in arrays)
    filled = [a for a in arrays if len(a)]
    lo = min((int(a.min()) for a in filled), default=0)
    hi = max((int(a.max()) for a in filled), default=-1)
    values: IntArray | None = None
    if _dense(hi - lo + 1, total):
        span = hi - lo + 1

        def codes(a: IntArray) -> IntArray:
            return a - lo if lo else a

        ref_codes, rank_codes = codes(reference), [codes(r) for r in ranks]
    else:  # sparse ids: positions among the distinct ids instead
        values, inverse = np.unique(np.concatenate(arrays), return_inverse=True)
        inverse = inverse.reshape(-1)
        span, lo = len(values), 0
        bounds = np.cumsum([len(a) for a in arrays])[:-1]
        ref_codes, *rank_codes = np.split(inverse, bounds)
    ref_seen = np.zeros(max(span, 0), np.bool_)
    ref_seen[ref_codes] = True
    joined = np.concatenate(rank_codes) if rank_codes else np.zeros(0, np.int64)
    counts = np.bincount(joined, minlength=max(span, 0))
    del joined
    ddp_seen = counts > 0
    repeated = counts > 1
    del counts
    ddp_distinct = int(np.count_nonzero(ddp_seen))
    extras = int(np.count_nonzero(ddp_seen & ~ref_seen))
    del ddp_seen
    within = [0] * len(rank_codes)
    if repeated.any():  # only ids seen twice can be a rank's own repeats: few, whatever the epoch
        for r, codes_r in enumerate(rank_codes):
            held = codes_r[repeated[codes_r]]
            within[r] = len(held) - len(_distinct_sorted(held))
    return EpochCounts(
        lo=lo,
        values=values,
        ref_seen=ref_seen,
        ref_distinct=int(np.count_nonzero(ref_seen)),
        ddp_distinct=ddp_distinct,
        extras=extras,
        within=tuple(within),
    )


def same_reference_ids(a: EpochCounts, b: EpochCounts) -> bool:
    """The two epochs' references hold the same distinct ids."""
    if a.ref_distinct != b.ref_distinct:
        return False
    if a.values is None and b.values is None and a.lo == b.lo:
        x, y = a.ref_seen, b.ref_seen
        n = min(len(x), len(y))
        return bool(np.array_equal(x[:n], y[:n]) and not x[n:].any() and not y[n:].any())
    return bool(np.array_equal(a.ref_ids(), b.ref_ids()))


def same_id_set(a: IntArray, b: IntArray) -> bool:
    """``set(a) == set(b)``."""
    if not len(a) or not len(b):
        return not len(a) and not len(b)
    lo = min(int(a.min()), int(b.min()))
    hi = max(int(a.max()), int(b.max()))
    if not _dense(hi - lo + 1, len(a) + len(b), per_id=32):  # one byte per entry: a generous table
        return bool(np.array_equal(_distinct_sorted(a), _distinct_sorted(b)))
    x = np.zeros(hi - lo + 1, np.bool_)
    y = np.zeros(hi - lo + 1, np.bool_)
    x[a - lo if lo else a] = True
    y[b - lo if lo else b] = True
    return bool(np.array_equal(x, y))
