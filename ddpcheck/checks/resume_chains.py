"""Resumed twice, as a job restarted twice is: each chain judged over every rank against the
uninterrupted run, and named (a state saved right after a restore that misses the workers' progress,
a restored object that keeps its loaded state)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ddpcheck.checks.resume_common import batches_text, first_difference, flat, via
from ddpcheck.messages import count_text
from ddpcheck.restores import ChainResult, RankRestore, RankResume, ResumeRow, Stop, StopResult

STALE_STATE = (
    "stale state after restore: resumed twice, the second restore repeats what the first restored run "
    "already trained: the state saved after a restore is the one restored, not the position reached "
    "since (a restored object keeps its loaded state, e.g. HF datasets before PR #8295)"
)
INCOMPLETE_STATE = (
    "incomplete state right after restore: a state saved within num_workers batches after a restore "
    "misses the workers' progress (workers that have not delivered since the restore report the "
    "restored position, torchdata PR #1251), so the second restore repeats samples; a checkpoint "
    "num_workers + 1 batches after the restore is exact"
)


@dataclass(frozen=True)
class ChainJudgement:
    """One chain judged over every rank: its row, and for a failure the cause, detail and ranks."""

    stop: Stop
    later: int
    row: ResumeRow
    cause: str = ""
    detail: str = ""
    ranks: tuple[int, ...] = ()
    fix: str = ""

    @property
    def ok(self) -> bool:
        return self.row.status == "pass"


def fast_forwarded_again(rank: RankResume, chain: ChainResult) -> int | None:
    """Where the chain's second restore started when it skipped the first restore's fast-forward a
    second time (None: it did not): the first restored run continued exactly, and the second restore
    starts ``stop.step`` batches past where that run stopped, because the state saved after the first
    restore counts the batches it fast-forwarded as yielded again. Past the epoch's end that finds no
    batch at all (``StopIteration`` before the first)."""
    stop, epoch = chain.stop, rank.uninterrupted[chain.stop.epoch]
    if not stop.step or list(chain.first) != list(epoch[stop.step : stop.step + chain.later]):
        return None
    late = 2 * stop.step + chain.later
    if chain.error:
        past = late >= len(epoch) and "StopIteration before the first batch" in chain.error
        return late if past else None
    second = chain.second
    return (
        late if second is not None and late < len(epoch) and list(second.rest) == list(epoch[late:]) else None
    )


COUNTED_TWICE = (
    "skipped batches counted again: restored at batch {k} and run {j} more, the state saved then says "
    "{late} batches yielded, not {real}: the restore's fast-forward over the first {k} batches is counted "
    "as batches trained, so the next restore skips {k} batches it never trained{past}"
)
COUNTED_TWICE_TORCHDATA = (
    " (torchdata's StatefulDataLoader restores an IterableDataset that has no state_dict by naive "
    "fast-forward, each skipped batch counted as yielded; torchtitan's ParallelAwareDataloader inherits it)"
)
COUNTED_TWICE_FIX = (
    "give the dataset state_dict()/load_state_dict() (its position in the stream): the loader then "
    "restores that position instead of fast-forwarding, and a state saved after a restore is the "
    "position reached"
)


def counted_twice_cause(rank: RankResume, chain: ChainResult, late: int) -> str:
    """:data:`COUNTED_TWICE` with the chain's numbers; where the state lives in the loader, torchdata's
    known case named."""
    k, j, n = chain.stop.step, chain.later, len(rank.uninterrupted[chain.stop.epoch])
    past = (
        f", past the end of the epoch ({n} batches): StopIteration before the first batch"
        if late >= n
        else ""
    )
    cause = COUNTED_TWICE.format(k=k, j=j, late=late, real=k + j, past=past)
    return cause + (COUNTED_TWICE_TORCHDATA if rank.mechanism == "loader" else "")


def chain_text(stop: Stop, later: int) -> str:
    """The row kind: how the job was stopped and restored twice."""
    return (
        f"resumed twice: stop at epoch {stop.epoch} step {stop.step}, restore, stop "
        f"{batches_text(later).replace('batches', 'steps').replace('batch', 'step')} later, restore"
    )


@dataclass(frozen=True)
class ChainDamage:
    """What one rank's chain did against the uninterrupted run (plain counts)."""

    lost: int = 0
    repeated: int = 0
    differs: int | None = None  # first differing batch after the first stop
    next_differs: bool = False
    stale: bool = False  # the second restore repeats what the first restored run yielded

    @property
    def ok(self) -> bool:
        return self.differs is None and not self.next_differs


def chain_damage(rank: RankResume, chain: ChainResult) -> ChainDamage:
    """The chain's whole stream (first restored run + second restore's rest) against the rest of the
    epoch, and the next epoch against the uninterrupted one."""
    stop = chain.stop
    expected = rank.uninterrupted[stop.epoch][stop.step :]
    second = chain.second or StopResult(stop)
    got = tuple(chain.first) + tuple(second.rest)
    differs = first_difference(expected, got, rank.in_order)
    next_differs = False
    if second.next_epoch is not None and stop.epoch + 1 < len(rank.uninterrupted):
        following = rank.uninterrupted[stop.epoch + 1]
        next_differs = first_difference(following, second.next_epoch, rank.in_order) is not None
    lost = sum((Counter(flat(expected)) - Counter(flat(got))).values())
    repeated = sum((Counter(flat(got)) - Counter(flat(expected))).values())
    again = set(flat(chain.first)) & set(flat(second.rest))
    restarted = bool(second.rest) and bool(chain.first) and second.rest[0] == chain.first[0]
    return ChainDamage(lost, repeated, differs, next_differs, bool(again) or restarted)


