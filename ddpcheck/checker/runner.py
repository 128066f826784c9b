"""Orchestration: loader file + options -> runs at each world size -> traces -> verdicts -> CheckResult.

This is the one place that knows the whole data path. It launches (through ``ddpcheck.launch``),
turns rank outcomes into traces, hands traces to the pure checks, and never renders anything.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from ddpcheck.checker.loaderfile import BadLoaderFile, LoaderSpec, defined_names, precheck
from ddpcheck.checker.options import BadInput, CheckOptions, validate
from ddpcheck.checker.recording import MIXED_IDS, RankRecording, record_rank
from ddpcheck.checks import run_checks
from ddpcheck.checks.verdict import Verdict, allow
from ddpcheck.figures import FigureData, figure_data
from ddpcheck.launch import GroupCall, GroupResult, StartedGroups, TargetRef, started_groups
from ddpcheck.launch.preload import frozen_heap, preload_imports
from ddpcheck.result import CheckResult, WorldResult
from ddpcheck.scenarios import Outcome, Scenario
from ddpcheck.scenarios import build as build_scenarios
from ddpcheck.scenarios.protocol import Context as ScenarioContext
from ddpcheck.trace import RankFailure, RunTrace

Progress = Callable[[str], None]


class Interrupted(Exception):
    """Ctrl-C or SIGTERM during a run; ``partial`` holds every world size that finished."""

    def __init__(self, partial: CheckResult) -> None:
        super().__init__("interrupted")
        self.partial = partial


def check_loader(
    path: str, options: CheckOptions | None = None, *, progress: Progress | None = None
) -> CheckResult:
    """Run the loader file under every world size and judge it. Raises BadInput / BadLoaderFile (exit 2)."""
    options = options or CheckOptions()
    say = progress or (lambda _msg: None)
    validate(options)
    spec = LoaderSpec(path=str(path), factory=options.factory)
    try:
        precheck(spec)
    except BadLoaderFile as exc:
        raise BadInput(str(exc)) from None
    world_sizes = tuple(sorted(set(options.world_sizes)))
    runs: list[WorldResult] = []
    notes: list[str] = []
    reference: RunTrace | None = None

    def result() -> CheckResult:
        return CheckResult(
            loader=str(path),
            runs=tuple(runs),
            id_source=reference.id_source if reference else "index",
            epochs=options.epochs,
            options=_jsonable_options(options),
            notes=tuple(notes),
        )

    heap = contextlib.ExitStack()
    try:
        heap.enter_context(frozen_heap())  # what is loaded now stays out of the preload's collections
        if options.preload and (options.simulate or options.backend != "nccl"):  # nccl ranks are spawned
            loaded = preload_imports(str(path), deadline_s=options.timeout)
            if loaded.imported:
                say(f"imported {', '.join(loaded.imported)} once ({loaded.seconds:.1f}s); ranks inherit them")
            notes.extend(loaded.notes())
        heap.enter_context(frozen_heap())  # and what it imported, from the first fork on
        say(f"reference run (1 process) of {path}")
        # The reference is always the correct loop (set_epoch called); with --no-set-epoch only the
        # runs skip it, so reshuffle fails exactly when the order depends on that call.
        reruns: dict[int, RunTrace] = {}  # determinism reruns already recorded beside another run
        if options.determinism and options.set_epoch and 1 in world_sizes and not options.simulate:
            # world size 1's run is the reference itself; its rerun uses the second core meanwhile
            # (simulated ones take every core: world size 1 reruns after it, and not if it failed)
            reference, reruns[1] = _runs(spec, [(replace(options, set_epoch=True), 1, ())] * 2)
        else:
            reference = _run(spec, replace(options, set_epoch=True), 1)
        _raise_if_bad_input(reference)
        notes.extend(_notes(reference, world_sizes))
        scenarios = build_scenarios(spec, options, defined_names(spec.path))
        for ws in world_sizes:
            runs.append(
                _check_world(spec, options, reference, ws, say, scenarios, reruns.pop(ws, None), notes)
            )
        for scenario in scenarios:  # what spans world sizes (elastic resume)
            for ws, outcome in scenario.finish().items():
                runs[:] = [
                    _with_outcome(r, outcome, options.allow) if r.world_size == ws else r for r in runs
                ]
    except KeyboardInterrupt:
        notes.append("interrupted: world sizes after the last one shown were not checked")
        raise Interrupted(replace(result(), interrupted=True)) from None
    finally:
        heap.close()
    return result()


def _check_world(
    spec: LoaderSpec,
    options: CheckOptions,
    reference: RunTrace,
    ws: int,
    say: Progress,
    scenarios: Sequence[Scenario] = (),
    rerun: RunTrace | None = None,
    notes: list[str] | None = None,
) -> WorldResult:
    started = time.monotonic()
    skip = _skip_reason(options, ws)
    if skip:
        say(f"world size {ws}: skipped ({skip})")
        return WorldResult(ws, options.backend, skipped=skip)
    say(f"world size {ws}: running {ws} {'simulated ' if options.simulate else ''}ranks")
    # The run, (for --steps windows) the reference window and the determinism rerun are forked
    # together and recorded side by side where their ranks fit the cores; otherwise the rerun's ranks
    # wait and then record while this process draws the run's figures.
    jobs: list[_Job] = []
    windowed = options.steps is not None and ws > 1
    if options.steps is not None and ws > 1:
        # windows: the reference runs the same global number of samples as the W ranks together
        say(f"world size {ws}: reference window of {options.steps * ws} steps (1 process)")
        jobs.append((replace(options, set_epoch=True, steps=options.steps * ws), 1, ()))
    if not (ws == 1 and options.set_epoch):
        jobs.append((options, ws, ()))
    rerun_job: _Job | None = None
    if options.determinism and rerun is None:
        rerun_job = (options, ws, rerun_sample(ws) if options.simulate else ())
    with _recording(spec, jobs, rerun_job) as recording:
        traces = recording.jobs()
        if windowed:
            reference = traces.pop(0)
        run = reference if ws == 1 and options.set_epoch else traces.pop(0)
        local = _rank_local_indices(reference, run)
        if local or _identified_apart(reference, run):
            # Indices cannot be compared: each rank indexes its own dataset from 0 (datasets'
            # split_dataset_by_node), or some rank saw no indices at all (batches formed outside a
            # torch iterator there). The batches' data can; for local indices only an id field will
            # do (without one the checks say why).
            by_data = replace(options, ids_from_data=True)
            alt_reference, alt_run = _runs(
                spec, [(replace(by_data, set_epoch=True), 1, ()), (by_data, ws, ())]
            )
            usable = alt_run.id_source.startswith("field:") if local else True
            if not local and _hashes_collide(reference, alt_reference):
                raise BadInput(
                    f"at world size {ws} some rank sees no dataset indices, and the samples cannot be told "
                    "apart by their content (equal samples): give the batches an id field or define "
                    "sample_ids(batch)"
                )
            if alt_run.ok and alt_reference.ok and alt_run.id_source == alt_reference.id_source and usable:
                why = "rank-local indices" if local else "indices not seen on every rank"
                said = f"world size {ws}: {why}; samples identified by {_describe_source(alt_run.id_source)}"
                say(said)
                if notes is not None:
                    notes.append(said)
                reference, run, options = alt_reference, alt_run, by_data
                rerun_job = (by_data, ws, ()) if options.determinism else None
        if not (options.determinism and run.ok):
            rerun, rerun_job = None, None  # a failed run is judged alone: its rerun would only repeat it
        final_reference, final_run = reference, run

        def draw() -> FigureData:
            return figure_data(final_reference, final_run)

        if rerun_job is None:
            figures = draw()
        elif rerun_job is recording.held:
            rerun, figures = recording.held_run(draw)
        else:
            rerun, figures = _while_recording(spec, rerun_job, draw)
    # the run's note; the rerun's only when it had to be redone (its sample says nothing more)
    note = _shortcut_note(run) or (_shortcut_note(rerun) if rerun is not None else "")
    if note and notes is not None and note not in notes:
        notes.append(note)
    verdicts = run_checks(reference, run, rerun)
    failures = run.failures + (rerun.failures if rerun else ())
    # --- checks with their own rank-side runs (ddpcheck.scenarios): metric, training, resume ---
    extra = Outcome()
    for scenario in scenarios if run.ok else ():
        extra += scenario.world(ScenarioContext(ws, run, reference))
    verdicts += extra.verdicts
    failures += extra.failures
    verdicts = _allowed(verdicts, options.allow)
    result = WorldResult(
        world_size=ws,
        backend=run.backend,
        verdicts=tuple(verdicts),
        failures=failures,
        divergence=extra.divergence,
        resume=extra.resume,
        seconds=time.monotonic() - started,
        figures=figures,
    )
    failed = sum(v.failed for v in verdicts)
    status = "ok" if result.ok else f"{failed} checks failed, {len(result.failures)} rank failures"
    say(f"world size {ws}: {status} ({result.seconds:.2f}s)")
    return result


def _hashes_collide(by_index: RunTrace, by_data: RunTrace) -> bool:
    """Content hashes that make distinct indices look like one sample: identifying by data would call
    equal samples duplicates (a false overlap), so it is no identification at all."""
    if by_data.id_source != "content-hash" or by_index.id_source != "index":
        return False
    if not (by_index.ok and by_data.ok and by_index.ranks and by_data.ranks):
        return False
    indexed, hashed = by_index.ranks[0].epochs[0].ids, by_data.ranks[0].epochs[0].ids
    return len(set(hashed)) < len(set(indexed))


def _identified_apart(reference: RunTrace, run: RunTrace) -> bool:
    """The run's samples were identified another way than the reference's, or its ranks disagree."""
    return run.ok and reference.ok and run.id_source != reference.id_source


def _describe_source(source: str) -> str:
    if source.startswith("field:"):
        return f"the batches' {source}"
    return "a content hash of each sample" if source == "content-hash" else source


def _rank_local_indices(reference: RunTrace, run: RunTrace) -> bool:
    """Index identity, and some rank's map-style dataset has another length than the single process's."""
    if not (run.ok and reference.ok and reference.ranks and run.id_source == "index"):
        return False
    facts = reference.ranks[0].facts
    if facts.dataset_kind != "map" or facts.dataset_len is None:
        return False
    return any(r.facts.dataset_len not in (None, facts.dataset_len) for r in run.ranks)


def _allowed(verdicts: Sequence[Verdict], allowed: Sequence[str]) -> list[Verdict]:
    """``--allow CHECK``: that check's failure is reported as ``allowed``."""
    return [allow(v) if v.check in allowed else v for v in verdicts]


