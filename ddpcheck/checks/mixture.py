"""``mixture``: every rank and every DataLoader worker draws each source in its declared share.

Mixtures draw samples from several sources with weights (HF ``interleave_datasets(probabilities=...)``,
litdata's ``CombinedStreamingDataset(weights=...)``, webdataset's ``RandomMix``, lhotse's ``mux``,
torchdata's ``MultiNodeWeightedSampler``, a ``WeightedRandomSampler`` over a concatenation). Under DDP and
workers they break where no sample check looks: every sample may still be seen exactly once. The ranks
record each sample's source (``ddpcheck.checker.mixture``); this module judges, per epoch:

* **shares**: per rank, per (rank, worker) and for the union of the ranks, the counts of each source
  against the expected shares: the file's ``source_weights()``, else the single-process run's shares.
  Pearson's chi-square: a goodness-of-fit test against declared weights, a two-sample (homogeneity) test
  against the single-process counts; cells expected below 5 are pooled, a group with under two cells left
  is not tested. At one rank the run *is* the single process: its workers are compared with each other,
  and its shares with the declared weights.
* **same order**: two workers (or ranks) that draw the same source at the same position far more often
  than independent draws would (``sum p_k^2``; a Chernoff bound on the binomial tail), at least 90% of
  the time over 30 or more draws: their mixing RNG is seeded alike. A stream that repeats itself at a
  short lag (a round-robin schedule, not an RNG) is left out.
* **exhaustion**: a source with expected share ``p`` absent from the last ``L`` samples of a stream, with
  ``(1 - p)^L`` below the threshold: it ran out and the others filled its place. This names the cause of a
  share that drifts; alone it fails nothing: a source that runs out while every share holds is how a
  mixture sampled without replacement ends (HF ``all_exhausted_without_replacement``: every sample once).

Every test of a layout (all epochs, groups, pairs, sources) is one family: each p-value is compared with
``ALPHA / tests`` (Bonferroni; for "does any fail" Holm decides the same). So a correct loader fails with
probability at most ``ALPHA`` = 1% per layout whatever its number of ranks, workers and epochs. Measured
on synthetic correct runs (iid multinomial draws per rank and worker, 3 sources, two epochs, declared and
single-process expectations, a balanced and a skewed mixture): 0 of the 200 runs of
``tests/test_mixture.py`` (world sizes 1, 2, 4; workers 0 and 2; 600 to 20,000 samples) fail, 3 of 1,000
of the same design (0.3%), 0 of 200 at world sizes 8 and 16 with 2 or 4 workers; the test holds the rate
under 2%. Chi-square's p-values are approximate for small counts; the pooling keeps them conservative there.

Causes, in the order they are named: the same mixing RNG on every worker or rank (with the samples they
repeat), a source exhausted and refilled from the others, weights scaled by the number of workers (the
observed shares fit the declared ones with some weights multiplied or divided by it), ranks drawing
different shares, and the ranks' union drawing other shares than the single process.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, cast

from ddpcheck.checks.context import Context
from ddpcheck.evidence import MixtureShares
from ddpcheck.messages import count_text
from ddpcheck.trace import EpochTrace, RunTrace, SourceCodes
from ddpcheck.verdict import MIXTURE, Verdict, not_applicable, skipped

ALPHA = 0.01  # family-wise false-alarm rate per layout (Bonferroni over every test of the layout)
MIN_EXPECTED = 5.0  # chi-square cells expected below this are pooled
SAME_ORDER = 0.9  # two streams agreeing on at least this share of positions...
MIN_ORDER = 30  # ...over at least this many draws
MAX_LAG = 16  # a stream agreeing with itself at a lag up to this follows a schedule, not an RNG
ALL_PAIRS = 16  # up to this many streams every pair is compared for the same order; beyond, a linear set
MAX_SCALED_SOURCES = 8  # subsets of sources tried for "weights scaled by the worker count"

NO_SOURCE = (
    "batches carry no source: define sample_source(batch) (one name per sample) or give dict batches a "
    "'source' field to check a mixture (or sources were not read: CheckOptions(mixture=False))"
)
SAME_RNG = (
    "the mixing RNG is seeded the same on every worker or rank: they draw the same sources in the same "
    "order (and the same samples where the sources are not split too)"
)
EXHAUSTED = (
    "a source runs out before the epoch ends and the others fill its place: the shares drift away from "
    "the weights (exhausted and refilled from another)"
)
WORKER_SCALED = (
    "the shares match the declared weights with some multiplied by the number of DataLoader workers: the "
    "weights are scaled by the worker count"
)
RANK_SHARES = (
    "the ranks draw different shares (per-rank weights or sources): the global batch is not the declared mix"
)
WRONG_SHARES = "the sources are drawn in other shares than declared, on every rank alike"
UNION_DIFFERS = "the ranks together draw other shares than the single process"
UNDECLARED = "samples come from a source that source_weights() does not name"
MIXTURE_FIXES = {
    SAME_RNG: "seed the mixing RNG per worker and rank (seed + rank * num_workers + worker id, from "
    "torch.utils.data.get_worker_info()), or draw the mixture once in the sampler",
    EXHAUSTED: "make every source long enough for its weight over the epoch (repeat it), or stop when the "
    "first source is exhausted",
    WORKER_SCALED: "give each worker the declared weights (or divide the counts, not the weights, by "
    "num_workers)",
    RANK_SHARES: "give every rank the same weights and a source of each kind (shard within each source)",
    WRONG_SHARES: "pass the declared weights to the mixing (or correct source_weights())",
    UNION_DIFFERS: "draw the mixture the same way at every world size (the same weights, the same sources)",
    UNDECLARED: "name every source in source_weights(), or leave it out of the mixture",
}


# ----------------------------------------------------------------------------- statistics


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X chi-square with ``df`` degrees of freedom (regularised upper incomplete gamma)."""
    if df <= 0:
        return 1.0
    if x <= 0:
        return 1.0
    a, z = df / 2.0, x / 2.0
    log_front = a * math.log(z) - z - math.lgamma(a)
    if z < a + 1.0:  # series for the lower part
        term = total = 1.0 / a
        n = a
        for _ in range(10_000):
            n += 1.0
            term *= z / n
            total += term
            if term < total * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(log_front))
    tiny = 1e-300  # Lentz's continued fraction for the upper part
    b = z + 1.0 - a
    c, d = 1.0 / tiny, 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        step = d * c
        h *= step
        if abs(step - 1.0) < 1e-15:
            break
    return min(1.0, math.exp(log_front) * h)


