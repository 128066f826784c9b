"""Carrying a plan out: the reference, then each layout's recordings, checks and scenarios.

The one place that knows the whole data path: it records (through :mod:`ddpcheck.session.record`),
runs the scenarios, hands what came back to the judge (:mod:`ddpcheck.checks.judge`) and wraps its
verdicts; it never decides a verdict and never renders anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ddpcheck.checker.identity import OBJECT_ITEMS
from ddpcheck.checker.loaderfile import BadLoaderFile, LoaderSpec, defined_names, precheck
from ddpcheck.checks.judge import Launch, LoaderRecord, Rules, judge, judge_finished
from ddpcheck.checks.replicas import data_parallel_view
from ddpcheck.evidence import ReplicaGroups
from ddpcheck.figures import FigureData, ReplicaGroup, figure_data
from ddpcheck.launch import ProgressCallback, shared_tmp
from ddpcheck.launch.preload import frozen_heap, preload_imports
from ddpcheck.layout import Layout, LayoutError, check_ranks
from ddpcheck.messages import count_text
from ddpcheck.options import BadInput, CheckOptions
from ddpcheck.result import CheckResult, RunRecord, WorldResult
from ddpcheck.scenarios import DataRun, Outcome, Scenario
from ddpcheck.scenarios import build as build_scenarios
from ddpcheck.session.plan import LayoutPlan, RunPlan, plan_run
from ddpcheck.session.record import Job, record, recording, shortcut_note
from ddpcheck.trace import RunTrace
from ddpcheck.verdict import REPLICA_CONSISTENCY, Verdict

Progress = Callable[[str], None]


class Interrupted(Exception):
    """Ctrl-C or SIGTERM during a run; ``partial`` holds every layout that finished."""

    def __init__(self, partial: CheckResult) -> None:
        super().__init__("interrupted")
        self.partial = partial


def check_loader(
    path: str,
    options: CheckOptions | None = None,
    *,
    progress: Progress | None = None,
    on_progress: ProgressCallback | None = None,
) -> CheckResult:
    """Run the loader file in every planned layout and judge it. Raises BadInput (exit 2).

    ``progress`` hears the run's messages; ``on_progress`` every rank's position while a group runs (the
    live display's callback: not an option of the run, never reported)."""
    options = options or CheckOptions()  # checked when made
    if not options.simulate:  # the one limit on real ranks, as the command line and the marker apply it
        try:
            for layout in (*options.layouts, *(Layout.plain(ws) for ws in options.world_sizes)):
                check_ranks(layout.world_size, mesh=bool(layout.mesh))
        except LayoutError as exc:
            raise BadInput(str(exc)) from None
    spec = LoaderSpec(path=str(path), factory=options.factory)
    try:
        precheck(spec)
    except BadLoaderFile as exc:
        raise BadInput(str(exc)) from None
    session = _Session(spec, options, progress or (lambda _msg: None), on_progress)
    try:
        with shared_tmp(), frozen_heap():  # what is loaded now stays out of the preload's collections
            session.preload()
            with frozen_heap():  # and what it imported, from the first fork on
                session.carry_out(plan_run(options))
    except KeyboardInterrupt:
        session.notes.append("interrupted: world sizes after the last one shown were not checked")
        raise Interrupted(session.result(interrupted=True)) from None
    return session.result()


@dataclass
class _Judged:
    """One layout's recordings, ready to judge: the reference and run it compares (both redone by data
    when indices could not identify samples), the determinism rerun, the figures, a note."""

    reference: RunTrace
    run: RunTrace
    rerun: RunTrace | None
    figures: FigureData
    notes: tuple[str, ...] = ()


class _Session:
    """One run's state: what finished so far (the result of an interrupted run is built from it)."""

    def __init__(
        self, spec: LoaderSpec, options: CheckOptions, say: Progress, on_progress: ProgressCallback | None
    ) -> None:
        self.spec, self.options, self.say, self.on_progress = spec, options, say, on_progress
        self.runs: list[WorldResult] = []
        self.notes: list[str] = []
        self.reference: RunTrace | None = None
        self.single = Layout.plain(1)  # the reference's layout
        self.alone = False  # the loader names shared memory machine-wide: no two of its groups overlap

    def result(self, *, interrupted: bool = False) -> CheckResult:
        return CheckResult(
            loader=self.spec.path,
            runs=tuple(self.runs),
            id_source=self.reference.id_source if self.reference else "index",
            epochs=self.options.epochs,
            options=RunRecord(self.options),
            notes=tuple(self.notes),
            interrupted=interrupted,
        )

    def preload(self) -> None:
        options = self.options
        if options.preload and (options.simulate or options.backend != "nccl"):  # nccl ranks are spawned
            loaded = preload_imports(self.spec.path, deadline_s=options.timeout)
            if loaded.imported:
                self.say(
                    f"imported {', '.join(loaded.imported)} once ({loaded.seconds:.1f}s); ranks inherit them"
                )
            self.notes.extend(loaded.notes())

    def carry_out(self, plan: RunPlan) -> None:
        self.say(f"reference run (1 process) of {self.spec.path}")
        rerun: RunTrace | None = None
        if plan.reference_rerun:  # world size 1's rerun records on the second core meanwhile
            quiet = replace(
                plan.reference, options=replace(plan.reference.options, work=False, mixture=False)
            )
            both = record(self.spec, [plan.reference, quiet], on_progress=self.on_progress, on_note=self.say)
            self.reference, rerun = both  # the rerun measures no work
            self.alone = self.reference.named_memory or rerun.named_memory
        else:
            self.reference = record(
                self.spec, [plan.reference], on_progress=self.on_progress, on_note=self.say
            )[0]
            self.alone = self.reference.named_memory
        raise_if_bad_input(self.reference)
        if self.reference.failures:  # nothing can be judged without it: stop here, its ranks reported
            self.runs.append(reference_failed(self.reference, plan.reference.layout))
            self.notes.append(NO_REFERENCE)
            self.say(f"the single-process reference failed: {self.reference.failures[0].message}")
            return
        sizes = tuple(p.layout.dp_world_size for p in plan.layouts)
        self.notes.extend(reference_notes(self.reference, sizes))
        scenarios = build_scenarios(self.spec, self.options, defined_names(self.spec.path))
        for layout in plan.layouts:
            beside = rerun if layout.layout.world_size == 1 else None
            if beside is not None:
                rerun = None  # world size 1's alone: not held through the larger layouts (N ids each epoch)
            self.single = plan.reference.layout
            result, notes = self._check_layout(layout, beside, scenarios)
            self.runs.append(result)
            self.notes.extend(n for n in notes if n not in self.notes)
        for scenario in scenarios:  # what spans layouts (restores in another topology)
            for label, outcome in scenario.finish().items():
                for i, run in enumerate(self.runs):
                    if run.label == label:
                        self.runs[i] = with_outcome(run, outcome, self.options)
                        if run.ok and not self.runs[i].ok:  # said "ok so far" before: say what changed
                            self.say(f"{layout_name(run.layout or Layout.plain(run.world_size))}: "
                                     f"{status_text(self.runs[i])}")  # fmt: skip

    def _check_layout(
        self, plan: LayoutPlan, rerun: RunTrace | None, scenarios: Sequence[Scenario]
    ) -> tuple[WorldResult, tuple[str, ...]]:
        layout = plan.layout
        ws = layout.world_size
        name = layout_name(layout)
        started = time.monotonic()
        if plan.skip:
            self.say(f"{name}: skipped ({plan.skip})")
            return WorldResult(ws, self.options.backend, skipped=plan.skip, layout=layout), ()
        simulated = "simulated " if self.options.simulate else ""
        self.say(f"{name}: running {count_text(ws, simulated + 'ranks')}")
        if plan.window is not None:
            self.say(f"{name}: reference window of {plan.window.options.steps} steps (1 process)")
        assert self.reference is not None
        judged = self._record_layout(plan, rerun)
        reference, run, again = judged.reference, judged.run, judged.rerun
        result = layout_result(reference, run, again, layout, self.options, scenarios, figures=judged.figures)
        result = timed(result, started)
        status = status_text(result)
        if result.ok and self.options.elastic and self.options.resume:
            status = "ok so far (elastic resume is checked once every layout has run)"
        self.say(f"{name}: {status} ({result.seconds:.2f}s)")
        return result, judged.notes

    def _record_layout(self, plan: LayoutPlan, rerun: RunTrace | None) -> _Judged:
        """Record the layout's jobs and its rerun (forked together; the rerun is let go while this
        process draws the run's figures, or beside the jobs where their ranks fit the cores)."""
        assert self.reference is not None
        reference = self.reference
        notes: list[str] = []
        watch = self.on_progress
        with recording(
            self.spec, plan.jobs, plan.rerun, alone=self.alone, on_progress=watch, on_note=self.say
        ) as started:
            traces = started.jobs()
            self.alone = self.alone or any(t.named_memory for t in traces)
            if plan.window is not None:
                reference = traces.pop(0)
            run = reference if plan.run is None else traces.pop(0)
            rerun_job = plan.rerun
            redone = _by_data(self.spec, self.options, plan, self.single, reference, run, watch)
            if redone is not None:
                reference, run, by_data, note = redone
                self.say(note)
                notes.append(note)
                rerun_job = Job(by_data, plan.layout) if by_data.determinism else None
            if not (self.options.determinism and run.ok):
                rerun, rerun_job = None, None  # a failed run is judged alone: its rerun would only repeat it

            def draw(reference: RunTrace = reference, run: RunTrace = run) -> FigureData:
                return figure_data(reference, data_parallel_view(plan.layout, run))

            if rerun_job is None:
                figures = draw()
            elif rerun_job is started.held:
                rerun, figures = started.held_run(draw)
            else:
                with recording(self.spec, [], rerun_job, on_progress=watch, on_note=self.say) as by_itself:
                    rerun, figures = by_itself.held_run(draw)
        # the run's note; the rerun's only when it had to be redone (its sample says nothing more)
        name = layout_name(plan.layout)
        note = shortcut_note(run, name) or (shortcut_note(rerun, name) if rerun is not None else "")
        if note:
            notes.append(note)
        return _Judged(reference, run, rerun, figures, tuple(notes))


def layout_result(
    reference: RunTrace,
    run: RunTrace,
    rerun: RunTrace | None,
    layout: Layout,
    options: CheckOptions,
    scenarios: Sequence[Scenario] = (),
    *,
    figures: FigureData | None = None,
    once: str = "",
) -> WorldResult:
    """One layout's result from its recordings, for local and joined runs alike: the scenarios run (their
    own rank-side runs: metric, training, resume; only when the run is ok), then the judge decides every
    verdict (:func:`ddpcheck.checks.judge.judge`), and this wraps them with the failures and rows.
    ``once``: why there is no determinism rerun, when none could be recorded (a joined launch runs once).
    Its ``seconds`` are the caller's to time (:func:`timed`).
    """
    failures = run.failures + (rerun.failures if rerun is not None else ())
    extra = Outcome()
    for scenario in scenarios if run.ok else ():
        extra += scenario.world(DataRun(layout.world_size, run, reference, layout=layout))
    launch = Launch(layout, (LoaderRecord("", reference, run, rerun),), once=once, extra=extra.verdicts)
    (judged,) = judge(launch, Rules.of(options))
    return WorldResult(
        layout=layout,
        world_size=layout.world_size,
        backend=run.backend,
        verdicts=judged.verdicts,
        failures=failures + extra.failures,
        divergence=extra.divergence,
        resume=extra.resume,
        figures=with_replicas(figures, layout, judged.verdicts) if figures is not None else None,
    )


def timed(result: WorldResult, started: float) -> WorldResult:
    """``result`` with its seconds: since ``started`` (its layout's ``time.monotonic()`` start)."""
    return replace(result, seconds=time.monotonic() - started)


def _by_data(
    spec: LoaderSpec,
    options: CheckOptions,
    plan: LayoutPlan,
    single: Layout,
    reference: RunTrace,
    run: RunTrace,
    on_progress: ProgressCallback | None = None,
) -> tuple[RunTrace, RunTrace, CheckOptions, str] | None:
    """The reference and the run recorded again with samples identified by their data, when indices
    cannot be compared: each rank indexes its own dataset from 0 (datasets' ``split_dataset_by_node``),
    or some rank saw no indices at all (batches formed outside a torch iterator there). For local
    indices only an id field will do (without one the checks say why). None when not needed or not
    possible; BadInput when the data cannot tell samples apart."""
    local = _rank_local_indices(reference, run)
    if not (local or _identified_apart(reference, run)):
        return None
    ws = plan.layout.world_size
    by_data = replace(options, ids_from_data=True)
    digest = plan.run.digest if plan.run is not None else False
    jobs = [Job(replace(by_data, set_epoch=True), single), Job(by_data, plan.layout, digest=digest)]
    alone = reference.named_memory or run.named_memory
    alt_reference, alt_run = record(spec, jobs, alone=alone, on_progress=on_progress)
    usable = alt_run.id_source.startswith("field:") if local else True
    if not local and _hashes_collide(reference, alt_reference):
        raise BadInput(
            f"at world size {ws} some rank sees no dataset indices, and the samples cannot be told "
            "apart by their content (equal samples): give the batches an id field or define "
            "sample_ids(batch)"
        )
    if not (alt_run.ok and alt_reference.ok and alt_run.id_source == alt_reference.id_source and usable):
        return None
    why = "rank-local indices" if local else "indices not seen on every rank"
    note = f"{layout_name(plan.layout)}: {why}; samples identified by {_describe_source(alt_run.id_source)}"
    return alt_reference, alt_run, by_data, note


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


def with_replicas(figures: FigureData, layout: Layout, verdicts: Sequence[Verdict]) -> FigureData:
    """The pictures' names for the layout, and on a mesh its replica groups (from replica_consistency)."""
    if not layout.mesh:
        return figures
    replica = next((v for v in verdicts if v.check == REPLICA_CONSISTENCY), None)
    said = replica.evidence if replica is not None else None
    listed = said.per_group if isinstance(said, ReplicaGroups) else ()
    groups = tuple(ReplicaGroup(g.where, g.steps, g.epoch, g.step, g.kind) for g in listed)
    return replace(figures, where=f"mesh {layout.label}", rank_noun="dp rank", replicas=groups)


NO_REFERENCE = (
    "the single-process reference could not be recorded (its rank failed, see above): no world size or "
    "mesh can be judged without it, so none was run"
)


def reference_failed(reference: RunTrace, layout: Layout) -> WorldResult:
    """The result of a run whose reference failed: the reference's own rank failures, at world size 1."""
    return WorldResult(1, reference.backend, failures=reference.failures, layout=layout)


def status_text(result: WorldResult) -> str:
    """``ok``, or ``2 checks failed (coverage, no_overlap), 1 rank failure``: a progress line's verdict."""
    if result.ok:
        return "ok"
    failed = [v.check for v in result.verdicts if v.failed]
    parts = []
    if failed:
        parts.append(f"{count_text(len(failed), 'checks')} failed ({', '.join(failed)})")
    if result.failures:
        parts.append(count_text(len(result.failures), "rank failures"))
    return ", ".join(parts)


def layout_name(layout: Layout) -> str:
    """``world size 2`` or ``mesh dp=2,tp=2``: how progress lines and notes name a layout."""
    return f"mesh {layout.label}" if layout.mesh else f"world size {layout.world_size}"


def with_outcome(result: WorldResult, outcome: Outcome, options: CheckOptions) -> WorldResult:
    """``result`` with what a scenario added once every layout had run (elastic resume), judged."""
    return replace(
        result,
        verdicts=result.verdicts + judge_finished(outcome.verdicts, Rules.of(options)),
        failures=result.failures + outcome.failures,
        divergence=result.divergence + outcome.divergence,
        resume=result.resume + outcome.resume,
    )


def raise_if_bad_input(reference: RunTrace) -> None:
    """A reference run that fails on bad input (import error, no factory, ...) is exit 2, not a crash."""
    bad = reference.bad_input
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


def reference_notes(reference: RunTrace, world_sizes: Sequence[int]) -> list[str]:
    """What the report says of the reference itself: content-hash identity, world sizes beyond its samples."""
    notes = []
    if reference.id_source == "content-hash":
        notes.append(
            "samples are identified by a content hash (no sample_ids hook, no id/idx/index field): "
            "equal samples look duplicated"
        )
    if reference.id_source == OBJECT_ITEMS:
        notes.append(
            "the sampler yields objects, not indices (lhotse's CutSets): samples are identified by their id "
            "attribute, else their content; a sample_ids(batch) hook says otherwise"
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