def _with_outcome(result: WorldResult, outcome: Outcome, allowed: Sequence[str]) -> WorldResult:
    return replace(
        result,
        verdicts=result.verdicts + tuple(_allowed(outcome.verdicts, allowed)),
        failures=result.failures + outcome.failures,
        divergence=result.divergence + outcome.divergence,
        resume=result.resume + outcome.resume,
    )


def _skip_reason(options: CheckOptions, world_size: int) -> str:
    if options.backend == "nccl" and not options.simulate:
        import torch

        found = torch.cuda.device_count()
        if found < world_size:
            return f"NCCL world size {world_size} needs {world_size} GPUs, found {found}"
    return ""


_Job = tuple[CheckOptions, int, tuple[int, ...]]  # options, world size, only these ranks (() = all)
RERUN_SAMPLE_FROM = 128  # simulated worlds from this size on rerun a sample of ranks for determinism
RERUN_SAMPLE_EDGE = 8  # the first and the last ranks sampled
RERUN_SAMPLE_SPREAD = 16  # evenly spaced ranks sampled between them


def rerun_sample(world_size: int) -> tuple[int, ...]:
    """The ranks a simulated determinism rerun records (() = all): a full rerun of a huge simulated world
    doubles its cost, and a seed that varies between runs shows on any rank. The edges are where
    padding and uneven shares live; the spread covers the middle."""
    if world_size < RERUN_SAMPLE_FROM:
        return ()
    edge = set(range(RERUN_SAMPLE_EDGE)) | set(range(world_size - RERUN_SAMPLE_EDGE, world_size))
    step = world_size / (RERUN_SAMPLE_SPREAD + 1)
    spread = {round(step * (i + 1)) for i in range(RERUN_SAMPLE_SPREAD)}
    return tuple(sorted(edge | spread))


