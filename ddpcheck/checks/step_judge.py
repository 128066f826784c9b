"""The step checks of one script launch, judged together (issue 35).

``ddpcheck run`` and ``ddpcheck judge`` attach them to the loader whose batches reached ``backward``:
``step_equivalence``, ``equal_microsteps`` and ``sequence_split`` are the step's own; ``supervision`` and
``rng_independence`` replace the per-batch forms a loader gets alone, because a micro-step (what one
backward consumed) and the loop's own draws are what the step trains on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from ddpcheck.checks.groups import group_size_of, step_group_cause
from ddpcheck.checks.microsteps import check_equal_microsteps
from ddpcheck.checks.rng import check_rng_independence
from ddpcheck.checks.sequence_split import check_sequence_split
from ddpcheck.checks.step import OTHER, check_step_equivalence
from ddpcheck.checks.supervision import check_step_supervision
from ddpcheck.evidence import StepEvidence
from ddpcheck.layout import Layout
from ddpcheck.options import IGNORE_INDEX
from ddpcheck.recorded import Recorded
from ddpcheck.trace import EpochTrace, StepTrace
from ddpcheck.verdict import (
    EQUAL_MICROSTEPS,
    RNG_INDEPENDENCE,
    SEQUENCE_SPLIT,
    STEP_EQUIVALENCE,
    SUPERVISION,
    Verdict,
    not_applicable,
)

NO_BACKWARD = "the script ran no backward pass while it was recorded"
SLICED_BY_LOADER = (
    "the loader hands each rank of {dims} its own slice of every sequence: the replay, fed one rank per "
    "data-parallel coordinate, would see a slice, not the whole sequences"
)


@dataclass(frozen=True)
class StepRecord:
    """One launch's step recordings: what the step checks read.

    ``steps``: each global rank's StepTrace (None: that rank recorded none); ``replay``: the one-process
    replay's StepTrace (None: none ran, ``no_replay`` says why); ``loading``: per loader name, each global
    rank's recorded epochs (their fetch draws); ``ignore_index``: the label value that supervises nothing.
    """

    steps: tuple[StepTrace | None, ...]
    replay: StepTrace | None = None
    no_replay: str = ""
    loading: Mapping[str, Sequence[Sequence[EpochTrace]]] = field(default_factory=dict)
    ignore_index: int = IGNORE_INDEX

    @property
    def backward(self) -> bool:
        """Whether any rank ran a backward pass while recorded."""
        return any(t is not None and (t.steps or t.open_micro) for t in self.steps)


def step_record(run: Recorded, ignore_index: int = IGNORE_INDEX) -> StepRecord:
    """What the step checks read from one launch: each rank's steps, each loader's epochs per rank."""
    ranks = range(run.layout.world_size)
    steps = tuple(run.traces[r].steps if r in run.traces else None for r in ranks)
    names = dict.fromkeys(lo.name for r in sorted(run.traces) for lo in run.traces[r].loaders)
    loading: dict[str, list[tuple[EpochTrace, ...]]] = {}
    for name in names:
        loading[name] = [
            next((lo.trace.epochs for lo in run.traces[r].loaders if lo.name == name), ())
            if r in run.traces
            else ()
            for r in ranks
        ]
    return StepRecord(steps, loading=loading, ignore_index=ignore_index)


def fed_loader(steps: Sequence[StepTrace | None]) -> str:
    """The loader whose batches the micro-steps consumed most often ("" none: no backward, or batches that
    came from no recorded loader)."""
    names = Counter(
        m.loader
        for t in steps
        if t is not None
        for micro in (*(s.micro for s in t.steps), t.open_micro)
        for m in micro
        if m.loader
    )
    return names.most_common(1)[0][0] if names else ""


def judge_step(record: StepRecord, layout: Layout, loader: Sequence[Verdict] = ()) -> tuple[Verdict, ...]:
    """``supervision``, ``rng_independence``, ``step_equivalence``, ``equal_microsteps`` and
    ``sequence_split`` of one launch at ``layout``, in that order; ``supervision`` is left out when no
    backward ran (the loader's per-batch form then stands). ``loader``: the fed loader's verdicts (its
    prompt groups name a step's cause)."""
    rng = check_rng_independence(layout, record.steps, record.loading)
    if not record.backward:
        return (
            rng,
            not_applicable(STEP_EQUIVALENCE, NO_BACKWARD),
            not_applicable(EQUAL_MICROSTEPS, NO_BACKWARD),
            not_applicable(SEQUENCE_SPLIT, NO_BACKWARD),
        )
    supervision = check_step_supervision(record.steps, ignore_index=record.ignore_index)
    if layout.world_size < 2:
        equivalence = not_applicable(STEP_EQUIVALENCE, "one process: its step is the single process's own")
    elif layout.sequence_dims:
        sliced = SLICED_BY_LOADER.format(dims=", ".join(layout.sequence_dims))
        equivalence = not_applicable(STEP_EQUIVALENCE, sliced)
    elif record.replay is None:
        why = record.no_replay or "the one-process replay did not run"
        equivalence = not_applicable(STEP_EQUIVALENCE, f"{why}: nothing to compare the step with")
    else:
        equivalence = check_step_equivalence(record.steps, record.replay, layout)
        equivalence = for_groups(equivalence, record, layout, group_size_of(loader))
    microsteps = check_equal_microsteps(record.steps, layout)
    return supervision, rng, equivalence, microsteps, check_sequence_split(record.steps, layout)


def for_groups(verdict: Verdict, record: StepRecord, layout: Layout, size: int) -> Verdict:
    """``step_equivalence``'s generic cause named for prompt groups of ``size`` copies (RL: GRPO, RLOO):
    split across ranks at a failing step, per-rank group statistics; else a statistic across groups."""
    evidence = verdict.evidence
    if size < 2 or not verdict.failed or verdict.cause != OTHER or not isinstance(evidence, StepEvidence):
        return verdict
    fed = fed_loader(record.steps)
    heads = (
        layout.representatives() if len(record.steps) == layout.world_size else list(range(len(record.steps)))
    )
    head = record.steps[heads[0]]
    failing = {s.index for s in evidence.steps if s.rel is None or s.rel > evidence.tolerance}
    positions = [
        (m.epoch, b)
        for step in (head.steps if head is not None else ())
        if step.index in failing
        for m in step.micro
        if m.loader == fed
        for b in m.batches
    ]
    epochs = [record.loading.get(fed, [()] * len(record.steps))[r] for r in heads]
    cause, fix = step_group_cause(size, epochs, positions)
    return replace(verdict, cause=cause, fix=fix) if cause else verdict


def merged(loader_verdicts: Sequence[Verdict], step_verdicts: Sequence[Verdict]) -> list[Verdict]:
    """The loader's verdicts with the step's: a step form replaces the loader's verdict of the same check,
    the step's own checks follow the data checks."""
    by_check = {v.check: v for v in step_verdicts}
    out = [
        by_check.pop(v.check, v) if v.check in (SUPERVISION, RNG_INDEPENDENCE) else v for v in loader_verdicts
    ]
    return out + [v for v in step_verdicts if v.check in by_check]
