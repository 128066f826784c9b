"""Ids held against the dataset's length: an index that overflowed its integer type or ran past the data.

A sampler that keeps its index map in a type too narrow wraps once the dataset outgrows it: past 2^15
samples an int16 index turns negative, past 2^31 an int32 one, past 2^32 a uint32 one starts again from
0. The loader still runs (``dataset[-5]`` reads from the end), and a single process that wraps the same
way agrees with every rank, so comparing ranks with one process sees nothing: only the dataset's own
length does. Judged where the ids are the sampler's own indices into the dataset (``index_space``); the
first bad position (epoch, rank, position) is named, so the wrap can be found in the index map.

Not a finding where most ids lie outside the dataset's length: a map-style dataset may be keyed by any
ints it likes (a dict of sparse ids), and then its keys are not indices at all.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from ddpcheck.checks.tally import bounds, chunks, int_ids
from ddpcheck.trace import RunTrace

OVERFLOW = (
    "an index overflowed: the sampler's index map is stored in an integer type too narrow for the dataset "
    "(it wraps to negative or small indices), or it indexes past the dataset's end"
)
OVERFLOW_FIX = (
    "store the index map in int64 (numpy's default), and check its largest index against len(dataset) "
    "when it is built"
)


@dataclass(frozen=True)
class Overflow:
    """The first id outside ``[0, limit)``, where it is, and how many of the epoch's ids are outside."""

    epoch: int
    rank: int
    position: int
    value: int
    limit: int
    count: int  # ids outside [0, limit) in this epoch, over every rank
    negative: int  # of those, negative ones
    ranks: tuple[int, ...]  # the ranks holding any

    def what(self) -> str:
        """What the first bad id says about the type that wrapped."""
        v = self.value
        if v < 0:
            for bits in (8, 16, 32):
                if v >= -(1 << (bits - 1)) and self.limit > (1 << (bits - 1)):
                    return f"negative: an int{bits} index wraps to negative past {(1 << (bits - 1)) - 1:,}"
            return "negative: a signed index wrapped past its type's largest value"
        if v >= 1 << 32:
            return "at or above 2^32"
        if v >= 1 << 31:
            return f"at or above 2^31: {v - (1 << 32)} as a signed 32-bit value, a wrapped or negative index"
        return "past the dataset's last index"


def _bad_positions(ids: Sequence[Hashable], limit: int) -> tuple[int, int, int, int]:
    """(first bad position or -1, its value, how many are bad, how many are negative)."""
    if int_ids(ids):
        lo, hi = bounds(ids)
        if hi < lo or (lo >= 0 and hi < limit):
            return -1, 0, 0, 0
        first, value, count, negative = -1, 0, 0, 0
        for start, part in chunks(ids):
            bad = (part < 0) | (part >= limit)
            n = int(np.count_nonzero(bad))
            if n and first < 0:
                at = int(np.argmax(bad))
                first, value = start + at, int(part[at])
            count += n
            negative += int(np.count_nonzero(part < 0)) if n else 0
        return first, value, count, negative
    first, value, count, negative = -1, 0, 0, 0
    for i, x in enumerate(ids):
        if type(x) is int and not 0 <= x < limit:
            if first < 0:
                first, value = i, x
            count += 1
            negative += x < 0
    return first, value, count, negative


def find_overflow(run: RunTrace) -> Overflow | None:
    """The first epoch in which some rank yields an index outside its dataset (None: none does, or the
    ids are not indices, or most of them lie outside: keys, not indices)."""
    if run.id_source != "index":
        return None
    for epoch in range(run.num_epochs):
        found: list[
            tuple[int, int, int, int, int, int]
        ] = []  # (rank, position, value, count, negative, limit)
        total = 0
        for rank in run.ranks:
            limit = rank.facts.index_space
            trace = rank.epochs[epoch]
            total += len(trace.ids)
            if limit is None:
                continue
            first, value, count, negative = _bad_positions(trace.ids, limit)
            if count:
                found.append((rank.rank, first, value, count, negative, limit))
        bad = sum(f[3] for f in found)
        if found and 2 * bad < total:
            first, position, value, _, _, limit = found[0]
            negative = sum(f[4] for f in found)
            return Overflow(epoch, first, position, value, limit, bad, negative, tuple(f[0] for f in found))
    return None
