"""resume and elastic_resume: stop mid-epoch, restart as a restarted job would, compare the streams.

Rank side (:func:`resume_rank`): build the loader, run the correct loop uninterrupted and save the
data state at each stop point on the way (``torch.save`` to bytes, as a checkpoint would). Then, per
stop point, re-run the loader file's module code, rebuild the loader with fresh global RNG state,
restore (``torch.load``), finish the epoch and, for some stops, run the next one. How the state is
saved, in this order: the loader's ``state_dict``/``load_state_dict`` (torchdata's
``StatefulDataLoader``), its batch sampler's or sampler's, or the file's
``resume_loader(loader, epoch, step, samples_seen)`` hook. Everything that comes back is plain data.

Elastic (:func:`elastic_rank`): every rank of a group of another size loads what old rank 0 saved
(or gets the old counters through the hook) and finishes the epoch.

The judges (:func:`judge_resume`, :func:`judge_elastic`) are pure.
"""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ddpcheck.checker.loaderfile import LoaderSpec, call_by_name, optional_hook, unwrap_loader
from ddpcheck.checker.recording import RESUME_HOOK as HOOK
from ddpcheck.checker.recording import group_position, has_state
from ddpcheck.checks.ids import ELASTIC_RESUME, RESUME
from ddpcheck.checks.verdict import Verdict, failed, not_applicable, passed, skipped
from ddpcheck.launch import GroupResult, TargetRef, report_progress, run_ranks
from ddpcheck.launch.rank import worker_headline
from ddpcheck.messages import count_text, exception_text, one_line
from ddpcheck.result import ResumeRow
from ddpcheck.scenarios.protocol import DataRun, Outcome, rank_failures

if TYPE_CHECKING:
    from ddpcheck.checker.options import CheckOptions
    from ddpcheck.checker.recording import RecordOptions

HOW_TO_ENABLE = (
    "the loader has no state to resume from: give the loader, its sampler or its batch sampler "
    "state_dict()/load_state_dict() (torchdata's StatefulDataLoader, ddpcheck's DDPSamplerWrapper), or "
    f"define {HOOK}(loader, epoch, step, samples_seen) in the loader file"
)
Batches = tuple[tuple[Hashable, ...], ...]


# ----------------------------------------------------------------------------- plain data


@dataclass(frozen=True)
class Stop:
    """Stop after ``step`` batches (1-based count of finished batches) of ``epoch``."""

    epoch: int
    step: int
    next_epoch: bool = False  # also run epoch + 1 after the restore
    elastic: bool = False  # also restore at the other world sizes (--elastic)


@dataclass(frozen=True)
class StopResult:
    stop: Stop
    rest: Batches = ()
    next_epoch: Batches | None = None
    error: str = ""


@dataclass(frozen=True)
class RankResume:
    """One rank's uninterrupted stream (per epoch, per batch) and its resumed pieces."""

    rank: int
    mechanism: str  # "loader" | "batch_sampler" | "sampler" | "batch_sampler.sampler" | "hook" | ""
    uninterrupted: tuple[Batches, ...] = ()
    resumed: tuple[StopResult, ...] = ()
    states: tuple[tuple[Stop, bytes], ...] = ()  # rank 0, elastic stops only
    workers: int = 0  # DataLoader worker processes (they fetch ahead of the loop)
    in_order: bool = True  # False: DataLoader(in_order=False) with workers, batches may come in any order


@dataclass(frozen=True)
class Restore:
    """What an elastic rank starts from: old rank 0's saved state, or the old counters for the hook."""

    stop: Stop
    state: bytes = b""
    samples_seen: int = 0


# ----------------------------------------------------------------------------- rank side


def _holder(outer: Any, mechanism: str) -> Any:
    loader = unwrap_loader(outer)
    if mechanism == "loader":
        return outer if has_state(outer) else loader
    if mechanism == "batch_sampler.sampler":
        return loader.batch_sampler.sampler
    return getattr(loader, mechanism)


