"""The judges of ``resume`` and ``elastic_resume``: plain data in (each rank's uninterrupted stream and
what every restore yielded), verdicts and rows out. No processes, no torch.distributed: the rank side
(:mod:`ddpcheck.scenarios.resume_rank`) records, the parent side (:mod:`ddpcheck.scenarios.resume`)
launches, these decide.

A restore is **exact** (same topology: the stream continues exactly), **resharded** (another topology:
across the old ranks' batches before the stop and the new ranks' after it the epoch is covered once,
repeats only from the new layout's padding), **refused** (the restore raised: an honest answer) or
**failed** (samples silently lost or repeated, named with its mechanism).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from ddpcheck.checks.ids import ELASTIC_RESUME, RESUME
from ddpcheck.checks.verdict import Verdict, failed, not_applicable, passed, skipped
from ddpcheck.layout import Layout
from ddpcheck.messages import count_text
from ddpcheck.result import ResumeRow

RESUME_HOOK = "resume_loader"  # the loader file's hooks, by the names the rank side looks up
SAVE_HOOK = "save_state"
LOAD_HOOK = "load_state"
HOOK = RESUME_HOOK

HOW_TO_ENABLE = (
    "the loader has no state to resume from: give the loader, its sampler or its batch sampler "
    "state_dict()/load_state_dict() (torchdata's StatefulDataLoader, ddpcheck's DDPSamplerWrapper), or "
    f"define {HOOK}(loader, epoch, step, samples_seen) in the loader file"
)
Batches = tuple[tuple[Hashable, ...], ...]
State = bytes | str | None  # what one rank saved (torch.save'd; a str: its DCP checkpoint), None: nothing


# ----------------------------------------------------------------------------- plain data


@dataclass(frozen=True)
class Stop:
    """Stop after ``step`` batches (1-based count of finished batches) of ``epoch``.

    A stop after the epoch's last step (``boundary``) is read the two ways trainers restore it: a loop
    that finishes the stopped epoch (nothing left) and goes on, or one that starts the next epoch at once
    (Lightning, HF Trainer); a loader is right when it is exact under either.
    """

    epoch: int
    step: int
    next_epoch: bool = False  # also run epoch + 1 after the restore
    elastic: bool = False  # also restore in other topologies (--elastic, --resume-workers)
    boundary: bool = False  # the epoch's last step: the restored job's next pass is epoch + 1


@dataclass(frozen=True)
class StopResult:
    """One restore: the rest of the stopped epoch and the next epoch after it; at a boundary also
    ``next_pass``, the first pass of a job that starts the next epoch at once (None: not needed)."""

    stop: Stop
    rest: Batches = ()
    next_epoch: Batches | None = None
    error: str = ""
    next_pass: Batches | None = None
    read_rest: bool = True  # False: the boundary's next pass was exact, the other reading was not run
    planned: Stop | None = None  # the job's stop this answers (a rank with fewer batches stops earlier)
    saved_by: tuple[int, ...] | None = None  # the old ranks that saved a state (None: not known, a hook)
    logged: tuple[str, ...] = ()  # what the library logged (WARNING and above) or warned while restoring


@dataclass(frozen=True)
class ChainResult:
    """Resumed twice, as a job restarted twice does: restored at ``stop``, ran ``later`` more batches
    (``first``), saved again, restored again in a fresh module (``second``: the rest of the epoch and
    the next). ``error``: a restore or save raised (one line)."""

    stop: Stop
    later: int
    first: Batches = ()
    second: StopResult | None = None
    error: str = ""


@dataclass(frozen=True)
class RankResume:
    """One rank's uninterrupted stream (per epoch, per batch), its resumed pieces and what it saved."""

    rank: int
    mechanism: str  # "loader" | "batch_sampler" | "sampler" | "batch_sampler.sampler" | "hook" | "hooks" | ""
    uninterrupted: tuple[Batches, ...] = ()
    resumed: tuple[StopResult, ...] = ()
    states: tuple[tuple[Stop, State], ...] = ()  # this rank's states at the topology stops
    workers: int = 0  # DataLoader worker processes (they fetch ahead of the loop)
    in_order: bool = True  # False: DataLoader(in_order=False) with workers, batches may come in any order
    # restores into loaders with N workers: (N, per topology stop the rest, or the error it raised)
    other_workers: tuple[tuple[int, tuple[StopResult | str, ...]], ...] = ()
    workers_settable: bool = True  # the factory takes num_workers
    chains: tuple[ChainResult, ...] = ()  # resumed twice
    factory: str = ""  # "" the main factory; else another make_*_loader the file defines
    extra: tuple[RankResume, ...] = ()  # the file's other make_*_loader factories, resumed the same way


@dataclass(frozen=True)
class Restore:
    """What a rank of another layout starts from: every old rank's saved state (or, for the hook, the
    old counters), stopped at ``stop`` in layout ``old``."""

    old: str  # the old layout's label
    stop: Stop
    states: tuple[State, ...] = ()
    samples_seen: int = 0


