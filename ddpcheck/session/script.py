"""Auditing a training script: ``ddpcheck run -- train.py ARGS`` and ``ddpcheck judge DIR``.

The script runs unmodified, once per layout, on ranks started as torchrun starts them
(:mod:`ddpcheck.launch.script`); each rank records every loader the script iterates
(:mod:`ddpcheck.checker.script`) into a trace file. World size 1 (a run of the same script) is the
single-process reference. Each loader is then judged by the same checks as a loader file, one row
group per loader (``train.py:42``), and the causes speak of the script. A launch is read back by
:mod:`ddpcheck.launch.recorded`; the rules only a script needs, once the checks have judged, are
:mod:`ddpcheck.checks.scripts`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ddpcheck.checker.script_env import GPUS_ENV, NEEDS_CUDA, ScriptTarget
from ddpcheck.checks.batch_sources import judge_sources, nothing_iterated
from ddpcheck.checks.eval_metric import MetricJudgement, evenly_note, judge_metric
from ddpcheck.checks.ids import METRIC_EQUIVALENCE
from ddpcheck.checks.replicas import data_parallel_view
from ddpcheck.checks.scripts import (
    alone,
    at_loader,
    framework_sampler,
    in_script_words,
    launcher_note,
    no_rerun,
    script_cause,
    standin_reference,
    told_cause,
)
from ddpcheck.checks.step import loss_scale, wants_loss_probe
from ddpcheck.checks.step_judge import StepRecord, fed_loader, judge_step, merged
from ddpcheck.checks.verdict import MetricEvidence, Verdict, not_applicable
from ddpcheck.figures import figure_data
from ddpcheck.launch.recorded import Recorded, launch_failure, launch_problem, read_launch, read_trace_dir
from ddpcheck.launch.script import launch_script
from ddpcheck.launch.workdir import WorkdirGuard, WorkdirUnavailable
from ddpcheck.layout import Layout, LayoutError, check_ranks
from ddpcheck.messages import count_text, one_line
from ddpcheck.options import IGNORE_INDEX, TEST_WORLD_SIZES, BadInput, CheckOptions, mesh_layouts, validate
from ddpcheck.result import CheckResult, WorldResult
from ddpcheck.session.fingerprinted import is_fingerprinted, judge_fingerprinted
from ddpcheck.session.run import Interrupted, allowed, jsonable_options, judge_world, layout_name, status_text
from ddpcheck.trace import EpochTrace, RunTrace, ScriptLoader, StepTrace

Progress = Callable[[str], None]
DEFAULT_MODEL_STEPS = 2
COMPARED_BATCHES = 4  # with whole epochs: the step windows that start in an epoch's first 4 batches...
TAIL_BATCHES = 8  # ...and in its last 8 (each compared window saves the weights and its batches)


@dataclass(frozen=True)
class ScriptOptions:
    """A script audit: the options shared with loader files (``check``), and the script's own."""

    check: CheckOptions = field(default_factory=CheckOptions)
    model_steps: int | None = DEFAULT_MODEL_STEPS  # None: the script's loop receives whole epochs
    hooks: str = ""  # a file with loader-file hooks (sample_ids, batch_work, token_ids)
    cwd: str = ""  # the script's working directory ("" = this process's)
    step: bool = True  # watch the training step and judge it (--no-step: the loaders alone)
    ignore_index: int = IGNORE_INDEX  # the label value that supervises nothing
    batches: str = ""  # a batch function to record (--batches NAME), in windows of check.steps calls
    eval_rounds: int = 1  # the script's evaluations compared (--eval-rounds; metric_equivalence)