def _save(state: Any) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def _load(data: bytes) -> tuple[Any, str]:
    """As a checkpoint is loaded: ``weights_only=True`` (torch's default) first."""
    import torch

    try:
        return torch.load(io.BytesIO(data), weights_only=True), ""
    except Exception as exc:
        note = f"the state loads only with torch.load(weights_only=False) ({type(exc).__name__})"
        return torch.load(io.BytesIO(data), weights_only=False), note


def _ids_of(iterable: Any, hook: Any, facts: Any, options: RecordOptions, log: Any = None) -> Batches:
    """Ids of every batch ``iterable`` yields. For index identity the DataLoader underneath logs what it
    dispatched (``log``: every loader's, for a hook's iterable); batches an iterable skipped
    (``islice``) were logged too, so the yielded ones are the last entries."""
    from ddpcheck.checker.identity import make_id_extractor
    from ddpcheck.checker.index_log import log_of
    from ddpcheck.checker.recording import is_collated

    if log is None:
        log = log_of(unwrap_loader(iterable))
    log.clear()
    by_index = facts.dataset_kind == "map" and hook is None and not options.ids_from_data
    out: list[tuple[Hashable, ...]] = []
    count = 0
    extract = None
    for batch in iterable:
        count += 1
        report_progress(f"resume: batch {count}")
        if by_index:
            continue
        if extract is None:
            under = unwrap_loader(iterable)
            collated = is_collated(under) if hasattr(under, "batch_sampler") else True
            _, extract = make_id_extractor(hook, batch, collated)
        out.append(tuple(extract(batch)))
    if not by_index:
        return tuple(out)
    entries = list(log.ready)[-count:] if count else []
    if len(entries) < count or any(ids is None for ids, _ in entries):
        raise RuntimeError("cannot tell which indices the resumed loader yielded; define sample_ids(batch)")
    return tuple(tuple(ids or ()) for ids, _ in entries)


def _call_hook(hook: Any, loader: Any, epoch: int, step: int, samples_seen: int) -> Any:
    return call_by_name(hook, {"loader": loader, "epoch": epoch, "step": step, "samples_seen": samples_seen})


def _restart(
    spec: LoaderSpec, options: RecordOptions, rank: int, world_size: int
) -> tuple[Any, Any, Any, Any]:
    from ddpcheck.checker.recording import build_loader, read_facts
    from ddpcheck.launch.rank import fresh_random_state

    fresh_random_state()
    outer, module = build_loader(spec, options, rank, world_size, fresh=True)
    return outer, module, optional_hook(module, "sample_ids"), read_facts(unwrap_loader(outer))


def _finish(
    spec: LoaderSpec,
    options: RecordOptions,
    mechanism: str,
    stop: Stop,
    state: bytes,
    samples_seen: int,
    rank: int,
    world_size: int,
) -> StopResult:
    from ddpcheck.checker.index_log import catch_all
    from ddpcheck.checker.recording import SET_EPOCH_HOOK, loop_set_epoch

    outer, module, hook, facts = _restart(spec, options, rank, world_size)
    epoch_hook = optional_hook(module, SET_EPOCH_HOOK)
    note = ""
    if mechanism == "hook":
        loop_set_epoch(outer, stop.epoch, epoch_hook)
        with catch_all() as log:  # the hook may build its own loader and start iterating it at once
            rest_iterable = _call_hook(
                optional_hook(module, HOOK), outer, stop.epoch, stop.step, samples_seen
            )
            rest = _ids_of(rest_iterable, hook, facts, options, log)
    else:
        saved, note = _load(state)
        _holder(outer, mechanism).load_state_dict(saved)
        loop_set_epoch(outer, stop.epoch, epoch_hook)
        rest = _ids_of(outer, hook, facts, options)
    following = None
    if stop.next_epoch:
        loop_set_epoch(outer, stop.epoch + 1, epoch_hook)
        following = _ids_of(outer, hook, facts, options)
    return StopResult(stop, rest, following, error=note)