def stop_points(run_batches: Sequence[int], epochs: int, elastic: bool) -> tuple[Stop, ...]:
    """The first, a middle and the last step of epoch 0, and the middle of a later epoch (its order
    must be restored too). Epoch 0's middle also runs the next epoch; its last step is a boundary.
    Topology restores (``elastic``) start from every one of them. ``run_batches``: each epoch's batch
    count (largest rank: a rank with fewer stops at its own last step, :func:`local_stop`)."""
    stops = []
    n = run_batches[0] if run_batches else 0
    if n >= 1:
        middle = (n + 1) // 2
        for step in sorted({1, middle, n}):
            stops.append(Stop(0, step, next_epoch=step == middle, elastic=elastic, boundary=step == n))
    later = run_batches[1] if epochs > 1 and len(run_batches) > 1 else 0
    if later >= 1:
        stops.append(Stop(1, (later + 1) // 2, elastic=elastic))
    return tuple(stops)


def local_stop(stop: Stop, counts: Sequence[int]) -> Stop:
    """Where a rank with ``counts`` batches per epoch is when the job stops at ``stop``: a rank with
    fewer batches than the stop's step has finished its epoch (its own boundary); None counts: as planned."""
    if stop.epoch >= len(counts):
        return stop
    n = counts[stop.epoch]
    step = min(stop.step, n)
    return replace(stop, step=step, boundary=step == n)


# ----------------------------------------------------------------------------- pure judges


def flat(batches: Iterable[Sequence[Hashable]]) -> list[Hashable]:
    return [i for b in batches for i in b]


def first_difference(expected: Batches, got: Batches, in_order: bool = True) -> int | None:
    """The first batch where ``got`` leaves ``expected`` (None: never). Out-of-order loaders compare
    their batches as a multiset: with ``in_order=False`` any order is the loader's contract."""
    if not in_order:
        key = lambda batch: sorted(map(repr, batch))  # noqa: E731
        return None if sorted(map(key, expected)) == sorted(map(key, got)) else 0
    for j, (a, b) in enumerate(zip(expected, got, strict=False)):
        if sorted(map(repr, a)) != sorted(map(repr, b)):
            return j
    return None if len(expected) == len(got) else min(len(expected), len(got))


@dataclass
class _StopJudgement:
    stop: Stop
    skipped: int = 0
    repeated: int = 0
    first_divergence: int | None = None
    cause: str = ""
    ranks: list[int] = field(default_factory=list)
    error: str = ""
    before: int = 0
    after: int = 0
    finish_first: bool = False  # exact only for a loop that finishes the stopped epoch before the next
    saved_by: tuple[int, ...] | None = None  # the old ranks that saved a state
    logged: dict[int, tuple[str, ...]] = field(default_factory=dict)  # failing rank -> what it logged
    shifts: list[tuple[int, int | None]] = field(default_factory=list)  # (step, where the rest starts)

    @property
    def ok(self) -> bool:
        return not (self.ranks or self.error)

    def note(self, mechanism: str) -> str:
        if self.error or not self.ok:
            return self.error or self.cause
        if not self.finish_first:
            return f"via {via(mechanism)}"
        return (
            f"via {via(mechanism)}, for a loop that finishes the stopped epoch (empty) before the next; "
            "a job that starts the next epoch at once (Lightning, HF Trainer) gets another stream"
        )


def via(mechanism: str) -> str:
    """How a report names where the state lives: the file's hooks by their names."""
    return f"{SAVE_HOOK}/{LOAD_HOOK}" if mechanism == "hooks" else mechanism


def _finishes_first(rank: RankResume, result: StopResult) -> bool:
    """A boundary restore is exact for a loop that finishes the stopped epoch (nothing left) first."""
    following = result.stop.epoch + 1
    return (
        not result.rest
        and result.next_epoch is not None
        and following < len(rank.uninterrupted)
        and first_difference(rank.uninterrupted[following], result.next_epoch, rank.in_order) is None
    )


def _expected_rest(rank: RankResume, stop: Stop) -> Batches:
    """What the restored loader's next pass must yield: the rest of the epoch, or after the epoch's last
    step the whole next epoch."""
    if stop.boundary:
        following = stop.epoch + 1
        return rank.uninterrupted[following] if following < len(rank.uninterrupted) else ()
    return rank.uninterrupted[stop.epoch][stop.step :]


BOUNDARY_REPLAY = (
    "stopped after the epoch's last step, the restored loader runs that finished epoch again instead of "
    "the next one: the saved state does not mark the epoch finished (a loader that fetches a batch "
    "ahead saves before its last batch is handed out), so a job restored at an epoch's end trains an "
    "epoch twice"
)
BOUNDARY_EMPTY = (
    "stopped after the epoch's last step, the restored loader yields nothing in the next epoch: the "
    "'finished' state is applied to the next pass, so a job restored at an epoch's end skips an epoch"
)


def batches_text(n: int) -> str:
    """``1 batch``, ``3 batches``."""
    return f"{n} batch" if n == 1 else f"{n} batches"


def shift_of(epoch: Batches, got: Batches) -> int | None:
    """Where in ``epoch`` the stream ``got`` starts when it is the epoch's tail from there (None: it is
    no tail of the epoch). An empty ``got`` says nothing."""
    return next((k for k in range(len(epoch) + 1) if list(got) == list(epoch[k:])), None)


def batches_off(shifts: Sequence[tuple[int, int | None]]) -> int | None:
    """The one offset N (resumed at step + N) every failing stop shares, from (step, shift) pairs:
    a skip off by a constant, e.g. W-1 batches early (accelerate PR #3952). A stop whose early skip is
    clamped at the epoch's start (shift 0) agrees when its step is within N. None: no common offset."""
    offs = [(step, shift - step) for step, shift in shifts if shift is not None and shift != step]
    exact = {off for step, off in offs if step + off > 0}  # not clamped at the epoch's start
    if len(exact) != 1 or len(offs) != len(shifts):
        return None
    n = exact.pop()
    agree = all(off == n or (step + off == 0 and step + n <= 0) for step, off in offs)
    return n if agree else None


def off_by_text(n: int) -> str:
    return (
        f"off by {batches_text(abs(n))}: the restored loader resumes {batches_text(abs(n))} "
        f"{'late' if n > 0 else 'early'} at every stop, so it {'skips' if n > 0 else 'repeats'} them "
        "(a skip count off by a constant: counting from the wrong step, num_processes - 1 early as in "
        "accelerate PR #3952, or samples counted as batches)"
    )


def offset_every_epoch(expected: Batches, got: Batches) -> int | None:
    """The epoch after a restore, shifted by k > 0 batches: ``got`` starts k batches into ``expected``
    (and may wrap around or stop at its end). None: not a shift."""
    for k in range(1, len(expected)):
        tail = list(expected[k:])
        if got and list(got[: len(tail)]) == tail and list(got[len(tail) :]) in ([], list(expected[:k])):
            return k
    return None


OFFSET_EVERY_EPOCH = (
    "offset applied every epoch: the epoch after the restored one starts {k} in, as the restored "
    "epoch did (the resume offset is applied to every epoch instead of once: clear it after the first "
    "restored epoch)"
)
SEED_LOST = (
    "epoch seed lost on rebuild: the restored loader follows epoch {epoch}'s order instead of epoch "
    "{stopped}'s (the loader rebuilt for the restore draws its order without the epoch: its epoch is "
    "not restored, or its order comes from global random state that no state_dict saves; seed it from "
    "seed + epoch)"
)
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


def _cause(rank: RankResume, stop: Stop, got: Batches) -> str:
    got_items = flat(got)
    if stop.boundary:
        finished = rank.uninterrupted[stop.epoch]
        if not got_items and _expected_rest(rank, stop):
            return BOUNDARY_EMPTY
        if got_items == flat(finished):
            return BOUNDARY_REPLAY
        stop = Stop(stop.epoch + 1, 0)  # otherwise judged as a restore at the next epoch's start
    expected = rank.uninterrupted[stop.epoch][stop.step :]
    ahead = len(expected) - len(got)
    if rank.workers and rank.mechanism != "loader" and ahead > 0 and list(got) == list(expected[ahead:]):
        return (
            f"the {rank.mechanism}'s state runs ahead of training: DataLoader workers had fetched {ahead} "
            "more batches when it was saved; save the state through the loader (torchdata's "
            "StatefulDataLoader) or use num_workers=0"
        )
    other = _other_epoch(rank, stop, got_items)
    if other is not None:
        return other
    return _cause_within(rank, stop, got)


def _other_epoch(rank: RankResume, stop: Stop, got_items: list[Hashable]) -> str | None:
    """The rest follows another epoch's order: an earlier one (the epoch seed lost) or the next."""
    for epoch, batches in enumerate(rank.uninterrupted):
        if epoch != stop.epoch and got_items and got_items == flat(batches[stop.step :]):
            if epoch < stop.epoch:
                return f"the restored loader replays epoch {epoch}'s order: " + SEED_LOST.format(
                    epoch=epoch, stopped=stop.epoch
                )
            return (
                f"the restored loader jumps ahead to epoch {epoch}'s order: the saved generator state "
                "already belongs to the next permutation (saved after the epoch's permutation was drawn)"
            )
    return None


def _cause_within(rank: RankResume, stop: Stop, got: Batches) -> str:
    """The rest holds this epoch's samples: started over, shifted, or another order."""
    got_items = flat(got)
    expected_epoch = rank.uninterrupted[stop.epoch]
    if got_items and got_items == flat(expected_epoch)[: len(got_items)] and stop.step > 0:
        return f"{RESTARTED}: the saved position is not restored"
    shifted = shift_of(expected_epoch, got)
    if shifted is not None and shifted != stop.step:
        off = shifted - stop.step
        return (
            f"{off_by_text(off).partition(':')[0]}: the restored loader resumes at step {shifted + 1} "
            f"instead of step {stop.step + 1}: it skips {count_text(abs(off), 'batches')} too "
            f"{'many' if off > 0 else 'few'} (counting samples as batches, or an off-by-one in the step)"
        )
    if Counter(got_items) == Counter(flat(expected_epoch[stop.step :])):
        return "the rest of the epoch has the right samples in another order"
    if set(got_items) <= set(flat(expected_epoch)):
        if rank.mechanism == "hook":
            return (
                "resume_loader's rest of the epoch takes this epoch's samples in another order: check "
                "which order it draws and how it skips what was trained"
            )
        return (
            "the restored loader draws another order of the same epoch: the saved generator or "
            "position belongs to another point (saved after the epoch's permutation was drawn?), or the "
            "state leaves out buffered samples (a shuffle buffer: HF datasets' is lost on resume)"
        )
    return "the resumed stream differs from the uninterrupted one"


def next_epoch_cause(rank: RankResume, stop: Stop, got: Batches) -> str:
    """Why the epoch after a restored one differs: shifted by the restored offset, or the order of the
    restored epoch again (the epoch seed lost)."""
    following = stop.epoch + 1
    expected = rank.uninterrupted[following]
    k = offset_every_epoch(expected, got)
    if k is not None:
        return OFFSET_EVERY_EPOCH.format(k=batches_text(k))
    if got and flat(got) == flat(rank.uninterrupted[stop.epoch]) and flat(got) != flat(expected):
        return SEED_LOST.format(epoch=stop.epoch, stopped=following)
    return "the epoch after the restored one differs from the uninterrupted run"


def _judge_one(j: _StopJudgement, rank: RankResume, result: StopResult) -> None:
    """Add one rank's restore at ``j.stop`` to its judgement."""
    if result.error.startswith("restoring failed"):
        j.error = j.error or f"rank {rank.rank}: {result.error}"
        return
    stop = result.stop
    j.before += len(flat(rank.uninterrupted[stop.epoch][: stop.step]))
    start = stop.step  # where ``expected`` starts in its epoch
    next_cause = ""
    if stop.boundary and result.next_pass is not None:
        # a job that starts the next epoch at once (Lightning, HF Trainer) ...
        expected, got, start = _expected_rest(rank, stop), result.next_pass, 0
        differs = first_difference(expected, got, rank.in_order)
        if differs is not None and result.read_rest and _finishes_first(rank, result):
            j.finish_first = True  # ... or one that finishes the stopped epoch first
            expected = got = result.next_epoch or ()
            differs = None
    else:
        expected = rank.uninterrupted[stop.epoch][stop.step :]
        got = result.rest
        differs = first_difference(expected, got, rank.in_order)
        if result.next_epoch is not None and stop.epoch + 1 < len(rank.uninterrupted):
            following = rank.uninterrupted[stop.epoch + 1]
            if first_difference(following, result.next_epoch, rank.in_order) is not None:
                next_cause = next_epoch_cause(rank, stop, result.next_epoch)
    j.after += len(flat(got))
    j.saved_by = result.saved_by if j.saved_by is None else j.saved_by
    if differs is None and not next_cause:
        return
    j.ranks.append(rank.rank)
    if result.logged:
        j.logged[rank.rank] = result.logged
    j.skipped += sum((Counter(flat(expected)) - Counter(flat(got))).values())
    j.repeated += sum((Counter(flat(got)) - Counter(flat(expected))).values())
    if differs is not None:
        step = start + differs + 1
        j.first_divergence = step if j.first_divergence is None else min(j.first_divergence, step)
        j.cause = j.cause or _cause(rank, result.stop, got)
        if not (stop.boundary and result.next_pass is not None):
            j.shifts.append((stop.step, shift_of(rank.uninterrupted[stop.epoch], got)))
    else:
        j.cause = j.cause or next_cause


def _judge_stops(ranks: Sequence[RankResume]) -> dict[Stop, _StopJudgement]:
    judgements: dict[Stop, _StopJudgement] = {}
    for rank in ranks:
        for result in rank.resumed:
            planned = result.planned or result.stop  # ranks with fewer batches stop earlier in the epoch
            _judge_one(judgements.setdefault(planned, _StopJudgement(planned)), rank, result)
    for (
        stop,
        j,
    ) in judgements.items():  # every rank trained one rank's remainder: one state restored everywhere
        rests = [
            r.rest for rank in ranks for r in rank.resumed if (r.planned or r.stop) == stop and not r.error
        ]
        if not j.ok and len(rests) > 1 and rests[0] and all(r == rests[0] for r in rests):
            j.cause = RANK0_STATE
        elif not j.ok and len(ranks) > 1 and j.saved_by == (0,) and any(r != 0 for r in j.ranks):
            j.cause = RANK0_SAVED  # the others find no state of their own in rank 0's
    return judgements


RESTARTED = "the restored loader starts the epoch over"


def _name_offsets(judgements: dict[Stop, _StopJudgement]) -> None:
    """Failing stops that share one offset are one mechanism: off by N batches. Read first at a
    step-1 stop, a skip N batches early looks like starting the epoch over (accelerate PR #3952);
    stops read at an epoch's end (no shift to read) do not vote."""
    bad = [j for j in judgements.values() if not j.ok and not j.error]
    voting = [j for j in bad if j.shifts]
    n = batches_off([pair for j in voting for pair in j.shifts]) if voting else None
    if n is None or any(j.cause in (RANK0_STATE, RANK0_SAVED) for j in bad):
        return
    for j in voting:  # only the clamped reading; any other cause says more (where, or why: prefetch)
        if j.cause.startswith(RESTARTED):
            j.cause = off_by_text(n)


def judge_resume(
    world_size: int, ranks: Sequence[RankResume], mesh: str = ""
) -> tuple[Verdict, tuple[ResumeRow, ...]]:
    """Before + after the stop equals the uninterrupted stream on every rank; the next epoch is unchanged;
    resumed twice, the whole chain does too. ``mesh``: the layout's label when it is a device mesh (the
    rows' topology names it)."""
    if not ranks or not ranks[0].mechanism:
        return not_applicable(RESUME, HOW_TO_ENABLE), ()
    mechanism = ranks[0].mechanism
    judgements = _judge_stops(ranks)
    _name_offsets(judgements)
    topology = f"{mesh} -> {mesh}" if mesh else ""
    rows = tuple(
        ResumeRow(
            world_size,
            world_size,
            j.stop.epoch,
            j.stop.step,
            "pass" if j.ok else "fail",
            skipped=j.skipped,
            repeated=j.repeated,
            first_divergence=j.first_divergence,
            note=j.note(mechanism),
            change=topology,
            outcome="exact" if j.ok else "failed",
            before=j.before,
            after=j.after,
        )
        for j in sorted(judgements.values(), key=lambda j: (j.stop.epoch, j.stop.step))
    )
    chains = judge_chains(ranks, world_size, topology)
    if not judgements:
        return skipped(RESUME, "no stop point could be reached (the epochs are empty)"), rows
    return _resume_verdict(mechanism, judgements, chains), rows + tuple(c.row for c in chains)


def _resume_verdict(
    mechanism: str, judgements: dict[Stop, _StopJudgement], chains: Sequence[ChainJudgement]
) -> Verdict:
    bad = [j for j in judgements.values() if not j.ok]
    tried = ", ".join(f"e{j.stop.epoch}/s{j.stop.step}" for j in judgements.values())
    bad_chains = [c for c in chains if not c.ok]
    if not bad and not bad_chains:
        twice = f", resumed twice exactly ({len(chains)} chains)" if chains else ""
        return passed(
            RESUME,
            f"resumed exactly via {via(mechanism)} at {len(judgements)} stop points ({tried}), "
            f"next epochs unchanged{twice}",
        )
    if not bad:
        first_chain = bad_chains[0]
        return failed(
            RESUME,
            first_chain.detail,
            cause=first_chain.cause,
            ranks=first_chain.ranks,
            epochs=(first_chain.stop.epoch,),
        )
    first = sorted(bad, key=lambda j: (j.stop.epoch, j.stop.step))[0]
    if first.error:
        detail = f"restoring at epoch {first.stop.epoch} step {first.stop.step} failed: {first.error}"
        return failed(RESUME, detail, cause=first.error, epochs=(first.stop.epoch,))
    where = (
        f"diverges at step {first.first_divergence}"
        if first.first_divergence is not None
        else "changes the next epoch"
    )
    detail = (
        f"stopped at epoch {first.stop.epoch} step {first.stop.step} and resumed via {via(mechanism)}, rank "
        f"{first.ranks[0]} {where}: {count_text(first.skipped, 'samples')} skipped, "
        f"{count_text(first.repeated, 'samples')} repeated"
        + (f" ({len(bad)} of {len(judgements)} stop points fail)" if len(bad) > 1 else "")
    )
    verdict = failed(RESUME, detail, cause=first.cause, ranks=tuple(first.ranks), epochs=(first.stop.epoch,))
    data: dict[str, object] = {}
    if first.logged:  # the library's own word on the restore (torchtitan: "DataLoader state is empty ...")
        data["logged"] = [f"rank {r}: {line}" for r, lines in sorted(first.logged.items()) for line in lines]
    return replace(verdict, fix=TOPOLOGY_FIXES.get(first.cause, ""), data=data)


# ----------------------------------------------------------------------------- resumed twice


@dataclass(frozen=True)
class ChainJudgement:
    """One chain judged over every rank: its row, and for a failure the cause, detail and ranks."""

    stop: Stop
    later: int
    row: ResumeRow
    cause: str = ""
    detail: str = ""
    ranks: tuple[int, ...] = ()

    @property
    def ok(self) -> bool:
        return self.row.status == "pass"


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
            by_key.setdefault((chain.stop, chain.later), []).append((rank, chain))
    return tuple(
        _judge_chain(key, members, by_key, (world_size, topology)) for key, members in by_key.items()
    )


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
    errors = [f"rank {rank.rank}: {c.error}" for rank, c in members if c.error]
    if errors:
        row = replace(row, status="fail", outcome="failed", note=f"{kind}: {errors[0]}")
        return ChainJudgement(stop, later, row, errors[0], f"{kind}: {errors[0]}")
    damages = {rank.rank: chain_damage(rank, c) for rank, c in members}
    before = sum(len(flat(rank.uninterrupted[stop.epoch][: stop.step])) for rank, _ in members)
    after = sum(len(flat(c.first)) + len(flat((c.second or StopResult(stop)).rest)) for _, c in members)
    row = replace(row, before=before, after=after)
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


@dataclass(frozen=True)
class Topology:
    """Where a restore happens: a layout and its DataLoader workers (None: the loader's own)."""

    layout: Layout
    workers: int | None = None

    @property
    def label(self) -> str:
        return self.layout.label


def change_text(old: Topology, new: Topology, old_workers: int) -> str:
    if new.workers is not None and old.layout == new.layout:
        return f"workers {old_workers} -> {new.workers}"
    return f"{old.label} -> {new.label}"


def judge_restore(
    old_layout: Layout,
    old: Sequence[RankResume],
    new: Topology,
    stop: Stop,
    rests: Sequence[StopResult | Batches | str],
    pad_room: int,
    *,
    change: str,
) -> ResumeRow:
    """A restore into another topology: old data-parallel ranks' batches before the stop + the new ones'
    after it cover the epoch once (repeats within ``pad_room``); replicas of the new layout restore the
    same rest. ``rests`` per new rank (a str: that rank's restore raised). At a boundary the next pass
    of a job that starts the next epoch at once is the other reading: it must cover that epoch once."""
    row = ResumeRow(
        old_layout.world_size, new.layout.world_size, stop.epoch, stop.step, "pass", change=change
    )
    errors = [r for r in rests if isinstance(r, str)]
    if errors:
        note = f"refused: restoring raised {errors[0]}"
        return replace(row, outcome="refused", note=note)
    results = [
        r if isinstance(r, StopResult) else StopResult(stop, r) for r in rests if not isinstance(r, str)
    ]
    by_rank = {r.rank: r for r in old}
    old_firsts = [by_rank[r] for r in old_layout.representatives() if r in by_rank]
    before = flat(b for r in old_firsts for b in r.uninterrupted[stop.epoch][: stop.step])
    epoch_items = set(flat(b for r in old_firsts for b in r.uninterrupted[stop.epoch]))
    row = replace(row, before=len(before))
    passes = [r.next_pass for r in results]
    rests_ = [r.rest for r in results]
    if not stop.boundary or any(p is None for p in passes):
        same = _continues(old_layout, old, new, stop, rests_)
        return _covers(row, old_layout, new, before, rests_, epoch_items, pad_room, continues=same)
    same = _continues(old_layout, old, new, stop, passes, starting=True)  # type: ignore[arg-type]
    starting = _covers(row, old_layout, new, [], passes, epoch_items, pad_room, continues=same)  # type: ignore[arg-type]
    if starting.outcome != "failed" or not all(r.read_rest for r in results):
        return starting
    same = _continues(old_layout, old, new, stop, rests_)
    finishing = _covers(row, old_layout, new, before, rests_, epoch_items, pad_room, continues=same)
    if finishing.outcome == "failed":
        return starting
    damage = _damage(starting.skipped, starting.repeated, pad_room) or "differs"
    note = (
        f"{finishing.note} if the loop finishes the stopped epoch first; starting the next at once {damage}"
    )
    return replace(finishing, note=note)


def _continues(
    old_layout: Layout,
    old: Sequence[RankResume],
    new: Topology,
    stop: Stop,
    rests: Sequence[Batches],
    *,
    starting: bool = False,
) -> bool:
    """The data-parallel layout is unchanged (``dp=2,tp=2 -> dp=2``, the same worker count) and every
    data-parallel rank continues its own stream exactly: an exact restore, not a resharded one."""
    if old_layout.dp_world_size != new.layout.dp_world_size or new.workers is not None:
        return False
    by_rank = {r.rank: r for r in old}
    news = new.layout.representatives()
    for dp, rank in enumerate(old_layout.representatives()):
        before = by_rank.get(rank)
        if before is None or dp >= len(news) or news[dp] >= len(rests):
            return False
        epoch = stop.epoch + 1 if starting else stop.epoch
        if epoch >= len(before.uninterrupted):
            return False
        expected = before.uninterrupted[epoch] if starting else before.uninterrupted[epoch][stop.step :]
        if first_difference(expected, rests[news[dp]], before.in_order) is not None:
            return False
    return True


def _damage(lost: int, repeated: int, pad_room: int) -> str:
    words = []
    if lost:
        words.append(f"loses {count_text(lost, 'samples')}")
    if repeated > pad_room:
        words.append(f"repeats {count_text(repeated, 'samples')}")
    return " and ".join(words)


def _covers(
    row: ResumeRow,
    old_layout: Layout,
    new: Topology,
    before: list[Hashable],
    rests: Sequence[Batches],
    epoch_items: set[Hashable],
    pad_room: int,
    *,
    continues: bool = False,
) -> ResumeRow:
    """``before`` + the new data-parallel ranks' ``rests`` cover ``epoch_items`` once; replicas agree.
    ``continues``: every data-parallel rank continues its own stream (:func:`_continues`): exact."""
    layout, stop = new.layout, Stop(row.epoch, row.step)
    after = flat(b for rank in layout.representatives() if rank < len(rests) for b in rests[rank])
    diverging = [
        rank
        for group in layout.replica_groups()
        for rank in group[1:]
        if rank < len(rests) and rests[rank] != rests[group[0]]
    ]
    counts = Counter(before + after)
    lost = len(epoch_items - set(counts))
    repeated = sum(c - 1 for c in counts.values() if c > 1)
    row = replace(row, skipped=lost, repeated=repeated, after=len(after))
    if diverging:
        note = f"replicas restored different rests (rank {diverging[0]} differs from its group's first rank)"
        return replace(row, status="fail", outcome="failed", note=note)
    if lost == 0 and repeated <= pad_room:
        same = old_layout == layout and new.workers is None
        note = "nothing lost, " + (f"{repeated} padding copies" if repeated else "nothing repeated")
        if continues and not same:
            note = (
                f"the data-parallel layout is unchanged (dp world size {layout.dp_world_size}): every "
                "data-parallel rank continues its own stream exactly"
            )
        return replace(row, outcome="exact" if same or continues else "resharded", note=note)
    where = f"at epoch {stop.epoch} step {stop.step}"
    if not before and stop.step:
        where = f"after epoch {stop.epoch}'s last step, epoch {stop.epoch + 1}"
    note = f"not elastic: {row.topology} {where} {_damage(lost, repeated, pad_room)}"
    return replace(row, status="fail", outcome="failed", note=note)


def judge_elastic(
    old: Sequence[RankResume], new_world_size: int, stop: Stop, rests: Sequence[Batches | str], pad_room: int
) -> ResumeRow:
    """:func:`judge_restore` between two plain world sizes."""
    old_layout, new = Layout.plain(len(old)), Topology(Layout.plain(new_world_size))
    change = f"{len(old)} -> {new_world_size}"
    return judge_restore(old_layout, old, new, stop, rests, pad_room, change=change)


NOT_ELASTIC = {
    "hook": "resume_loader skips a per-rank count: at another world size the shards change, so the "
    "position must come from samples_seen over the global order (not elastic)",
}
NOT_ELASTIC_STATE = (
    "restored at another world size, the saved data state does not continue the same global order: "
    "not elastic"
)
RANK0_STATE = (
    "every rank restored the same state (only rank 0 saves, or every rank loads rank 0's file): the "
    "ranks restart from one rank's position and shard, so samples are trained twice or never"
)
RANK0_SAVED = (
    "only rank 0 saves the data state and every rank restores from it: a loader that keys its state by "
    "rank (torchtitan's ParallelAwareDataloader: 'dp_rank_<r>') finds none of its own on the other "
    "ranks, which start their epoch over (or resume at rank 0's position) while rank 0 resumes"
)
GLOBAL_RANK_STATE = (
    "the state is keyed by the global rank, but the data is sharded by the data-parallel rank: a rank "
    "of the new mesh loads the state of an old rank that held another shard (load the state of the old "
    "rank with the same data-parallel rank, with a load_state hook)"
)
WORKER_OFFSETS = (
    "restored with another number of DataLoader workers, the state's per-worker positions do not carry "
    "over: samples of the old workers' shards are lost or repeated"
)
ROUNDED_TO_BATCHES = (
    "the restore reshards at whole-batch granularity: the saved position is rounded to the new layout's "
    "global batch (litdata's elastic resume rounds down, then drops a ragged tail), so a stop off such a "
    "boundary repeats or loses fewer samples than one global batch"
)
TOPOLOGY_FIXES = {  # and the resume causes that have one
    BOUNDARY_REPLAY: "save the loader's state after its iterator is exhausted (torchdata's "
    "StatefulDataLoader marks the epoch finished then), or start the next epoch without loading a state "
    "saved at an epoch's end",
    BOUNDARY_EMPTY: "start the next epoch from a fresh iterator (call iter() once more), or save the state "
    "after the epoch's loop has ended",
    ROUNDED_TO_BATCHES: "checkpoint where the samples seen are a multiple of the new layout's global batch "
    "(data-parallel size x workers x batch size), or accept the few repeats with --allow elastic_resume",
    RANK0_STATE: "save every rank's state and load old rank r's into new rank r (the default), or write "
    "a load_state hook that reads every old rank's",
    RANK0_SAVED: "save the data state on every rank, not only rank 0 (torchtitan's checkpointer saves "
    "the dataloader on every rank, each dp rank under its own key), and load rank r's into rank r",
    GLOBAL_RANK_STATE: "key the saved state by the data-parallel rank (a load_state hook that picks the old "
    "rank with the same dp_rank)",
    WORKER_OFFSETS: "restore with the saved number of workers, or keep per-worker offsets that reshard "
    "(litdata does)",
    NOT_ELASTIC_STATE: "save a position in the global order (samples_seen) instead of a per-rank one, or "
    "restart elastic jobs at an epoch's start",
}


def topology_verdict(rows: Sequence[ResumeRow], cause: str) -> Verdict:
    """elastic_resume from the restores into one topology: any silent loss or repetition fails it;
    exact, resharded and refused restores are honest answers."""
    bad = [r for r in rows if r.outcome == "failed"]
    changes = ", ".join(dict.fromkeys(r.topology for r in rows))
    if not rows:
        return skipped(ELASTIC_RESUME, "no state to restore in another topology")
    refused = [r for r in rows if r.outcome == "refused"]
    if not bad:
        kinds = Counter(r.outcome for r in rows)
        said = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        detail = f"restored in other topologies ({changes}): {said}; nothing silently lost or repeated"
        if refused:
            detail += f" (refused: {refused[0].note.removeprefix('refused: ')})"
        return passed(ELASTIC_RESUME, detail)
    verdict = failed(
        ELASTIC_RESUME,
        bad[0].note + (f" ({len(bad)} of {len(rows)} restores fail)" if len(bad) > 1 else ""),
        cause=cause,
        epochs=(bad[0].epoch,),
    )
    return replace(verdict, fix=TOPOLOGY_FIXES.get(cause, ""))


def within_global_batch(row: ResumeRow, new: Topology, old: Sequence[RankResume]) -> bool:
    """A global position (every old rank saved the same state) restored with lost and repeated both
    fewer than one global batch of the new topology: litdata's rounding, not a per-rank state."""
    saved = {
        state for r in old for stop, state in r.states if (stop.epoch, stop.step) == (row.epoch, row.step)
    }
    if len(old) < 2 or len(saved) != 1 or None in saved:  # one old rank: nothing tells a global state
        return False
    sizes = [len(b) for r in old[:1] for epoch in r.uninterrupted[:1] for b in epoch[:1]]
    workers = new.workers if new.workers is not None else (old[0].workers if old else 0)
    stride = new.layout.dp_world_size * max(1, workers) * (sizes[0] if sizes else 1)
    return max(row.skipped, row.repeated) < stride


def _judged_pass(result: StopResult | Batches) -> Batches:
    """What a restore yielded: at a boundary the next epoch's pass (the rest of the stopped one is empty)."""
    if not isinstance(result, StopResult):
        return result
    return result.next_pass if result.stop.boundary and result.next_pass is not None else result.rest


def restore_cause(
    old_layout: Layout,
    new: Topology,
    old: Sequence[RankResume],
    rests: Sequence[StopResult | Batches | str],
    mechanism: str,
    row: ResumeRow | None = None,
) -> str:
    """The mechanism behind a failed restore into ``new``: rank 0's state everywhere, a state keyed by
    the global rank on a mesh, positions rounded to whole batches, workers' offsets lost, or a per-rank
    state that is not elastic."""
    if mechanism == "hook":
        return NOT_ELASTIC["hook"]
    rounded = row is not None and within_global_batch(row, new, old)
    if new.workers is not None and old_layout == new.layout:
        return ROUNDED_TO_BATCHES if rounded else WORKER_OFFSETS
    states = [dict(r.states) for r in old]
    for stop in states[0] if states else {}:
        saved = [s.get(stop) for s in states]
        if len(saved) > 1 and sum(x is not None for x in saved) == 1:
            return RANK0_STATE
    clean = [_judged_pass(r) for r in rests if not isinstance(r, str)]
    if len(clean) > 1 and len(set(clean)) == 1 and clean[0] and new.layout.dp_world_size > 1:
        return RANK0_STATE
    if (old_layout.mesh or new.layout.mesh) and (old_layout.replicas > 1 or new.layout.replicas > 1):
        return GLOBAL_RANK_STATE
    return ROUNDED_TO_BATCHES if rounded else NOT_ELASTIC_STATE


# ----------------------------------------------------------------------------- other loaders of the file


RESTARTS_AT_ZERO = "restarts at sample 0 after a restore"


def factory_cause(name: str, cause: str) -> str:
    """A failure of another factory's loader, named by the factory (``make_valid_loader``...)."""
    if cause.startswith(("the restored loader starts the epoch over", BOUNDARY_REPLAY[:40])):
        return f"the loader built by {name} {RESTARTS_AT_ZERO}: {cause}"
    return f"the loader built by {name}: {cause}"


def judge_all(
    world_size: int, ranks: Sequence[RankResume], mesh: str = ""
) -> tuple[Verdict, tuple[ResumeRow, ...]]:
    """:func:`judge_resume` of the main loader, then of every other ``make_*_loader`` the file defines
    (their rows named by the factory); the first failure of any fails ``resume``."""
    verdict, rows = judge_resume(world_size, ranks, mesh)
    names = dict.fromkeys(e.factory for r in ranks for e in r.extra)
    for name in names:
        extra = [e for r in ranks for e in r.extra if e.factory == name]
        other, more = judge_resume(world_size, extra, mesh)
        rows += tuple(replace(row, change=f"{row.topology}, {name}") for row in more)
        if other.status == "fail" and verdict.status != "fail":
            cause = factory_cause(name, other.cause)
            verdict = replace(other, detail=f"{name}: {other.detail}", cause=cause)
        elif other.status == "pass" and verdict.status == "pass":
            verdict = replace(verdict, detail=f"{verdict.detail}; {name} resumed exactly too")
    return verdict, rows