def chain_cause(damages: Sequence[tuple[int, ChainDamage]], workers: int) -> str:
    """Name a failed chain from every chain of the stop (``later`` -> damage): a checkpoint within
    ``workers`` batches after a restore repeats while one past it is exact (incomplete state); a second
    restore that repeats the first restored run (stale state)."""
    short = [d for later, d in damages if later <= workers and not d.ok]
    long_ok = any(later > workers and d.ok for later, d in damages)
    if workers and short and long_ok and any(d.repeated for d in short):
        return INCOMPLETE_STATE
    if any(d.stale for _, d in damages if not d.ok):
        return STALE_STATE
    return "resumed twice, the stream differs from the uninterrupted one"


def judge_chains(
    ranks: Sequence[RankResume], world_size: int, topology: str = ""
) -> tuple[ChainJudgement, ...]:
    """Every chain (resumed twice), judged over every rank against the uninterrupted run."""
    topology = f"{topology or f'{world_size} -> {world_size}'}, resumed twice"
    by_key: dict[tuple[Stop, int], list[tuple[RankResume, ChainResult]]] = {}
    for rank in ranks:
        for chain in rank.chains:
            if chain.stop.epoch < len(rank.uninterrupted):  # a judge never reads past what a rank recorded
                by_key.setdefault((chain.stop, chain.later), []).append((rank, chain))
    return tuple(
        _judge_chain(key, members, by_key, (world_size, topology)) for key, members in by_key.items()
    )


def _counted_twice(
    stop: Stop, later: int, row: ResumeRow, kind: str, again: list[tuple[RankResume, ChainResult, int]]
) -> ChainJudgement:
    """A chain whose second restore skipped the first restore's fast-forward again, on the ranks in
    ``again`` (rank, chain, where the second restore started): what each lost of the epoch's rest."""
    rank, chain, late = again[0]
    n = len(rank.uninterrupted[stop.epoch])
    lost = sum(len(flat(r.uninterrupted[stop.epoch][stop.step + later : late])) for r, _, late in again)
    cause = counted_twice_cause(rank, chain, late)
    if late >= n:
        where = f"fast-forwards {late} batches of {n} and yields nothing"
    else:
        where = f"resumes at batch {late + 1} instead of batch {stop.step + later + 1}"
    detail = f"{kind}: rank {rank.rank}'s second restore {where}: {count_text(lost, 'samples')} lost"
    row = replace(row, status="fail", outcome="failed", skipped=lost, note=f"{kind}: {cause}")
    ranks = tuple(r.rank for r, _, _ in again)
    return ChainJudgement(stop, later, row, cause, detail, ranks, fix=COUNTED_TWICE_FIX)


def _judge_chain(
    key: tuple[Stop, int],
    members: list[tuple[RankResume, ChainResult]],
    every: dict[tuple[Stop, int], list[tuple[RankResume, ChainResult]]],
    where: tuple[int, str],
) -> ChainJudgement:
    stop, later = key
    kind = f"{chain_text(stop, later)} (via {via(members[0][0].mechanism)})"
    world_size, topology = where
    row = ResumeRow(world_size, world_size, stop.epoch, stop.step, "pass", change=topology)
    again = [(rank, c, late) for rank, c in members if (late := fast_forwarded_again(rank, c)) is not None]
    if again:
        return _counted_twice(stop, later, row, kind, again)
    errors = [f"rank {rank.rank}: {c.error}" for rank, c in members if c.error]
    if errors:
        row = replace(row, status="fail", outcome="failed", note=f"{kind}: {errors[0]}")
        return ChainJudgement(stop, later, row, errors[0], f"{kind}: {errors[0]}")
    damages = {rank.rank: chain_damage(rank, c) for rank, c in members}
    counts = tuple(
        RankRestore(
            rank.rank,
            len(flat(rank.uninterrupted[stop.epoch][: stop.step])),
            len(flat(c.first)) + len(flat((c.second or StopResult(stop)).rest)),
            damages[rank.rank].lost,
            damages[rank.rank].repeated,
        )
        for rank, c in sorted(members, key=lambda m: m[0].rank)
    )
    before, after = sum(r.before for r in counts), sum(r.after for r in counts)
    row = replace(row, before=before, after=after, ranks=counts)
    bad = sorted(r for r, d in damages.items() if not d.ok)
    if not bad:
        return ChainJudgement(stop, later, replace(row, outcome="exact", note=kind))
    lost = sum(d.lost for d in damages.values())
    repeated = sum(d.repeated for d in damages.values())
    rank0 = next(rank for rank, _ in members if rank.rank == bad[0])
    per_later = [
        (other_later, chain_damage(r, c))
        for (s, other_later), pairs in every.items()
        if s == stop
        for r, c in pairs
        if r.rank == bad[0] and not c.error
    ]
    cause = chain_cause(per_later, rank0.workers)
    row = replace(
        row, status="fail", outcome="failed", skipped=lost, repeated=repeated, note=f"{kind}: {cause}"
    )
    detail = (
        f"{kind}: rank {bad[0]} {count_text(lost, 'samples')} lost, {count_text(repeated, 'samples')} "
        "repeated against the uninterrupted run"
    )
    return ChainJudgement(stop, later, row, cause, detail, tuple(bad))
