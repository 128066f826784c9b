"""The judge of ``resume``: plain data in (each rank's uninterrupted stream and what every restore
yielded, :mod:`ddpcheck.restores`), a verdict and rows out. No processes, no torch.distributed: the
rank side (:mod:`ddpcheck.scenarios.resume_rank`) records, the parent side
(:mod:`ddpcheck.scenarios.resume`) launches, the judges decide: this one restores in the same topology
(where a job stops, and why a restore fails), :mod:`~ddpcheck.checks.resume_chains` resumed twice,
:mod:`~ddpcheck.checks.resume_elastic` another topology.

A restore is **exact** (same topology: the stream continues exactly), **resharded** (another topology:
across the old ranks' batches before the stop and the new ranks' after it the epoch is covered once,
repeats only from the new layout's padding), **refused** (the restore raised: an honest answer) or
**failed** (samples silently lost or repeated, named with its mechanism). A stop the ranks' records
cannot answer (an epoch no rank recorded) is not judged, and the verdict says so.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, replace

from ddpcheck.checks.resume_chains import ChainJudgement, judge_chains
from ddpcheck.checks.resume_common import (
    BOUNDARY_EMPTY,
    BOUNDARY_REPLAY,
    HOW_TO_ENABLE,
    RANK0_SAVED,
    RANK0_STATE,
    TOPOLOGY_FIXES,
    batches_text,
    first_difference,
    flat,
    shift_of,
    via,
)
from ddpcheck.evidence import RestoreLog
from ddpcheck.messages import count_text
from ddpcheck.restores import Batches, RankRestore, RankResume, ResumeRow, Stop, StopResult
from ddpcheck.verdict import RESUME, Verdict, failed, not_applicable, passed, skipped


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
    per_rank: list[RankRestore] = field(default_factory=list)  # every judged rank's counts
    unjudged: list[str] = field(default_factory=list)  # why a rank's records could not judge it (or part)

    @property
    def ok(self) -> bool:
        return not (self.ranks or self.error)

    @property
    def judged(self) -> bool:
        """Some rank's restore was judged (a failure to restore is an answer too)."""
        return bool(self.per_rank or self.error)

    def note(self, mechanism: str) -> str:
        if self.error or not self.ok:
            return self.error or self.cause
        if not self.judged:
            return f"not judged: {self.unjudged[0]}"
        said = f"via {via(mechanism)}"
        if self.finish_first:
            said += (
                ", for a loop that finishes the stopped epoch (empty) before the next; a job that starts "
                "the next epoch at once (Lightning, HF Trainer) gets another stream"
            )
        return f"{said}; not judged: {self.unjudged[0]}" if self.unjudged else said

    def row(self, world_size: int, mechanism: str, topology: str) -> ResumeRow:
        status = "fail" if not self.ok else "pass" if self.judged else "skip"
        return ResumeRow(
            world_size, world_size, self.stop.epoch, self.stop.step, status,
            skipped=self.skipped, repeated=self.repeated, first_divergence=self.first_divergence,
            note=self.note(mechanism), change=topology,
            outcome={"fail": "failed", "pass": "exact"}.get(status, ""),
            before=self.before, after=self.after, ranks=tuple(sorted(self.per_rank, key=lambda r: r.rank)),
        )  # fmt: skip


def unrecorded(rank: RankResume, stop: Stop) -> str:
    """Why this rank's uninterrupted run cannot say what a restore at ``stop`` must yield ("": it can).
    A rank with fewer batches finishes its epoch early (its own boundary): after the last recorded
    epoch its next pass has nothing to be compared with."""
    recorded = len(rank.uninterrupted)
    if stop.epoch >= recorded:
        return f"rank {rank.rank} recorded no epoch {stop.epoch} (the uninterrupted run has {recorded})"
    if stop.boundary and stop.epoch + 1 >= recorded:
        return (
            f"rank {rank.rank} had finished epoch {stop.epoch} at the stop, and its next pass (epoch "
            f"{stop.epoch + 1}) has no uninterrupted epoch to be compared with"
        )
    return ""


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
    """Add one rank's restore at ``j.stop`` to its judgement (never past what the rank recorded)."""
    if result.error.startswith("restoring failed"):
        j.error = j.error or f"rank {rank.rank}: {result.error}"
        return
    stop = result.stop
    why = unrecorded(rank, stop)
    if why and (stop.epoch >= len(rank.uninterrupted) or result.rest or not result.read_rest):
        j.unjudged.append(why)
        return
    before = len(flat(rank.uninterrupted[stop.epoch][: stop.step]))
    if why:  # the last recorded epoch's end: the rest of that epoch (empty) is all that can be judged
        j.unjudged.append(why)
        j.before += before
        j.per_rank.append(RankRestore(rank.rank, before))
        return
    expected, got, start, differs, next_cause = _compared(j, rank, result)
    lost = sum((Counter(flat(expected)) - Counter(flat(got))).values())
    repeated = sum((Counter(flat(got)) - Counter(flat(expected))).values())
    bad = differs is not None or bool(next_cause)
    j.before += before
    j.after += len(flat(got))
    j.per_rank.append(RankRestore(rank.rank, before, len(flat(got)), *((lost, repeated) if bad else (0, 0))))
    j.saved_by = result.saved_by if j.saved_by is None else j.saved_by
    if not bad:
        return
    j.ranks.append(rank.rank)
    if result.logged:
        j.logged[rank.rank] = result.logged
    j.skipped += lost
    j.repeated += repeated
    if differs is not None:
        step = start + differs + 1
        j.first_divergence = step if j.first_divergence is None else min(j.first_divergence, step)
        j.cause = j.cause or _cause(rank, result.stop, got)
        if not (stop.boundary and result.next_pass is not None):
            j.shifts.append((stop.step, shift_of(rank.uninterrupted[stop.epoch], got)))
    else:
        j.cause = j.cause or next_cause