def check_script(
    path_or_module: str,
    args: Sequence[str] = (),
    options: ScriptOptions | None = None,
    *,
    progress: Progress | None = None,
    **fields: Any,
) -> CheckResult:
    """Audit a training script as ``ddpcheck run`` does; returns the result (never raises on findings).

    ``path_or_module``: a ``.py`` file, or a module name run as ``python -m`` (``"pkg.train"``);
    ``args``: the script's own command line; ``options``: the audit's :class:`ScriptOptions`;
    ``fields``: any field of them or of :class:`~ddpcheck.options.CheckOptions` (``world_sizes``,
    ``model_steps`` - batches per epoch the loop receives, None: whole epochs -, ``step``, ``cwd``,
    ``hooks``, ``steps``, ``max_idle``...), laid over ``options`` (see :func:`script_options`). Raises
    BadInput for a missing script, bad options, or a script that runs to its end at one process without
    iterating a DataLoader (nothing to check).

    Example::

        result = ddpcheck.check_script("train.py", ["--epochs", "1"], world_sizes=(1, 2))
        assert result.ok, result.exit_code
    """
    settings = script_options(options, **fields)
    base = settings.cwd or os.getcwd()
    as_file = path_or_module.endswith(".py") or os.path.isfile(os.path.join(base, path_or_module))
    target = ScriptTarget(
        path=path_or_module if as_file else "", module="" if as_file else path_or_module, args=tuple(args)
    )
    return audit_script(target, settings, progress=progress)


SEQUENCE_FIELDS = ("world_sizes", "meshes", "allow")  # CheckOptions fields held as tuples


def script_options(base: ScriptOptions | None = None, **fields: Any) -> ScriptOptions:
    """``base`` with ``fields`` laid over it, each a :class:`ScriptOptions` field or a
    :class:`~ddpcheck.options.CheckOptions` one (lists become tuples). Without ``base``: the options of a
    check from inside a test suite (world sizes 1 and 2) with no resume (a script has none)."""
    own = {f.name for f in dataclasses.fields(ScriptOptions)} - {"check"}
    mine = {k: v for k, v in fields.items() if k in own}
    check: dict[str, Any] = {
        k: tuple(v) if k in SEQUENCE_FIELDS else v for k, v in fields.items() if k not in own
    }
    if base is None:
        return ScriptOptions(
            CheckOptions(**{"world_sizes": TEST_WORLD_SIZES, "resume": False, **check}), **mine
        )
    return replace(base, check=replace(base.check, **check) if check else base.check, **mine)


def audit_script(
    target: ScriptTarget, options: ScriptOptions | None = None, *, progress: Progress | None = None
) -> CheckResult:
    """Run the script at world size 1 and every requested layout, and judge each loader it iterates.

    Raises BadInput (exit 2) for a script that does not exist, bad options, or one that iterated no
    DataLoader at one process although it ran to its end."""
    options = options or ScriptOptions()
    say = progress or (lambda _m: None)
    validate(options.check)
    meshes = mesh_layouts(options.check)
    cwd = options.cwd or os.getcwd()
    _precheck(target, cwd)
    if options.hooks and not os.path.isfile(options.hooks):
        raise BadInput(f"--hooks: no such file: {options.hooks}")
    layouts = [Layout.plain(ws) for ws in sorted(set(options.check.world_sizes)) if ws > 1] + list(meshes)
    try:
        for layout in layouts:  # every rank is a fresh interpreter on this machine
            instead = "record it inside your own launch: torchrun ... -m ddpcheck.record"
            check_ranks(layout.world_size, mesh=bool(layout.mesh), instead=instead)
    except LayoutError as exc:
        raise BadInput(str(exc)) from None
    try:  # each run sees the directory as the user left it (DDPCHECK_WORKDIR)
        guard = WorkdirGuard(cwd)
        guard.ready()
    except (ValueError, WorkdirUnavailable) as exc:
        raise BadInput(str(exc)) from None
    workdir = tempfile.mkdtemp(prefix="ddpchk-")
    guard.own.append(os.path.realpath(workdir))
    session = _ScriptSession(target, options, cwd, workdir, say, guard)
    try:
        session.carry_out(layouts)
    except WorkdirUnavailable as exc:
        raise BadInput(str(exc)) from None
    except KeyboardInterrupt:
        session.notes.append("interrupted: layouts after the last one shown were not checked")
        raise Interrupted(session.result(interrupted=True)) from None
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return session.result()