def _pool(
    expected: Sequence[float], observed: Sequence[Sequence[float]]
) -> tuple[list[float], list[list[float]]]:
    """Cells (columns) expected below MIN_EXPECTED merged into one, smallest first."""
    order = sorted(range(len(expected)), key=lambda k: expected[k])
    keep = [k for k in order if expected[k] >= MIN_EXPECTED]
    small = [k for k in order if expected[k] < MIN_EXPECTED]
    groups = [[k] for k in keep]
    if small:
        if sum(expected[k] for k in small) >= MIN_EXPECTED or not groups:
            groups.append(small)
        else:
            groups[0] = groups[0] + small  # the smallest kept cell absorbs them
    return (
        [sum(expected[k] for k in g) for g in groups],
        [[sum(row[k] for k in g) for g in groups] for row in observed],
    )


def goodness_of_fit(counts: Sequence[int], shares: Sequence[float]) -> float | None:
    """p-value of ``counts`` drawn with ``shares`` (Pearson; None: too few samples to test)."""
    n = sum(counts)
    if n == 0:
        return None
    if any(c > 0 and p <= 0 for c, p in zip(counts, shares, strict=True)):
        return 0.0
    cells = [(c, n * p) for c, p in zip(counts, shares, strict=True) if p > 0]
    expected, (observed,) = _pool([e for _, e in cells], [[c for c, _ in cells]])
    if len(expected) < 2:
        return None
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True))
    return chi2_sf(stat, len(expected) - 1)


