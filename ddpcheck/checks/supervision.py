"""``supervision``: every micro-batch on every rank holds at least one sample and, where batches carry
labels, at least one label that is not the ignore index (issue 35).

Data alone decides it, so it judges a script's micro-steps (:func:`check_step_supervision`, from the step
watcher's :class:`~ddpcheck.trace.MicroStep` counts) and a loader file's batches
(:func:`check_supervision`, from each :class:`~ddpcheck.trace.EpochTrace`'s ``batch_sizes`` and
``supervised``; a batch is a micro-batch there). A micro-step that received no batch from a loader (a
padding pass the loop builds itself, weighted zero) holds no data and is not judged.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ddpcheck.checks.context import Context
from ddpcheck.checks.wording import ranks_text
from ddpcheck.evidence import Supervision
from ddpcheck.messages import count_text
from ddpcheck.options import IGNORE_INDEX
from ddpcheck.trace import RunTrace, StepTrace
from ddpcheck.verdict import SUPERVISION, Verdict, not_applicable, passed, skipped

UNSUPERVISED = (
    "micro-batches whose every label is the ignore index: a masked mean (loss * mask).sum() / mask.sum() is "
    "0/0 there, a NaN gradient that DDP's all-reduce spreads to every rank; cross_entropy(ignore_index=...) "
    "gives a NaN loss with a zero gradient, a silently smaller step"
)
EMPTY = (
    "micro-batches holding no sample: a mean over them is 0/0 (a NaN gradient that DDP's all-reduce spreads "
    "to every rank), and a rank that skips its empty micro-batch runs fewer backward passes than the others"
)
SUPERVISION_FIXES = {
    UNSUPERVISED: "drop samples without a supervised token before sharding (or pack them with others), and "
    "divide the summed loss by the supervised-token count all-reduced over the data-parallel group",
    EMPTY: "give every rank at least one sample per micro-batch (pad the shards, or drop whole windows on "
    "every rank alike)",
}


@dataclass(frozen=True)
class Unit:
    """One micro-batch (or loader batch) of one rank: where it is and what it holds."""

    rank: int
    epoch: int
    where: str  # "micro-batch 2 of optimizer step 3" / "batch 2"
    samples: int  # -1 unknown
    supervised: int | None  # None: no labels


def _step_units(run: Sequence[StepTrace | None]) -> Iterable[Unit]:
    for rank, trace in enumerate(run):
        if trace is None:
            continue
        windows = [(f"optimizer step {s.index}", s.micro) for s in trace.steps]
        windows.append(("the backward passes after the last optimizer step", trace.open_micro))
        for label, micro in windows:
            for m, step in enumerate(micro):
                if step.batches:  # a micro-step fed by a loader (padding passes hold no data)
                    yield Unit(rank, step.epoch, f"micro-batch {m} of {label}", step.samples, step.supervised)


def _epoch_units(run: RunTrace) -> Iterable[Unit]:
    for rank in run.ranks:
        for epoch in rank.epochs:
            supervised = epoch.supervised
            for b, size in enumerate(epoch.batch_sizes):
                sup = supervised[b] if supervised is not None and b < len(supervised) else None
                yield Unit(rank.rank, epoch.epoch, f"batch {b}", size, sup)


def judge_units(units: Iterable[Unit], ranks: int, ignore_index: int = IGNORE_INDEX) -> Verdict:
    """The verdict over every micro-batch of every rank (``ranks``: how many ranks recorded them)."""
    total = 0
    labelled = False
    empty: list[Unit] = []
    unsupervised: list[Unit] = []
    for unit in units:
        total += 1
        labelled = labelled or unit.supervised is not None
        if unit.samples == 0:
            empty.append(unit)
        elif unit.supervised == 0:
            unsupervised.append(unit)
    if not total:
        return not_applicable(SUPERVISION, "no micro-batch was recorded")
    counted = Supervision(total, len(empty), len(unsupervised))
    over = f"{count_text(total, 'micro-batches')} on {count_text(ranks, 'ranks')}"
    if not empty and not unsupervised:
        if not labelled:
            return Verdict(
                SUPERVISION,
                "pass",
                f"every one of {over} holds a sample (batches carry no labels)",
                evidence=counted,
            )
        return Verdict(
            SUPERVISION,
            "pass",
            f"every one of {over} holds a label other than {ignore_index}",
            evidence=counted,
        )
    found, cause = (empty, EMPTY) if empty else (unsupervised, UNSUPERVISED)
    first = found[0]
    what = (
        "holds no sample"
        if found is empty
        else f"holds no label other than {ignore_index} ({first.samples} samples)"
    )
    bad_ranks = sorted({u.rank for u in found})
    detail = (
        f"rank {first.rank}'s {first.where} (epoch {first.epoch}) {what}; "
        f"{len(found)} of {over} {'hold no sample' if found is empty else 'are unsupervised'}"
    )
    if len(bad_ranks) > 1:
        detail += f" ({ranks_text(bad_ranks)})"
    if empty and unsupervised:
        detail += f", and {len(unsupervised)} more hold no label other than {ignore_index}"
    return Verdict(
        SUPERVISION,
        "fail",
        detail,
        cause,
        ranks=tuple(bad_ranks),
        epochs=tuple(sorted({u.epoch for u in found})),
        examples=tuple(f"rank {u.rank}: {u.where}" for u in found[:5]),
        evidence=counted,
        fix=SUPERVISION_FIXES[cause],
    )


def check_step_supervision(run: Sequence[StepTrace | None], *, ignore_index: int = IGNORE_INDEX) -> Verdict:
    """``supervision`` on a script's micro-steps: ``run`` holds each rank's StepTrace by global rank (None:
    recorded none); ``ignore_index`` is the label value the rank side did not count as supervised (-100,
    or ``--ignore-index``), named in the report. Where the step watcher ran, this replaces the per-batch
    :func:`check_supervision` of the script's loaders: a micro-step is what one backward pass consumed."""
    missing = [r for r, t in enumerate(run) if t is None]
    if missing:
        return skipped(SUPERVISION, f"rank {missing[0]} recorded no training step")
    return judge_units(_step_units(run), len(run), ignore_index)


def check_supervision(
    reference: RunTrace, run: RunTrace, rerun: RunTrace | None = None, *, ctx: Context | None = None
) -> Verdict:
    """``supervision`` on a loader's batches (a loader file, or each loader of a script): every batch of
    every rank holds a sample and, where batches carry labels (``EpochTrace.supervised``), a supervised
    one. ``n/a`` when the batches carry no labels and none is empty (nothing to say)."""
    ctx = ctx or Context(reference, run, rerun)
    if ctx.unjudgeable:
        return skipped(SUPERVISION, ctx.unjudgeable)
    epochs = [e for r in run.ranks for e in r.epochs]
    labelled = any(e.supervised is not None for e in epochs)
    if not labelled and any(e.batch_sizes for e in epochs) and not any(0 in e.batch_sizes for e in epochs):
        verdict = passed(SUPERVISION, "")  # what the batches say, without a Unit each (4096 ranks: millions)
    else:
        verdict = judge_units(_epoch_units(run), len(run.ranks))
    if verdict.status == "pass" and not labelled:
        return not_applicable(
            SUPERVISION, "the batches carry no labels (no 'labels' field), and none is empty"
        )
    return verdict
