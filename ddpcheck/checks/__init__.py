"""The data checks: pure functions from recorded traces to Verdicts (no processes, no torch).

The registry, the shared context and ``run_checks`` resolve lazily: a front end that only wants a plain
type (``ddpcheck.verdict.Verdict``, a check id) imports this package
without importing every check and numpy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "REGISTRY": "ddpcheck.checks.registry",
    "Check": "ddpcheck.checks.registry",
    "run_checks": "ddpcheck.checks.registry",
    "Context": "ddpcheck.checks.context",
    "Verdict": "ddpcheck.verdict",
}

__all__ = ["REGISTRY", "Check", "Context", "Verdict", "run_checks"]

if TYPE_CHECKING:
    from ddpcheck.checks.context import Context
    from ddpcheck.checks.registry import REGISTRY, Check, run_checks
    from ddpcheck.verdict import Verdict


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ddpcheck.checks' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
