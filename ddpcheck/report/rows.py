"""A report's row: one layout's cells, ranks, padding and idle time, as every view of a result shows it.

Below :mod:`ddpcheck.report.view` and the tables it computes from a row (:mod:`~ddpcheck.report.step_view`,
:mod:`~ddpcheck.report.mixture_view`), so each names the row's type without an import circle.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddpcheck.restores import ResumeRow
from ddpcheck.result import WorldResult


@dataclass(frozen=True)
class Cell:
    """One check at one layout: ``status`` None when it did not run; ``cause`` the cause's number."""

    check: str
    status: str | None
    tip: str = ""  # every verdict's detail for this check, for a hover text
    cause: int | None = None


@dataclass(frozen=True)
class Row:
    """One layout: its label (``ws=2``), the grid's first column (``2``), its cells and its ranks."""

    run: WorldResult
    label: str
    short: str
    anchor: str  # an id for links: "ws2", "dp2-tp2"
    cells: tuple[Cell, ...]
    ranks: str  # "ok", "skipped: ...", "rank 1 crashed; ranks 0, 2 aborted"
    padding: str  # "4 padding copies of 64 samples (6%)...", "none", or "" when padding was not judged
    idle: str = ""  # "idle 14%, 12% (random batching: 16%, 17%)", or "" when work was not measured
    loader: str = ""  # a script's loader (``train.py:42``), the grid's own column; "" for a loader file

    def cell(self, check: str) -> Cell:
        return next((c for c in self.cells if c.check == check), Cell(check, None))

    @property
    def failing(self) -> bool:
        """A check failed here or a rank crashed, hung or was killed."""
        return bool(self.run.failures) or any(c.status == "fail" for c in self.cells)

    @property
    def bad_restores(self) -> tuple[ResumeRow, ...]:
        """The restores worth a picture: failed ones (samples lost or repeated), then refused ones."""
        order = {"failed": 0, "refused": 1}
        rows = [s for s in self.run.resume if restore_outcome(s) in order]
        return tuple(sorted(rows, key=lambda s: order[restore_outcome(s)]))


def restore_outcome(row: ResumeRow) -> str:
    """exact, resharded, refused or failed (a row judged before outcomes were named: by its status)."""
    return row.outcome or {"pass": "exact", "fail": "failed"}.get(row.status, row.status)