def homogeneity(a: Sequence[int], b: Sequence[int]) -> float | None:
    """p-value of ``a`` and ``b`` being drawn with the same shares (2 x K chi-square; None: too few)."""
    na, nb = sum(a), sum(b)
    if na == 0 or nb == 0:
        return None
    n = na + nb
    columns = [x + y for x, y in zip(a, b, strict=True)]
    smaller = min(na, nb)
    expected_min = [c * smaller / n for c in columns]  # the row with fewer samples decides pooling
    _, (pa, pb, pc) = _pool(expected_min, [a, b, columns])
    if len(pc) < 2:
        return None
    stat = 0.0
    for row, total in ((pa, na), (pb, nb)):
        for o, col in zip(row, pc, strict=True):
            e = total * col / n
            if e > 0:
                stat += (o - e) ** 2 / e
    return chi2_sf(stat, len(pc) - 1)


def agreement_p(matches: int, length: int, chance: float) -> float:
    """Upper bound on P(at least ``matches`` agreements in ``length`` independent positions), each agreeing
    with probability ``chance`` (Chernoff: exp(-n KL))."""
    if length == 0 or matches <= chance * length:
        return 1.0
    if chance <= 0:
        return 0.0
    share = matches / length
    if share >= 1.0:
        return math.exp(length * math.log(chance))
    kl = share * math.log(share / chance) + (1 - share) * math.log((1 - share) / (1 - chance))
    return math.exp(-length * kl)


# ----------------------------------------------------------------------------- the traces as counts


@dataclass
class Stream:
    """One rank's (or one worker's) samples of an epoch in yield order: source codes and ids."""

    rank: int
    worker: int | None
    codes: Any  # numpy int array of global source codes
    ids: Sequence[Hashable]  # the rank's epoch ids
    positions: Any = None  # numpy indices into ``ids`` of this worker's samples (None: all of them)

    def sample_ids(self) -> list[Hashable]:
        if self.positions is None:
            return list(self.ids)
        return [self.ids[i] for i in self.positions.tolist()]

    @property
    def where(self) -> str:
        return f"rank {self.rank}" + (f" worker {self.worker}" if self.worker is not None else "")


@dataclass
class Tests:
    """The layout's family of tests: every p-value, with what it says."""

    results: list[tuple[float, str, str, int]] = field(default_factory=list)  # (p, kind, where, epoch)

    def add(self, p: float | None, kind: str, where: str, epoch: int) -> None:
        if p is not None:
            self.results.append((p, kind, where, epoch))

    def failed(self) -> list[tuple[float, str, str, int]]:
        limit = ALPHA / max(len(self.results), 1)
        return sorted((r for r in self.results if r[0] < limit), key=lambda r: r[0])


def _names(run: RunTrace, reference: RunTrace) -> list[str]:
    names: list[str] = []
    for trace in (reference, run):
        for rank in trace.ranks:
            for epoch in rank.epochs:
                if epoch.sources is not None:
                    for name, _ in epoch.sources.declared:
                        if name not in names:
                            names.append(name)
    for trace in (reference, run):
        for rank in trace.ranks:
            for epoch in rank.epochs:
                if epoch.sources is not None:
                    names.extend(n for n in epoch.sources.names if n not in names)
    return names


def _global_codes(sources: SourceCodes, index: dict[str, int]) -> Any:
    import numpy as np

    local = (
        np.frombuffer(cast(Any, sources.codes), dtype=np.int16)
        if _is_int16(sources.codes)
        else np.asarray(sources.codes, dtype=np.int64)
    )
    remap = np.asarray([index[n] for n in sources.names], dtype=np.int64)
    return remap[local.astype(np.int64)] if len(local) else np.zeros(0, dtype=np.int64)


def _is_int16(codes: Sequence[int]) -> bool:
    return getattr(codes, "typecode", "") == "h"


def _streams(trace: EpochTrace, rank: int, index: dict[str, int]) -> tuple[Stream, list[Stream]]:
    """The rank's whole stream, and one per worker (empty when the workers are unknown or one)."""
    import numpy as np

    assert trace.sources is not None
    codes = _global_codes(trace.sources, index)
    whole = Stream(rank, None, codes, trace.ids)
    workers = trace.worker_ids
    if not workers or len(set(workers)) < 2 or len(workers) != len(trace.batch_sizes):
        return whole, []
    per_sample = np.repeat(np.asarray(workers, dtype=np.int64), np.asarray(trace.batch_sizes, dtype=np.int64))
    out = []
    for worker in sorted(set(workers)):
        where = np.flatnonzero(per_sample == worker)
        out.append(Stream(rank, worker, codes[where], trace.ids, where))
    return whole, out


