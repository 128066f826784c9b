"""``rng_independence``: random draws differ across data-parallel ranks and DataLoader workers, and are equal
across the non-data peers of a mesh that hold one sample (issue 35).

Two kinds of draws are judged, each as the rank side recorded it (a 64-bit fingerprint of a generator's
state before the draw: equal fingerprints mean the same numbers):

* **loading**: per fetch (a batch built by a worker or the main process), the state of each stream the
  fetch consumed (``EpochTrace.draws``);
* **the loop**: draws made outside any module's forward before the model is called (noise, timesteps,
  masks: ``MicroStep.draws``). A site that draws at most once per micro-step one number, or before the
  batch arrived numbers not shaped by its sample count (a shared permutation that re-splits the dataset),
  makes a step-wide decision (a resolution, a task, an order) that ranks may share on purpose: it is left
  out; a site that draws a batch's worth, or several times per micro-step, draws per sample. A state of 0
  is unknown.

Only streams actually consumed are recorded, so a pipeline that draws nothing passes. Two streams count
as the same when they share at least half of the shorter one's states (one coincidence, such as a sample
that seeds its own augmentation and was padded onto a second rank, is not a seeded-alike stream).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

from ddpcheck.checks.context import Context
from ddpcheck.layout import Layout
from ddpcheck.messages import count_text
from ddpcheck.trace import Draw, EpochTrace, RunTrace, StepTrace
from ddpcheck.verdict import RNG_INDEPENDENCE, Verdict, not_applicable, skipped

WORKER_ID_SEED = (
    "a worker_init_fn seeds {stream} from the worker id alone: worker {worker} of every rank draws the same "
    "numbers (every epoch alike)"
)
SAME_BASE_SEED = (
    "the same torch.manual_seed on every rank: torch's DataLoader derives every rank's workers' base seed "
    "from it, so worker {worker} of every rank draws the same {stream} numbers"
)
WORKERS_SEEDED_ALIKE = (
    "worker {worker} of every rank draws the same {stream} numbers: the workers are seeded alike on every "
    "rank (a worker_init_fn seeding from the worker id alone, or the same torch.manual_seed on every rank, "
    "from which torch's DataLoader derives the workers' seeds)"
)
MAIN_SAME = (
    "the ranks load with the same {stream} state: seeded alike on every rank, every rank augments its "
    "samples with the same numbers"
)
WORKERS_ALIKE = (
    "the DataLoader workers of one rank draw the same {stream} numbers: the stream is seeded before the "
    "workers start, or by a worker_init_fn with a constant"
)
LOOP_SAME = (
    "the loop draws {what} at {site} from {source} seeded alike on every rank: every rank uses the same "
    "numbers for its own samples, so the global batch explores one rank's draws"
)
PEERS_DIFFER = (
    "non-data peers that hold one sample draw different {what} at {site}: the generator is seeded by the "
    "global rank where the data-parallel rank belongs"
)
RNG_FIXES = {
    WORKER_ID_SEED: "seed from torch's per-worker seed in worker_init_fn (np.random.seed(torch.initial_seed()"
    " % 2**32), random.seed(torch.initial_seed())), or drop the worker_init_fn: torch seeds numpy and random",
    SAME_BASE_SEED: "seed each rank apart once the model is built (torch.manual_seed(seed + rank): DDP "
    "broadcasts rank 0's weights), or give the DataLoader generator=torch.Generator().manual_seed(seed + "
    "rank)",
    WORKERS_SEEDED_ALIKE: "seed workers from torch.initial_seed() in worker_init_fn, and each rank's "
    "generator with seed + rank",
    MAIN_SAME: "seed the loading stream with seed + rank (or load in workers seeded per rank)",
    WORKERS_ALIKE: "seed each worker in worker_init_fn from torch.initial_seed() (it differs per worker)",
    LOOP_SAME: "seed the loop's generator with seed + dp_rank (the data-parallel rank), or draw on one rank "
    "and scatter",
    PEERS_DIFFER: "seed it with seed + dp_rank, the same on every peer of a data-parallel rank (or draw on "
    "one peer and broadcast)",
}


@dataclass(frozen=True)
class Stream:
    """The states one stream was drawn from on one rank (and one worker, for loading)."""

    rank: int
    worker: int | None
    stream: str
    states: tuple[int, ...]
    site: str = ""
    call: str = ""
    epoch_starts: tuple[int, ...] = ()  # the first state of each epoch (loading)

    @property
    def where(self) -> str:
        return f"rank {self.rank}" + (f" worker {self.worker}" if self.worker is not None else "")


@dataclass(frozen=True)
class Finding:
    cause: str
    fix: str
    detail: str
    ranks: tuple[int, ...]


def _alike(streams: Sequence[Stream]) -> list[tuple[int, int, int]]:
    """``(i, j, shared)`` for every pair of streams of one name that share at least half of the shorter
    one's states: one hash index over all states, so the cost grows with the states, not with the pairs
    of a thousand ranks' streams."""
    owners: dict[tuple[str, int], list[int]] = {}
    for i, s in enumerate(streams):
        for state in set(s.states):
            owners.setdefault((s.stream, state), []).append(i)
    shared: Counter[tuple[int, int]] = Counter()
    for indices in owners.values():
        for i, j in combinations(indices, 2):
            shared[(i, j)] += 1
    out = []
    for (i, j), n in sorted(shared.items()):
        need = max(1, math.ceil(min(len(streams[i].states), len(streams[j].states)) / 2))
        if n >= need:
            out.append((i, j, n))
    return out


