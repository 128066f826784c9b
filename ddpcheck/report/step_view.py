"""The training step's comparison as a table and a picture (issue 35), part of the report view
(:mod:`ddpcheck.report.view`): per compared optimizer step, how far the DDP gradient is from one process's
on the union of the ranks' micro-batches, against the tolerance, with each rank's micro-batches, samples
and supervised labels (the numbers a cause such as "a per-rank mean over different token counts" rests on).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING

from ddpcheck.evidence import ComparedStep, StepEvidence
from ddpcheck.verdict import STEP_EQUIVALENCE

if TYPE_CHECKING:
    from ddpcheck.report.rows import Row

FLOOR = 1e-9  # the picture's lowest relative difference (an exact replay's float noise is ~1e-8)
CEILING = 10.0
WIDTH, LEFT, BAR, GAP, TOP = 720, 64, 22, 6, 26


@dataclass(frozen=True)
class StepTable:
    """One layout's step comparison."""

    label: str
    anchor: str
    status: str
    tolerance: float
    dtype: str
    steps: tuple[ComparedStep, ...]

    @property
    def headers(self) -> tuple[str, ...]:
        return (
            "step",
            "rel. difference",
            "micro-batches per rank",
            "samples per rank",
            "supervised per rank",
        )

    def cells(self) -> list[list[str]]:
        def per_rank(values: tuple[int, ...]) -> str:
            return " / ".join(map(str, values)) if values else "-"

        return [
            [
                str(s.index),
                "NaN" if s.rel is None else f"{s.rel:.2g}",
                per_rank(s.micro),
                per_rank(s.samples),
                per_rank(s.supervised or ()),
            ]
            for s in self.steps
        ]

    def svg(self) -> str:
        """A bar per compared step on a log scale, the tolerance as a dashed line (bars past it in red)."""
        height = TOP + len(self.steps) * (BAR + GAP) + 24
        plot = WIDTH - LEFT - 16

        def x(value: float) -> float:
            clipped = min(max(value, FLOOR), CEILING)
            return LEFT + plot * (math.log10(clipped) - math.log10(FLOOR)) / math.log10(CEILING / FLOOR)

        body = [
            f'<text x="{LEFT}" y="16" font-size="12" fill="#59636e">relative L2 difference of the DDP '
            f"gradient from one process's (log scale); dashed: the tolerance {self.tolerance:g}</text>"
        ]
        for i, step in enumerate(self.steps):
            y = TOP + i * (BAR + GAP)
            value = CEILING if step.rel is None else step.rel
            over = step.rel is None or step.rel > self.tolerance
            shown = "NaN" if step.rel is None else f"{step.rel:.2g}"
            body.append(
                f'<text x="{LEFT - 8}" y="{y + 15}" font-size="12" text-anchor="end">step {step.index}</text>'
                f'<rect class="step-diff" x="{LEFT}" y="{y}" width="{x(value) - LEFT:.1f}" height="{BAR}" '
                f'fill="{"#d62728" if over else "#4e79a7"}"><title>{escape(f"step {step.index}: {shown}")}'
                "</title></rect>"
            )
        line = x(self.tolerance)
        bottom = TOP + len(self.steps) * (BAR + GAP)
        body.append(
            f'<line x1="{line:.1f}" y1="{TOP - 4}" x2="{line:.1f}" y2="{bottom}" stroke="#1f2328" '
            'stroke-dasharray="4 3"/>'
        )
        for power in range(round(math.log10(FLOOR)), round(math.log10(CEILING)) + 1, 2):
            body.append(
                f'<text x="{x(10.0**power):.1f}" y="{bottom + 16}" font-size="11" text-anchor="middle" '
                f'fill="#59636e">1e{power}</text>'
            )
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" '
            f'height="{height}" role="img" aria-label="{escape(self.label, quote=True)}" '
            f'font-family="system-ui, sans-serif">{"".join(body)}</svg>'
        )


def step_table(row: Row) -> StepTable | None:
    """The step_equivalence verdict's compared steps as a table (None where no step was compared)."""
    verdict = next((v for v in row.run.verdicts if v.check == STEP_EQUIVALENCE), None)
    evidence = verdict.evidence if verdict is not None else None
    if verdict is None or not isinstance(evidence, StepEvidence) or not evidence.steps:
        return None
    return StepTable(
        label=row.label,
        anchor=f"step-{row.anchor}",
        status=verdict.status,
        tolerance=evidence.tolerance,
        dtype=evidence.dtype,
        steps=evidence.steps,
    )
