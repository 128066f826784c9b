"""Orchestration: loader file + options -> runs at each world size -> traces -> verdicts -> CheckResult.

This is the one place that knows the whole data path. It launches (through ``ddpcheck.launch``),
turns rank outcomes into traces, hands traces to the pure checks, and never renders anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ddpcheck.checks import run_checks
from ddpcheck.divergence import HookCheck, defined_names
from ddpcheck.launch import GroupResult, TargetRef, run_ranks
from ddpcheck.loaderfile import BadLoaderFile, LoaderSpec, precheck
from ddpcheck.record import RankFailure, RunTrace
from ddpcheck.recorder import RankRecording, RecordOptions, record_rank
from ddpcheck.result import CheckResult, MetricRow, WorldResult

BACKENDS = ("gloo", "nccl")
Progress = Callable[[str], None]


class BadInput(ValueError):
    """Options or inputs that make the run impossible; the message is one actionable line (exit 2)."""


class Interrupted(Exception):
    """Ctrl-C or SIGTERM during a run; ``partial`` holds every world size that finished."""

    def __init__(self, partial: CheckResult) -> None:
        super().__init__("interrupted")
        self.partial = partial


@dataclass(frozen=True)
class CheckOptions:
    world_sizes: tuple[int, ...] = (1, 2, 3, 4)
    epochs: int = 2
    backend: str = "gloo"
    factory: str = "make_loader"
    patch: bool = False
    simulate: bool = False
    load_data: bool = False
    set_epoch: bool = True
    timeout: float = 120.0
    determinism: bool = True
    batch_size: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # --- metric and training equivalence (ddpcheck.evaluate, ddpcheck.training) ---
    metrics: bool | None = None  # None: when the file defines forward or metric
    metric_tolerance: float | None = None  # None: exact for integers, relative 1e-6 for floats
    train_steps: int = 3  # 0: off; runs when the file defines make_model and loss
    # --- windows, allowed failures, resume ---
    steps: int | None = None  # per rank per epoch window; None: whole epochs
    allow: tuple[str, ...] = ()  # check ids whose failure is reported as "allowed"
    resume: bool = True  # the mid-epoch resume check, where the loader has a state mechanism
    elastic: bool = False  # also restore at other world sizes

    def record_options(self) -> RecordOptions:
        return RecordOptions(
            epochs=self.epochs,
            load_data=self.load_data,
            set_epoch=self.set_epoch,
            patch=self.patch,
            batch_size=self.batch_size,
        )


def validate(options: CheckOptions) -> None:
    if not options.world_sizes:
        raise BadInput("no world sizes given")
    for ws in options.world_sizes:
        if not isinstance(ws, int) or isinstance(ws, bool) or ws < 1:
            raise BadInput(f"world sizes must be positive integers, got {ws!r}")
    if not isinstance(options.epochs, int) or options.epochs < 1:
        raise BadInput(f"epochs must be at least 1, got {options.epochs!r}")
    if options.timeout <= 0:
        raise BadInput(f"timeout must be positive, got {options.timeout!r}")
    if options.backend not in BACKENDS:
        raise BadInput(f"unknown backend {options.backend!r}; choose one of {', '.join(BACKENDS)}")
    if options.backend == "nccl" and not options.simulate:
        import torch

        if not torch.cuda.is_available():
            raise BadInput("backend nccl needs CUDA, and this machine has no CUDA device; use --backend gloo")
    tolerance = options.metric_tolerance
    if tolerance is not None and not (isinstance(tolerance, (int, float)) and 0 <= tolerance < float("inf")):
        raise BadInput(f"metric tolerance must be a non-negative number, got {tolerance!r}")
    steps = options.train_steps
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise BadInput(f"train steps must be a non-negative integer (0 turns it off), got {steps!r}")


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

    try:
        say(f"reference run (1 process) of {path}")
        # The reference is always the correct loop (set_epoch called); with --no-set-epoch only the
        # runs skip it, so reshuffle fails exactly when the order depends on that call.
        reference = _run(spec, replace(options, set_epoch=True), 1)
        _raise_if_bad_input(reference)
        notes.extend(_notes(reference, world_sizes))
        hooks = _hook_checks(spec, options)
        for ws in world_sizes:
            runs.append(_check_world(spec, options, reference, ws, say, hooks))
    except KeyboardInterrupt:
        notes.append("interrupted: world sizes after the last one shown were not checked")
        raise Interrupted(result()) from None
    return result()


def _check_world(
    spec: LoaderSpec,
    options: CheckOptions,
    reference: RunTrace,
    ws: int,
    say: Progress,
    hooks: Sequence[HookCheck] = (),
) -> WorldResult:
    started = time.monotonic()
    skip = _skip_reason(options, ws)
    if skip:
        say(f"world size {ws}: skipped ({skip})")
        return WorldResult(ws, options.backend, skipped=skip)
    say(f"world size {ws}: running {ws} {'simulated ' if options.simulate else ''}ranks")
    run = reference if ws == 1 and options.set_epoch else _run(spec, options, ws)
    rerun = _run(spec, options, ws) if options.determinism and run.ok else None
    verdicts = run_checks(reference, run, rerun)
    failures = run.failures + (rerun.failures if rerun else ())
    # --- metric and training equivalence: only for files with the hooks (see _hook_checks) ---
    divergence: list[MetricRow] = []
    for hook in hooks if run.ok else ():
        outcome = hook.world(ws)
        verdicts += outcome.verdicts
        divergence += outcome.divergence
        failures += outcome.failures
    # --- end ---
    result = WorldResult(
        world_size=ws,
        backend=run.backend,
        verdicts=tuple(verdicts),
        failures=failures,
        divergence=tuple(divergence),
        seconds=time.monotonic() - started,
    )
    failed = sum(v.failed for v in verdicts)
    status = "ok" if result.ok else f"{failed} checks failed, {len(result.failures)} rank failures"
    say(f"world size {ws}: {status} ({result.seconds:.2f}s)")
    return result


def _hook_checks(spec: LoaderSpec, options: CheckOptions) -> list[HookCheck]:
    """Metric / training equivalence, when the file's source defines their hooks (nothing runs here)."""
    from ddpcheck.evaluate import MetricEquivalence
    from ddpcheck.training import TrainingEquivalence

    names = defined_names(spec.path)
    found = (MetricEquivalence.maybe(spec, options, names), TrainingEquivalence.maybe(spec, options, names))
    return [check for check in found if check is not None]