def _loading_streams(loading: Mapping[str, Sequence[Sequence[EpochTrace]]]) -> dict[str, list[Stream]]:
    """Per loader, one Stream per (rank, worker, stream name) over every recorded epoch."""
    out: dict[str, list[Stream]] = {}
    for name, per_rank in loading.items():
        streams: list[Stream] = []
        for rank, epochs in enumerate(per_rank):
            keyed: dict[tuple[int | None, str], list[int]] = {}
            starts: dict[tuple[int | None, str], list[int]] = {}
            for epoch in epochs:
                seen: set[tuple[int | None, str]] = set()
                for fetch in sorted(epoch.draws or (), key=lambda f: f.batch):
                    for draw in fetch.draws:
                        if not draw.state:  # unknown
                            continue
                        key = (fetch.worker, draw.stream)
                        keyed.setdefault(key, []).append(draw.state)
                        if key not in seen:
                            seen.add(key)
                            starts.setdefault(key, []).append(draw.state)
            for (worker, stream), states in keyed.items():
                streams.append(
                    Stream(rank, worker, stream, tuple(states), epoch_starts=tuple(starts[(worker, stream)]))
                )
        out[name] = streams
    return out


def _decisions(trace: StepTrace) -> set[tuple[str, str]]:
    """(stream, site) pairs that draw at most once per micro-step either one number, or, before the
    micro-step's batch arrived, numbers not shaped by its sample count (a permutation of the dataset that
    re-splits it each epoch): a step-wide decision (a resolution, a task, a shared order) that ranks may
    share on purpose. A site drawing several times per micro-step, or a batch's worth, draws per sample."""
    single: dict[tuple[str, str], bool] = {}
    for micro in [m for s in trace.steps for m in s.micro] + list(trace.open_micro):
        seen: dict[tuple[str, str], int] = {}
        for d in micro.draws:
            key = (d.stream, d.site)
            seen[key] = seen.get(key, 0) + 1
            shared = math.prod(d.shape) == 1 or (d.before_batch and not _per_sample(d, micro.samples))
            single[key] = single.get(key, True) and shared and seen[key] == 1
    return {key for key, one in single.items() if one}


def _per_sample(draw: Draw, samples: int) -> bool:
    """Whether a draw is shaped by the batch: its first dimension is the micro-step's sample count (or
    that count is unknown)."""
    return samples <= 0 or not draw.shape or draw.shape[0] == samples


def _loop_streams(steps: Sequence[StepTrace | None]) -> list[Stream]:
    """Per rank, one Stream per (stream, site) of the loop's draws; unknown states (0) and step-wide
    decisions left out."""
    out: list[Stream] = []
    for rank, trace in enumerate(steps):
        if trace is None:
            continue
        shared = _decisions(trace)
        by_key: dict[tuple[str, str], list[Draw]] = {}
        for micro in [m for s in trace.steps for m in s.micro] + list(trace.open_micro):
            for draw in micro.draws:
                if draw.state and (draw.stream, draw.site) not in shared:
                    by_key.setdefault((draw.stream, draw.site), []).append(draw)
        for (stream, site), draws in by_key.items():
            out.append(Stream(rank, None, stream, tuple(d.state for d in draws), site, draws[0].call))
    return out


