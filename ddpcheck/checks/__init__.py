"""The data checks: pure functions from recorded traces to Verdicts (no processes, no torch)."""

from ddpcheck.checks.context import Context
from ddpcheck.checks.registry import REGISTRY, Check, run_checks
from ddpcheck.checks.verdict import Verdict

__all__ = ["REGISTRY", "Check", "Context", "Verdict", "run_checks"]