def _counts(codes: Any, k: int) -> list[int]:
    import numpy as np

    return [int(c) for c in np.bincount(codes, minlength=k)[:k]] if len(codes) else [0] * k


def _usable(run: RunTrace) -> bool | None:
    """True: every rank's every epoch has sources; False: none; None: some do (mixed)."""
    flags = [e.sources is not None for r in run.ranks for e in r.epochs if len(e.ids)]
    if not flags:
        return False
    if all(flags):
        return True
    return None if any(flags) else False


# ----------------------------------------------------------------------------- the check


@dataclass
class Tally:
    """The layout's counts and its family of tests, gathered epoch by epoch."""

    names: list[str]
    declared: list[float] | None
    one_process: bool
    ranks: int
    tests: Tests = field(default_factory=Tests)
    union_total: list[int] = field(default_factory=list)
    rank_total: list[list[int]] = field(default_factory=list)
    worker_total: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    reference_total: list[int] = field(default_factory=list)
    expected_per_epoch: list[list[float]] = field(default_factory=list)
    same_order: list[tuple[float, Stream, Stream, int, int, float]] = field(default_factory=list)
    exhausted: list[tuple[float, Stream, str, int, int]] = field(
        default_factory=list
    )  # (p, stream, source, gap, n)
    undeclared: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        k = len(self.names)
        self.union_total, self.reference_total = [0] * k, [0] * k
        self.rank_total = [[0] * k for _ in range(self.ranks)]

    @property
    def k(self) -> int:
        return len(self.names)

    @property
    def index(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.names)}


def _add(total: list[int], counts: Sequence[int]) -> list[int]:
    return [a + b for a, b in zip(total, counts, strict=True)]


def _declared(run: RunTrace, names: Sequence[str]) -> list[float] | None:
    pairs = next(
        (
            e.sources.declared
            for r in run.ranks
            for e in r.epochs
            if e.sources is not None and e.sources.declared
        ),
        (),
    )
    if not pairs:
        return None
    weights = dict(pairs)
    total = sum(weights.values())
    return [weights.get(n, 0.0) / total for n in names]


def check_mixture(
    reference: RunTrace, run: RunTrace, rerun: RunTrace | None = None, *, ctx: Context | None = None
) -> Verdict:
    """Each source's share per epoch, per rank, per worker and over the union, against the declared
    weights or the single process; the mixing order across workers and ranks; exhausted sources (named
    only where a share drifts: a source that runs out while every share holds is how sampling without
    replacement ends)."""
    ctx = ctx or Context(reference, run, rerun)
    if ctx.unjudgeable:
        return skipped(MIXTURE, ctx.unjudgeable)
    usable, reference_usable = _usable(run), _usable(reference)
    if not usable or not reference_usable:
        if usable is None or reference_usable is None:
            return not_applicable(MIXTURE, "only some batches carry a source: " + NO_SOURCE)
        return not_applicable(MIXTURE, NO_SOURCE)
    names = _names(run, reference)
    tally = Tally(names, _declared(run, names), len(run.ranks) == 1, len(run.ranks))
    epochs = min(min(len(r.epochs) for r in run.ranks), min(len(r.epochs) for r in reference.ranks))
    for epoch in range(epochs):
        _tally_epoch(tally, reference, run, epoch)
    return _judge(tally, run)


def _tally_epoch(t: Tally, reference: RunTrace, run: RunTrace, epoch: int) -> None:
    import numpy as np

    index, k = t.index, t.k
    ref_codes = np.concatenate(
        [_global_codes(r.epochs[epoch].sources, index) for r in reference.ranks]  # type: ignore[arg-type]
    )
    ref_counts = _counts(ref_codes, k)
    t.reference_total = _add(t.reference_total, ref_counts)
    ref_n = sum(ref_counts)
    expected = t.declared if t.declared is not None else [c / ref_n if ref_n else 0.0 for c in ref_counts]
    t.expected_per_epoch.append(expected)
    wholes, workers = [], []
    for rank in run.ranks:
        whole, per_worker = _streams(rank.epochs[epoch], rank.rank, index)
        wholes.append(whole)
        workers.extend(per_worker)
    union = _counts(np.concatenate([w.codes for w in wholes]) if wholes else np.zeros(0, np.int64), k)
    t.union_total = _add(t.union_total, union)
    if t.declared is not None:
        t.undeclared |= {t.names[i] for i in range(k) if union[i] and t.declared[i] == 0}
    _share_tests(t, epoch, union, ref_counts, wholes, workers)
    _order_tests(t, epoch, workers or wholes)
    _tail_tests(t, epoch, workers or wholes, expected)


