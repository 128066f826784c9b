"""The mixture verdict's shares as a table (per source: expected, single process, all ranks, each rank and
worker), part of the report view (:mod:`ddpcheck.report.view`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ddpcheck.evidence import MixtureShares
from ddpcheck.verdict import MIXTURE

if TYPE_CHECKING:
    from ddpcheck.report.rows import Row


@dataclass(frozen=True)
class MixtureTable:
    """One layout's mixture: per source the expected share, and each group's shares (summed over epochs).

    ``groups`` are ``(who, samples, shares)``: "expected", "single process", "all ranks", "rank 0",
    "rank 0 worker 1" ...; ``status`` the mixture verdict's."""

    label: str
    anchor: str
    status: str
    sources: tuple[str, ...]
    expected_from: str
    groups: tuple[tuple[str, int, tuple[float, ...]], ...]

    @property
    def headers(self) -> tuple[str, ...]:
        return ("", "samples", *self.sources)

    def cells(self) -> list[list[str]]:
        """The groups as text cells: who, samples, each share as a percentage."""
        return [[who, f"{n:,}" if n else "", *(f"{x:.1%}" for x in shares)] for who, n, shares in self.groups]


def mixture_table(row: Row) -> MixtureTable | None:
    """The mixture verdict's data as a table (None where batches carry no source)."""
    verdict = next((v for v in row.run.verdicts if v.check == MIXTURE), None)
    shares = verdict.evidence if verdict is not None else None
    if verdict is None or not isinstance(shares, MixtureShares) or not shares.sources:
        return None
    sources = shares.sources

    def group(who: str, counts: Sequence[int]) -> tuple[str, int, tuple[float, ...]] | None:
        if len(counts) != len(sources):
            return None
        n = sum(int(c) for c in counts)
        return (who, n, tuple(int(c) / n if n else 0.0 for c in counts))

    groups = [("expected", 0, tuple(float(x) for x in shares.expected))]
    found = [group("single process", shares.reference_counts), group("all ranks", shares.union_counts)]
    by_rank: dict[int, list[tuple[int, Sequence[int]]]] = {}
    for rank, worker, counts in shares.worker_counts:
        by_rank.setdefault(int(rank), []).append((int(worker), counts))
    for r, counts in enumerate(shares.rank_counts):
        found.append(group(f"rank {r}", counts))
        found += [group(f"rank {r} worker {w}", c) for w, c in by_rank.get(r, [])]
    groups += [g for g in found if g is not None]
    return MixtureTable(
        label=row.label,
        anchor=f"mixture-{row.anchor}",
        status=verdict.status,
        sources=tuple(str(s) for s in sources),
        expected_from=shares.expected_from,
        groups=tuple(groups),
    )
