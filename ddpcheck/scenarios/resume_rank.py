"""The rank side of ``resume`` and ``elastic_resume``: what runs inside a rank.

Saving and loading are what trainers do. By default every rank saves its own data state (the loader's
``state_dict``, else its batch sampler's or sampler's) and after a restart rank r loads old rank r's,
when there is one. A loader file says otherwise with ``save_state(loader, rank, world_size)`` (what that
rank writes; ``None`` when it writes nothing, as a rank-0-only saver) and ``load_state(loader, states,
rank, world_size)`` (every old rank's value, ``None`` where one saved nothing); trainers that skip
batches instead say so with ``resume_loader(loader, epoch, step, samples_seen)``. States go through
``torch.save``/``torch.load`` as a checkpoint would (:class:`~ddpcheck.checker.state.LoaderState`).

Every loader is opened, restarted, read and set to its epochs through the rank side's face
(:func:`~ddpcheck.checker.face.open_loader`, :class:`~ddpcheck.checker.face.OpenedLoader`).
:func:`resume_rank`: build the loader, run the correct loop uninterrupted and save the state at each
stop point; then per stop point re-run the loader file's module code, rebuild the loader with fresh
global RNG, restore, finish the epoch (and, for some stops, run the next). With ``--resume-workers``
the same restores are made into loaders rebuilt with other numbers of DataLoader workers, in the same
process. The middle stop's restored run also saves again 1 (and, with workers, ``num_workers + 1``)
batches later, and each such state is restored once more in a fresh module (resumed twice); the
file's other ``make_*_loader`` factories are resumed the same way. A ``resume_loader`` that names
``state``/``states`` restores in the user's order (ddpcheck loads nothing itself); ``--dcp`` saves and
loads through ``torch.distributed.checkpoint``, every rank together. :func:`restore_rank` restores, in
a group of another layout (another world size or mesh), what every old rank saved, every restore of
that layout in one group. A restore that raises anything but an interrupt is an answer (refused).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from ddpcheck.checker.face import OpenedLoader, open_loader
from ddpcheck.checker.hooks import RESUME_HOOK as HOOK
from ddpcheck.checker.index_log import IndexLog, catch_all
from ddpcheck.checker.loaderfile import call_by_name
from ddpcheck.checker.recipe import LoaderRecipe, group_position
from ddpcheck.checker.state import LoaderState, loaded, user_order
from ddpcheck.checks.resume import local_stop, stop_points
from ddpcheck.checks.resume_common import first_difference
from ddpcheck.launch import report_progress
from ddpcheck.launch.rank import worker_headline
from ddpcheck.messages import exception_text, one_line
from ddpcheck.restores import Batches, ChainResult, RankResume, Restore, State, Stop, StopResult

# ----------------------------------------------------------------------------- what a rank is asked


@dataclass(frozen=True)
class ResumeJob:
    """What a resume group does: where to stop, how many epochs, where the state lives (``mechanism``,
    read in the data run), the worker counts to restore into, every rank's batches per epoch
    (``counts``), the file's other loader factories and, with ``--dcp``, the checkpoint root."""

    stops: tuple[Stop, ...]
    epochs: int
    mechanism: str
    other_workers: tuple[int, ...] = ()
    counts: tuple[tuple[int, ...], ...] = ()
    factories: tuple[str, ...] = ()
    dcp_dir: str = ""
    chains: bool = True


@dataclass(frozen=True)
class Rebuild:
    """How this rank rebuilds its loader as a restarted process would: the recipe (``num_workers`` set:
    with that many DataLoader workers), where the state lives, this rank's place and, with ``--dcp``,
    the checkpoint root ("": states through torch.save/torch.load)."""

    recipe: LoaderRecipe
    mechanism: str
    rank: int
    world_size: int
    dcp_dir: str = ""

    def open(self, *, restarted: bool = False) -> OpenedLoader:
        """The loader opened (``restarted``: as a restarted process opens it), its facts read at once:
        as built, before a state is loaded or an epoch set."""
        opened = open_loader(self.recipe, self.rank, self.world_size, restarted=restarted)
        _as_built = opened.facts
        return opened

    def state(self, opened: OpenedLoader) -> LoaderState:
        return opened.state(self.mechanism, dcp=bool(self.dcp_dir))

    def with_workers(self, workers: int) -> Rebuild:
        return replace(self, recipe=self.recipe.evolve(num_workers=workers))