def _precheck(target: ScriptTarget, cwd: str) -> None:
    if target.path:
        path = target.path if os.path.isabs(target.path) else os.path.join(cwd, target.path)
        if os.path.isdir(path):
            raise BadInput(f"{target.path} is a folder: give the script file, or -m PACKAGE for a package")
        if not os.path.isfile(path):
            raise BadInput(f"no such script: {target.path}")
        _compiles(path, target.path)
        return
    if not target.module:
        raise BadInput(
            "give the script to run: ddpcheck run -- train.py ARGS, or ddpcheck run -m MODULE ARGS"
        )
    sys.path.insert(0, cwd)
    try:
        found = importlib.util.find_spec(target.module)
    except (ImportError, ValueError):
        found = None
    finally:
        sys.path.remove(cwd)
    if found is None:
        raise BadInput(f"no module named {target.module!r} (looked from {cwd})")


def _compiles(path: str, shown: str) -> None:
    """A script that is no Python (a syntax error, a binary file) is bad input, said before any rank
    starts, as for a loader file."""
    try:
        with open(path, "rb") as handle:
            source = handle.read()
        compile(source, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise BadInput(f"{shown}:{exc.lineno or 1}: not valid Python: {exc.msg}") from None
    except (ValueError, OSError) as exc:  # null bytes; unreadable
        raise BadInput(f"{shown}: not a Python script ({one_line(str(exc), 200)})") from None


class _ScriptSession:
    def __init__(
        self,
        target: ScriptTarget,
        options: ScriptOptions,
        cwd: str,
        workdir: str,
        say: Progress,
        guard: WorkdirGuard | None = None,
    ):
        self.target, self.options, self.cwd, self.workdir, self.say = target, options, cwd, workdir, say
        self.guard = guard
        self.runs: list[WorldResult] = []
        self.notes: list[str] = []
        self.reference: Recorded | None = None
        self.launches = 0

    def result(self, *, interrupted: bool = False) -> CheckResult:
        options = {
            **jsonable_options(self.options.check),
            "script": self.target.shown,
            "script_args": list(self.target.args),
            "model_steps": "all" if self.options.model_steps is None else self.options.model_steps,
            "cwd": self.cwd,
        }
        source = "index"
        if self.reference is not None and self.reference.traces:
            loaders = next(iter(self.reference.traces.values())).loaders
            source = loaders[0].id_source if loaders else source
        return CheckResult(
            loader=self.target.shown,
            runs=tuple(self.runs),
            id_source=source,
            epochs=self.options.check.epochs,
            options=options,
            notes=tuple(
                dict.fromkeys(
                    [*self.notes, *metric_notes(self.runs), *(self.guard.notes() if self.guard else [])]
                )
            ),
            interrupted=interrupted,
        )

    def carry_out(self, layouts: Sequence[Layout]) -> None:
        self.say(f"reference run (1 process) of {self.target.shown}")
        self.notes.extend(filter(None, [launcher_note(os.environ)]))
        reference = self._launch(Layout.plain(1))
        self.reference = reference
        single = Layout.plain(1)
        printed = reference.outputs.get(0, "")
        nothing = nothing_iterated(list(reference.traces.values()), printed, self.options.batches)
        if nothing:
            raise BadInput(nothing)
        problem = launch_problem(reference)
        if problem:
            self.runs.append(
                WorldResult(
                    1,
                    "gloo",
                    failures=reference.failures or (launch_failure(problem, reference),),
                    layout=single,
                    seconds=reference.seconds,
                    loader=self.target.shown,
                )
            )
            self.notes.append(problem)
            self.say(f"the single-process run failed: {problem}")
            return
        self.notes.extend(_trace_notes(reference))
        self.runs.extend(
            self._judge(reference, reference, None, single, self._step_record(reference, single))
        )
        determinism = self.options.check.determinism
        for layout in layouts:
            window_reference = reference
            if self.options.check.steps is not None and layout.dp_world_size > 1:  # the same global window
                steps = self.options.check.steps * layout.dp_world_size
                self.say(f"{layout_name(layout)}: reference window of {steps} steps (1 process)")
                window_reference = self._launch(Layout.plain(1), steps=steps)
            self.say(f"{layout_name(layout)}: running {count_text(layout.world_size, 'ranks')}")
            run = self._launch(layout, compare=layout.world_size > 1)
            rerun = None
            if determinism and run.traces and not run.failures:
                self.say(f"{layout_name(layout)}: determinism rerun")
                rerun = self._launch(layout)
                determinism = False  # one rerun: the first layout with several ranks
            self.notes.extend(_trace_notes(run))
            results = self._judge(window_reference, run, rerun, layout, self._step_record(run, layout))
            self.runs.extend(results)
            for result in results:
                self.say(
                    f"{result.loader} at {layout_name(layout)}: {status_text(result)} ({result.seconds:.2f}s)"
                )

    def _compared(self, compare: bool) -> list[str]:
        """Which step windows a launch keeps for the replay: none (a launch nothing replays), the windows
        the loop reaches in an epoch's first batches, and with whole epochs (``--model-steps all``) also
        the epoch's last windows, where the ranks' shorter tails differ."""
        if not compare:
            return ["--compare-batches", "0"]
        if self.options.model_steps is None:
            return ["--compare-batches", str(COMPARED_BATCHES), "--tail-batches", str(TAIL_BATCHES)]
        return ["--compare-batches", str(self.options.model_steps)]

    def _eval_flags(self, layout: Layout, replay: str) -> list[str]:
        """The script's evaluations (issue 41): none in a replay or with ``--no-metrics``; the single process
        saves the weights it evaluates, every larger layout evaluates on them."""
        if replay or self.options.check.metrics is False:
            return ["--eval-rounds", "0"]
        rounds = ["--eval-rounds", str(self.options.eval_rounds)]
        if layout.world_size > 1 and self.reference is not None and self.reference.out:
            return [*rounds, "--eval-weights", self.reference.out]
        return rounds

    def _step_record(self, run: Recorded, layout: Layout) -> StepRecord | None:
        """The run's step recordings and, where several ranks take the step, the one-process replay of what
        they received (one more launch: the batches of one rank per data-parallel coordinate); None
        without ``--step``."""
        if not self.options.step:
            return None
        record = step_record(run, self.options.ignore_index)
        if layout.world_size < 2 or not record.backward or launch_problem(run):
            return record
        self.say(f"{layout_name(layout)}: replaying its first steps at 1 process")
        replay = self._launch(Layout.plain(1), replay=run.out, mesh=layout)
        traces = [t.steps for t in replay.traces.values() if t.steps is not None]
        if not traces or launch_problem(replay):
            problem = launch_problem(replay) or "it recorded no step"
            return replace(record, no_replay=f"the one-process replay failed ({problem})")
        replayed = traces[0]
        if wants_loss_probe(record.steps, replayed, layout):
            self.say(f"{layout_name(layout)}: the loss adds up over the ranks: replaying every batch twice")
            probe = self._launch(Layout.plain(1), replay=run.out, twice=True, mesh=layout)
            probes = [t.steps for t in probe.traces.values() if t.steps is not None]
            if probes and not launch_problem(probe):
                replayed = replace(replayed, loss_scale=loss_scale(replayed, probes[0]))
        return replace(record, replay=replayed)

    def _launch(
        self,
        layout: Layout,
        steps: int | None = None,
        replay: str = "",
        compare: bool = False,
        twice: bool = False,
        mesh: Layout | None = None,
    ) -> Recorded:
        """One launch of the script at ``layout``; ``compare``: keep the compared steps' gradients and save
        their batches for a replay (the run that is replayed, and the replay); ``mesh``: a replay's
        recorded layout."""
        self.launches += 1
        out = os.path.join(self.workdir, f"l{self.launches}")
        check = replace(self.options.check, steps=steps) if steps is not None else self.options.check
        command = ["-m", "ddpcheck.record", "--out", out, "--epochs", str(check.epochs)]
        if self.options.step:
            command += ["--step", *self._compared(compare or bool(replay))]
            if self.options.ignore_index != IGNORE_INDEX:
                command += ["--ignore-index", str(self.options.ignore_index)]
        if replay:
            command += ["--replay", replay, *(["--replay-twice"] if twice else [])]
            if mesh is not None and mesh.mesh:
                command += ["--mesh", mesh.spec, "--data-dims", ",".join(mesh.data_dims)]
        command += self._eval_flags(layout, replay)
        command += [
            "--model-steps",
            "all" if self.options.model_steps is None else str(self.options.model_steps),
        ]
        if check.steps is not None:
            command += ["--steps", str(check.steps)]
        if self.options.hooks:
            command += ["--hooks", os.path.abspath(self.options.hooks)]
        if self.options.batches:
            command += ["--batches", self.options.batches]
        if layout.replicas > 1:
            command.append("--digest")
        if not check.work:
            command.append("--no-work")
        command += ["--work-cost", check.work_cost]
        if self.target.module:
            command += ["-m", self.target.module, *self.target.args]
        else:
            command += ["--", self.target.path, *self.target.args]
        env = rank_environment(layout.world_size)
        launch = launch_script(
            command,
            layout.world_size,
            out,
            cwd=self.cwd,
            timeout=check.timeout,
            env=env,
            workdir=self.guard,
            label=layout_name(layout),
        )
        return replace(read_launch(launch, layout), environment=env, out=out)

    def _judge(
        self,
        reference: Recorded,
        run: Recorded,
        rerun: Recorded | None,
        layout: Layout,
        step: StepRecord | None = None,
    ) -> list[WorldResult]:
        problem = launch_problem(run)
        gpus = run.environment.get(GPUS_ENV)
        if problem and NEEDS_CUDA in problem and gpus not in (None, "0"):
            # the GPUs that exist ran the smaller layouts; this one is a GPU count, not a bug
            why = f"world size {layout.world_size} needs {layout.world_size} GPUs, found {gpus}: {problem}"
            return [
                WorldResult(layout.world_size, "nccl", skipped=why, layout=layout, loader=self.target.shown)
            ]
        if problem:
            return [
                WorldResult(
                    layout.world_size,
                    "gloo",
                    failures=run.failures or (launch_failure(problem, run),),
                    layout=layout,
                    seconds=run.seconds,
                    loader=self.target.shown,
                )
            ]
        return judge_launch(reference, run, rerun, layout, self.options.check, step=step)


def metric_notes(runs: Sequence[WorldResult]) -> list[str]:
    """A note where every layout compared split the eval set evenly (equal metrics there prove little)."""
    found = [
        (run.layout.dp_world_size if run.layout else run.world_size, v.evidence)
        for run in runs
        for v in run.verdicts
        if v.check == METRIC_EQUIVALENCE and isinstance(v.evidence, MetricEvidence)
    ]
    note = evenly_note(found)
    return [note] if note else []


def rank_environment(world_size: int, gpus: int | None = None) -> dict[str, str]:
    """What makes a GPU user's script distributed here as under torchrun on enough GPUs.

    With a GPU for every rank the script runs on them as written. With fewer (none, or one GPU and
    world size 2) CUDA is hidden from the ranks, so ``cuda:local_rank`` cannot collide or point past
    the last device: NCCL runs on gloo and a cuda mesh on the CPU (the rank side says so), and
    Accelerate and the HF Trainer, which fall back to one process per rank without CUDA, are told
    to use the CPU.
    """
    if gpus is None:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus >= world_size:
        return {}
    return {"CUDA_VISIBLE_DEVICES": "", "ACCELERATE_USE_CPU": "true", GPUS_ENV: str(gpus)}


def _trace_notes(recorded: Recorded) -> list[str]:
    notes: list[str] = []
    for trace in recorded.traces.values():
        notes.extend(trace.notes)
    ws = recorded.layout.world_size
    if ws > 1 and recorded.traces and not any(t.joined_group for t in recorded.traces.values()):
        notes.append(
            f"at {layout_name(recorded.layout)} the script never joined a process group: its ranks train "
            "independently (no gradient is averaged), each on what its own loader yields"
        )
    return notes


# --- judging --------------------------------------------------------------------------------------------


def judge_launch(
    reference: Recorded,
    run: Recorded,
    rerun: Recorded | None,
    layout: Layout,
    options: CheckOptions,
    *,
    standin: str = "",
    step: StepRecord | None = None,
) -> list[WorldResult]:
    """Every loader of ``run`` judged against the same loader of ``reference``: one WorldResult each.

    ``standin`` (non-empty: why) means the reference is not a real single-process run; the checks
    that need one are skipped with that reason. ``step``: the launch's step recordings, judged with the
    loader whose batches reached backward (the first loader when none did)."""
    results = _judge_loaders(reference, run, rerun, layout, options, standin)
    if options.metrics is not False and results:  # the script's own evaluation (issue 41)
        results = with_metric(results, judge_metric(reference.traces, run.traces, layout), options, standin)
    if step is None or not results:
        return results
    fed = fed_loader(step.steps)
    at = next((i for i, r in enumerate(results) if r.loader == fed), 0)
    grouped = _grouped(run)
    verdicts = [
        in_script_words(at_loader(alone(v, *grouped), results[at].loader)) for v in judge_step(step, layout)
    ]
    joined = merged(results[at].verdicts, allowed(verdicts, options.allow))
    results[at] = replace(results[at], verdicts=tuple(joined))
    return results


def with_metric(
    results: list[WorldResult], judged: MetricJudgement, options: CheckOptions, standin: str
) -> list[WorldResult]:
    """``metric_equivalence`` joins the row of the eval loader it judged (the first row where none)."""
    verdict = judged.verdict
    if standin:
        verdict = not_applicable(METRIC_EQUIVALENCE, f"needs the single process's evaluation: {standin}")
    at = next((i for i, r in enumerate(results) if r.loader == judged.loader), 0)
    joined = (*results[at].verdicts, *allowed([verdict], options.allow))
    return [*results[:at], replace(results[at], verdicts=joined), *results[at + 1 :]]


def step_record(run: Recorded, ignore_index: int = IGNORE_INDEX) -> StepRecord:
    """What the step checks read from one launch: each rank's steps, each loader's epochs per rank."""
    ranks = range(run.layout.world_size)
    steps = tuple(run.traces[r].steps if r in run.traces else None for r in ranks)
    loading: dict[str, list[tuple[EpochTrace, ...]]] = {}
    for name in _loader_names(run, run):
        per_rank = [
            next((lo.trace.epochs for lo in run.traces[r].loaders if lo.name == name), ())
            if r in run.traces
            else ()
            for r in ranks
        ]
        loading[name] = per_rank
    return StepRecord(steps, loading=loading, ignore_index=ignore_index)


def _judge_loaders(
    reference: Recorded,
    run: Recorded,
    rerun: Recorded | None,
    layout: Layout,
    options: CheckOptions,
    standin: str,
) -> list[WorldResult]:
    seconds = run.seconds
    results = []
    grouped = _grouped(run)
    for name in _loader_names(reference, run):
        ref = _run_trace(reference, name, 1)
        current = _run_trace(run, name, layout.world_size)
        again = _run_trace(rerun, name, layout.world_size) if rerun is not None else None
        missing = _missing_ranks(run, name)
        if current is None or missing:
            why = (
                f"ranks {', '.join(map(str, missing))} never iterate it"
                if missing
                else "the script did not iterate it at this layout"
            )
            results.append(
                WorldResult(
                    layout.world_size,
                    "gloo",
                    (Verdict("coverage", "n/a", why),),
                    layout=layout,
                    seconds=seconds,
                    loader=name,
                )
            )
            continue
        reason = standin
        if ref is None:
            reason = reason or "the single-process run did not iterate this loader"
            ref = standin_reference(current)
        figures = figure_data(ref, data_parallel_view(layout, current))
        judged = judge_world(ref, current, again, layout, options, figures=figures)  # as loader files are
        verdicts = [script_cause(v, current, name, reason, layout.world_size == 1) for v in judged.verdicts]
        verdicts = [framework_sampler(v, ref, current) for v in verdicts]
        verdicts = [told_cause(alone(v, *grouped), current, layout) for v in verdicts]
        verdicts = [in_script_words(at_loader(v, name)) for v in verdicts]
        results.append(
            replace(judged, verdicts=tuple(allowed(verdicts, options.allow)), seconds=seconds, loader=name)
        )
    single, twice = ({} if standin else reference.traces), (rerun.traces if rerun is not None else None)
    for source in judge_sources(single, run.traces, twice, layout, seconds):  # --batches functions
        results.append(replace(source, verdicts=tuple(allowed(list(source.verdicts), options.allow))))
    return results


def _grouped(run: Recorded) -> tuple[bool, tuple[str, ...]]:
    """(whether the ranks ran in a process group, the frameworks they imported), for :func:`alone`."""
    traces = run.traces.values()
    joined = run.layout.world_size == 1 or any(t.joined_group for t in traces)
    return joined, tuple(sorted({f for t in traces for f in t.frameworks}))


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


def _run_trace(recorded: Recorded | None, name: str, world_size: int) -> RunTrace | None:
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
        backend="gloo",
        ranks=ranks,
        id_source=sources.pop() if len(sources) == 1 else "mixed",
        set_epoch=all(lo.set_epoch for _, lo in found),
    )


