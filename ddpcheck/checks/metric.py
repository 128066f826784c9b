"""Metric divergence between one process and DDP: evaluation results -> MetricRows and a Verdict.

Pure: no processes, no torch. The scenario (:mod:`ddpcheck.scenarios.metric`) hands over an
:class:`Evaluation` per world size: the metric over the naive gather (rank-major, padding copies
kept), over the corrected gather (``sync_dicts_ddp(..., ids_key=...)``: copies dropped, id order),
and the ids of the naive gather. The world size 1 evaluation is the reference. Comparing the id
sequences names the cause, counted: duplicated samples (padding), dropped samples (drop_last), or
only the order.

Tolerance: by default integer metrics must match exactly and float metrics within a relative 1e-6
(absolute 1e-12 at zero, as ``pytest.approx``); an explicit tolerance applies to every metric.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from ddpcheck.evidence import MetricValues
from ddpcheck.messages import count_text
from ddpcheck.result import MetricRow, gather_effects
from ddpcheck.verdict import METRIC_EQUIVALENCE, Verdict

DEFAULT_RELATIVE = 1e-6
ABSOLUTE_FLOOR = 1e-12
MAX_EXAMPLES = 8
DROP_FIX = "use padding + ids_key dedup for evaluation"


@dataclass(frozen=True)
class Evaluation:
    """Rank 0's view of one evaluation epoch at one world size (plain data)."""

    world_size: int
    naive: dict[str, float]  # metric over the rank-major gather, padding copies kept
    corrected: dict[str, float]  # metric over the ids_key gather: copies dropped, id order
    ids: Sequence[Hashable]  # ids of the naive gather, in its order
    drops: bool = False  # the loader or its sampler drops samples instead of padding


@dataclass(frozen=True)
class Causes:
    """How the naive gather differs from the single-process epoch, as sample counts."""

    duplicated: int = 0  # extra copies (padding)
    dropped: int = 0  # reference samples no rank saw
    extra: int = 0  # samples the reference never saw
    order_differs: bool = False  # same samples, another order (after dropping copies)
    duplicated_ids: tuple[Hashable, ...] = ()
    dropped_ids: tuple[Hashable, ...] = ()

    @property
    def same_samples(self) -> bool:
        return not (self.duplicated or self.dropped or self.extra)

    @property
    def order_only(self) -> bool:
        return self.same_samples and self.order_differs


# --------------------------------------------------------------------------- causes


def count_causes(reference_ids: Sequence[Hashable], naive_ids: Sequence[Hashable]) -> Causes:
    """Compare the naive gather's ids with the single-process epoch's."""
    seen: dict[Hashable, None] = {}
    copies: dict[Hashable, None] = {}
    for i in naive_ids:
        if i in seen:
            copies[i] = None
        else:
            seen[i] = None
    reference = dict.fromkeys(reference_ids)
    dropped = [i for i in reference if i not in seen]
    extra = sum(1 for i in seen if i not in reference)
    first_seen = list(seen)
    return Causes(
        duplicated=len(naive_ids) - len(seen),
        dropped=len(dropped),
        extra=extra,
        order_differs=first_seen != list(reference),
        duplicated_ids=tuple(list(copies)[:MAX_EXAMPLES]),
        dropped_ids=tuple(dropped[:MAX_EXAMPLES]),
    )


# --------------------------------------------------------------------------- tolerance


def is_integer(value: object) -> bool:
    return isinstance(value, int) or type(value).__name__.startswith(("int", "uint"))


def close(reference: float, value: float, tolerance: float | None = None) -> bool:
    """Equal within the tolerance (see the module docstring); NaN equals NaN."""
    if math.isnan(reference) or math.isnan(value):
        return math.isnan(reference) and math.isnan(value)
    if tolerance is None:
        if is_integer(reference) and is_integer(value):
            return reference == value
        tolerance = DEFAULT_RELATIVE
    if tolerance == 0:
        return reference == value
    return math.isclose(value, reference, rel_tol=tolerance, abs_tol=ABSOLUTE_FLOOR)


def describe_tolerance(tolerance: float | None) -> str:
    if tolerance is None:
        return f"exact for integers, relative {DEFAULT_RELATIVE:g} for floats"
    return "exact" if tolerance == 0 else f"relative {tolerance:g}"


# --------------------------------------------------------------------------- rows and verdict


def _value(values: Mapping[str, float], name: str) -> float:
    return values.get(name, math.nan)


def _metric_names(*values: Mapping[str, float]) -> list[str]:
    names: dict[str, None] = {}
    for v in values:
        names.update(dict.fromkeys(v))
    return list(names)


def _naive_cause(causes: Causes, drops: bool) -> str:
    parts = []
    if causes.dropped:
        parts.append(("drop_last: " if drops else "") + "no gather recovers them; " + DROP_FIX)
    if causes.duplicated:
        parts.append("padding copies; ids_key dedup removes them")
    if causes.extra:
        parts.append(f"{count_text(causes.extra, 'samples')} the single-process epoch never sees")
    if causes.order_only:
        parts.append("the metric depends on order; ids_key restores it")
    return "; ".join(parts)