def _run(spec: LoaderSpec, options: CheckOptions, world_size: int) -> RunTrace:
    return _runs(spec, [(options, world_size, ())])[0]


def _runs(spec: LoaderSpec, jobs: Sequence[_Job]) -> list[RunTrace]:
    """Record each job: side by side where their ranks fit the cores, else one by one (see
    :class:`_Recording`). Only the first job reports live progress."""
    with _recording(spec, jobs, None) as recording:
        return recording.jobs()


T = TypeVar("T")


class _Recording:
    """One world size's recordings. Real ranks of every job, and of the held determinism rerun, are
    forked up front (so no rank inherits the traces that arrive later); they are then let go side by
    side where they fit the cores, else the jobs one by one and the rerun only when asked, while this
    process draws the run's figures. Simulated ranks take every core: they run one job at a time."""

    def __init__(
        self, spec: LoaderSpec, jobs: Sequence[_Job], held: _Job | None, started: StartedGroups | None
    ) -> None:
        self.spec, self._jobs, self.held, self._started = spec, list(jobs), held, started
        self._held_group: GroupResult | None = None  # the held rerun, when it ran beside the jobs

    def jobs(self) -> list[RunTrace]:
        if self._started is None:  # simulated: one job at a time, each over every core
            return [_simulate(self.spec, options, ws, ranks) for options, ws, ranks in self._jobs]
        indices = list(range(len(self._jobs)))
        if self._jobs and self.held is not None and _fits_cores([*self._jobs, self.held]):
            *groups, self._held_group = self._started.collect(*indices, len(self._jobs))
        elif _fits_cores(self._jobs):
            groups = self._started.collect(*indices)
        else:
            groups = [self._started.collect(i)[0] for i in indices]
        return [
            to_run_trace(g, set_epoch=opts.set_epoch)
            for g, (opts, _, _) in zip(groups, self._jobs, strict=True)
        ]

    def held_run(self, work: Callable[[], T]) -> tuple[RunTrace, T]:
        """Let the held rerun go (unless it already ran), do ``work`` meanwhile (no forking in it), then
        collect the rerun."""
        assert self.held is not None and self._started is not None
        index = len(self._jobs)
        if self._held_group is None:
            self._started.open(index)
        done = work()
        group = self._held_group or self._started.collect(index)[0]
        return to_run_trace(group, set_epoch=self.held[0].set_epoch), done