@dataclass(frozen=True)
class Start:
    """What one restore starts from: where the job stopped and what every old rank saved there."""

    stop: Stop
    states: tuple[State, ...] = ()
    samples_seen: int = 0


@dataclass
class Restored:
    """A rebuilt, restored loader: the loader, what the loop iterates (``iterable``; None: the loader
    itself) and what was said. ``log``: where the DataLoaders a resume hook iterates log (it may build
    its own loader)."""

    opened: OpenedLoader
    iterable: Iterable[Any] | None = None
    log: IndexLog | None = None
    note: str = ""
    logged: tuple[str, ...] = ()
    saved_by: tuple[int, ...] | None = None


# --------------------------------------------------------------- answers, checkpoints, what is said


def answerable(exc: BaseException) -> bool:
    """A restore that raised this is an answer (refused), not a crash: any exception, and a
    ``BaseException`` such as DCP's ``CheckpointException``, but not an interrupt or an exit."""
    return not isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit))


def dcp_path(root: str, *parts: object) -> str:
    """One checkpoint directory under the run's DCP root."""
    import os

    return os.path.join(root, "_".join(str(p) for p in parts))


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


# ----------------------------------------------------------------------------- one restore


def _each_batch(save: Callable[[int], None] | None, count: int) -> None:
    """After each batch a restored loop yields: the live position and, where asked, a state saved."""
    report_progress(f"resume: batch {count}")
    if save is not None:  # e.g. save the state here, as training does, the iterator alive
        save(count)


def _settled(restored: Restored, save: Callable[[int], None] | None = None) -> Batches:
    opened, on_batch = restored.opened, partial(_each_batch, save)
    got = opened.settled(restored.iterable, log=restored.log, on_batch=on_batch)
    return tuple(tuple(ids) for ids in got)


def _call_hook(opened: OpenedLoader, start: Start, states: list[Any] | None) -> Any:
    """``resume_loader`` with what it names: the position, the rank's place and, in the user's
    restore order, this rank's state (old rank r's for rank r) and every old rank's."""
    rank = opened.rank
    args: dict[str, Any] = {
        **opened.place(),
        "loader": opened.outer,
        "epoch": start.stop.epoch,
        "step": start.stop.step,
        "samples_seen": start.samples_seen,
    }
    if states is not None:  # the user's restore order: the hook loads, ddpcheck does not
        args.update(state=states[rank] if rank < len(states) else None, states=states)
    hook = opened.hooks.resume
    if hook is None:
        raise RuntimeError(f"the loader file defines no {HOOK}()")
    return call_by_name(hook, args)


@contextmanager
def _reopen(rb: Rebuild, start: Start) -> Iterator[Restored]:
    """Rebuild, restore from ``start`` and set the epoch, as the restarted job's loop would, in the
    order the file says: ddpcheck's load then ``set_epoch``; or, for ``resume_loader`` (which may name
    ``state``/``states``), ``set_epoch`` then the hook, which returns what the loop iterates. For a hook
    every DataLoader iterated meanwhile logs its indices (it may build its own loader)."""
    opened = rb.open(restarted=True)
    saved_by = tuple(i for i, data in enumerate(start.states) if data is not None)
    in_user_order = user_order(opened.hooks.resume)
    if rb.mechanism == "hook" or in_user_order:
        opened.set_epoch(start.stop.epoch)
        values, note = loaded(start.states) if in_user_order else (None, "")
        with catch_all() as log:
            with _heard() as heard:
                iterable = _call_hook(opened, start, values)
            known = saved_by if values is not None else None
            yield Restored(opened, iterable, log, note, tuple(dict.fromkeys(heard)), known)
        return
    with _heard() as heard:
        note = rb.state(opened).load(start.states)
    opened.set_epoch(start.stop.epoch)
    yield Restored(opened, None, None, note, tuple(dict.fromkeys(heard)), saved_by)


