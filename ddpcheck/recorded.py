"""A script's launch as the judge reads it: each rank's trace, and why a rank has none (plain data).

:mod:`ddpcheck.launch.recorded` reads a launch started here or recorded elsewhere into a :class:`Recorded`;
the judge (:mod:`ddpcheck.checks.judge`) and the session read it; :func:`launch_problem` says why nothing
of one can be judged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ddpcheck.layout import Layout
from ddpcheck.trace import RankFailure, ScriptRankTrace


@dataclass
class Recorded:
    """One launch read back: each rank's trace, or why there is none."""

    layout: Layout
    traces: dict[int, ScriptRankTrace]
    failures: tuple[RankFailure, ...]
    seconds: float = 0.0
    environment: dict[str, str] = field(default_factory=dict)  # what ddpcheck set for the ranks
    outputs: dict[int, str] = field(default_factory=dict)  # the last lines each rank printed
    out: str = ""  # the launch's trace directory (a replay reads its saved steps there)


def launch_problem(recorded: Recorded) -> str:
    """Why nothing of this launch can be judged ("" when it can)."""
    if recorded.failures:
        first = min(recorded.failures, key=lambda f: (f.kind == "secondary", f.rank))
        return first.message
    fallbacks = {t.fallback for t in recorded.traces.values() if t.fallback}
    if fallbacks:
        return sorted(fallbacks)[0]
    if not any(t.loaders or t.sources for t in recorded.traces.values()):
        return "the script iterated no DataLoader"
    return ""


def launch_failure(message: str, recorded: Recorded | None = None) -> RankFailure:
    """The launch's one failure (no rank failed, yet nothing can be judged), with what rank 0 printed."""
    return RankFailure(0, "error", message, output=recorded.outputs.get(0, "") if recorded else "")
