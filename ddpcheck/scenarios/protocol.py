"""The one shape of a check that needs its own rank-side runs (metric, training, resume).

A scenario is built in the parent from the loader file's names and the options (nothing runs then).
The session calls :meth:`Scenario.world` once per layout, after the data run, and
:meth:`Scenario.finish` once at the end (for what spans world sizes, such as elastic resume).
Inside, a scenario launches its own ranks; what comes back from them is plain data, and its verdicts
come from a pure judge. The session never names a scenario: it iterates :func:`ddpcheck.scenarios.build`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ddpcheck.layout import Layout
from ddpcheck.restores import ResumeRow
from ddpcheck.result import MetricRow
from ddpcheck.trace import RankFailure, RunTrace
from ddpcheck.verdict import Verdict

if TYPE_CHECKING:
    from ddpcheck.launch import GroupResult


@dataclass(frozen=True)
class Outcome:
    """What a scenario adds to one world size's result."""

    verdicts: tuple[Verdict, ...] = ()
    divergence: tuple[MetricRow, ...] = ()
    failures: tuple[RankFailure, ...] = ()
    resume: tuple[ResumeRow, ...] = ()

    def __add__(self, other: Outcome) -> Outcome:
        return Outcome(
            self.verdicts + other.verdicts,
            self.divergence + other.divergence,
            self.failures + other.failures,
            self.resume + other.resume,
        )


@dataclass
class DataRun:
    """What the session hands a scenario for one layout: the data run it judged (plain data)."""

    world_size: int
    run: RunTrace  # every rank of the layout
    reference: RunTrace
    layout: Layout | None = None  # None: the plain world size ``world_size``


class Scenario(Protocol):
    """A check with its own rank-side runs; see the module docstring."""

    def world(self, ctx: DataRun) -> Outcome: ...

    def finish(self) -> dict[str, Outcome]:
        """Outcomes that need every layout (a layout's label -> what to add to it); usually empty."""
        ...


def rank_failures(group: GroupResult, check: str = "") -> tuple[RankFailure, ...]:
    """The failed ranks of a group as plain data, the ranks a peer took down last; messages start with
    ``check`` when a scenario's own group failed."""
    prefix = f"{check}: " if check else ""
    return tuple(
        RankFailure(
            rank=o.rank,
            kind=o.kind,
            message=f"{prefix}{o.message}",
            stack=o.error or o.stack,
            progress=o.progress,
        )
        for o in sorted(group.outcomes, key=lambda o: (o.kind == "secondary", o.rank))
        if not o.ok
    )