def _finish(
    rb: Rebuild,
    start: Start,
    *,
    start_next: bool = False,
    following: bool = True,
    saves: dict[int, State] | None = None,
) -> StopResult:
    """:func:`_finish_once`; a restore that raises stops the DataLoader workers it started first: left
    to the loader's own shutdown, each would be joined for 5 s (torch's status interval) per refusal.
    ``saves``: batch counts of the rest after which the state is saved again (the chains' first leg,
    taken from this restored run instead of another rebuild), filled in place."""
    with _reaping():
        return _finish_once(rb, start, start_next=start_next, following=following, saves=saves)


@contextmanager
def _reaping() -> Iterator[None]:
    import multiprocessing

    before = {child.pid for child in multiprocessing.active_children()}
    try:
        yield
    except BaseException:
        for child in multiprocessing.active_children():
            if child.pid not in before:
                child.terminate()
        raise


def _finish_once(
    rb: Rebuild, start: Start, *, start_next: bool, following: bool, saves: dict[int, State] | None
) -> StopResult:
    """Rebuild the loader as a restarted process would, restore, finish the epoch (and the next when
    ``stop.next_epoch`` or a boundary and ``following``); ``start_next``: only the next epoch's first
    pass, as a trainer restored at an epoch's end runs it."""
    stop = start.stop
    if start_next:
        start = replace(start, stop=Stop(stop.epoch + 1, 0), samples_seen=0)
    with _reopen(rb, start) as restored:
        save = partial(_save_during, rb, restored, start.stop, saves) if saves else None
        rest = _settled(restored, save)
        after = None
        finished = not (stop.boundary and rest)  # a boundary with a rest left fails that reading already
        if not start_next and (stop.next_epoch or (stop.boundary and following and finished)):
            restored.opened.set_epoch(stop.epoch + 1)
            after = _settled(Restored(restored.opened))
    note, logged = restored.note, restored.logged
    return StopResult(stop, rest, after, error=note, saved_by=restored.saved_by, logged=logged)


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
    if expected_next is not None and first_difference(expected_next, starting.rest, in_order) is None:
        return replace(starting, rest=(), next_epoch=None, next_pass=starting.rest, read_rest=False)
    return replace(finish(following=expected_next is not None), next_pass=starting.rest)


# ----------------------------------------------------------------------------- resumed twice


def chain_lengths(workers: int, step: int, batches: int) -> tuple[int, ...]:
    """How many batches the first restored run trains before the second stop: 1 (a checkpoint right
    after a restore, within ``num_workers`` batches: torchdata PR #1251's window) and, with workers,
    ``workers + 1`` (just past it); each leaves the second stop inside the epoch."""
    lengths = (1, workers + 1) if workers else (1,)
    return tuple(dict.fromkeys(j for j in lengths if step + j < batches))


def _save_during(rb: Rebuild, restored: Restored, stop: Stop, saves: dict[int, State], count: int) -> None:
    if count in saves:
        where = dcp_path(rb.dcp_dir, rb.recipe.factory, "chain", stop.epoch, stop.step, count)
        saves[count] = rb.state(restored.opened).save(where if rb.dcp_dir else "")


def _chain(rb: Rebuild, first: StopResult, later: int, saved: State) -> ChainResult:
    """The second restore of a chain: what the first restored run saved ``later`` batches after the
    stop, gathered from every rank (a collective every rank joins, whatever its first run raised)."""
    start = first.stop
    states = gather_one(saved)
    if first.error.startswith("restoring failed") or (saved is None and not any(states)):
        error = first.error if first.error.startswith("restoring failed") else "nothing was saved"
        return ChainResult(start, later, error=error or "restoring failed")
    second = replace(start, step=start.step + later, next_epoch=True, boundary=False)
    seen = sum(len(b) for b in first.rest[:later]) * rb.world_size
    try:
        result = _finish(rb, Start(second, states, seen))
    except BaseException as exc:
        if not answerable(exc):
            raise
        error = f"restoring failed: {failure_text(exc)}"
        return ChainResult(start, later, first.rest[:later], error=error)
    return ChainResult(start, later, first.rest[:later], result)


