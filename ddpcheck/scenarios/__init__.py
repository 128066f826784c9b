"""Checks that need their own rank-side runs, behind one protocol (:mod:`ddpcheck.scenarios.protocol`).

``metric`` (metric equivalence), ``training`` (training equivalence) and ``resume`` (mid-epoch and
elastic resume). :func:`build` is all the session knows of them.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from ddpcheck.scenarios.protocol import DataRun, Outcome, Scenario, rank_failures

if TYPE_CHECKING:
    from ddpcheck.checker.loaderfile import LoaderSpec
    from ddpcheck.options import CheckOptions

# module: its scenario class, whose ``maybe`` builds one or returns None; imported only when a run is built
REGISTERED = (
    ("ddpcheck.scenarios.metric", "MetricEquivalence"),
    ("ddpcheck.scenarios.training", "TrainingEquivalence"),
    ("ddpcheck.scenarios.resume", "ResumeCheck"),
)


def build(spec: LoaderSpec, options: CheckOptions, names: frozenset[str]) -> list[Scenario]:
    """Every registered scenario the file and options ask for (nothing runs here)."""
    found = []
    for module, name in REGISTERED:
        scenario = getattr(import_module(module), name).maybe(spec, options, names)
        if scenario is not None:
            found.append(scenario)
    return found


__all__ = ["DataRun", "Outcome", "Scenario", "build", "rank_failures"]