def resume_rank(
    spec: LoaderSpec, options: RecordOptions, stops: tuple[Stop, ...], epochs: int, mechanism: str
) -> RankResume:
    """In a rank: the uninterrupted stream with states saved at ``stops``, then each stop resumed.

    ``mechanism`` is what the data run found (``LoaderFacts.resumable``): probing again here could
    start the loader's iterator before its first ``set_epoch``.
    """
    from ddpcheck.checker.recording import SET_EPOCH_HOOK, build_loader, loop_set_epoch, read_facts

    rank, world_size = group_position()
    report_progress("resume: building the loader")
    outer, module = build_loader(spec, options, rank, world_size)
    hook = optional_hook(module, "sample_ids")
    facts = read_facts(unwrap_loader(outer))
    wanted = {(s.epoch, s.step): s for s in stops}
    states: dict[Stop, bytes] = {}
    seen: dict[Stop, int] = {}
    uninterrupted = []
    epoch_hook = optional_hook(module, SET_EPOCH_HOOK)
    for epoch in range(epochs):
        loop_set_epoch(outer, epoch, epoch_hook)
        batches = []
        for batch_ids in _stream(outer, hook, facts, options):
            batches.append(batch_ids)
            stop = wanted.get((epoch, len(batches)))
            if stop is not None:
                seen[stop] = len(batches)
                if mechanism != "hook":
                    try:
                        states[stop] = _save(_holder(outer, mechanism).state_dict())
                    except Exception as exc:  # the loader's resume is broken: a verdict, not a crash
                        failure = f"saving the state failed: {failure_text(exc)}"
                        broken = StopResult(stop, error=f"restoring failed: {failure}")
                        return RankResume(rank, mechanism, (), (broken,))
        uninterrupted.append(tuple(batches))
    resumed = []
    for stop in stops:
        if stop not in seen:
            continue
        report_progress(f"resume: restoring at epoch {stop.epoch}, step {stop.step}")
        samples = sum(len(b) for b in uninterrupted[stop.epoch][: stop.step]) * world_size
        try:
            result = _finish(spec, options, mechanism, stop, states.get(stop, b""), samples, rank, world_size)
        except Exception as exc:
            result = StopResult(stop, error=f"restoring failed: {failure_text(exc)}")
        resumed.append(result)
    keep = tuple((s, b) for s, b in states.items() if s.elastic) if rank == 0 else ()
    workers = int(getattr(unwrap_loader(outer), "num_workers", 0) or 0)
    return RankResume(
        rank, mechanism, tuple(uninterrupted), tuple(resumed), keep, workers=workers, in_order=facts.in_order
    )


def _stream(outer: Any, hook: Any, facts: Any, options: RecordOptions) -> Iterable[tuple[Hashable, ...]]:
    from ddpcheck.checker.recording import batches_with_ids

    by_index = not options.ids_from_data
    for _, ids, _ in batches_with_ids(outer, hook, facts, None, unwrap_loader(outer), by_index=by_index):
        yield tuple(ids)


def elastic_rank(spec: LoaderSpec, options: RecordOptions, restore: Restore, mechanism: str) -> Batches | str:
    """In a rank of the new group: restore what the old group saved and finish the epoch.

    A restore that raises is an answer (the loader is not elastic), returned as its one-line message.
    """
    rank, world_size = group_position()
    stop = restore.stop
    try:
        result = _finish(
            spec,
            options,
            mechanism,
            replace(stop, next_epoch=False),  # the old ranks' next epoch says nothing here
            restore.state,
            restore.samples_seen,
            rank,
            world_size,
        )
    except Exception as exc:
        return failure_text(exc)
    return result.rest


# ----------------------------------------------------------------------------- pure judges


def _flat(batches: Iterable[Sequence[Hashable]]) -> list[Hashable]:
    return [i for b in batches for i in b]