# --- ddpcheck judge DIR ---------------------------------------------------------------------------------


def judge_directory(
    directory: str | Path,
    reference: str | Path | None = None,
    options: CheckOptions | None = None,
    layout: Layout | None = None,
    replay: str | Path | None = None,
    twice: str | Path | None = None,
) -> CheckResult:
    """Judge one recorded launch; ``reference``: the same script recorded at one process; ``replay``: the
    launch's one-process replay (``python -m ddpcheck.record --replay DIR``), for ``step_equivalence``;
    ``twice``: that replay fed every batch twice (``--replay-twice``), which says how the loss scales.
    The step checks are judged where the launch was recorded with ``--step``."""
    options = options or CheckOptions()
    if is_fingerprinted(directory):  # recorded with --fingerprint: the ranks' own verdict, no ids
        return judge_fingerprinted(
            directory, options, reference=reference, replay=replay or twice, layout=layout
        )
    run = read_trace_dir(directory, layout)
    step = _recorded_step(run, replay, twice)
    notes = _trace_notes(run)
    runs: list[WorldResult] = []
    if reference is not None:
        ref = read_trace_dir(reference)
        if ref.layout.world_size != 1:
            raise BadInput(f"--reference {reference} holds a launch of {ref.layout.world_size} ranks, not 1")
        standin = ""
    else:
        ref = run
        standin = "no --reference given (record the script at one process and pass that directory)"
        notes.append(f"coverage and single-process equivalence are not judged: {standin}")
    problem = launch_problem(run)
    if problem:
        runs.append(
            WorldResult(
                run.layout.world_size,
                "recorded",
                failures=run.failures or (launch_failure(problem),),
                layout=run.layout,
                loader=str(directory),
            )
        )
    else:
        names_from = ref if reference is not None else run
        results = judge_launch(names_from, run, None, run.layout, options, standin=standin, step=step)
        runs.extend(replace(r, verdicts=tuple(no_rerun(v) for v in r.verdicts)) for r in results)
    return CheckResult(
        loader=str(directory),
        runs=tuple(runs),
        epochs=options.epochs,
        options={**jsonable_options(options), "judged": str(directory)},
        notes=tuple(dict.fromkeys([*notes, *metric_notes(runs)])),
    )


