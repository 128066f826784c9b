"""Process groups: start ranks, rendezvous on loopback, deadlines, collect results, leave nothing behind.

The names below resolve lazily, so a light module of this package (:mod:`ddpcheck.launch.workdir`, which
a rank enters before anything starts a thread) can be imported without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "GroupCall": "ddpcheck.launch.group",
    "GroupResult": "ddpcheck.launch.group",
    "ProgressCallback": "ddpcheck.launch.group",
    "RankOutcome": "ddpcheck.launch.group",
    "StartedGroups": "ddpcheck.launch.group",
    "default_start_method": "ddpcheck.launch.group",
    "run_groups": "ddpcheck.launch.group",
    "run_ranks": "ddpcheck.launch.group",
    "started_groups": "ddpcheck.launch.group",
    "report_progress": "ddpcheck.launch.beats",
    "shared_tmp": "ddpcheck.launch.rank",
    "TargetRef": "ddpcheck.launch.target",
}

__all__ = list(_EXPORTS)

if TYPE_CHECKING:
    from ddpcheck.launch.beats import report_progress
    from ddpcheck.launch.group import (
        GroupCall,
        GroupResult,
        ProgressCallback,
        RankOutcome,
        StartedGroups,
        default_start_method,
        run_groups,
        run_ranks,
        started_groups,
    )
    from ddpcheck.launch.rank import shared_tmp
    from ddpcheck.launch.target import TargetRef


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ddpcheck.launch' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