def _first_difference(expected: Batches, got: Batches, in_order: bool = True) -> int | None:
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

    @property
    def ok(self) -> bool:
        return not (self.ranks or self.error)


def failure_text(exc: BaseException) -> str:
    """One readable line for an exception raised while saving or restoring: a DataLoader worker's
    exception by its own type, message and the user's frame, never torch's whole re-raised text."""
    if isinstance(exc, StopIteration):
        return (
            "StopIteration before the first batch (the restored state points past the end of the "
            "epoch, or at a snapshot of an earlier one)"
        )
    text = exception_text(exc)
    return one_line(worker_headline(text) or f"{type(exc).__name__}: {text}".strip().rstrip(":"), 300)


def _cause(rank: RankResume, stop: Stop, got: Batches) -> str:
    flat = _flat(got)
    expected = rank.uninterrupted[stop.epoch][stop.step :]
    ahead = len(expected) - len(got)
    if rank.workers and rank.mechanism != "loader" and ahead > 0 and list(got) == list(expected[ahead:]):
        return (
            f"the {rank.mechanism}'s state runs ahead of training: DataLoader workers had fetched {ahead} "
            "more batches when it was saved; save the state through the loader (torchdata's "
            "StatefulDataLoader) or use num_workers=0"
        )
    whole = _flat(rank.uninterrupted[stop.epoch])
    if not expected and flat and Counter(flat) == Counter(whole):
        return (
            "stopped after the epoch's last step, the saved state marks the epoch as finished, so a job "
            "restored into that epoch runs all of it again (a loader that fetches a batch ahead ends its "
            "inner iterator before the last batch is handed out)"
        )
    if not expected and flat:
        return (
            "stopped after the epoch's last step, the restored loader yields another whole epoch: a "
            "state saved at an epoch's end restarts the pass (a loader that restarts when it runs out), "
            "so a job restored there trains an extra epoch"
        )
    for epoch, batches in enumerate(rank.uninterrupted):
        if epoch != stop.epoch and flat and flat == _flat(batches[stop.step :]):
            if epoch < stop.epoch:
                return (
                    f"the restored loader replays epoch {epoch}'s order: its epoch is not restored, or "
                    "its order comes from global random state (random, numpy, torch) that no "
                    "state_dict saves (seed it from seed + epoch)"
                )
            return (
                f"the restored loader jumps ahead to epoch {epoch}'s order: the saved generator state "
                "already belongs to the next permutation (saved after the epoch's permutation was drawn)"
            )
    expected_epoch = rank.uninterrupted[stop.epoch]
    if flat and flat == _flat(expected_epoch)[: len(flat)] and stop.step > 0:
        return "the restored loader starts the epoch over: the saved position is not restored"
    shifted = next(
        (
            k
            for k in range(len(expected_epoch) + 1)
            if k != stop.step and list(got) == list(expected_epoch[k:])
        ),
        None,
    )
    if shifted is not None:
        off = shifted - stop.step
        return (
            f"the restored loader resumes at step {shifted + 1} instead of step {stop.step + 1}: it skips "
            f"{abs(off)} {'batch' if abs(off) == 1 else 'batches'} too {'many' if off > 0 else 'few'} "
            "(counting samples as batches, or an off-by-one in the step)"
        )
    if Counter(flat) == Counter(_flat(expected_epoch[stop.step :])):
        return "the rest of the epoch has the right samples in another order"
    if set(flat) <= set(_flat(expected_epoch)):
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