def _share_tests(
    t: Tally, epoch: int, union: list[int], ref_counts: list[int], wholes: list[Stream], workers: list[Stream]
) -> None:
    """Each rank's, each worker's and the union's counts against the expected shares."""

    def test(counts: list[int], where: str, rest: list[int] | None = None) -> None:
        if t.declared is not None:
            t.tests.add(goodness_of_fit(counts, t.declared), "shares", where, epoch)
        elif rest is not None:
            t.tests.add(homogeneity(counts, rest), "shares", where, epoch)
        elif not t.one_process:
            t.tests.add(homogeneity(counts, ref_counts), "shares", where, epoch)

    if not t.one_process:
        test(union, "the union of the ranks")
    for r, whole in enumerate(wholes):
        counts = _counts(whole.codes, t.k)
        t.rank_total[r] = _add(t.rank_total[r], counts)
        if not t.one_process or t.declared is not None:  # one process: its shares against the declared ones
            test(counts, whole.where)
    for stream in workers:
        counts = _counts(stream.codes, t.k)
        key = (stream.rank, stream.worker or 0)
        t.worker_total[key] = _add(t.worker_total.get(key, [0] * t.k), counts)
        mine = next(w for w in wholes if w.rank == stream.rank)
        rest = (
            [a - b for a, b in zip(_counts(mine.codes, t.k), counts, strict=True)] if t.one_process else None
        )
        test(counts, stream.where, rest)


def _order_tests(t: Tally, epoch: int, streams: list[Stream]) -> None:
    """Pairs of streams drawing the same source at the same position far more often than chance."""
    import numpy as np

    scheduled = [_scheduled(s.codes) for s in streams]
    for i, j in _pairs(len(streams)):
        (a, sa), (b, sb) = (streams[i], scheduled[i]), (streams[j], scheduled[j])
        length = min(len(a.codes), len(b.codes))
        if length < MIN_ORDER or sa or sb:
            continue
        head_a, head_b = a.codes[:length], b.codes[:length]
        matches = int(np.count_nonzero(head_a == head_b))
        # independent streams agree where both draw one source: sum_k of their own shares' products
        k = t.k
        chance = float(np.dot(np.bincount(head_a, minlength=k), np.bincount(head_b, minlength=k))) / length**2
        # rejects only from SAME_ORDER agreement on: a smaller region, the same family
        p = agreement_p(matches, length, chance) if matches >= SAME_ORDER * length else 1.0
        t.tests.add(p, "order", f"{a.where} and {b.where}", epoch)
        if matches >= SAME_ORDER * length:
            t.same_order.append((p, a, b, matches, length, chance))


def _tail_tests(t: Tally, epoch: int, streams: list[Stream], expected: list[float]) -> None:
    """A source with share p absent from the last L samples of a stream, (1 - p)^L small: it ran out."""
    import numpy as np

    for stream in streams:
        n = len(stream.codes)
        if n < MIN_ORDER:
            continue
        last = np.full(t.k, -1, dtype=np.int64)
        np.maximum.at(last, stream.codes, np.arange(n))
        for i, share in enumerate(expected):
            if share <= 0 or share >= 1:
                continue
            gap = n - 1 - int(last[i])
            # every source counts in the family; a gap under MIN_ORDER never rejects (a smaller region)
            p = math.exp(gap * math.log1p(-share)) if gap >= MIN_ORDER else 1.0
            t.tests.add(p, "tail", f"{stream.where}: {t.names[i]}", epoch)
            t.exhausted.append((p, stream, t.names[i], gap, n))


