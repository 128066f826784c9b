"""Process groups: start ranks, rendezvous on loopback, deadlines, collect results, leave nothing behind."""

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
from ddpcheck.launch.rank import report_progress, shared_tmp
from ddpcheck.launch.target import TargetRef

__all__ = [
    "GroupCall",
    "GroupResult",
    "ProgressCallback",
    "RankOutcome",
    "StartedGroups",
    "TargetRef",
    "default_start_method",
    "report_progress",
    "run_groups",
    "run_ranks",
    "shared_tmp",
    "started_groups",
]