def judge_resume(world_size: int, ranks: Sequence[RankResume]) -> tuple[Verdict, tuple[ResumeRow, ...]]:
    """Before + after the stop equals the uninterrupted stream on every rank; the next epoch is unchanged."""
    if not ranks or not ranks[0].mechanism:
        return not_applicable(RESUME, HOW_TO_ENABLE), ()
    mechanism = ranks[0].mechanism
    judgements: dict[Stop, _StopJudgement] = {}
    for rank in ranks:
        for result in rank.resumed:
            j = judgements.setdefault(result.stop, _StopJudgement(result.stop))
            if result.error.startswith("restoring failed"):
                j.error = j.error or f"rank {rank.rank}: {result.error}"
                continue
            expected = rank.uninterrupted[result.stop.epoch][result.stop.step :]
            got = result.rest
            missing = Counter(_flat(expected)) - Counter(_flat(got))
            extra = Counter(_flat(got)) - Counter(_flat(expected))
            differs = _first_difference(expected, got, rank.in_order)
            next_changed = False
            if result.next_epoch is not None and result.stop.epoch + 1 < len(rank.uninterrupted):
                following = rank.uninterrupted[result.stop.epoch + 1]
                next_changed = _first_difference(following, result.next_epoch, rank.in_order) is not None
            if differs is not None or next_changed:
                j.ranks.append(rank.rank)
                j.skipped += sum(missing.values())
                j.repeated += sum(extra.values())
                if differs is not None:
                    step = result.stop.step + differs + 1
                    j.first_divergence = step if j.first_divergence is None else min(j.first_divergence, step)
                    j.cause = j.cause or _cause(rank, result.stop, got)
                else:
                    j.cause = j.cause or "the epoch after the restored one differs from the uninterrupted run"
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
            note=j.error or (j.cause if not j.ok else f"via {mechanism}"),
        )
        for j in sorted(judgements.values(), key=lambda j: (j.stop.epoch, j.stop.step))
    )
    bad = [j for j in judgements.values() if not j.ok]
    tried = ", ".join(f"e{j.stop.epoch}/s{j.stop.step}" for j in judgements.values())
    if not judgements:
        return skipped(RESUME, "no stop point could be reached (the epochs are empty)"), rows
    if not bad:
        return (
            passed(
                RESUME,
                f"resumed exactly via {mechanism} at {len(judgements)} stop points ({tried}), "
                "next epochs unchanged",
            ),
            rows,
        )
    first = sorted(bad, key=lambda j: (j.stop.epoch, j.stop.step))[0]
    if first.error:
        detail = f"restoring at epoch {first.stop.epoch} step {first.stop.step} failed: {first.error}"
        return failed(RESUME, detail, cause=first.error, epochs=(first.stop.epoch,)), rows
    where = (
        f"diverges at step {first.first_divergence}"
        if first.first_divergence is not None
        else "changes the next epoch"
    )
    detail = (
        f"stopped at epoch {first.stop.epoch} step {first.stop.step} and resumed via {mechanism}, rank "
        f"{first.ranks[0]} {where}: {count_text(first.skipped, 'samples')} skipped, "
        f"{count_text(first.repeated, 'samples')} repeated"
        + (f" ({len(bad)} of {len(judgements)} stop points fail)" if len(bad) > 1 else "")
    )
    return (
        failed(RESUME, detail, cause=first.cause, ranks=tuple(first.ranks), epochs=(first.stop.epoch,)),
        rows,
    )


def judge_elastic(
    old: Sequence[RankResume], new_world_size: int, stop: Stop, rests: Sequence[Batches | str], pad_room: int
) -> ResumeRow:
    """Old ranks' batches before the stop + new ranks' rest: nothing lost, nothing repeated beyond padding."""
    errors = [r for r in rests if isinstance(r, str)]
    if errors:
        note = (
            f"not elastic: {len(old)} -> {new_world_size} at epoch {stop.epoch} step {stop.step}: "
            f"restoring raised {errors[0]}"
        )
        return ResumeRow(len(old), new_world_size, stop.epoch, stop.step, "fail", note=note)
    before = _flat(b for r in old for b in r.uninterrupted[stop.epoch][: stop.step])
    epoch_items = set(_flat(b for r in old for b in r.uninterrupted[stop.epoch]))
    after = _flat(b for rest in rests if not isinstance(rest, str) for b in rest)
    counts = Counter(before + after)
    lost = len(epoch_items - set(counts))
    repeated = sum(c - 1 for c in counts.values() if c > 1)
    ok = lost == 0 and repeated <= pad_room
    words = []
    if lost:
        words.append(f"loses {count_text(lost, 'samples')}")
    if repeated > pad_room:
        words.append(f"repeats {count_text(repeated, 'samples')}")
    note = (
        "nothing lost, " + (f"{repeated} padding copies" if repeated else "nothing repeated")
        if ok
        else f"not elastic: {len(old)} -> {new_world_size} at epoch {stop.epoch} step {stop.step} "
        + " and ".join(words)
    )
    return ResumeRow(
        len(old), new_world_size, stop.epoch, stop.step, "pass" if ok else "fail", lost, repeated, None, note
    )