def _judge(t: Tally, run: RunTrace) -> Verdict:
    """The verdict from the layout's tests; a cause that claims a drift only where a share test failed."""
    failures = t.tests.failed()
    limit = ALPHA / max(len(t.tests.results), 1)
    data = _shares_evidence(t)
    summary = _summary(t.names, t.declared, t.union_total, t.rank_total, len(t.tests.results))
    if t.undeclared:
        detail = f"{', '.join(sorted(t.undeclared))} not in source_weights(); {summary}"
        return _fail(UNDECLARED, detail, data, epochs=(0,))
    kinds = {kind for _, kind, _, _ in failures}
    if "order" in kinds:
        return _same_order(t, failures, data, summary)
    shares = [f for f in failures if f[1] == "shares"]
    tail = [e for e in t.exhausted if e[0] < limit]
    if not shares:
        if tail:  # a source ran out, every share holds: sampling without replacement ends so
            _, stream, source, gap, n = min(tail, key=lambda e: e[0])
            summary += (
                f"; {source} runs out {gap} samples before the end of {stream.where}'s {n}, every share holds"
            )
        return Verdict(MIXTURE, "pass", summary, evidence=data)
    epochs_failed = tuple(sorted({e for _, _, _, e in shares}))
    if tail:
        p, stream, source, gap, n = min(tail, key=lambda e: e[0])
        detail = (
            f"{source} is absent from the last {gap} of {stream.where}'s {n} samples (p={p:.2g}); {summary}"
        )
        return _fail(EXHAUSTED, detail, data, epochs=epochs_failed, ranks=(stream.rank,))
    return _share_cause(t, run, shares, limit, data, summary)


def _same_order(
    t: Tally, failures: list[tuple[float, str, str, int]], data: MixtureShares, summary: str
) -> Verdict:
    _, a, b, matches, length, chance = min(t.same_order, key=lambda s: s[0])
    repeated = _repeated(a, b)
    shown = f"; {count_text(len(repeated), 'samples')} seen by both" if repeated else ""
    detail = (
        f"{a.where} and {b.where} draw the same source at {matches} of {length} positions "
        f"(independent draws would agree at {chance:.0%}){shown}; {summary}"
    )
    epochs_failed = tuple(sorted({e for _, _, _, e in failures}))
    ranks = tuple(sorted({a.rank, b.rank}))
    return _fail(SAME_RNG, detail, data, epochs=epochs_failed, ranks=ranks, examples=tuple(repeated[:6]))


def _share_cause(
    t: Tally,
    run: RunTrace,
    shares: list[tuple[float, str, str, int]],
    limit: float,
    data: MixtureShares,
    summary: str,
) -> Verdict:
    """Name why the shares drift: weights scaled by the workers, per-rank shares, or other shares."""
    first = shares[0]
    where_text = f"{first[2]} in epoch {first[3]} (p={first[0]:.2g}, threshold {limit:.2g})"
    epochs_failed = tuple(sorted({e for _, _, _, e in shares}))
    failing_where = {w for _, _, w, _ in shares}
    ranks_failed = tuple(
        sorted(
            {r.rank for r in run.ranks if any(f"{w} ".startswith(f"rank {r.rank} ") for w in failing_where)}
        )
    )
    num_workers = max((r.facts.num_workers for r in run.ranks), default=0)
    if t.declared is not None and num_workers > 1:
        counts = t.union_total if not t.one_process else t.rank_total[0]
        scaled = _scaled_fit(counts, t.declared, num_workers, t.names)
        if scaled:
            detail = f"the shares fit the weights with {scaled} by the {num_workers} workers; {summary}"
            return _fail(WORKER_SCALED, detail, data, epochs=epochs_failed, ranks=ranks_failed)
    if len(run.ranks) > 1 and not _ranks_alike(t.rank_total):
        return _fail(RANK_SHARES, f"{where_text}; {summary}", data, epochs=epochs_failed, ranks=ranks_failed)
    cause = WRONG_SHARES if t.declared is not None else UNION_DIFFERS
    return _fail(cause, f"{where_text}; {summary}", data, epochs=epochs_failed, ranks=ranks_failed)


def _pairs(n: int) -> list[tuple[int, int]]:
    """The streams compared for the same order: every pair up to ALL_PAIRS streams; beyond, each with the
    first and with the next (a seed shared by all of them shows in both; the cost stays linear)."""
    if n <= ALL_PAIRS:
        return list(combinations(range(n), 2))
    return sorted({(0, j) for j in range(1, n)} | {(j - 1, j) for j in range(2, n)})


