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
from ddpcheck.checks.batch_sources import nothing_iterated
from ddpcheck.checks.eval_metric import evenly_note
from ddpcheck.checks.judge import Rules, judge, launch_of
from ddpcheck.checks.replicas import data_parallel_view
from ddpcheck.checks.scripts import RECORDED_ONCE, launcher_note
from ddpcheck.checks.step import loss_scale, wants_loss_probe
from ddpcheck.checks.step_judge import StepRecord, step_record
from ddpcheck.evidence import MetricEvidence
from ddpcheck.figures import figure_data
from ddpcheck.launch.recorded import read_launch, read_trace_dir
from ddpcheck.launch.script import launch_script
from ddpcheck.launch.watchdog import Limits
from ddpcheck.launch.workdir import WorkdirGuard, WorkdirUnavailable
from ddpcheck.layout import Layout, LayoutError, check_ranks
from ddpcheck.messages import count_text, one_line
from ddpcheck.options import TEST_WORLD_SIZES, BadInput, CheckOptions, mesh_layouts, validate
from ddpcheck.recorded import Recorded, launch_failure, launch_problem
from ddpcheck.result import CheckResult, RunRecord, ScriptRun, WorldResult
from ddpcheck.session.fingerprinted import is_fingerprinted, judge_fingerprinted
from ddpcheck.session.run import Interrupted, layout_name, status_text, with_replicas
from ddpcheck.trace import StepTrace
from ddpcheck.verdict import METRIC_EQUIVALENCE
from ddpcheck.wire.argv import RecordArgs

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
        script = ScriptRun(self.target.shown, tuple(self.target.args), self.options.model_steps, self.cwd)
        source = "index"
        if self.reference is not None and self.reference.traces:
            loaders = next(iter(self.reference.traces.values())).loaders
            source = loaders[0].id_source if loaders else source
        return CheckResult(
            loader=self.target.shown,
            runs=tuple(self.runs),
            id_source=source,
            epochs=self.options.check.epochs,
            options=RunRecord(self.options.check, script=script),
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
                    f"{_progress_name(result)} at {layout_name(layout)}: "
                    f"{status_text(result)} ({result.seconds:.2f}s)"
                )

    def _compared(self, compare: bool) -> dict[str, int | None]:
        """Which step windows a launch keeps for the replay: none (a launch nothing replays), the windows
        the loop reaches in an epoch's first batches, and with whole epochs (``--model-steps all``) also
        the epoch's last windows, where the ranks' shorter tails differ."""
        if not compare:
            return {"compare_batches": 0}
        if self.options.model_steps is None:
            return {"compare_batches": COMPARED_BATCHES, "tail_batches": TAIL_BATCHES}
        return {"compare_batches": self.options.model_steps}

    def _eval_flags(self, layout: Layout, replay: str) -> dict[str, Any]:
        """The script's evaluations (issue 41): none in a replay or with ``--no-metrics``; the single process
        saves the weights it evaluates, every larger layout evaluates on them."""
        if replay or self.options.check.metrics is False:
            return {"eval_rounds": 0}
        rounds = {"eval_rounds": self.options.eval_rounds}
        if layout.world_size > 1 and self.reference is not None and self.reference.out:
            return {**rounds, "eval_weights": self.reference.out}
        return rounds

    def _step_record(self, run: Recorded, layout: Layout) -> StepRecord | None:
        """The run's step recordings and, where several ranks take the step, the one-process replay of what
        they received (one more launch: the batches of one rank per data-parallel coordinate); None
        without ``--step``."""
        if not self.options.step:
            return None
        record = step_record(run, self.options.check.ignore_index)
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
        step: dict[str, Any] = {}
        if self.options.step:
            step = {"step": True, **self._compared(compare or bool(replay))}
        if replay and mesh is not None and mesh.mesh:
            step.update(mesh=mesh.spec, data_dims=tuple(mesh.data_dims))
        record = RecordArgs(
            out=out,
            path="" if self.target.module else self.target.path,
            module=self.target.module,
            script_args=tuple(self.target.args),
            epochs=check.epochs,
            model_steps=self.options.model_steps,
            steps=check.steps,
            hooks=os.path.abspath(self.options.hooks) if self.options.hooks else "",
            digest=layout.replicas > 1,
            work=check.work,
            work_cost=check.work_cost,
            batches=self.options.batches,
            replay=replay,
            replay_twice=bool(replay) and twice,
            ignore_index=check.ignore_index,  # the step's and the loaders' supervised counts
            **step,
            **self._eval_flags(layout, replay),
        )
        command = ["-m", "ddpcheck.record", *record.to_argv()]
        env = rank_environment(layout.world_size)
        launch = launch_script(
            command,
            layout.world_size,
            out,
            cwd=self.cwd,
            limits=Limits(check.timeout, check.max_time),
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
        return script_results(reference, run, rerun, self.options.check, step=step)


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


# --- wrapping the judge's verdicts -------------------------------------------------------------------------

SCRIPT_BACKEND = "gloo"  # what a script's results say: its ranks' traces name no backend of their own


def script_results(
    reference: Recorded,
    run: Recorded,
    rerun: Recorded | None,
    options: CheckOptions,
    *,
    standin: str = "",
    once: str = "",
    step: StepRecord | None = None,
) -> list[WorldResult]:
    """Every loader and batch source of ``run`` judged (:func:`ddpcheck.checks.judge.judge`) against the
    same loader of ``reference``: one WorldResult each, with its pictures and the launch's seconds.

    ``standin`` (non-empty: why) means the reference is not a real single-process run; ``once``: why no
    determinism rerun exists; ``step``: the launch's step recordings."""
    layout = run.layout
    metrics = options.metrics is not False  # the script's own evaluation (issue 41); off: --no-metrics
    launch = launch_of(
        reference, run, rerun, backend=SCRIPT_BACKEND, standin=standin, once=once, step=step, metrics=metrics
    )
    results = []
    variables = _variables(reference, run)
    for judged in judge(launch, Rules.of(options)):
        figures = None
        if judged.reference is not None and judged.run is not None:
            figures = figure_data(judged.reference, data_parallel_view(layout, judged.run))
            figures = with_replicas(figures, layout, judged.verdicts)
        results.append(
            WorldResult(
                layout.world_size,
                SCRIPT_BACKEND,
                judged.verdicts,
                layout=layout,
                seconds=run.seconds,
                figures=figures,
                loader=judged.loader,
                loader_variable=variables.get(judged.loader, ""),
            )
        )
    return results


def _progress_name(result: WorldResult) -> str:
    """A loader in a progress line: its variable and line (the report drops the line where no other
    loader shares the variable; a progress line cannot know yet)."""
    return f"{result.loader_variable} ({result.loader})" if result.loader_variable else result.loader


def _variables(reference: Recorded, run: Recorded) -> dict[str, str]:
    """Each loader's variable (``train_loader``) as the ranks' traces name it: the reports call it so."""
    found: dict[str, str] = {}
    for recorded in (reference, run):
        for trace in recorded.traces.values():
            for loader in trace.loaders:
                if loader.variable:
                    found.setdefault(loader.name, loader.variable)
    return found


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
    options = replace(options, ignore_index=run.ignore_index)  # as the ranks counted
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
        runs += script_results(names_from, run, None, options, standin=standin, once=RECORDED_ONCE, step=step)
    return CheckResult(
        loader=str(directory),
        runs=tuple(runs),
        epochs=options.epochs,
        options=RunRecord(options, judged=str(directory)),
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
    record = step_record(run, run.ignore_index)  # the ignore index the launch recorded with
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
