"""resume and elastic_resume: stop mid-epoch, restart as a restarted job would, compare the streams.

Saving and loading are what trainers do. By default every rank saves its own data state (the loader's
``state_dict``, else its batch sampler's or sampler's) and after a restart rank r loads old rank r's,
when there is one. A loader file says otherwise with ``save_state(loader, rank, world_size)`` (what that
rank writes; ``None`` when it writes nothing, as a rank-0-only saver) and ``load_state(loader, states,
rank, world_size)`` (every old rank's value, ``None`` where one saved nothing); trainers that skip
batches instead say so with ``resume_loader(loader, epoch, step, samples_seen)``. States go through
``torch.save``/``torch.load`` as a checkpoint would.

Rank side (:func:`resume_rank`): build the loader, run the correct loop uninterrupted and save the
state at each stop point; then per stop point re-run the loader file's module code, rebuild the loader
with fresh global RNG, restore, finish the epoch (and, for some stops, run the next). With
``--resume-workers`` the same restores are made into loaders rebuilt with other numbers of DataLoader
workers, in the same process. :func:`restore_rank` restores, in a group of another layout (another
world size or mesh), what every old rank saved, every restore of that layout in one group.

A restore is **exact** (same topology: the stream continues exactly), **resharded** (another topology:
across the old ranks' batches before the stop and the new ranks' after it the epoch is covered once,
repeats only from the new layout's padding), **refused** (the restore raised: an honest answer) or
**failed** (samples silently lost or repeated, named with its mechanism). The judges are pure.
"""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from ddpcheck.checker.loaderfile import (
    LoaderSpec,
    call_by_name,
    get_factory,
    optional_hook,
    unwrap_loader,
)
from ddpcheck.checker.options import mesh_layouts
from ddpcheck.checker.recording import LOAD_HOOK, SAVE_HOOK, group_position, has_state
from ddpcheck.checker.recording import RESUME_HOOK as HOOK
from ddpcheck.checks.ids import ELASTIC_RESUME, RESUME
from ddpcheck.checks.verdict import Verdict, failed, not_applicable, passed, skipped
from ddpcheck.launch import GroupCall, GroupResult, TargetRef, report_progress, run_groups, run_ranks
from ddpcheck.launch.rank import worker_headline
from ddpcheck.layout import Layout
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
State = bytes | None  # what one rank saved (torch.save'd), None when it saved nothing


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


@dataclass(frozen=True)
class Restore:
    """What a rank of another layout starts from: every old rank's saved state (or, for the hook, the
    old counters), stopped at ``stop`` in layout ``old``."""

    old: str  # the old layout's label
    stop: Stop
    states: tuple[State, ...] = ()
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


def _restart(
    spec: LoaderSpec, options: RecordOptions, rank: int, world_size: int, workers: int | None = None
) -> tuple[Any, Any, Any, Any]:
    from ddpcheck.checker.recording import build_loader, read_facts
    from ddpcheck.launch.rank import fresh_random_state

    fresh_random_state()
    if workers is not None:  # the factory takes num_workers (checked before): rebuild with N of them
        options = replace(options, factory_args=(*options.factory_args, ("num_workers", workers)))
    outer, module = build_loader(spec, options, rank, world_size, fresh=True)
    return outer, module, optional_hook(module, "sample_ids"), read_facts(unwrap_loader(outer))


def _hook_args(options: RecordOptions, rank: int, world_size: int) -> dict[str, Any]:
    """What the save_state/load_state hooks may name: the rank, world size and data-parallel position."""
    layout = options.layout or Layout.plain(world_size)
    return {
        "rank": rank,
        "world_size": world_size,
        "dp_rank": layout.dp_rank(rank),
        "dp_world_size": layout.dp_world_size,
    }


