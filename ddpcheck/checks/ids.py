"""Check ids, where code written before they moved imports them from: they live in
:mod:`ddpcheck.verdict` (plain data at the bottom, importing nothing of ddpcheck); new code imports them
from there.
"""

from __future__ import annotations

from ddpcheck.verdict import (
    ALL_CHECKS,
    BATCH_INTEGRITY,
    COVERAGE,
    DATA_CHECKS,
    DETERMINISM,
    ELASTIC_RESUME,
    EQUAL_MICROSTEPS,
    EQUAL_STEPS,
    METRIC_EQUIVALENCE,
    MIXTURE,
    NO_OVERLAP,
    PACKING,
    PADDING_BOUND,
    REPLICA_CONSISTENCY,
    RESHUFFLE,
    RESUME,
    RNG_INDEPENDENCE,
    SEQUENCE_SPLIT,
    SHORT_LABELS,
    SINGLE_PROCESS_EQUIVALENCE,
    STEP_CHECKS,
    STEP_EQUIVALENCE,
    SUPERVISION,
    TRAINING_EQUIVALENCE,
    WORK_BALANCE,
    WORKER_SHARDING,
)

__all__ = [
    "ALL_CHECKS",
    "BATCH_INTEGRITY",
    "COVERAGE",
    "DATA_CHECKS",
    "DETERMINISM",
    "ELASTIC_RESUME",
    "EQUAL_MICROSTEPS",
    "EQUAL_STEPS",
    "METRIC_EQUIVALENCE",
    "MIXTURE",
    "NO_OVERLAP",
    "PACKING",
    "PADDING_BOUND",
    "REPLICA_CONSISTENCY",
    "RESHUFFLE",
    "RESUME",
    "RNG_INDEPENDENCE",
    "SEQUENCE_SPLIT",
    "SHORT_LABELS",
    "SINGLE_PROCESS_EQUIVALENCE",
    "STEP_CHECKS",
    "STEP_EQUIVALENCE",
    "SUPERVISION",
    "TRAINING_EQUIVALENCE",
    "WORKER_SHARDING",
    "WORK_BALANCE",
]