def _dp_groups(layout: Layout, ranks: int) -> list[int]:
    """Each rank's data-parallel rank (a plain world size: the rank itself)."""
    if ranks != layout.world_size:
        return list(range(ranks))
    return [layout.dp_rank(r) for r in range(ranks)]


def _loading_finding(name: str, streams: Sequence[Stream], dp: Sequence[int]) -> Finding | None:
    pairs = _alike(streams)
    for i, j, shared in pairs:
        a, b = streams[i], streams[j]
        if a.rank == b.rank and a.worker != b.worker:
            text = WORKERS_ALIKE.format(stream=a.stream)
            detail = f"{name}: {a.where} and {b.where} draw {a.stream} from the same states while loading"
            return Finding(text, RNG_FIXES[WORKERS_ALIKE], detail, (a.rank,))
        if dp[a.rank] == dp[b.rank]:
            continue  # peers of one data-parallel rank: _peer_finding asks them to agree
        cause, key = _loading_cause(a, streams, pairs)
        detail = (
            f"{name}: {a.where} and {b.where} draw {a.stream} from the same states while loading "
            f"({shared} of {count_text(len(a.states), 'fetches')})"
        )
        return Finding(cause, RNG_FIXES[key], detail, (a.rank, b.rank))
    return None


def _loading_cause(
    a: Stream, streams: Sequence[Stream], pairs: Sequence[tuple[int, int, int]]
) -> tuple[str, str]:
    """Name why one worker's stream repeats on another rank (the cause text and its fixes key)."""
    if a.worker is None:
        return MAIN_SAME.format(stream=a.stream), MAIN_SAME
    worker = a.worker
    torch_alike = any(
        streams[i].stream == "torch"
        and streams[i].worker == streams[j].worker
        and streams[i].rank != streams[j].rank
        for i, j, _ in pairs
    )
    if torch_alike:
        return SAME_BASE_SEED.format(worker=worker, stream=a.stream), SAME_BASE_SEED
    reseeded = len(a.epoch_starts) > 1 and len(set(a.epoch_starts)) == 1
    torch_apart = any(s.stream == "torch" and s.worker is not None for s in streams)
    if a.stream != "torch" and (reseeded or torch_apart):
        return WORKER_ID_SEED.format(stream=a.stream, worker=worker), WORKER_ID_SEED
    return WORKERS_SEEDED_ALIKE.format(worker=worker, stream=a.stream), WORKERS_SEEDED_ALIKE


def _what(s: Stream) -> str:
    call = f"{s.call}(...)" if s.call else "random numbers"
    return call


def _source(s: Stream) -> str:
    return {
        "generator": "a torch.Generator",
        "torch": "torch's default generator",
        "cuda": "the CUDA generator",
        "numpy": "numpy's global state",
        "random": "Python's random",
    }.get(s.stream, f"the {s.stream} stream")


def _loop_finding(
    streams: Sequence[Stream], dp: Sequence[int], groups: Sequence[Sequence[int]]
) -> Finding | None:
    for i, j, shared in _alike(streams):
        a, b = streams[i], streams[j]
        if dp[a.rank] != dp[b.rank]:
            site = a.site or "an unknown line"
            cause = LOOP_SAME.format(what=_what(a), site=site, source=_source(a))
            detail = (
                f"rank {a.rank} and rank {b.rank} draw {_what(a)} at {site} from the same states "
                f"({shared} of {count_text(len(a.states), 'draws')})"
            )
            return Finding(cause, RNG_FIXES[LOOP_SAME], detail, (a.rank, b.rank))
    return _peer_finding(streams, groups)