def _corrected_cause(causes: Causes, reference_ids: Sequence[Hashable]) -> str:
    """Why the ids_key gather still differs from one process (when it does)."""
    if causes.dropped:
        return DROP_FIX
    if causes.extra:
        return "the ranks see samples the single-process epoch does not: see coverage"
    if list(reference_ids) != sorted(dict.fromkeys(reference_ids), key=_sort_key):
        return "the metric depends on order, and one process's order is not id order (ids_key sorts by id)"
    return "per-sample outputs differ from one process: forward depends on the batch or rank"


def _sort_key(x: Hashable) -> tuple[str, object]:
    return (type(x).__name__, x)


def _unaffected(causes: Causes) -> str:
    if not causes.same_samples:
        return "no effect on this metric"
    return "rank-major order: no effect on this metric" if causes.order_differs else "none"


def metric_rows(
    reference: Evaluation, run: Evaluation, tolerance: float | None = None
) -> tuple[MetricRow, ...]:
    """One row per metric: the three values and the counted cause of the naive difference."""
    causes = count_causes(reference.ids, run.ids)
    ref = reference.naive
    rows = []
    for name in _metric_names(ref, run.naive, run.corrected):
        r, n, c = _value(ref, name), _value(run.naive, name), _value(run.corrected, name)
        naive_same, corrected_same = close(r, n, tolerance), close(r, c, tolerance)
        if naive_same and corrected_same:
            cause = _unaffected(causes)
        elif naive_same:
            cause = "corrected differs: " + _corrected_cause(causes, reference.ids)
        else:
            cause = _naive_cause(causes, run.drops) or "outputs differ"
            if not corrected_same and not causes.dropped:
                cause += "; corrected differs: " + _corrected_cause(causes, reference.ids)
        rows.append(
            MetricRow(
                metric=name,
                reference=r,
                naive=n,
                corrected=c,
                duplicated=causes.duplicated,
                dropped=causes.dropped,
                order_only=causes.order_only and not naive_same,
                cause=cause,
            )
        )
    return tuple(rows)


def _fmt(value: float) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _gather_summary(causes: Causes) -> str:
    return ", ".join(
        gather_effects(causes.duplicated, causes.dropped, causes.extra, order_only=causes.order_only)
    )


def judge_metrics(
    reference: Evaluation, run: Evaluation, rows: Sequence[MetricRow], tolerance: float | None = None
) -> Verdict:
    """``metric_equivalence``: the ids_key gather must reproduce the single-process metric."""
    causes = count_causes(reference.ids, run.ids)
    naive_off = [row for row in rows if not close(row.reference, row.naive, tolerance)]
    bad = [row for row in rows if not close(row.reference, row.corrected, tolerance)]
    naive_text = (
        "the naive gather differs: "
        + ", ".join(f"{r.metric} {_fmt(r.naive)} vs {_fmt(r.reference)}" for r in naive_off)
        + (f" ({_gather_summary(causes)})" if _gather_summary(causes) else "")
        if naive_off
        else "the naive gather matches too"
        + (f" (despite {_gather_summary(causes)})" if _gather_summary(causes) else "")
    )
    measured = MetricValues(
        reference=dict(reference.naive),
        naive=dict(run.naive),
        corrected=dict(run.corrected),
        duplicated=causes.duplicated,
        dropped=causes.dropped,
        extra=causes.extra,
        order_differs=causes.order_differs,
        tolerance=describe_tolerance(tolerance),
        samples=len(dict.fromkeys(reference.ids)),
    )
    examples = causes.dropped_ids or causes.duplicated_ids
    if not bad:
        names = ", ".join(f"{r.metric} {_fmt(r.reference)}" for r in rows) or "no metrics"
        detail = f"the ids_key gather reproduces the single-process metrics ({names}); {naive_text}"
        return Verdict(METRIC_EQUIVALENCE, "pass", detail, examples=examples, evidence=measured)
    values = ", ".join(f"{r.metric} {_fmt(r.corrected)} vs {_fmt(r.reference)}" for r in bad)
    if causes.dropped:
        who = "by drop_last " if run.drops else ""
        verb = "reaches" if causes.dropped == 1 else "reach"
        fix = DROP_FIX if run.drops else f"no gather can recover them; {DROP_FIX}"
        lead = f"{count_text(causes.dropped, 'samples')} dropped {who}never {verb} any rank; {fix}"
        cause = "drop_last drops samples from evaluation" if run.drops else "samples never reach any rank"
    else:
        lead = "the ids_key gather does not reproduce the single-process metrics"
        cause = _corrected_cause(causes, reference.ids)
    if all(close(r.naive, r.corrected, tolerance) for r in bad):
        naive_text = "the naive gather gives the same"
    detail = f"{lead}: corrected DDP {values} (single process); {naive_text}"
    return Verdict(METRIC_EQUIVALENCE, "fail", detail, cause, examples=examples, evidence=measured)