def _recorded_step(
    run: Recorded, replay: str | Path | None, twice: str | Path | None = None
) -> StepRecord | None:
    """The step recordings of a launch recorded with ``--step`` (None: recorded without), with its replay's
    step when one is given (and how its loss scales, from the replay fed every batch ``twice``)."""
    if not any(t.steps is not None for t in run.traces.values()):
        if replay is not None:
            raise BadInput("--replay: the launch was recorded without --step: nothing to compare")
        return None
    record = step_record(run)
    if replay is None:
        if twice is not None:
            raise BadInput("--replay-twice needs --replay: the probe is read against the replay")
        why = "no --replay given (record the launch's replay: python -m ddpcheck.record --replay DIR)"
        return replace(record, no_replay=why)
    steps = _replay_steps(replay, "--replay", False)
    if twice is not None:
        steps = replace(steps, loss_scale=loss_scale(steps, _replay_steps(twice, "--replay-twice", True)))
    return replace(record, replay=steps)


def _replay_steps(directory: str | Path, option: str, twice: bool) -> StepTrace:
    """The one-process replay recorded in ``directory`` (fed every batch twice, or not), or BadInput."""
    replayed = read_trace_dir(directory)
    steps = [t.steps for t in replayed.traces.values() if t.steps is not None and t.steps.replay]
    if replayed.layout.world_size != 1 or not steps or steps[0].twice != twice:
        how = "--replay DIR --replay-twice" if twice else "--replay DIR"
        what = "one-process replay fed every batch twice" if twice else "one-process replay"
        raise BadInput(f"{option} {directory} holds no {what} (record it with {how})")
    return steps[0]