@contextlib.contextmanager
def _recording(spec: LoaderSpec, jobs: Sequence[_Job], rerun: _Job | None) -> Iterator[_Recording]:
    simulated = (jobs[0] if jobs else rerun or (CheckOptions(), 0, ()))[0].simulate
    if simulated or not (jobs or rerun):
        yield _Recording(spec, jobs, None, None)
        return
    held = rerun
    calls = [_group_call(spec, job, progress=i == 0) for i, job in enumerate(jobs)]
    if held is not None:
        calls.append(_group_call(spec, held, progress=True))  # it runs alone, after the jobs
    with started_groups(calls, hold=True) as started:
        yield _Recording(spec, jobs, held, started)


def _while_recording(spec: LoaderSpec, job: _Job, work: Callable[[], T]) -> tuple[RunTrace, T]:
    """Record ``job`` while this process does ``work`` (which must not fork): real ranks run meanwhile
    on the other cores; simulated ranks, which take every core, run after it."""
    options, world_size, ranks = job
    if options.simulate:
        done = work()
        return _simulate(spec, options, world_size, ranks), done
    with _recording(spec, [], job) as recording:
        return recording.held_run(work)


def _group_call(spec: LoaderSpec, job: _Job, *, progress: bool) -> GroupCall:
    options, world_size, _ = job
    return GroupCall(
        TargetRef.of(record_rank),
        world_size,
        backend=options.backend,
        timeout=options.timeout,
        kwargs={"spec": spec, "options": options.record_options()},
        on_progress=options.on_progress if progress else None,
    )


def _fits_cores(jobs: Sequence[_Job]) -> bool:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return sum(world_size for _, world_size, _ in jobs) <= max(cores, 1)


def _simulate(spec: LoaderSpec, options: CheckOptions, world_size: int, ranks: tuple[int, ...]) -> RunTrace:
    from ddpcheck.launch.simulate import SHORTCUTS_FROM, NeedsCollectives, simulate_ranks

    kwargs = {"spec": spec, "options": options.record_options()}
    try:
        group = simulate_ranks(
            record_rank, world_size, kwargs=kwargs, timeout=options.timeout, ranks=ranks or None,
            shortcuts=world_size >= SHORTCUTS_FROM,
        )  # fmt: skip
        mismatch = group.shortcuts.get("mismatch")
        if mismatch:  # the recognised sampler's shortcut was wrong: nothing of that run can be trusted
            group = simulate_ranks(
                record_rank, world_size, kwargs=kwargs, timeout=options.timeout, ranks=ranks or None,
                shortcuts=False,
            )  # fmt: skip
            group.shortcuts = {"redone": mismatch}
    except NeedsCollectives as exc:
        raise BadInput(str(exc)) from None
    trace = to_run_trace(group, set_epoch=options.set_epoch)
    return replace(trace, rank_sample=ranks, options={**trace.options, "shortcuts": group.shortcuts})