def _fail(cause: str, detail: str, data: MixtureShares, **said: Any) -> Verdict:
    return Verdict(MIXTURE, "fail", detail, cause, evidence=data, fix=MIXTURE_FIXES[cause], **said)


def _scheduled(codes: Any) -> bool:
    """The stream agrees with itself at a short lag nearly everywhere: a fixed schedule (round-robin)."""
    n = len(codes)
    if n < MIN_ORDER + MAX_LAG:
        return False
    head = codes[: min(n, 4096)]
    return any(float((head[lag:] == head[:-lag]).mean()) >= SAME_ORDER for lag in range(1, MAX_LAG + 1))


def _repeated(a: Stream, b: Stream) -> list[Hashable]:
    seen = set(a.sample_ids())
    return [i for i in dict.fromkeys(b.sample_ids()) if i in seen]


def _ranks_alike(rank_total: Sequence[Sequence[int]]) -> bool:
    """The ranks' epoch counts look drawn with one set of shares (each against the others; Bonferroni)."""
    if len(rank_total) < 2:
        return True
    tests = []
    for r, counts in enumerate(rank_total):
        rest = [sum(other[i] for j, other in enumerate(rank_total) if j != r) for i in range(len(counts))]
        p = homogeneity(list(counts), rest)
        if p is not None:
            tests.append(p)
    return not tests or min(tests) >= ALPHA / len(tests)


def _scaled_fit(counts: Sequence[int], declared: Sequence[float], workers: int, names: Sequence[str]) -> str:
    """The sources whose weight, multiplied (or divided) by ``workers``, makes the counts fit: "" if none."""
    k = len(declared)
    if k > MAX_SCALED_SOURCES:
        return ""
    best, text = 0.0, ""
    for size in range(1, k):
        for subset in combinations(range(k), size):
            for factor, word in ((workers, "multiplied"), (1 / workers, "divided")):
                raw = [w * factor if i in subset else w for i, w in enumerate(declared)]
                total = sum(raw)
                p = goodness_of_fit(counts, [w / total for w in raw]) if total > 0 else None
                if p is not None and p > max(best, ALPHA):
                    best = p
                    noun = "weight" if size == 1 else "weights"
                    text = f"{'/'.join(names[i] for i in subset)}'s {noun} {word} by"
    return text.replace(" by", "") if text else ""


def _shares(counts: Sequence[int]) -> list[float]:
    n = sum(counts)
    return [round(c / n, 4) if n else 0.0 for c in counts]


def _shares_evidence(t: Tally) -> MixtureShares:
    """Counts summed over the epochs: the union, each rank, each (rank, worker), the single process; what
    they are held against; the tests."""
    declared = t.declared
    expected = declared if declared is not None else _shares(t.reference_total)
    return MixtureShares(
        sources=tuple(t.names),
        expected_from="source_weights()" if declared is not None else "single-process run",
        expected=tuple(round(p, 4) for p in expected),
        declared=tuple(round(p, 4) for p in declared) if declared is not None else None,
        reference_counts=tuple(t.reference_total),
        union_counts=tuple(t.union_total),
        rank_counts=tuple(tuple(c) for c in t.rank_total),
        worker_counts=tuple((r, w, tuple(c)) for (r, w), c in sorted(t.worker_total.items())),
        epochs=len(t.expected_per_epoch),
        tests=len(t.tests.results),
        alpha=ALPHA,
        smallest_p=min((r[0] for r in t.tests.results), default=None),
    )


def _summary(
    names: Sequence[str],
    declared: Sequence[float] | None,
    union: Sequence[int],
    ranks: Sequence[Sequence[int]],
    tests: int,
) -> str:
    shares = ", ".join(f"{n} {s:.1%}" for n, s in zip(names, _shares(union), strict=True))
    against = (
        "declared " + ", ".join(f"{p:.1%}" for p in declared)
        if declared is not None
        else "the single process"
    )
    ranks_text, tests_text = count_text(len(ranks), "ranks"), count_text(tests, "tests")
    return f"shares {shares} over {ranks_text} (against {against}; {tests_text})"
