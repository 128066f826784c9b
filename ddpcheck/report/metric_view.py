"""The script's own evaluation compared with one process's (issue 41), part of the report view
(:mod:`ddpcheck.report.view`): per layout, each value the evaluation reported at one process and at this
layout (rank 0's, and the other ranks' where they reported it), whether they agree within the tolerance,
which evaluations were compared on which weights, and how the ranks split the eval set (the numbers a cause
such as "padding copies counted" rests on).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ddpcheck.evidence import ComparedValue, MetricEvidence
from ddpcheck.messages import count_text
from ddpcheck.verdict import METRIC_EQUIVALENCE

if TYPE_CHECKING:
    from ddpcheck.report.rows import Row

HEADERS = ("evaluation", "value", "one process", "rank 0", "other ranks", "agree")


def shown(value: float | None, unit: float = 0.0) -> str:
    """A value as the table shows it: to its printed precision where it was printed, else 6 digits."""
    if value is None:
        return "-"
    if math.isnan(value):
        return "NaN"
    if unit > 0 and unit < 1:
        return f"{value:.{max(0, round(-math.log10(unit)))}f}"
    return f"{value:.6g}"


@dataclass(frozen=True)
class MetricTable:
    """One layout's comparison of the script's reported values."""

    label: str
    anchor: str
    status: str
    evidence: MetricEvidence

    @property
    def headers(self) -> tuple[str, ...]:
        return HEADERS

    @property
    def values(self) -> tuple[ComparedValue, ...]:
        return self.evidence.values

    def cells(self) -> list[list[str]]:
        return [
            [
                str(v.evaluation + 1),
                v.name,
                shown(v.reference, v.unit),
                shown(v.value, v.unit),
                " / ".join(shown(r, v.unit) for r in v.ranks[1:]) or "-",
                "yes" if v.equal else "NO",
            ]
            for v in self.values
        ]

    @property
    def caption(self) -> str:
        """The tolerance, the evaluations compared, and the split of the eval set."""
        evidence = self.evidence
        parts = [
            f"tolerance: relative {evidence.rel:g} (at least {evidence.absolute:g}); printed values also one "
            "unit in their last digit",
            *[f"compared: {e}" for e in evidence.evaluations],
        ]
        if evidence.shards:
            split = " / ".join(map(str, evidence.shards))
            parts.append(
                f"eval set of {evidence.set_size:,}: {split} samples per rank, "
                f"{count_text(evidence.copies, 'copies')}, {evidence.dropped} dropped"
            )
        return "; ".join(parts)


def metric_table(row: Row) -> MetricTable | None:
    """The metric_equivalence verdict's compared values as a table (None where nothing was compared)."""
    verdict = next((v for v in row.run.verdicts if v.check == METRIC_EQUIVALENCE), None)
    evidence = verdict.evidence if verdict is not None else None
    if verdict is None or not isinstance(evidence, MetricEvidence) or not evidence.values:
        return None
    return MetricTable(
        label=row.label, anchor=f"metric-{row.anchor}", status=verdict.status, evidence=evidence
    )
