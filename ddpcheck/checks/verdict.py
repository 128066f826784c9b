"""The Verdict and its builders, where code written before they moved imports them from.

They live in :mod:`ddpcheck.verdict` (plain data at the bottom, importing nothing of ddpcheck) and the
typed evidence in :mod:`ddpcheck.evidence`; new code imports them from there.
"""

from __future__ import annotations

from ddpcheck.evidence import ComparedStep, StepEvidence
from ddpcheck.verdict import Status, Verdict, allow, failed, not_applicable, passed, skipped

__all__ = [
    "ComparedStep",
    "Status",
    "StepEvidence",
    "Verdict",
    "allow",
    "failed",
    "not_applicable",
    "passed",
    "skipped",
]
