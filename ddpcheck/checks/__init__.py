"""The data checks: pure functions from recorded traces to Verdicts (no processes, no torch).

The registry, the shared context and ``run_checks`` resolve lazily: a front end that imports this package
imports no check and no numpy until it names one of them. The Verdict and the check ids are not here: they
live once, in :mod:`ddpcheck.verdict`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "REGISTRY": "ddpcheck.checks.registry",
    "Check": "ddpcheck.checks.registry",
    "run_checks": "ddpcheck.checks.registry",
    "Context": "ddpcheck.checks.context",
}

__all__ = ["REGISTRY", "Check", "Context", "run_checks"]

if TYPE_CHECKING:
    from ddpcheck.checks.context import Context
    from ddpcheck.checks.registry import REGISTRY, Check, run_checks


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ddpcheck.checks' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