def _compared(
    j: _StopJudgement, rank: RankResume, result: StopResult
) -> tuple[Batches, Batches, int, int | None, str]:
    """What the restore must yield and what it did (``expected``, ``got``, where ``expected`` starts in
    its epoch, the first differing batch), and why the epoch after it differs ("": it does not)."""
    stop = result.stop
    if stop.boundary and result.next_pass is not None:
        # a job that starts the next epoch at once (Lightning, HF Trainer) ...
        expected, got = _expected_rest(rank, stop), result.next_pass
        differs = first_difference(expected, got, rank.in_order)
        if differs is not None and result.read_rest and _finishes_first(rank, result):
            j.finish_first = True  # ... or one that finishes the stopped epoch first
            expected = got = result.next_epoch or ()
            differs = None
        return expected, got, 0, differs, ""
    expected = rank.uninterrupted[stop.epoch][stop.step :]
    differs = first_difference(expected, result.rest, rank.in_order)
    next_cause = ""
    if result.next_epoch is not None and stop.epoch + 1 < len(rank.uninterrupted):
        following = rank.uninterrupted[stop.epoch + 1]
        if first_difference(following, result.next_epoch, rank.in_order) is not None:
            next_cause = next_epoch_cause(rank, stop, result.next_epoch)
    return expected, result.rest, stop.step, differs, next_cause


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
    ordered = sorted(judgements.values(), key=lambda j: (j.stop.epoch, j.stop.step))
    rows = tuple(j.row(world_size, mechanism, topology) for j in ordered)
    chains = judge_chains(ranks, world_size, topology)
    if not judgements:
        return skipped(RESUME, "no stop point could be reached (the epochs are empty)"), rows
    return _resume_verdict(mechanism, judgements, chains), rows + tuple(c.row for c in chains)


def _resume_verdict(
    mechanism: str, judgements: dict[Stop, _StopJudgement], chains: Sequence[ChainJudgement]
) -> Verdict:
    bad = [j for j in judgements.values() if not j.ok]
    judged = [j for j in judgements.values() if j.judged]
    tried = ", ".join(f"e{j.stop.epoch}/s{j.stop.step}" for j in judged)
    bad_chains = [c for c in chains if not c.ok]
    unjudged = [why for j in judgements.values() for why in j.unjudged]
    if not bad and not bad_chains:
        if not judged and not chains:
            return skipped(RESUME, f"no restore could be judged: {unjudged[0]}")
        twice = f", resumed twice exactly ({len(chains)} chains)" if chains else ""
        partly = f"; not judged: {unjudged[0]}" if unjudged else ""
        return passed(
            RESUME,
            f"resumed exactly via {via(mechanism)} at {len(judged)} stop points ({tried}), "
            f"next epochs unchanged{twice}{partly}",
        )
    if not bad:
        first_chain = bad_chains[0]
        verdict = failed(
            RESUME,
            first_chain.detail,
            cause=first_chain.cause,
            ranks=first_chain.ranks,
            epochs=(first_chain.stop.epoch,),
        )
        return replace(verdict, fix=first_chain.fix)
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
    log = None
    if first.logged:  # the library's own word on the restore (torchtitan: "DataLoader state is empty ...")
        said = sorted(first.logged.items())
        log = RestoreLog(tuple(f"rank {r}: {line}" for r, lines in said for line in lines))
    return replace(verdict, fix=TOPOLOGY_FIXES.get(first.cause, ""), evidence=log)


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