def gather_one(state: Any) -> tuple[Any, ...]:
    """Every rank's value (a collective in an initialised group of more than one rank)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return (state,)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, state)
    return tuple(gathered)


def _gather_states(states: dict[Stop, State], stops: Sequence[Stop]) -> dict[Stop, tuple[State, ...]]:
    """Every rank's state at every stop, for a ``load_state`` hook that reads them all."""
    everyone = gather_one(tuple(states.get(stop) for stop in stops))
    return {stop: tuple(g[i] for g in everyone) for i, stop in enumerate(stops)}


# ----------------------------------------------------------------------------- the resume group


@dataclass
class _Pass:
    """The saving pass: the uninterrupted stream, every stop's state and where each stop was reached."""

    uninterrupted: list[Batches] = field(default_factory=list)
    states: dict[Stop, State] = field(default_factory=dict)
    seen: dict[Stop, int] = field(default_factory=dict)
    broken: StopResult | None = None  # saving raised: the loader's resume is broken


def _saving_pass(rb: Rebuild, job: ResumeJob, opened: OpenedLoader, local: dict[Stop, Stop]) -> _Pass:
    """The correct loop, uninterrupted, saving the state wherever a stop falls on this rank."""
    wanted: dict[tuple[int, int], list[Stop]] = {}
    for stop, here in local.items():
        wanted.setdefault((here.epoch, here.step), []).append(stop)
    saves = rb.mechanism != "hook" or user_order(opened.hooks.resume)
    out = _Pass()
    for epoch in range(job.epochs):
        opened.set_epoch(epoch)
        batches: list[tuple[Hashable, ...]] = []
        for _, ids, _ in opened.batches():
            batches.append(tuple(ids))
            for stop in wanted.get((epoch, len(batches)), []):
                out.seen[stop] = len(batches)
                if saves and out.broken is None:
                    out.broken = _save_at(rb, opened, stop, local[stop], out.states)
        out.uninterrupted.append(tuple(batches))
    return out


def _save_at(
    rb: Rebuild, opened: OpenedLoader, stop: Stop, here: Stop, states: dict[Stop, State]
) -> StopResult | None:
    where = dcp_path(rb.dcp_dir, rb.recipe.factory, stop.epoch, stop.step) if rb.dcp_dir else ""
    try:
        states[stop] = rb.state(opened).save(where)
    except Exception as exc:  # the loader's resume is broken: a verdict, not a crash
        failure = f"saving the state failed: {failure_text(exc)}"
        return StopResult(here, error=f"restoring failed: {failure}", planned=stop)
    return None


@dataclass
class _Group:
    """One loader's resume in this rank: how it is rebuilt, the job, the saving pass, where each stop
    falls on this rank (``local``) and every rank's state at every stop (``everyone``)."""

    rb: Rebuild
    job: ResumeJob
    saving: _Pass
    local: dict[Stop, Stop]
    everyone: dict[Stop, tuple[State, ...]]
    in_order: bool = True

    def reached(self) -> list[Stop]:
        return [s for s in self.local if s in self.saving.seen]

    def start(self, stop: Stop) -> Start:
        here = self.local[stop]
        samples = sum(len(b) for b in self.saving.uninterrupted[here.epoch][: here.step])
        return Start(here, self.everyone.get(stop, ()), samples * self.rb.world_size)


def _attempt(finish: Callable[[], StopResult], here: Stop, planned: Stop) -> StopResult:
    try:
        result = finish()
    except BaseException as exc:
        if not answerable(exc):
            raise
        result = StopResult(here, error=f"restoring failed: {failure_text(exc)}")
    return replace(result, planned=planned)


def _chain_plan(group: _Group, workers: int) -> tuple[Stop | None, tuple[int, ...]]:
    """Epoch 0's middle stop (the one that also runs the next epoch) and the chains' lengths there.
    Every rank plans the same chains (their second states are gathered): the lengths follow the
    shortest rank."""
    stop = next((s for s in group.reached() if s.next_epoch and not group.local[s].boundary), None)
    if stop is None or not group.job.chains or (group.rb.mechanism == "hook" and not group.everyone):
        return None, ()
    here = group.local[stop]
    shortest = [c[here.epoch] for c in group.job.counts if len(c) > here.epoch]
    batches = min([len(group.saving.uninterrupted[here.epoch]), *shortest])
    return stop, chain_lengths(workers, here.step, batches)