def _shortcut_note(trace: RunTrace) -> str:
    """What the report says about a recognised sampler computed directly under --simulate."""
    done = trace.options.get("shortcuts") or {}
    if done.get("redone"):
        return (
            f"world size {trace.world_size}: the direct computation of DistributedSampler differed from the "
            f"real one ({done['redone']}); every simulated rank was run again through the real sampler"
        )
    if done.get("direct"):
        return (
            f"world size {trace.world_size}: --simulate computed torch's DistributedSampler shares directly "
            f"for {done['direct']} rank-epochs, and ran the real DistributedSampler.__iter__ on "
            f"{done['verified']} of them: identical"
        )
    return ""


def to_run_trace(group: GroupResult, *, set_epoch: bool = True) -> RunTrace:
    """Rank outcomes -> a RunTrace (plain data); failed ranks become RankFailures."""
    recordings = [o.value for o in group.outcomes if o.ok and isinstance(o.value, RankRecording)]
    failures = tuple(
        RankFailure(
            rank=o.rank,
            kind=o.kind,
            message=o.message,
            stack=o.error or o.stack,
            progress=o.progress,
        )
        for o in sorted(group.outcomes, key=lambda o: (o.kind == "secondary", o.rank))
        if not o.ok
    )
    if group.diagnosis and failures:
        first = failures[0]
        failures = (replace(first, message=f"{first.message}\n{group.diagnosis}"), *failures[1:])
    bad = [o for o in group.outcomes if o.exc_type == "BadLoaderFile"]
    return RunTrace(
        world_size=group.world_size,
        backend=group.backend,
        ranks=tuple(r.trace for r in recordings),
        id_source=_common_source(recordings),
        set_epoch=set_epoch,
        failures=failures,
        options={"bad_input": bad[0].message} if bad and len(bad) == len(group.outcomes) else {},
    )


def _common_source(recordings: Sequence[RankRecording]) -> str:
    """How the ranks identified samples: their one way, or ``mixed`` where they differ."""
    sources = {r.id_source for r in recordings}
    if not sources:
        return "index"
    return sources.pop() if len(sources) == 1 else MIXED_IDS


def _raise_if_bad_input(reference: RunTrace) -> None:
    """A reference run that fails on bad input (import error, no factory, ...) is exit 2, not a crash."""
    bad = reference.options.get("bad_input")
    if bad:
        raise BadInput(bad)
    if reference.ok and reference.ranks:
        epochs = reference.ranks[0].epochs
        if epochs and all(len(e.ids) == 0 for e in epochs):
            length = reference.ranks[0].facts.dataset_len
            raise BadInput(
                "the loader yields no samples"
                + (" (its dataset has length 0)" if length == 0 else "")
                + ": nothing to check"
            )


def _notes(reference: RunTrace, world_sizes: tuple[int, ...]) -> list[str]:
    notes = []
    if reference.id_source == "content-hash":
        notes.append(
            "samples are identified by a content hash (no sample_ids hook, no id/idx/index field): "
            "equal samples look duplicated"
        )
    if reference.ok and reference.ranks and reference.ranks[0].epochs:
        n = len(reference.ranks[0].epochs[0].ids)
        big = [ws for ws in world_sizes if ws > n]
        if big:
            notes.append(
                f"world sizes {', '.join(map(str, big))} exceed the {n} samples of an epoch: "
                "some ranks can only see padding (allowed, but every such rank repeats samples)"
            )
    return notes


def _jsonable_options(options: CheckOptions) -> dict[str, Any]:
    out = {k: v for k, v in options.__dict__.items() if k not in ("extra", "factory_args", "on_progress")}
    out["world_sizes"] = list(options.world_sizes)
    if options.factory_args:
        out["factory_args"] = dict(options.factory_args)
    out.update(options.extra)
    return out