NOT_ELASTIC = {
    "hook": "resume_loader skips a per-rank count: at another world size the shards change, so the "
    "position must come from samples_seen over the global order (not elastic)",
}
NOT_ELASTIC_STATE = (
    "the saved data state is per rank: restored at another world size it does not continue the same "
    "global order (not elastic)"
)


def elastic_verdict(rows: Sequence[ResumeRow], mechanism: str = "") -> Verdict:
    bad = [r for r in rows if r.status == "fail"]
    pairs = sorted({(r.world_size_from, r.world_size_to) for r in rows})
    if not rows:
        return skipped(ELASTIC_RESUME, "no state to restore at another world size")
    text = ", ".join(f"{a}->{b}" for a, b in pairs)
    if not bad:
        return passed(
            ELASTIC_RESUME, f"restored at other world sizes ({text}): nothing lost, nothing repeated"
        )
    return failed(
        ELASTIC_RESUME,
        bad[0].note + (f" ({len(bad)} of {len(rows)} restores fail)" if len(bad) > 1 else ""),
        cause=NOT_ELASTIC.get(mechanism, NOT_ELASTIC_STATE),
        epochs=(bad[0].epoch,),
    )


# ----------------------------------------------------------------------------- parent side


def stop_points(run_batches: Sequence[int], epochs: int, elastic: bool) -> tuple[Stop, ...]:
    """First, middle and last step of epoch 0 and of a later epoch; the middle ones also run the next
    epoch (and are the elastic ones). ``run_batches``: each epoch's batch count (smallest rank)."""
    stops = []
    for epoch in sorted({0, min(1, epochs - 1)}):
        n = run_batches[epoch] if epoch < len(run_batches) else 0
        if n < 1:
            continue
        middle = (n + 1) // 2
        for step in sorted({1, middle, n}):
            is_middle = step == middle
            stops.append(Stop(epoch, step, next_epoch=is_middle, elastic=elastic and is_middle))
    return tuple(stops)


