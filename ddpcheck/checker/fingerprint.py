"""``ddpcheck.record --fingerprint``: coverage and overlap of the whole job proven inside its launch, from
a fixed-size summary per rank instead of every id written out (issue 37 item 2).

Each rank folds every recorded epoch's ids into a table of :data:`BUCKETS` buckets (by a hash of the
id): per bucket how many ids and the sum of a 64-bit hash of each (modulo 2^64), so the tables of all
ranks add up to the table of the union. Where the ids are the dataset's indices, the
table of ``0 .. N-1`` is computed the same way (each rank a slice). At the end of the recording one
``all_reduce`` on a gloo group of its own (the script's NCCL traffic untouched) adds the tables: equal
tables mean every index was yielded exactly once, up to a 2^-64 chance per bucket. Only the buckets that
differ are looked into: every rank lists its ids that fall in them, and the indices of them, so the
ids yielded twice and the ranks that hold them, and the ids no rank yielded, are named. Each rank's
stream hash (order-dependent) shows ranks that received the same stream.

Whether what the tables show is every index exactly once, padding, or a bug is the rule of
:mod:`ddpcheck.checks.fingerprint` (``epoch_status``), which this rank side only applies to print its
verdict in the launch.

The ids are spilled to a temporary file beside the traces while the epoch runs (the rank holds at
most :data:`HELD_IDS` of them in memory, a table is 512 kB) and removed once the check is done.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import numpy as np

from ddpcheck.checks.fingerprint import EpochCheck, FingerprintReport, SamplerSays, epoch_status
from ddpcheck.checks.tally import chunks, int_ids, mix, stream_hash
from ddpcheck.trace import ScriptRankTrace

BUCKET_BITS = 15
BUCKETS = 1 << BUCKET_BITS  # 2 x 8 bytes each: 512 kB a table
FOLD_IDS = 1 << 20  # ids folded at a time
HELD_IDS = 1 << 15  # ids a rank holds in memory before they go to its spill file (256 kB)
NAMED_IDS = 1 << 18  # ids and indices the ranks send together to name what differs, about
EXAMPLES = 5
_SALT = np.uint64(0x5DEECE66D1234567)  # the bucket's hash differs from the summed one


def buckets_of(ids: Any) -> Any:
    """Each id's bucket (int64 ids -> int64 bucket numbers)."""
    with np.errstate(over="ignore"):
        return (mix(ids.view(np.uint64) ^ _SALT) >> np.uint64(64 - BUCKET_BITS)).astype(np.int64)


def _sums(where: Any, values: Any) -> Any:
    """Per bucket the sum of ``values`` (uint64) modulo 2^64, exactly: two 32-bit halves, each summed as
    float64 (exact while a bucket holds fewer than 2^21 of the ids: :data:`FOLD_IDS` at a time)."""
    total = np.zeros(BUCKETS, np.uint64)
    with np.errstate(over="ignore"):
        for half in (0, 32):
            part = ((values >> np.uint64(half)) & np.uint64(0xFFFFFFFF)).astype(np.float64)
            summed = np.bincount(where, weights=part, minlength=BUCKETS).astype(np.uint64)
            total += summed << np.uint64(half)
    return total


def fold(parts: Iterator[Any]) -> Any:
    """The table of these ids (int64 chunks): shape (2, BUCKETS) of int64, rows count and hash sum."""
    table = np.zeros((2, BUCKETS), np.uint64)
    with np.errstate(over="ignore"):
        for chunk in parts:
            for start in range(0, len(chunk), FOLD_IDS):
                part = chunk[start : start + FOLD_IDS]
                where = buckets_of(part)
                table[0] += np.bincount(where, minlength=BUCKETS).astype(np.uint64)
                table[1] += _sums(where, mix(part.view(np.uint64)))
    return table.view(np.int64)


def index_table(size: int, rank: int, world: int) -> Any:
    """This rank's slice of the table of ``0 .. size-1`` (the slices of all ranks add up to it)."""
    lo, hi = size * rank // world, size * (rank + 1) // world
    step = 1 << 20
    return fold(np.arange(a, min(a + step, hi), dtype=np.int64) for a in range(lo, hi, step))