def _peer_finding(
    streams: Sequence[Stream], groups: Sequence[Sequence[int]], loader: str = ""
) -> Finding | None:
    """Peers of one data-parallel rank (one sample) must draw from the same states as its first rank."""
    by_rank: dict[int, dict[tuple[int | None, str, str], Stream]] = {}
    for s in streams:
        by_rank.setdefault(s.rank, {})[(s.worker, s.stream, s.site)] = s
    for group in groups:
        head = by_rank.get(group[0], {})
        for peer in group[1:]:
            for key, s in by_rank.get(peer, {}).items():
                mine = head.get(key)
                if mine is None or mine.states == s.states:
                    continue
                site = s.site or (f"{loader} loading" if loader else "an unknown line")
                what = _what(s) if not loader else f"{s.stream} numbers"
                detail = (
                    f"rank {group[0]} and rank {peer} hold one sample and draw different {what} at {site}"
                )
                cause = PEERS_DIFFER.format(what=what, site=site)
                return Finding(cause, RNG_FIXES[PEERS_DIFFER], detail, (group[0], peer))
    return None


def check_rng_independence(
    layout: Layout,
    steps: Sequence[StepTrace | None] = (),
    loading: Mapping[str, Sequence[Sequence[EpochTrace]]] | None = None,
) -> Verdict:
    """Random draws across data-parallel ranks, DataLoader workers and non-data peers.

    ``layout``: the run's layout; ``steps``: each rank's StepTrace by global rank (loop draws; empty when
    the step was not watched); ``loading``: per loader name, each global rank's recorded epochs (their
    ``draws``; epochs whose ``draws`` is None were not watched). A stream that no fetch and no loop step
    consumed is not recorded, so nothing drawn is a pass.
    """
    loading = loading or {}
    watched_loading = any(e.draws is not None for per in loading.values() for epochs in per for e in epochs)
    watched_steps = any(t is not None for t in steps)
    if not watched_loading and not watched_steps:
        return not_applicable(
            RNG_INDEPENDENCE, "random draws were not watched (no step watcher, no fetch draws)"
        )
    ranks = max([len(steps), *(len(per) for per in loading.values())])
    dp = _dp_groups(layout, ranks)
    groups = layout.replica_groups() if ranks == layout.world_size else [[r] for r in range(ranks)]
    per_loader = _loading_streams(loading)
    for name, streams in per_loader.items():
        found = _loading_finding(name, streams, dp) or _peer_finding(streams, groups, name)
        if found is not None:
            return _failed(found)
    loop = _loop_streams(steps)
    found = _loop_finding(loop, dp, groups)
    if found is not None:
        return _failed(found)
    return _passed(layout, per_loader, loop)


def _failed(found: Finding) -> Verdict:
    return Verdict(RNG_INDEPENDENCE, "fail", found.detail, found.cause, ranks=found.ranks, fix=found.fix)


def _passed(layout: Layout, per_loader: Mapping[str, Sequence[Stream]], loop: Sequence[Stream]) -> Verdict:
    parts = []
    for name, streams in per_loader.items():
        if streams:
            kinds = sorted({s.stream for s in streams})
            workers = len({(s.rank, s.worker) for s in streams})
            parts.append(f"{name} loading draws {'/'.join(kinds)} in {count_text(workers, 'streams')}")
    sites = sorted({s.site or s.stream for s in loop})
    if sites:
        parts.append(f"the loop draws at {', '.join(sites[:3])}")
    if not parts:
        return Verdict(RNG_INDEPENDENCE, "pass", "no random stream was consumed while loading or in the loop")
    peers = " and are equal across each rank's non-data peers" if layout.replicas > 1 else ""
    where = (
        f"the {layout.dp_world_size} data-parallel ranks"
        if layout.dp_world_size > 1
        else "one data-parallel rank"
    )
    return Verdict(
        RNG_INDEPENDENCE,
        "pass",
        f"{'; '.join(parts)}: every stream differs across {where} and their workers{peers}",
    )


def check_rng_independence_run(
    reference: RunTrace, run: RunTrace, rerun: RunTrace | None = None, *, ctx: Context | None = None
) -> Verdict:
    """``rng_independence`` on a loader's fetch draws (``EpochTrace.draws``): the registry's form for loader
    files, judged on the data-parallel view (one rank per data-parallel rank)."""
    ctx = ctx or Context(reference, run, rerun)
    if ctx.unjudgeable:
        return skipped(RNG_INDEPENDENCE, ctx.unjudgeable)
    if not any(e.draws is not None for r in run.ranks for e in r.epochs):
        return not_applicable(RNG_INDEPENDENCE, "the loader's random draws were not watched")
    return check_rng_independence(
        Layout.plain(len(run.ranks)), loading={"loader": [r.epochs for r in run.ranks]}
    )