def _restores(group: _Group, workers: int) -> tuple[list[StopResult], tuple[ChainResult, ...]]:
    """Each reached stop restored in a fresh module, as the restarted job would; the middle stop's
    restored run also saves again for the chains (resumed twice), whose second restores follow."""
    out = []
    uninterrupted = group.saving.uninterrupted
    chain_stop, lengths = _chain_plan(group, workers)
    saves: dict[int, State] = dict.fromkeys(lengths)
    for stop in group.reached():
        start = group.start(stop)
        here = start.stop
        report_progress(f"resume: restoring at epoch {here.epoch}, step {here.step}")
        following = stop.epoch + 1
        expected = uninterrupted[following] if following < len(uninterrupted) else ()
        kept = saves if stop == chain_stop else None
        finish = partial(
            _restore, partial(_finish, group.rb, start, saves=kept), here, expected, group.in_order
        )
        out.append(_attempt(finish, here, stop))
    first = next((r for r in out if r.planned == chain_stop), None)
    chains: list[ChainResult] = []
    for later in lengths:
        if first is None or (chains and not any(gather_one(_broken(group, chains[0])))):
            break  # past the workers' window only to name a failure of the first: cost kept in check
        here = first.stop
        report_progress(f"resume: resumed twice from epoch {here.epoch}, step {here.step}, +{later}")
        chains.append(_chain(group.rb, first, later, saves[later]))
    return out, tuple(chains)


def _broken(group: _Group, chain: ChainResult) -> bool:
    """The chain left the uninterrupted stream on this rank (whether to run the longer chain that
    tells why; the judging is the judge's)."""
    if chain.error or chain.second is None:
        return True
    uninterrupted = group.saving.uninterrupted
    stop = chain.stop
    got = tuple(chain.first) + tuple(chain.second.rest)
    if first_difference(uninterrupted[stop.epoch][stop.step :], got, group.in_order) is not None:
        return True
    following = uninterrupted[stop.epoch + 1] if stop.epoch + 1 < len(uninterrupted) else None
    after = chain.second.next_epoch
    return following is not None and after is not None and first_difference(following, after) is not None


def _by_workers(group: _Group, own: int) -> tuple[tuple[int, tuple[StopResult | str, ...]], ...]:
    """The topology stops restored into loaders rebuilt with each other worker count."""
    out = []
    for workers in (w for w in group.job.other_workers if w != own):  # own count: the resume itself
        rests: list[StopResult | str] = []
        for stop in (s for s in group.reached() if s.elastic):
            start = group.start(stop)
            here = start.stop
            report_progress(
                f"resume: restoring at epoch {here.epoch}, step {here.step} with {workers} workers"
            )
            rb = group.rb.with_workers(workers)
            finish = partial(_finish, rb, replace(start, stop=replace(here, next_epoch=False)))
            try:
                rests.append(replace(_restore(finish, here, None), planned=stop))
            except BaseException as exc:
                if not answerable(exc):
                    raise
                rests.append(failure_text(exc))
        out.append((workers, tuple(rests)))
    return tuple(out)


def resume_rank(recipe: LoaderRecipe, job: ResumeJob) -> RankResume:
    """In a rank: the uninterrupted stream with states saved at ``job.stops``, then each stop resumed
    (and, for the topology stops, resumed into loaders with each of ``job.other_workers`` workers), the
    middle stop resumed twice; then the file's other ``make_*_loader`` factories the same way.

    ``job.counts``: every rank's batches per epoch in the data run. Where ranks differ, a rank with
    fewer batches than a stop's step stops after its last one (:func:`local_stop`), as in the stopped
    job. ``job.mechanism`` is what the data run found (``LoaderFacts.resumable``): probing again here
    could start the loader's iterator before its first ``set_epoch``.
    """
    main = _resume_one(recipe, job)
    others = (recipe.evolve(spec=replace(recipe.spec, factory=name)) for name in job.factories)
    return replace(main, extra=tuple(_resume_other(other, job) for other in others))