def _skip_reason(options: CheckOptions, world_size: int) -> str:
    if options.backend == "nccl" and not options.simulate:
        import torch

        found = torch.cuda.device_count()
        if found < world_size:
            return f"NCCL world size {world_size} needs {world_size} GPUs, found {found}"
    return ""


def _run(spec: LoaderSpec, options: CheckOptions, world_size: int) -> RunTrace:
    kwargs = {"spec": spec, "options": options.record_options()}
    if options.simulate:
        from ddpcheck.launch.simulate import NeedsCollectives, simulate_ranks

        try:
            group = simulate_ranks(record_rank, world_size, kwargs=kwargs)
        except NeedsCollectives as exc:
            raise BadInput(str(exc)) from None
    else:
        group = run_ranks(
            TargetRef.of(record_rank),
            world_size,
            backend=options.backend,
            timeout=options.timeout,
            kwargs=kwargs,
        )
    return to_run_trace(group, set_epoch=options.set_epoch)


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
        for o in group.outcomes
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
        id_source=recordings[0].id_source if recordings else "index",
        set_epoch=set_epoch,
        failures=failures,
        options={"bad_input": bad[0].message} if bad and len(bad) == len(group.outcomes) else {},
    )


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
    out = {k: v for k, v in options.__dict__.items() if k != "extra"}
    out["world_sizes"] = list(options.world_sizes)
    out.update(options.extra)
    return out
