"""``training_equivalence`` judged: the weights after every DDP step equal one process's, within tolerance.

The scenario (:mod:`ddpcheck.scenarios.training`) trains both ways on its own ranks and compares the
weights (:class:`TrainingRun`: the relative difference after every step, and which samples each batch
held); this says what that means: where the weights part, and why (batches that are no slices of the
single-process batch, a loss normalised per rank, or the same samples training differently).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace

from ddpcheck.evidence import TrainingDiffs
from ddpcheck.messages import count_text
from ddpcheck.verdict import TRAINING_EQUIVALENCE, Verdict, skipped

TOLERANCE = 1e-10
ACCUMULATION = 2
Batches = tuple[tuple[Hashable, ...], ...]

LOCAL_NORMALISATION = (
    "each rank divides its token loss by its own token count, where one process divides by the count of "
    "the whole global batch: tokens on a rank with few of them weigh more"
)
LOCAL_NORMALISATION_FIX = (
    "divide by the token count summed over ranks (all_reduce it, then multiply by the world size to undo "
    "DDP's mean); transformers' Trainer: average_tokens_across_devices=True"
)


@dataclass(frozen=True)
class TrainingRun:
    """What the DDP ranks and the one process trained, compared step by step (plain data).

    ``plain``/``accumulated``: the relative weight difference after each plain and each accumulated step;
    ``global_count``: for a ``(sum, count)`` loss (``pair``), the difference when each rank divides by the
    count over all ranks; ``rank_batches``: each rank's batches in order; ``batches``/``accumulated_batches``:
    the one process's."""

    batch_size: int
    plain: tuple[float, ...] = ()
    accumulated: tuple[float, ...] = ()
    pair: bool = False
    global_count: tuple[float, ...] = ()
    rank_batches: tuple[Batches, ...] = ()
    batches: Batches = ()
    accumulated_batches: Batches = ()


def judge_training(
    run: TrainingRun, world_size: int, tolerance: float = TOLERANCE, accumulation: int = ACCUMULATION
) -> Verdict:
    """``training_equivalence``: the weights after every DDP step equal one process's, within tolerance."""
    plain, grouped = list(run.plain), list(run.accumulated)
    b = run.batch_size
    global_batch = b * world_size
    diffs = TrainingDiffs(
        steps=len(plain),
        per_rank_batch=b,
        global_batch=global_batch,
        accumulation=accumulation,
        tolerance=tolerance,
        max_relative_difference=tuple(plain),
        accumulation_max_relative_difference=tuple(grouped),
    )
    setup = f"DDP {world_size} ranks x batch {b} vs one process with batch {global_batch}"
    if not plain:
        return skipped(TRAINING_EQUIVALENCE, "no step could be compared (the loaders yield no batch)")
    parted = _first_over(plain, tolerance)
    parted_acc = _first_over(grouped, tolerance)
    diffs = replace(
        diffs,
        first_parting_step=None if parted is None else parted + 1,
        accumulation_first_parting_step=None if parted_acc is None else parted_acc + 1,
    )
    if parted is None and parted_acc is None:
        detail = _passing_detail(run, world_size, plain, grouped, accumulation)
        return Verdict(TRAINING_EQUIVALENCE, "pass", detail, evidence=diffs)
    if parted is not None:
        step, parting, what = parted, plain, setup
        shape = _composition(run.rank_batches, run.batches, 1)
    else:
        assert parted_acc is not None
        step, parting = parted_acc, grouped
        what = (
            f"DDP {world_size} ranks x {accumulation} accumulated micro-batches of {b} under no_sync vs one "
            f"process with batch {global_batch * accumulation}"
        )
        shape = _composition(run.rank_batches, run.accumulated_batches, accumulation)
    detail = (
        f"weights part at step {step + 1} of {len(parting)}: max relative difference {parting[step]:.3g} > "
        f"{tolerance:g} ({what})"
    )
    if run.pair and parted is not None:
        local_only = list(run.global_count)
        diffs = replace(diffs, global_normalisation_max_relative_difference=tuple(local_only))
        if local_only and _first_over(local_only, tolerance) is None:
            detail += "; dividing by the token count over all ranks matches"
            return Verdict(
                TRAINING_EQUIVALENCE,
                "fail",
                detail,
                LOCAL_NORMALISATION,
                evidence=diffs,
                fix=LOCAL_NORMALISATION_FIX,
            )
    return Verdict(TRAINING_EQUIVALENCE, "fail", detail, _parting_cause(shape), evidence=diffs)


def _first_over(diffs: Sequence[float], tolerance: float) -> int | None:
    return next((i for i, d in enumerate(diffs) if not d <= tolerance), None)


def _union(ranks: Sequence[Batches], start: int, count: int) -> Counter[Hashable]:
    merged: Counter[Hashable] = Counter()
    for batches in ranks:
        for ids in batches[start : start + count]:
            merged.update(ids)
    return merged


def _composition(ranks: Sequence[Batches], reference: Batches, per_step: int) -> tuple[int, int, int] | None:
    """First step whose rank batches are not the single-process batch: (step, missing, batch size)."""
    for step, ids in enumerate(reference):
        union = _union(ranks, step * per_step, per_step)
        want = Counter(ids)
        if union != want:
            return step, sum((want - union).values()), len(ids)
    return None


def _passing_detail(
    run: TrainingRun, world_size: int, plain: list[float], grouped: list[float], accumulation: int
) -> str:
    b = run.batch_size
    global_batch = b * world_size
    acc_text = (
        f"; {accumulation} micro-batches accumulated under no_sync match batch "
        f"{global_batch * accumulation} ({max(grouped):.2g})"
        if grouped
        else "; gradient accumulation is not compared for a (sum, count) loss"
        if run.pair
        else "; too few batches to check gradient accumulation"
    )
    return (
        f"DDP with {count_text(world_size, 'ranks')} x batch {b} trains like one process with batch "
        f"{global_batch} for {len(plain)} SGD steps (max relative weight difference "
        f"{max(plain):.2g}){acc_text}"
    )


def _parting_cause(shape: tuple[int, int, int] | None) -> str:
    """Why the weights part: batches that are no slices of the single-process batch (``shape``: step,
    missing, batch size), else the same samples training differently."""
    if shape is not None:
        return (
            f"per-rank batches are not slices of the single-process batch (step {shape[0] + 1}: "
            f"{shape[1]} of its {shape[2]} samples are on no rank): split each global batch across "
            "ranks strided, as DistributedSampler does, not in contiguous blocks"
        )
    return (
        "the same samples train differently: the loss is not a mean over the batch, or the model "
        "depends on the batch (BatchNorm statistics, dropout)"
    )