class ResumeCheck:
    """Parent side of ``resume`` (every world size) and ``elastic_resume`` (``--elastic``, at the end)."""

    def __init__(self, spec: LoaderSpec, options: CheckOptions) -> None:
        self.spec = spec
        self.options = options
        self.record = options.record_options()
        self.saved: dict[int, tuple[list[RankResume], tuple[Stop, ...]]] = {}
        self.pad_unit = 1  # samples one unit of padding holds (a whole batch where batches are padded)
        self.mechanism = ""  # where the data state lives: the elastic failure's cause depends on it

    @classmethod
    def maybe(cls, spec: LoaderSpec, options: CheckOptions, names: frozenset[str]) -> ResumeCheck | None:
        return cls(spec, options) if options.resume else None

    def _launch(self, target: Any, world_size: int, kwargs: dict[str, Any]) -> GroupResult:
        return run_ranks(
            TargetRef.of(target),
            world_size,
            backend=self.options.backend,
            timeout=self.options.timeout,
            kwargs=kwargs,
        )

    def world(self, ctx: DataRun) -> Outcome:
        ws = ctx.world_size
        if not ctx.run.ranks:
            return Outcome()
        if not ctx.run.ranks[0].facts.resumable:  # read off the loader in the data run: nothing to launch
            return Outcome(verdicts=(not_applicable(RESUME, HOW_TO_ENABLE),))
        if self.options.simulate:
            return Outcome(verdicts=(skipped(RESUME, "resume is checked with real ranks, not --simulate"),))
        if self.options.steps is not None:
            return Outcome(verdicts=(skipped(RESUME, "resume is not checked in --steps windows"),))
        counts = [
            min(len(r.epochs[e].batch_sizes) for r in ctx.run.ranks)
            for e in range(len(ctx.run.ranks[0].epochs))
        ]
        stops = stop_points(counts, self.options.epochs, self.options.elastic)
        epochs = max((s.epoch for s in stops), default=0) + 2
        mechanism = ctx.run.ranks[0].facts.resumable
        kwargs = {
            "spec": self.spec,
            "options": replace(self.record, layout=ctx.layout),  # every rank of a mesh restores
            "stops": stops,
            "epochs": epochs,
            "mechanism": mechanism,
        }
        group = self._launch(resume_rank, ws, kwargs)
        failures = rank_failures(group, RESUME)
        if failures:
            return Outcome(failures=failures)
        ranks = [o.value for o in group.outcomes if isinstance(o.value, RankResume)]
        verdict, rows = judge_resume(ws, ranks)
        plain = ctx.layout is None or not ctx.layout.mesh
        if ranks and ranks[0].mechanism and self.options.elastic and plain:
            self.saved[ws] = (ranks, stops)
            self.pad_unit = max(ctx.run.ranks[0].facts.pad_unit, 1)
            self.mechanism = ranks[0].mechanism
        return Outcome(verdicts=(verdict,), resume=rows)

    def finish(self) -> dict[int, Outcome]:
        if not self.options.elastic or len(self.saved) < 1:
            return {}
        out: dict[int, list[ResumeRow]] = {}
        failures: dict[int, tuple[Any, ...]] = {}
        sizes = sorted(set(self.options.world_sizes))
        for old_ws, (ranks, stops) in sorted(self.saved.items()):
            states = dict(ranks[0].states)
            mechanism = ranks[0].mechanism
            for stop in (s for s in stops if s.elastic):
                for new_ws in sizes:
                    if new_ws == old_ws:
                        continue
                    seen = sum(len(b) for r in ranks for b in r.uninterrupted[stop.epoch][: stop.step])
                    restore = Restore(stop, states.get(stop, b""), seen)
                    group = self._launch(
                        elastic_rank,
                        new_ws,
                        {
                            "spec": self.spec,
                            "options": self.record,
                            "restore": restore,
                            "mechanism": mechanism,
                        },
                    )
                    bad = rank_failures(group, ELASTIC_RESUME)
                    if bad:
                        failures[new_ws] = failures.get(new_ws, ()) + bad
                        continue
                    rests = [o.value for o in group.outcomes]
                    # the new layout pads the rest of the epoch out to whole units on every new rank:
                    # at most new_ws - 1 units of copies (a sample, or a batch where batches are padded)
                    pad_room = _pad_room(ranks, stop) + new_ws * self.pad_unit - 1
                    out.setdefault(new_ws, []).append(judge_elastic(ranks, new_ws, stop, rests, pad_room))
        result = {}
        for ws in set(out) | set(failures):
            rows = tuple(out.get(ws, ()))
            verdicts = (elastic_verdict(rows, self.mechanism),) if rows else ()
            result[ws] = Outcome(verdicts=verdicts, resume=rows, failures=failures.get(ws, ()))
        return result


def _pad_room(ranks: Sequence[RankResume], stop: Stop) -> int:
    """Copies the old layout itself holds in that epoch (its padding)."""
    items = _flat(b for r in ranks for b in r.uninterrupted[stop.epoch])
    return len(items) - len(set(items))