@contextlib.contextmanager
def teardown_deferred() -> Iterator[list[Callable[[], Any]]]:
    """While the script runs, its ``destroy_process_group()`` of every group waits (yielded: the calls
    to make) until the exchange at the end has used the process group (a script that tears it down as
    its last line is still checked)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    waiting: list[Callable[[], Any]] = []
    real = distributed_c10d.destroy_process_group

    def deferred(group: Any = None) -> None:
        if group is not None:
            real(group)
        elif not waiting:
            waiting.append(real)

    modules: tuple[Any, ...] = (dist, distributed_c10d)
    saved = [(m, m.destroy_process_group) for m in modules]
    for module, _ in saved:
        module.destroy_process_group = deferred
    try:
        yield waiting
    finally:
        for module, original in saved:
            module.destroy_process_group = original


def _epochs(trace: ScriptRankTrace) -> list[tuple[str, int, Any, Any]]:
    """(loader, epoch, ids, facts) of every recorded epoch with integer ids."""
    out = []
    for loader in trace.loaders:
        for epoch in loader.trace.epochs:
            if int_ids(epoch.ids):
                out.append((loader.name, epoch.epoch, epoch.ids, loader.trace.facts))
    return out


def exchange(
    trace: ScriptRankTrace,
    publish: Callable[[FingerprintReport], None],
    timeout_s: float = 300.0,
) -> FingerprintReport | None:
    """Judge every epoch of every loader all ranks recorded, with collectives on a gloo group of its own
    (None: the script ran in no process group, there is nobody to exchange with). Every rank
    ``publish``es the report before any returns: a launcher that stops the others when one rank exits
    non-zero cannot cut the verdict short."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    started, cpu = time.perf_counter(), time.process_time()
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = {(name, e): (ids, facts) for name, e, ids, facts in _epochs(trace)}
    keys: list[Any] = [None] * world
    dist.all_gather_object(keys, {k: f.index_space for k, (_, f) in mine.items()}, group=group)
    common = sorted(set.intersection(*(set(k) for k in keys)))
    sizes = [{k[key] for k in keys} for key in common]  # every rank's dataset length, where the ids index it
    tables = [fold(part for _, part in chunks(mine[key][0])) for key in common]
    for size in sizes:
        n = size.pop() if len(size) == 1 else None
        tables.append(index_table(n, rank, world) if n else np.zeros((2, BUCKETS), np.int64))
    summed = torch.from_numpy(np.stack(tables) if common else np.zeros((0, 2, BUCKETS), np.int64))
    dist.all_reduce(summed, group=group)
    streams = [[_signed(stream_hash(mine[key][0])), len(mine[key][0])] for key in common]
    hashes = torch.tensor(streams, dtype=torch.int64).reshape(len(common), 2)
    every = [torch.zeros_like(hashes) for _ in range(world)]
    dist.all_gather(every, hashes, group=group)
    total = summed.numpy()
    checks = []
    for i, key in enumerate(common):
        ids, facts = mine[key]
        observed, expected = total[i], total[len(common) + i]
        n = facts.index_space if len({k[key] for k in keys}) == 1 else None
        check = EpochCheck(key[0], key[1], ids=int(observed[0].sum()), dataset=n)
        check.same_streams = _same((int(h[i][0]), int(h[i][1])) for h in every)
        if n:
            _name(check, ids, observed, expected, (rank, world), group)
        says = SamplerSays(bool(facts.padding), bool(facts.drop_last), facts.batch_size)
        check.status, check.detail = epoch_status(check, says, world)
        checks.append(check)
    state = 2 * 2 * BUCKETS * 8 + HELD_IDS * 8  # one epoch's table and the indices' table, the ids held
    report = FingerprintReport(world, time.perf_counter() - started, time.process_time() - cpu, state, checks)
    publish(report)
    dist.barrier(group=group)
    dist.destroy_process_group(group)
    return report


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _same(streams: Iterator[tuple[int, int]]) -> list[list[int]]:
    """Groups of ranks whose non-empty streams (hash, length) are equal."""
    groups: dict[tuple[int, int], list[int]] = {}
    for r, key in enumerate(streams):
        if key[1]:
            groups.setdefault(key, []).append(r)
    return [g for g in groups.values() if len(g) > 1]


def _name(
    check: EpochCheck, ids: Any, observed: Any, expected: Any, where: tuple[int, int], group: Any
) -> None:
    """The buckets where the union differs from the dataset's indices: counted, and their ids named.
    As many buckets are looked into as keep what the ranks send to about :data:`NAMED_IDS` ids in all;
    where that is every differing one the counts are exact, else lower bounds (a bucket can hide a copy
    and a missing index that cancel out in its count)."""
    import torch.distributed as dist

    rank, world = where
    differs = np.flatnonzero((observed != expected).any(axis=0))
    check.buckets_differing = len(differs)
    delta = observed[0] - expected[0]
    swapped = int(np.count_nonzero(delta[differs] == 0))  # a copy and a missing index in one bucket
    check.extra, check.missing = int(delta[delta > 0].sum()) + swapped, int(-delta[delta < 0].sum()) + swapped
    if not len(differs):
        return
    per_bucket = (max(check.ids, check.dataset or 0) * 2) // BUCKETS + 1  # ids and indices, all ranks
    look = differs[: max(1, NAMED_IDS // per_bucket)]
    check.exact = len(look) == len(differs)
    held = _in_buckets((part for _, part in chunks(ids)), look)
    size = check.dataset or 0
    lo, hi = size * rank // world, size * (rank + 1) // world
    step = 1 << 20
    wanted = _in_buckets((np.arange(a, min(a + step, hi), dtype=np.int64) for a in range(lo, hi, step)), look)
    lists: list[Any] = [None] * world
    dist.all_gather_object(lists, (held, wanted), group=group)
    ranks = np.concatenate([np.full(len(got), r, np.int64) for r, (got, _) in enumerate(lists)])
    got = np.concatenate([g for g, _ in lists])
    indices = np.unique(np.concatenate([w for _, w in lists]))
    values, counts = np.unique(got, return_counts=True)
    copied = values[counts > 1]
    never = np.setdiff1d(indices, values)
    outside = np.setdiff1d(values, indices)
    if check.exact:
        check.extra = int((counts - 1).sum()) + len(outside)
        check.missing = len(never)
    check.twice = [(int(x), sorted(set(ranks[got == x].tolist()))) for x in copied[:EXAMPLES]]
    check.never = never[:EXAMPLES].tolist()
    check.outside = outside[:EXAMPLES].tolist()


def _in_buckets(parts: Iterator[Any], look: Any) -> Any:
    found = [part[np.isin(buckets_of(part), look)] for part in parts]
    return np.concatenate(found) if found else np.zeros(0, np.int64)