def _resume_one(recipe: LoaderRecipe, job: ResumeJob, factory: str = "") -> RankResume:
    rank, world_size = group_position()
    report_progress("resume: building the loader")
    rb = Rebuild(recipe, job.mechanism, rank, world_size, dcp_dir=job.dcp_dir)
    opened = rb.open()
    counts = job.counts[rank] if rank < len(job.counts) else ()
    local = {stop: local_stop(stop, counts) for stop in job.stops}
    saving = _saving_pass(rb, job, opened, local)
    if saving.broken is not None:
        return RankResume(rank, job.mechanism, (), (saving.broken,), factory=factory)
    saves = job.mechanism != "hook" or user_order(opened.hooks.resume)
    everyone = _gather_states(saving.states, job.stops) if saves else {}  # every stop: ranks align
    group = _Group(rb, job, saving, local, everyone, opened.facts.in_order)
    own = opened.workers
    resumed, chains = _restores(group, own)
    settable = opened.call.takes("num_workers")  # its loader can be rebuilt with N workers
    by_workers = _by_workers(group, own) if settable else ()
    return RankResume(
        rank,
        job.mechanism,
        tuple(saving.uninterrupted),
        tuple(resumed),
        tuple((s, saving.states.get(s)) for s in group.reached() if s.elastic),
        workers=own,
        in_order=group.in_order,
        other_workers=by_workers,
        workers_settable=settable,
        chains=chains,
        factory=factory,
    )


def _resume_other(recipe: LoaderRecipe, job: ResumeJob) -> RankResume:
    """Another factory of the file (``make_valid_loader``...): its own stops, from its own lengths (a
    first pass, every rank's counts gathered), restored through the same hooks."""
    rank, world_size = group_position()
    factory = recipe.factory
    try:
        opened = Rebuild(recipe, "", rank, world_size).open()
        mechanism = opened.resume_mechanism()
        mine = []
        for epoch in range(job.epochs):
            opened.set_epoch(epoch)
            mine.append(sum(1 for _ in opened.batches()))
    except Exception as exc:
        error = f"restoring failed: {failure_text(exc)}"
        gather_one(None)  # the others gather too: they see this rank's None and stop with it
        return RankResume(rank, "", (), (StopResult(Stop(0, 0), error=error),), factory=factory)
    everyone = gather_one(tuple(mine))  # type: ignore[arg-type]
    if not mechanism or any(c is None for c in everyone):
        return RankResume(rank, mechanism, factory=factory)
    counts = tuple(tuple(c) for c in everyone)  # type: ignore[union-attr]
    largest = [max(c[e] for c in counts if e < len(c)) for e in range(job.epochs)]
    stops = stop_points(largest, job.epochs, elastic=False)
    other = replace(job, stops=stops, mechanism=mechanism, counts=counts, other_workers=())
    return _resume_one(recipe, other, factory=factory)


def restore_rank(
    recipe: LoaderRecipe, restores: tuple[Restore, ...], mechanism: str, dcp_dir: str = ""
) -> tuple[StopResult | str, ...]:
    """In a rank of a group of another layout: every restore in turn, each from what the old ranks
    saved; the rest of the epoch each yields. A restore that raises is an answer (the loader refuses),
    returned as its one-line message."""
    rank, world_size = group_position()
    rb = Rebuild(recipe, mechanism, rank, world_size, dcp_dir=dcp_dir)
    out: list[StopResult | str] = []
    for restore in restores:
        stop = replace(restore.stop, next_epoch=False)  # the old ranks' next epoch says nothing here
        report_progress(f"restore from {restore.old}: epoch {stop.epoch}, step {stop.step}")
        finish = partial(_finish, rb, Start(stop, restore.states, restore.samples_seen))
        try:
            out.append(_restore(finish, stop, None))
        except BaseException as exc:
            if not answerable(exc):
                raise
            out.append(failure_text(exc))
    return tuple(out)


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
