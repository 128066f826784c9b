"""The one judge: what a launch recorded -> each loader's verdicts, every rewrite in one written order.

Every way of running ddpcheck ends here: a loader file's layout (``check_loader``, a joined launch), a
training script's launch (``ddpcheck run``), a launch recorded elsewhere (``ddpcheck judge DIR``, with
``--fingerprint`` or without). The session launches, reads what came back into a :class:`Launch` (plain
data) and wraps the :class:`Judged` it gets; it decides nothing. :func:`judge` reads, in this order:

1. each loader (:class:`LoaderRecord`): the checks of :data:`LOADER_CHECKS` on its traces (a stand-in
   reference from its ranks where the single-process run did not iterate it), or its fingerprinted epochs,
   or ``coverage`` n/a where it is absent at this layout; then each batch source (``--batches NAME``);
2. the verdicts of the checks with their own runs (``Launch.extra``: metric, training, resume), said of the
   first loader;
3. every verdict through :data:`REWRITES`, in their order: :func:`no_rerun` (a launch that runs once),
   :func:`max_idle` (``--max-idle``), then what only a script needs, from :mod:`ddpcheck.checks.scripts`:
   :func:`script_words` (``script_cause``), :func:`framework_sample` (``framework_sampler``),
   :func:`ranks_alone` (``alone``), :func:`mesh_told` (``told_cause``), :func:`loader_line`
   (``at_loader``), :func:`script_text` (``in_script_words``); these leave a loader file's verdicts, and a
   batch source's the ones that need a loader's traces, as they are;
4. the launch's own checks (:data:`LAUNCH_CHECKS`: the training step's, then a script's evaluation,
   ``metric_equivalence``), through the same rewrites, merged onto the loader they concern (a step form
   replaces the loader's verdict of the same check);
5. ``--allow``, once (:func:`allowed`).

Where a new check plugs in:

- a pure check of one loader's traces (reference, run, rerun): ``REGISTRY`` in
  :mod:`ddpcheck.checks.registry`, its id in :data:`ddpcheck.verdict.DATA_CHECKS`;
- a check of one loader that needs more than that (the layout: a mesh's sequence dimensions, groups that
  span ranks): a line in :data:`LOADER_CHECKS`, a function of :class:`Seen` returning its verdicts;
- a check of the whole launch (the step, a script's evaluation): a line in :data:`LAUNCH_CHECKS`, a
  function of :class:`Launch` and the loaders' verdicts so far (the step reads its loader's
  ``prompt_groups``) returning the loader it concerns and its verdicts (None: nothing to judge);
- a rewrite only some runs need: a line in :data:`REWRITES`, where it applies in the order.

Its id goes in :mod:`ddpcheck.verdict` (``ALL_CHECKS`` orders the report's columns).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from ddpcheck.checks.batch_sources import judge_sources
from ddpcheck.checks.eval_metric import judge_metric
from ddpcheck.checks.fingerprint import EpochCheck, fingerprint_verdicts
from ddpcheck.checks.replicas import judge_layout
from ddpcheck.checks.scripts import (
    alone,
    at_loader,
    framework_sampler,
    in_script_words,
    script_cause,
    standin_reference,
    told_cause,
)
from ddpcheck.checks.step_judge import StepRecord, fed_loader, judge_step, merged
from ddpcheck.checks.work import with_max_idle
from ddpcheck.layout import Layout
from ddpcheck.options import IGNORE_INDEX, CheckOptions
from ddpcheck.recorded import Recorded
from ddpcheck.trace import RunTrace, ScriptLoader, ScriptRankTrace
from ddpcheck.verdict import (
    COVERAGE,
    DETERMINISM,
    METRIC_EQUIVALENCE,
    Verdict,
    allow,
    not_applicable,
    skipped,
)

NOT_ITERATED = "the single-process run did not iterate this loader"


@dataclass(frozen=True)
class Rules:
    """How strictly to judge: the check ids whose failure is ``allowed`` (``--allow``), the idle
    fraction ``work_balance`` fails above (``--max-idle``), the label value that supervises nothing
    (``--ignore-index``: the ranks' counts left it out, ``supervision`` says so)."""

    allow: tuple[str, ...] = ()
    max_idle: float | None = None
    ignore_index: int = IGNORE_INDEX

    @classmethod
    def of(cls, options: CheckOptions) -> Rules:
        return cls(tuple(options.allow), options.max_idle, options.ignore_index)


@dataclass(frozen=True)
class LoaderRecord:
    """One loader of a launch: what its single-process reference, the run and the rerun recorded.

    ``name``: the line that built it in a script (``train.py:42``; "" for a loader file's loader);
    ``reference`` None: the single-process run did not iterate it (judged against a stand-in made of the
    run's ranks); ``absent``: why it cannot be judged at this layout; ``fingerprints``: a ``--fingerprint``
    launch's epochs (no traces)."""

    name: str = ""
    reference: RunTrace | None = None
    run: RunTrace | None = None
    rerun: RunTrace | None = None
    absent: str = ""
    fingerprints: tuple[EpochCheck, ...] | None = None


@dataclass(frozen=True)
class Sources:
    """The rank traces of a launch whose script called ``--batches`` functions, by rank: the single-process
    run's (empty: none to compare with), the run's and the rerun's (None: not rerun)."""

    reference: Mapping[int, ScriptRankTrace]
    run: Mapping[int, ScriptRankTrace]
    rerun: Mapping[int, ScriptRankTrace] | None = None


@dataclass(frozen=True)
class Evaluations:
    """A script's own evaluations (issue 41), as every rank recorded them: the single process's rank traces
    and the run's (each with its :class:`~ddpcheck.trace.EvalRecord` and the loaders' epochs, from which the
    eval set's split is read)."""

    reference: Mapping[int, ScriptRankTrace]
    run: Mapping[int, ScriptRankTrace]


@dataclass(frozen=True)
class ScriptFacts:
    """What a training script's launch says of itself: whether its ranks joined a process group (world
    size 1 counts as joined) and the frameworks they imported."""

    joined: bool = True
    frameworks: tuple[str, ...] = ()


@dataclass(frozen=True)
class Launch:
    """What one launch recorded at one layout, as the judge reads it (plain data).

    ``script`` None: a loader file's run (the rewrites that speak of a script leave it alone);
    ``standin``: why the reference is no single-process run (the checks that need one are skipped);
    ``once``: why no determinism rerun could be recorded (a launch that runs once); ``extra``: the verdicts
    of the checks with their own runs, said of the first loader; ``evaluations``: a script's own
    evaluations, judged by ``metric_equivalence`` (None: not judged, as with ``--no-metrics``)."""

    layout: Layout
    loaders: tuple[LoaderRecord, ...] = ()
    sources: Sources | None = None
    step: StepRecord | None = None
    script: ScriptFacts | None = None
    standin: str = ""
    once: str = ""
    extra: tuple[Verdict, ...] = ()
    evaluations: Evaluations | None = None


@dataclass(frozen=True)
class Seen:
    """What a verdict is judged and rewritten against: the launch, the rules, and its loader's name and
    traces (None for a batch source); ``standin``: why this loader's reference is no single-process run."""

    launch: Launch
    rules: Rules
    name: str = ""
    reference: RunTrace | None = None
    run: RunTrace | None = None
    rerun: RunTrace | None = None
    standin: str = ""


@dataclass(frozen=True)
class Judged:
    """One loader's (or batch source's) verdicts at the launch's layout, with the traces they were judged
    from (the session draws its pictures from them; None for a batch source or an absent loader)."""

    loader: str
    verdicts: tuple[Verdict, ...]
    reference: RunTrace | None = None
    run: RunTrace | None = None


# --- the checks, where a new one plugs in -----------------------------------------------------------------

LoaderCheck = Callable[[Seen], Sequence[Verdict]]
LaunchCheck = Callable[[Launch, Sequence[Judged]], tuple[str, Sequence[Verdict]] | None]


def data_checks(seen: Seen) -> Sequence[Verdict]:
    """The REGISTRY's checks on the layout's data-parallel view, ``replica_consistency`` after
    ``equal_steps`` (:func:`ddpcheck.checks.replicas.judge_layout`)."""
    assert seen.reference is not None and seen.run is not None
    layout, ignore_index = seen.launch.layout, seen.rules.ignore_index
    return judge_layout(seen.reference, seen.run, seen.rerun, layout, ignore_index=ignore_index)


def step_checks(launch: Launch, judged: Sequence[Judged]) -> tuple[str, Sequence[Verdict]] | None:
    """The training step's checks, said of the loader whose batches reached backward (the first loader
    when none did); None without a step recording. That loader's verdicts name a failing step's cause
    where its ``prompt_groups`` found groups (per-rank group statistics)."""
    if launch.step is None:
        return None
    fed = fed_loader(launch.step.steps)
    home = next((j for j in judged if j.loader == fed), judged[0] if judged else None)
    return fed, judge_step(launch.step, launch.layout, home.verdicts if home is not None else ())


def metric_check(launch: Launch, judged: Sequence[Judged]) -> tuple[str, Sequence[Verdict]] | None:
    """A script's evaluation (``metric_equivalence``, :mod:`ddpcheck.checks.eval_metric`), said of its eval
    loader (the first loader when it iterated none); None where the launch's evaluations are not judged."""
    found = launch.evaluations
    if found is None:
        return None
    metric = judge_metric(found.reference, found.run, launch.layout)
    if launch.standin:
        why = f"needs the single process's evaluation: {launch.standin}"
        return metric.loader, [not_applicable(METRIC_EQUIVALENCE, why)]
    return metric.loader, [metric.verdict]


LOADER_CHECKS: tuple[LoaderCheck, ...] = (data_checks,)
"""Each loader's checks at one layout, in report order: one function of :class:`Seen` per line."""

LAUNCH_CHECKS: tuple[LaunchCheck, ...] = (step_checks, metric_check)
"""The launch's own checks, given the loaders' verdicts so far: (the loader they concern, their verdicts), or
None; merged in this order."""


# --- the rewrites, in the one order they apply ------------------------------------------------------------

Rewrite = Callable[[Verdict, Seen], Verdict]


def no_rerun(verdict: Verdict, seen: Seen) -> Verdict:
    """A launch that runs once (``Launch.once`` says why) has no determinism to judge: said so."""
    if seen.launch.once and verdict.check == DETERMINISM and verdict.status in ("skip", "n/a"):
        return skipped(DETERMINISM, seen.launch.once)
    return verdict


def max_idle(verdict: Verdict, seen: Seen) -> Verdict:
    """``--max-idle``: ``work_balance`` fails above the user's idle fraction."""
    return with_max_idle(verdict, seen.rules.max_idle)


def script_words(verdict: Verdict, seen: Seen) -> Verdict:
    """A script's causes (a loop that never calls set_epoch; a stand-in reference's skips)."""
    if seen.launch.script is None or seen.run is None:
        return verdict
    single = seen.launch.layout.world_size == 1
    return script_cause(verdict, seen.run, seen.name, seen.standin, single)


def framework_sample(verdict: Verdict, seen: Seen) -> Verdict:
    """A framework that builds another sampler at one process: no stale epoch to compare."""
    if seen.launch.script is None or seen.reference is None or seen.run is None:
        return verdict
    return framework_sampler(verdict, seen.reference, seen.run)


def ranks_alone(verdict: Verdict, seen: Seen) -> Verdict:
    """Ranks that never joined a process group: named as that, with the launcher as the fix."""
    script = seen.launch.script
    return verdict if script is None else alone(verdict, script.joined, script.frameworks)


def mesh_told(verdict: Verdict, seen: Seen) -> Verdict:
    """A mesh failure named from what the script's samplers were given."""
    if seen.launch.script is None or seen.run is None:
        return verdict
    return told_cause(verdict, seen.run, seen.launch.layout)


def loader_line(verdict: Verdict, seen: Seen) -> Verdict:
    """A cause that blames the sampler, said at the line that built the loader."""
    return verdict if seen.launch.script is None else at_loader(verdict, seen.name)


def script_text(verdict: Verdict, seen: Seen) -> Verdict:
    """Loader-file words (hooks, CheckOptions) said as a script's."""
    return verdict if seen.launch.script is None else in_script_words(verdict)


REWRITES: tuple[Rewrite, ...] = (
    no_rerun,
    max_idle,
    script_words,
    framework_sample,
    ranks_alone,
    mesh_told,
    loader_line,
    script_text,
)
"""Every rewrite of a verdict once judged, in the order they apply (``--allow`` comes after all)."""


def rewritten(verdicts: Sequence[Verdict], seen: Seen) -> list[Verdict]:
    """``verdicts`` through :data:`REWRITES`, in order."""
    out = []
    for verdict in verdicts:
        for rewrite in REWRITES:
            verdict = rewrite(verdict, seen)
        out.append(verdict)
    return out


def allowed(verdicts: Sequence[Verdict], rules: Rules) -> tuple[Verdict, ...]:
    """``--allow CHECK``: that check's failure is reported as ``allowed`` (the last step, once)."""
    return tuple(allow(v) if v.check in rules.allow else v for v in verdicts)


# --- the judge ---------------------------------------------------------------------------------------------


def judge(launch: Launch, rules: Rules) -> tuple[Judged, ...]:
    """Every loader and batch source of ``launch`` judged: one :class:`Judged` each, in the order the
    module docstring gives."""
    out: list[Judged] = []
    for i, record in enumerate(launch.loaders):
        seen, verdicts = _loader(launch, rules, record)
        if i == 0:
            verdicts += launch.extra
        out.append(Judged(record.name, tuple(rewritten(verdicts, seen)), seen.reference, seen.run))
    if launch.sources is not None:
        sources = launch.sources
        found = judge_sources(sources.reference, sources.run, sources.rerun, launch.layout)
        out += [Judged(name, tuple(rewritten(v, Seen(launch, rules, name)))) for name, v in found]
    for check in LAUNCH_CHECKS:
        said = check(launch, out)
        if said is not None and out:
            _merge(out, launch, rules, *said)
    return tuple(replace(j, verdicts=allowed(j.verdicts, rules)) for j in out)


def _merge(out: list[Judged], launch: Launch, rules: Rules, about: str, verdicts: Sequence[Verdict]) -> None:
    """A launch check's verdicts, rewritten as said of the loader ``about`` (the first when no loader has
    that name), merged onto it in ``out``."""
    at = next((i for i, j in enumerate(out) if j.loader == about), 0)
    home = out[at]
    record = next((r for r in launch.loaders if r.name == home.loader), None)
    standin = _standin(launch, record)
    seen = Seen(launch, rules, home.loader, home.reference, home.run, standin=standin)
    out[at] = replace(home, verdicts=tuple(merged(home.verdicts, rewritten(verdicts, seen))))


def judge_finished(verdicts: Sequence[Verdict], rules: Rules) -> tuple[Verdict, ...]:
    """What a check with its own runs adds once every layout has run (elastic resume), judged as the
    rest: through the rewrites (none speaks of it) and ``--allow``."""
    seen = Seen(Launch(Layout.plain(1)), rules)
    return allowed(rewritten(verdicts, seen), rules)


def _standin(launch: Launch, record: LoaderRecord | None) -> str:
    """Why this loader's reference is no single-process run ("" when it is one)."""
    if record is None:
        return launch.standin
    return launch.standin or (NOT_ITERATED if record.reference is None else "")


def _loader(launch: Launch, rules: Rules, record: LoaderRecord) -> tuple[Seen, list[Verdict]]:
    """One loader's verdicts before the rewrites, and what they are rewritten against."""
    name, layout = record.name, launch.layout
    if record.fingerprints is not None:
        return Seen(launch, rules, name), list(fingerprint_verdicts(record.fingerprints, layout.world_size))
    if record.run is None:
        why = record.absent or "the script did not iterate it at this layout"
        return Seen(launch, rules, name), [not_applicable(COVERAGE, why)]
    reference = record.reference if record.reference is not None else standin_reference(record.run)
    seen = Seen(launch, rules, name, reference, record.run, record.rerun, _standin(launch, record))
    return seen, [v for check in LOADER_CHECKS for v in check(seen)]


# --- a script's launch as loader records -------------------------------------------------------------------


def launch_of(
    reference: Recorded,
    run: Recorded,
    rerun: Recorded | None,
    *,
    backend: str,
    standin: str = "",
    once: str = "",
    step: StepRecord | None = None,
    metrics: bool = True,
) -> Launch:
    """A script's launch at ``run.layout`` as the judge reads it: each loader the reference or the run
    iterated (in that order), its traces gathered over the ranks as one run on ``backend``; the batch
    sources; whether the ranks joined a group; with ``metrics``, its evaluations. ``standin``: the reference
    is no single-process run (its batch sources and evaluations are not compared)."""
    layout = run.layout
    records = []
    for name in _loader_names(reference, run):
        current = _run_trace(run, name, layout.world_size, backend)
        missing = _missing_ranks(run, name)
        if current is None or missing:
            said = f"ranks {', '.join(map(str, missing))} never iterate it" if missing else ""
            records.append(LoaderRecord(name, absent=said))
            continue
        again = _run_trace(rerun, name, layout.world_size, backend) if rerun is not None else None
        records.append(LoaderRecord(name, _run_trace(reference, name, 1, backend), current, again))
    again_traces = rerun.traces if rerun is not None else None
    sources = Sources({} if standin else reference.traces, run.traces, again_traces)
    traces = run.traces.values()
    joined = layout.world_size == 1 or any(t.joined_group for t in traces)
    facts = ScriptFacts(joined, tuple(sorted({f for t in traces for f in t.frameworks})))
    evaluations = Evaluations(reference.traces, run.traces) if metrics else None
    return Launch(layout, tuple(records), sources, step, facts, standin, once, evaluations=evaluations)


def _loader_names(reference: Recorded, run: Recorded) -> list[str]:
    names: dict[str, None] = {}
    for recorded in (reference, run):
        for rank in sorted(recorded.traces):
            for loader in recorded.traces[rank].loaders:
                names.setdefault(loader.name)
    return list(names)


def _missing_ranks(recorded: Recorded, name: str) -> list[int]:
    having = {r for r, t in recorded.traces.items() if any(lo.name == name for lo in t.loaders)}
    return [r for r in range(recorded.layout.world_size) if r not in having] if having else []


def _run_trace(recorded: Recorded | None, name: str, world_size: int, backend: str) -> RunTrace | None:
    """The loader's traces of every rank as one run (None: not every rank of ``world_size`` has it)."""
    if recorded is None:
        return None
    found: list[tuple[int, ScriptLoader]] = []
    for rank in sorted(recorded.traces):
        for loader in recorded.traces[rank].loaders:
            if loader.name == name:
                found.append((rank, loader))
    if len(found) != world_size:
        return None
    epochs = min(len(lo.trace.epochs) for _, lo in found)
    ranks = tuple(replace(lo.trace, rank=r, epochs=lo.trace.epochs[:epochs]) for r, lo in found)
    sources = {lo.id_source for _, lo in found}
    return RunTrace(
        world_size=world_size,
        backend=backend,
        ranks=ranks,
        id_source=sources.pop() if len(sources) == 1 else "mixed",
        set_epoch=all(lo.set_epoch for _, lo in found),
    )