def _saved_state(outer: Any, module: Any, mechanism: str, args: dict[str, Any]) -> State:
    """What this rank writes to its checkpoint: the file's ``save_state`` hook, else its state holder's."""
    save = optional_hook(module, SAVE_HOOK)
    if save is not None:
        value = call_by_name(save, {"loader": outer, **args})
        return None if value is None else _save(value)
    return _save(_holder(outer, mechanism).state_dict())


@contextmanager
def _heard() -> Iterator[list[str]]:
    """What is logged (WARNING and above, through any logger that reaches the root: torchtitan logs on
    the root logger itself) or warned meanwhile, one line each: a library's own word on a restore."""
    import logging
    import warnings

    lines: list[str] = []

    class _Heard(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(one_line(record.getMessage(), 300))

    handler = _Heard(logging.WARNING)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield lines
            lines.extend(one_line(str(w.message), 300) for w in caught)
    finally:
        root.removeHandler(handler)


def _finish(*args: Any, **kwargs: Any) -> StopResult:
    """:func:`_finish_once`; a restore that raises stops the DataLoader workers it started first: left
    to the loader's own shutdown, each would be joined for 5 s (torch's status interval) per refusal."""
    import multiprocessing

    before = {child.pid for child in multiprocessing.active_children()}
    try:
        return _finish_once(*args, **kwargs)
    except BaseException:
        for child in multiprocessing.active_children():
            if child.pid not in before:
                child.terminate()
        raise


def _finish_once(
    spec: LoaderSpec,
    options: RecordOptions,
    mechanism: str,
    stop: Stop,
    states: Sequence[State],
    samples_seen: int,
    rank: int,
    world_size: int,
    workers: int | None = None,
    *,
    start_next: bool = False,
    following: bool = True,
) -> StopResult:
    """Rebuild the loader as a restarted process would, restore, finish the epoch (and the next when
    ``stop.next_epoch`` or a boundary and ``following``); ``start_next``: only the next epoch's first
    pass, as a trainer restored at an epoch's end runs it."""
    from ddpcheck.checker.index_log import catch_all
    from ddpcheck.checker.recording import SET_EPOCH_HOOK, loop_set_epoch

    outer, module, hook, facts = _restart(spec, options, rank, world_size, workers)
    epoch_hook = optional_hook(module, SET_EPOCH_HOOK)
    load = optional_hook(module, LOAD_HOOK)
    note = ""
    epoch, step, seen = (stop.epoch + 1, 0, 0) if start_next else (stop.epoch, stop.step, samples_seen)
    if mechanism == "hook":
        loop_set_epoch(outer, epoch, epoch_hook)
        with catch_all() as log:  # the hook may build its own loader and start iterating it at once
            rest_iterable = _call_hook(optional_hook(module, HOOK), outer, epoch, step, seen)
            rest = _ids_of(rest_iterable, hook, facts, options, log)
    else:
        with _heard() as heard:
            if load is not None:
                values = []
                for data in states:
                    value, why = _load(data) if data is not None else (None, "")
                    values.append(value)
                    note = note or why
                args = {"loader": outer, "states": values, **_hook_args(options, rank, world_size)}
                call_by_name(load, args)
            else:  # rank r loads old rank r's state; a rank with no old counterpart starts without one
                own = states[rank] if rank < len(states) else None
                if own is not None:
                    saved, note = _load(own)
                    _holder(outer, mechanism).load_state_dict(saved)
        logged = tuple(dict.fromkeys(heard))
        saved_by = tuple(i for i, data in enumerate(states) if data is not None)
        loop_set_epoch(outer, epoch, epoch_hook)
        rest = _ids_of(outer, hook, facts, options)
    after = None
    finished = not (stop.boundary and rest)  # a boundary with a rest left fails that reading already
    if not start_next and (stop.next_epoch or (stop.boundary and following and finished)):
        loop_set_epoch(outer, stop.epoch + 1, epoch_hook)
        after = _ids_of(outer, hook, facts, options)
    if mechanism == "hook":
        return StopResult(stop, rest, after, error=note)
    return StopResult(stop, rest, after, error=note, saved_by=saved_by, logged=logged)


def _restore(
    finish: Callable[..., StopResult], stop: Stop, expected_next: Batches | None, in_order: bool = True
) -> StopResult:
    """``finish`` (a bound :func:`_finish`) the way the loop resumes. At a boundary, first as a job that
    starts the next epoch at once (``next_pass``), then, unless that was exact against
    ``expected_next`` (None: not known here, a restore in another topology is judged across ranks), as
    a loop that finishes the stopped epoch first (``rest``, ``next_epoch``)."""
    if not stop.boundary:
        return finish()
    starting = finish(start_next=True)
    if expected_next is not None and _first_difference(expected_next, starting.rest, in_order) is None:
        return replace(starting, rest=(), next_epoch=None, next_pass=starting.rest, read_rest=False)
    return replace(finish(following=expected_next is not None), next_pass=starting.rest)


def _call_hook(hook: Any, loader: Any, epoch: int, step: int, samples_seen: int) -> Any:
    return call_by_name(hook, {"loader": loader, "epoch": epoch, "step": step, "samples_seen": samples_seen})


def _workers_of(outer: Any, spec: LoaderSpec, module: Any) -> int:
    """The loader's worker count: its ``num_workers``, else the factory's default for it (a torchdata
    ``nodes`` pipeline keeps its workers inside)."""
    import inspect

    count = getattr(unwrap_loader(outer), "num_workers", None)
    if count is None:
        try:
            param = inspect.signature(get_factory(module, spec)).parameters.get("num_workers")
        except (TypeError, ValueError, AttributeError):
            param = None
        count = param.default if param is not None else 0
    if isinstance(count, bool) or not isinstance(count, int):
        return 0
    return count


def _takes_workers(spec: LoaderSpec, module: Any) -> bool:
    """The factory names ``num_workers`` (or takes ``**kwargs``): its loader can be rebuilt with N."""
    import inspect

    try:
        params = inspect.signature(get_factory(module, spec)).parameters
    except (TypeError, ValueError, AttributeError):
        return False
    named = params.get("num_workers")
    if named is not None:
        return named.kind is not inspect.Parameter.POSITIONAL_ONLY
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def local_stop(stop: Stop, counts: Sequence[int]) -> Stop:
    """Where a rank with ``counts`` batches per epoch is when the job stops at ``stop``: a rank with
    fewer batches than the stop's step has finished its epoch (its own boundary); None counts: as planned."""
    if stop.epoch >= len(counts):
        return stop
    n = counts[stop.epoch]
    step = min(stop.step, n)
    return replace(stop, step=step, boundary=step == n)


def _gather_states(states: dict[Stop, State], stops: Sequence[Stop]) -> dict[Stop, tuple[State, ...]]:
    """Every rank's state at every stop, for a ``load_state`` hook that reads them all."""
    import torch.distributed as dist

    mine = [states.get(stop) for stop in stops]
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return {stop: (state,) for stop, state in zip(stops, mine, strict=True)}
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return {stop: tuple(g[i] for g in gathered) for i, stop in enumerate(stops)}


def resume_rank(
    spec: LoaderSpec,
    options: RecordOptions,
    stops: tuple[Stop, ...],
    epochs: int,
    mechanism: str,
    other_workers: tuple[int, ...] = (),
    counts: tuple[tuple[int, ...], ...] = (),
) -> RankResume:
    """In a rank: the uninterrupted stream with states saved at ``stops``, then each stop resumed (and,
    for the topology stops, resumed into loaders with each of ``other_workers`` workers).

    ``counts``: every rank's batches per epoch in the data run. Where ranks differ, a rank with fewer
    batches than a stop's step stops after its last one (:func:`local_stop`), as in the stopped job.

    ``mechanism`` is what the data run found (``LoaderFacts.resumable``): probing again here could
    start the loader's iterator before its first ``set_epoch``.
    """
    from ddpcheck.checker.recording import SET_EPOCH_HOOK, build_loader, loop_set_epoch, read_facts

    rank, world_size = group_position()
    report_progress("resume: building the loader")
    outer, module = build_loader(spec, options, rank, world_size)
    hook = optional_hook(module, "sample_ids")
    facts = read_facts(unwrap_loader(outer))
    epoch_hook = optional_hook(module, SET_EPOCH_HOOK)
    local = {stop: local_stop(stop, counts[rank] if rank < len(counts) else ()) for stop in stops}
    wanted: dict[tuple[int, int], list[Stop]] = {}
    for stop, here in local.items():
        wanted.setdefault((here.epoch, here.step), []).append(stop)
    states: dict[Stop, State] = {}
    seen: dict[Stop, int] = {}
    uninterrupted = []
    for epoch in range(epochs):
        loop_set_epoch(outer, epoch, epoch_hook)
        batches = []
        for batch_ids in _stream(outer, hook, facts, options):
            batches.append(batch_ids)
            at = wanted.get((epoch, len(batches)), [])
            for stop in at:
                seen[stop] = len(batches)
            if at and mechanism != "hook":
                try:
                    args = _hook_args(options, rank, world_size)
                    state = _saved_state(outer, module, mechanism, args)
                except Exception as exc:  # the loader's resume is broken: a verdict, not a crash
                    failure = f"saving the state failed: {failure_text(exc)}"
                    broken = StopResult(local[at[0]], error=f"restoring failed: {failure}", planned=at[0])
                    return RankResume(rank, mechanism, (), (broken,))
                states.update(dict.fromkeys(at, state))
        uninterrupted.append(tuple(batches))
    reached = [stop for stop in stops if stop in seen]
    everyone = _gather_states(states, stops) if mechanism != "hook" else {}  # every stop: ranks align
    resumed = []
    for stop in reached:
        here = local[stop]
        report_progress(f"resume: restoring at epoch {here.epoch}, step {here.step}")
        samples = sum(len(b) for b in uninterrupted[here.epoch][: here.step]) * world_size
        finish = partial(
            _finish, spec, options, mechanism, here, everyone.get(stop, ()), samples, rank, world_size
        )
        following = stop.epoch + 1
        expected = uninterrupted[following] if following < len(uninterrupted) else ()
        try:
            result = _restore(finish, here, expected, facts.in_order)
        except Exception as exc:
            result = StopResult(here, error=f"restoring failed: {failure_text(exc)}")
        resumed.append(replace(result, planned=stop))
    settable = _takes_workers(spec, module)
    own = _workers_of(outer, spec, module)
    by_workers = []
    for workers in (w for w in other_workers if w != own) if settable else ():  # own count: the resume above
        rests: list[StopResult | str] = []
        for stop in (s for s in reached if s.elastic):
            here = local[stop]
            report_progress(
                f"resume: restoring at epoch {here.epoch}, step {here.step} with {workers} workers"
            )
            samples = sum(len(b) for b in uninterrupted[here.epoch][: here.step]) * world_size
            finish = partial(
                _finish,
                spec,
                options,
                mechanism,
                replace(here, next_epoch=False),
                everyone.get(stop, ()),
                samples,
                rank,
                world_size,
                workers,
            )
            try:
                rests.append(replace(_restore(finish, here, None), planned=stop))
            except Exception as exc:
                rests.append(failure_text(exc))
        by_workers.append((workers, tuple(rests)))
    keep = tuple((s, states.get(s)) for s in reached if s.elastic)
    return RankResume(
        rank,
        mechanism,
        tuple(uninterrupted),
        tuple(resumed),
        keep,
        workers=own,
        in_order=facts.in_order,
        other_workers=tuple(by_workers),
        workers_settable=settable,
    )


def _stream(outer: Any, hook: Any, facts: Any, options: RecordOptions) -> Iterable[tuple[Hashable, ...]]:
    from ddpcheck.checker.recording import batches_with_ids

    by_index = not options.ids_from_data
    for _, ids, _ in batches_with_ids(outer, hook, facts, None, unwrap_loader(outer), by_index=by_index):
        yield tuple(ids)


def restore_rank(
    spec: LoaderSpec, options: RecordOptions, restores: tuple[Restore, ...], mechanism: str
) -> tuple[StopResult | str, ...]:
    """In a rank of a group of another layout: every restore in turn, each from what the old ranks
    saved; the rest of the epoch each yields. A restore that raises is an answer (the loader refuses),
    returned as its one-line message."""
    rank, world_size = group_position()
    out: list[StopResult | str] = []
    for restore in restores:
        stop = replace(restore.stop, next_epoch=False)  # the old ranks' next epoch says nothing here
        report_progress(f"restore from {restore.old}: epoch {stop.epoch}, step {stop.step}")
        finish = partial(
            _finish, spec, options, mechanism, stop, restore.states, restore.samples_seen, rank, world_size
        )
        try:
            out.append(_restore(finish, stop, None))
        except Exception as exc:
            out.append(failure_text(exc))
    return tuple(out)


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
    before: int = 0
    after: int = 0
    finish_first: bool = False  # exact only for a loop that finishes the stopped epoch before the next
    saved_by: tuple[int, ...] | None = None  # the old ranks that saved a state
    logged: dict[int, tuple[str, ...]] = field(default_factory=dict)  # failing rank -> what it logged

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


def _finishes_first(rank: RankResume, result: StopResult) -> bool:
    """A boundary restore is exact for a loop that finishes the stopped epoch (nothing left) first."""
    following = result.stop.epoch + 1
    return (
        not result.rest
        and result.next_epoch is not None
        and following < len(rank.uninterrupted)
        and _first_difference(rank.uninterrupted[following], result.next_epoch, rank.in_order) is None
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


def _cause(rank: RankResume, stop: Stop, got: Batches) -> str:
    flat = _flat(got)
    if stop.boundary:
        finished = rank.uninterrupted[stop.epoch]
        if not flat and _expected_rest(rank, stop):
            return BOUNDARY_EMPTY
        if flat == _flat(finished):
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
            f"{count_text(abs(off), 'batches')} too {'many' if off > 0 else 'few'} "
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


def judge_resume(
    world_size: int, ranks: Sequence[RankResume], mesh: str = ""
) -> tuple[Verdict, tuple[ResumeRow, ...]]:
    """Before + after the stop equals the uninterrupted stream on every rank; the next epoch is unchanged.
    ``mesh``: the layout's label when it is a device mesh (the rows' topology names it)."""
    if not ranks or not ranks[0].mechanism:
        return not_applicable(RESUME, HOW_TO_ENABLE), ()
    mechanism = ranks[0].mechanism
    judgements: dict[Stop, _StopJudgement] = {}
    for rank in ranks:
        for result in rank.resumed:
            planned = result.planned or result.stop  # ranks with fewer batches stop earlier in the epoch
            j = judgements.setdefault(planned, _StopJudgement(planned))
            if result.error.startswith("restoring failed"):
                j.error = j.error or f"rank {rank.rank}: {result.error}"
                continue
            stop = result.stop
            j.before += len(_flat(rank.uninterrupted[stop.epoch][: stop.step]))
            start = stop.step  # where ``expected`` starts in its epoch
            next_changed = False
            if stop.boundary and result.next_pass is not None:
                # a job that starts the next epoch at once (Lightning, HF Trainer) ...
                expected, got, start = _expected_rest(rank, stop), result.next_pass, 0
                differs = _first_difference(expected, got, rank.in_order)
                if differs is not None and result.read_rest and _finishes_first(rank, result):
                    j.finish_first = True  # ... or one that finishes the stopped epoch first
                    expected = got = result.next_epoch or ()
                    differs = None
            else:
                expected = rank.uninterrupted[stop.epoch][stop.step :]
                got = result.rest
                differs = _first_difference(expected, got, rank.in_order)
                if result.next_epoch is not None and stop.epoch + 1 < len(rank.uninterrupted):
                    following = rank.uninterrupted[stop.epoch + 1]
                    next_changed = _first_difference(following, result.next_epoch, rank.in_order) is not None
            j.after += len(_flat(got))
            missing = Counter(_flat(expected)) - Counter(_flat(got))
            extra = Counter(_flat(got)) - Counter(_flat(expected))
            j.saved_by = result.saved_by if j.saved_by is None else j.saved_by
            if differs is not None or next_changed:
                j.ranks.append(rank.rank)
                if result.logged:
                    j.logged[rank.rank] = result.logged
                j.skipped += sum(missing.values())
                j.repeated += sum(extra.values())
                if differs is not None:
                    step = start + differs + 1
                    j.first_divergence = step if j.first_divergence is None else min(j.first_divergence, step)
                    j.cause = j.cause or _cause(rank, result.stop, got)
                else:
                    j.cause = j.cause or "the epoch after the restored one differs from the uninterrupted run"
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
            change=f"{mesh} -> {mesh}" if mesh else "",
            outcome="exact" if j.ok else "failed",
            before=j.before,
            after=j.after,
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
                f"resumed exactly via {via(mechanism)} at {len(judgements)} stop points ({tried}), "
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
        f"stopped at epoch {first.stop.epoch} step {first.stop.step} and resumed via {via(mechanism)}, rank "
        f"{first.ranks[0]} {where}: {count_text(first.skipped, 'samples')} skipped, "
        f"{count_text(first.repeated, 'samples')} repeated"
        + (f" ({len(bad)} of {len(judgements)} stop points fail)" if len(bad) > 1 else "")
    )
    verdict = failed(RESUME, detail, cause=first.cause, ranks=tuple(first.ranks), epochs=(first.stop.epoch,))
    data: dict[str, object] = {}
    if first.logged:  # the library's own word on the restore (torchtitan: "DataLoader state is empty ...")
        data["logged"] = [f"rank {r}: {line}" for r, lines in sorted(first.logged.items()) for line in lines]
    return replace(verdict, fix=TOPOLOGY_FIXES.get(first.cause, ""), data=data), rows


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
    before = _flat(b for r in old_firsts for b in r.uninterrupted[stop.epoch][: stop.step])
    epoch_items = set(_flat(b for r in old_firsts for b in r.uninterrupted[stop.epoch]))
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
        if _first_difference(expected, rests[news[dp]], before.in_order) is not None:
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
    after = _flat(b for rank in layout.representatives() if rank < len(rests) for b in rests[rank])
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


# ----------------------------------------------------------------------------- parent side


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


@dataclass
class _Saved:
    """What one layout's resume group left for restores in other topologies."""

    layout: Layout
    ranks: list[RankResume]
    stops: tuple[Stop, ...]
    pad_unit: int


class ResumeCheck:
    """Parent side of ``resume`` (every layout) and ``elastic_resume`` (other world sizes, meshes and
    worker counts: ``--elastic`` and ``--resume-workers``)."""

    def __init__(self, spec: LoaderSpec, options: CheckOptions) -> None:
        self.spec = spec
        self.options = options
        self.record = options.record_options()
        self.saved: dict[str, _Saved] = {}
        self.layouts: dict[str, Layout] = {}
        self.mechanism = ""  # where the data state lives: the elastic failure's cause depends on it
        self.meshes = mesh_layouts(options)
        self.by_workers: dict[str, Outcome] = {}  # restores with other worker counts, kept for finish()

    @classmethod
    def maybe(cls, spec: LoaderSpec, options: CheckOptions, names: frozenset[str]) -> ResumeCheck | None:
        return cls(spec, options) if options.resume else None

    @property
    def topology_stops(self) -> bool:
        return self.options.elastic or bool(self.options.resume_workers)

    def _launch(self, target: Any, layout: Layout, kwargs: dict[str, Any]) -> GroupResult:
        return run_ranks(
            TargetRef.of(target),
            layout.world_size,
            backend=self.options.backend,
            timeout=self.options.timeout,
            kwargs={**kwargs, "options": replace(self.record, layout=layout)},
        )

    def world(self, ctx: DataRun) -> Outcome:
        layout = ctx.layout or Layout.plain(ctx.world_size)
        self.layouts[layout.label] = layout
        if not ctx.run.ranks:
            return Outcome()
        if not ctx.run.ranks[0].facts.resumable:  # read off the loader in the data run: nothing to launch
            return Outcome(verdicts=(not_applicable(RESUME, HOW_TO_ENABLE),))
        if self.options.simulate:
            return Outcome(verdicts=(skipped(RESUME, "resume is checked with real ranks, not --simulate"),))
        if self.options.steps is not None:
            return Outcome(verdicts=(skipped(RESUME, "resume is not checked in --steps windows"),))
        by_rank = {r.rank: tuple(len(e.batch_sizes) for e in r.epochs) for r in ctx.run.ranks}
        per_rank = tuple(by_rank.get(rank, ()) for rank in range(layout.world_size))
        counts = [
            max(c[e] for c in by_rank.values() if e < len(c)) for e in range(len(ctx.run.ranks[0].epochs))
        ]
        stops = stop_points(counts, self.options.epochs, self.topology_stops)
        epochs = 2  # the stops' epochs and the one after epoch 0 (its middle and its boundary run it)
        mechanism = ctx.run.ranks[0].facts.resumable
        kwargs = {
            "spec": self.spec,
            "stops": stops,
            "epochs": epochs,
            "mechanism": mechanism,
            "other_workers": self.options.resume_workers,
            "counts": per_rank,
        }
        group = self._launch(resume_rank, layout, kwargs)  # every rank of a mesh restores
        failures = rank_failures(group, RESUME)
        if failures:
            return Outcome(failures=failures)
        ranks = [o.value for o in group.outcomes if isinstance(o.value, RankResume)]
        verdict, rows = judge_resume(layout.world_size, ranks, layout.label if layout.mesh else "")
        outcome = Outcome(verdicts=(verdict,), resume=rows)
        if ranks and ranks[0].mechanism:
            self.mechanism = ranks[0].mechanism
            unit = max(ctx.run.ranks[0].facts.pad_unit, 1)
            self.saved[layout.label] = _Saved(layout, ranks, stops, unit)
            if self.options.resume_workers:
                workers = self._worker_outcome(layout, ranks, unit)
                if self.options.elastic and workers.resume:  # one elastic_resume with the other layouts'
                    self.by_workers[layout.label] = workers
                else:
                    outcome += workers
        return outcome

    def _worker_outcome(self, layout: Layout, ranks: list[RankResume], unit: int) -> Outcome:
        """Restores into loaders with other numbers of workers, made in the resume group itself."""
        if not ranks[0].workers_settable:
            name = self.spec.factory
            why = f"{name}() takes no num_workers: name it so its loader can be rebuilt with other counts"
            return Outcome(verdicts=(not_applicable(ELASTIC_RESUME, why),))
        rows: list[ResumeRow] = []
        cause = ""
        saved = _Saved(layout, ranks, (), unit)
        topology_stops = [s for s, _ in ranks[0].states]
        for position, (workers, _) in enumerate(ranks[0].other_workers):
            new = Topology(layout, workers)
            change = change_text(Topology(layout), new, ranks[0].workers)
            for k, stop in enumerate(topology_stops):
                rests = [r.other_workers[position][1][k] for r in ranks]
                room = _pad_room(_firsts(saved), stop) + layout.dp_world_size * unit - 1
                rows.append(judge_restore(layout, ranks, new, stop, rests, room, change=change))
                if rows[-1].outcome == "failed" and not cause:
                    cause = restore_cause(layout, new, ranks, rests, self.mechanism, rows[-1])
        return Outcome(verdicts=(topology_verdict(rows, cause or WORKER_OFFSETS),), resume=tuple(rows))

    def finish(self) -> dict[str, Outcome]:
        """Restores into other layouts (``--elastic``): for each layout one group restores, one after
        another, what every other layout saved; groups of layouts that fit the cores run side by side."""
        if not self.options.elastic or not self.saved:
            return {}
        targets = list(self.layouts.values())
        plans: list[tuple[Layout, list[tuple[_Saved, Stop, Restore]]]] = []
        for new in targets:
            restores = []
            for saved in self.saved.values():
                if saved.layout == new:
                    continue
                for stop in (s for s in saved.stops if s.elastic):
                    states = tuple(dict(r.states).get(stop) for r in saved.ranks)
                    seen = sum(
                        len(b) for r in _firsts(saved) for b in r.uninterrupted[stop.epoch][: stop.step]
                    )
                    restores.append((saved, stop, Restore(saved.layout.label, stop, states, seen)))
            if restores:
                plans.append((new, restores))
        calls = [
            GroupCall(
                TargetRef.of(restore_rank),
                new.world_size,
                backend=self.options.backend,
                timeout=self.options.timeout,
                kwargs={
                    "spec": self.spec,
                    "options": replace(self.record, layout=new),
                    "restores": tuple(r for _, _, r in restores),
                    "mechanism": self.mechanism,
                },
            )
            for new, restores in plans
        ]
        groups = _side_by_side(calls)
        out: dict[str, Outcome] = {}
        for (new, restores), group in zip(plans, groups, strict=True):
            bad = rank_failures(group, ELASTIC_RESUME)
            if bad:
                out[new.label] = Outcome(failures=bad) + self.by_workers.pop(new.label, Outcome())
                continue
            per_rank = [o.value for o in group.outcomes]
            rows = []
            causes = []
            for k, (saved, stop, _) in enumerate(restores):
                rests = [values[k] for values in per_rank]
                room = _pad_room(_firsts(saved), stop) + new.dp_world_size * saved.pad_unit - 1
                change = f"{saved.layout.label} -> {new.label}"
                row = judge_restore(
                    saved.layout, saved.ranks, Topology(new), stop, rests, room, change=change
                )
                rows.append(row)
                if row.outcome == "failed":
                    causes.append(
                        restore_cause(saved.layout, Topology(new), saved.ranks, rests, self.mechanism, row)
                    )
            cause = causes[0] if causes else NOT_ELASTIC.get(self.mechanism, NOT_ELASTIC_STATE)
            workers = self.by_workers.pop(new.label, None)
            if workers is not None:
                first = workers.verdicts[0]
                cause = first.cause if first.status == "fail" else cause
                rows = [*workers.resume, *rows]
            out[new.label] = Outcome(verdicts=(topology_verdict(rows, cause),), resume=tuple(rows))
        for label, workers in self.by_workers.items():  # a layout no other layout's state was restored in
            out[label] = workers
        return out


def _side_by_side(calls: list[GroupCall]) -> list[GroupResult]:
    """Independent groups together where their ranks fit the cores, else one after another."""
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    out: list[GroupResult] = []
    batch: list[GroupCall] = []
    for call in calls:
        if batch and sum(c.world_size for c in batch) + call.world_size > max(cores, 1):
            out += run_groups(batch)
            batch = []
        batch.append(call)
    if batch:
        out += run_groups(batch)
    return out


def _firsts(saved: _Saved) -> list[RankResume]:
    by_rank = {r.rank: r for r in saved.ranks}
    return [by_rank[r] for r in saved.layout.representatives() if r in by_rank]


def _pad_room(ranks: Sequence[RankResume], stop: Stop) -> int:
    """Copies the old layout itself holds in that epoch (its padding)."""
    items = _flat(b for r in ranks for b in r.uninterrupted[stop.epoch])
    return len(items) - len(set(items))
