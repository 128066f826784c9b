"""``elastic_resume``: restores into another topology (world size, mesh, worker count). Across the old
ranks' batches before the stop and the new ranks' after it the epoch must be covered once (repeats only
from the new layout's padding); replicas of the new layout restore the same rest."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import replace

from ddpcheck.checks.resume_common import (
    GLOBAL_RANK_STATE,
    NOT_ELASTIC,
    NOT_ELASTIC_STATE,
    RANK0_STATE,
    ROUNDED_TO_BATCHES,
    TOPOLOGY_FIXES,
    WORKER_OFFSETS,
    first_difference,
    flat,
)
from ddpcheck.layout import Layout
from ddpcheck.messages import count_text
from ddpcheck.restores import Batches, RankRestore, RankResume, ResumeRow, Stop, StopResult, Topology
from ddpcheck.verdict import ELASTIC_RESUME, Verdict, failed, passed, skipped


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
    short = next((r.rank for r in old_firsts if stop.epoch >= len(r.uninterrupted)), None)
    if short is not None:  # a judge never reads past what a rank recorded
        note = f"not judged: old rank {short} recorded no epoch {stop.epoch}"
        return replace(row, status="skip", note=note)
    before = flat(b for r in old_firsts for b in r.uninterrupted[stop.epoch][: stop.step])
    epoch_items = set(flat(b for r in old_firsts for b in r.uninterrupted[stop.epoch]))
    row = replace(row, before=len(before))
    passes = [r.next_pass for r in results]
    rests_ = [r.rest for r in results]
    if not stop.boundary or any(p is None for p in passes):
        same = _continues(old_layout, old, new, stop, rests_)
        row = _covers(row, old_layout, new, before, rests_, epoch_items, pad_room, continues=same)
        return _with_ranks(row, old_firsts, new.layout, stop, rests_, finishing=True)
    same = _continues(old_layout, old, new, stop, passes, starting=True)  # type: ignore[arg-type]
    starting = _covers(row, old_layout, new, [], passes, epoch_items, pad_room, continues=same)  # type: ignore[arg-type]
    starting = _with_ranks(starting, old_firsts, new.layout, stop, passes, finishing=False)  # type: ignore[arg-type]
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
    return _with_ranks(replace(finishing, note=note), old_firsts, new.layout, stop, rests_, finishing=True)


def _with_ranks(
    row: ResumeRow,
    old_firsts: Sequence[RankResume],
    layout: Layout,
    stop: Stop,
    rests: Sequence[Batches],
    *,
    finishing: bool,
) -> ResumeRow:
    """``row`` with every rank's counts: an old data-parallel rank's samples trained before the stop and
    lost (of its epoch, trained by no new rank), a new one's trained after the restore and repeated
    (trained already, before the stop or by a lower new rank). ``finishing``: the loop finishes the
    stopped epoch (else the restored pass is the next epoch's, with nothing trained before it)."""
    befores = {
        r.rank: flat(r.uninterrupted[stop.epoch][: stop.step]) if finishing else [] for r in old_firsts
    }
    afters = {rank: flat(rests[rank]) for rank in layout.representatives() if rank < len(rests)}
    seen: Counter[Hashable] = Counter(i for items in befores.values() for i in items)
    repeated: dict[int, int] = {}
    for rank, items in afters.items():
        repeated[rank] = sum(1 for i in items if seen[i] > 0)
        seen.update(items)
    lost = {r.rank: sum(1 for i in set(flat(r.uninterrupted[stop.epoch])) if not seen[i]) for r in old_firsts}
    counts = tuple(
        RankRestore(k, len(befores.get(k, ())), len(afters.get(k, ())), lost.get(k, 0), repeated.get(k, 0))
        for k in sorted(set(befores) | set(afters))
    )
    return replace(row, ranks=counts)


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


def topology_verdict(rows: Sequence[ResumeRow], cause: str) -> Verdict:
    """elastic_resume from the restores into one topology: any silent loss or repetition fails it;
    exact, resharded and refused restores are honest answers."""
    bad = [r for r in rows if r.outcome == "failed"]
    changes = ", ".join(dict.fromkeys(r.topology for r in rows))
    if not rows:
        return skipped(ELASTIC_RESUME, "no state to restore in another topology")
    refused = [r for r in rows if r.outcome == "refused"]
    if not bad:
        kinds = Counter(r.outcome or "not judged" for r in rows)
        if set(kinds) == {"not judged"}:
            return skipped(ELASTIC_RESUME, rows[0].note)
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
