"""The Verdict, its statuses and the check ids: the plain data every layer shares, at the bottom.

Nothing of ddpcheck is imported here (a check's typed evidence, :mod:`ddpcheck.evidence`, is named only for
type checkers), so the options, the results, the checks and the reports all read from below. A check's
judgement of one layout is a :class:`Verdict`; the report renders these and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from ddpcheck.evidence import Evidence

# --- check ids, in report column order: every report, the CLI and the plugin use these names ---------------

COVERAGE = "coverage"
NO_OVERLAP = "no_overlap"
PADDING_BOUND = "padding_bound"
EQUAL_STEPS = "equal_steps"
RESHUFFLE = "reshuffle"
DETERMINISM = "determinism"
BATCH_INTEGRITY = "batch_integrity"
WORKER_SHARDING = "worker_sharding"
SINGLE_PROCESS_EQUIVALENCE = "single_process_equivalence"
WORK_BALANCE = "work_balance"
PACKING = "packing"
MIXTURE = "mixture"
REPLICA_CONSISTENCY = "replica_consistency"
METRIC_EQUIVALENCE = "metric_equivalence"
TRAINING_EQUIVALENCE = "training_equivalence"
RESUME = "resume"
ELASTIC_RESUME = "elastic_resume"
# the training step (issue 35): what the step does with the data (ddpcheck run; supervision and
# rng_independence on loader files too, where data alone decides them)
STEP_EQUIVALENCE = "step_equivalence"
EQUAL_MICROSTEPS = "equal_microsteps"
SUPERVISION = "supervision"
RNG_INDEPENDENCE = "rng_independence"
SEQUENCE_SPLIT = "sequence_split"  # context-parallel slices reassemble each sequence once (issue 42)
STEP_CHECKS = (STEP_EQUIVALENCE, EQUAL_MICROSTEPS, SEQUENCE_SPLIT, SUPERVISION, RNG_INDEPENDENCE)
# RL prompt groups (issue 42): the copies of a prompt the single-process loader repeats stay one group in
# every step's gather (ddpcheck.checks.groups); a data check, judged wherever the loader is
PROMPT_GROUPS = "prompt_groups"

DATA_CHECKS = (
    COVERAGE,
    NO_OVERLAP,
    PADDING_BOUND,
    EQUAL_STEPS,
    RESHUFFLE,
    DETERMINISM,
    BATCH_INTEGRITY,
    WORKER_SHARDING,
    SINGLE_PROCESS_EQUIVALENCE,
    WORK_BALANCE,
    PACKING,
    MIXTURE,
    SUPERVISION,
    RNG_INDEPENDENCE,
    PROMPT_GROUPS,
)
# replica_consistency is judged per layout beside the data checks (ddpcheck.checks.replicas); the step's
# supervision and rng_independence are data checks too (loader files get them), judged from the step
# watcher's micro-steps and loop draws in a script (ddpcheck.checks.supervision, ddpcheck.checks.rng)
ALL_CHECKS = (
    *DATA_CHECKS[:4],
    REPLICA_CONSISTENCY,
    *DATA_CHECKS[4:],
    METRIC_EQUIVALENCE,
    TRAINING_EQUIVALENCE,
    STEP_EQUIVALENCE,
    EQUAL_MICROSTEPS,
    SEQUENCE_SPLIT,
    RESUME,
    ELASTIC_RESUME,
)

# Column labels for one-row-per-world-size tables, where full ids would not fit a terminal.
SHORT_LABELS = {
    COVERAGE: "cover",
    NO_OVERLAP: "overlap",
    PADDING_BOUND: "pad",
    EQUAL_STEPS: "steps",
    REPLICA_CONSISTENCY: "replica",
    RESHUFFLE: "shuffle",
    DETERMINISM: "determ",
    BATCH_INTEGRITY: "batches",
    WORKER_SHARDING: "workers",
    SINGLE_PROCESS_EQUIVALENCE: "1-proc",
    WORK_BALANCE: "work",
    PACKING: "packing",
    MIXTURE: "mixture",
    METRIC_EQUIVALENCE: "metric",
    TRAINING_EQUIVALENCE: "train",
    RESUME: "resume",
    ELASTIC_RESUME: "elastic",
    STEP_EQUIVALENCE: "step",
    EQUAL_MICROSTEPS: "micro",
    SEQUENCE_SPLIT: "seq",
    SUPERVISION: "superv",
    RNG_INDEPENDENCE: "rng",
    PROMPT_GROUPS: "groups",
}

# --- statuses ------------------------------------------------------------------------------------------

Status = Literal["pass", "fail", "skip", "n/a", "allowed"]
"""``skip``: could not be judged (a broken run, an option turned it off); ``n/a``: does not apply to
this loader (no workers, no custom batch sampler, no resume mechanism); ``allowed``: failed, and the
user declared that failure a design choice with ``--allow CHECK``."""
PASS: Status = "pass"
FAIL: Status = "fail"
SKIP: Status = "skip"
NOT_APPLICABLE: Status = "n/a"
ALLOWED: Status = "allowed"
STATUSES: tuple[Status, ...] = (PASS, FAIL, SKIP, NOT_APPLICABLE, ALLOWED)


@dataclass(frozen=True)
class Verdict:
    """``detail`` is one plain sentence a user can act on; ``cause`` names the likely bug and ``fix``
    says what to change (:mod:`ddpcheck.checks.fixes`).

    ``ranks``, ``epochs`` and ``examples`` carry the concrete evidence (a few ids, not all of them),
    so a report can say "rank 1 and rank 3 both see samples 17, 42". ``evidence``: what the check
    measured, typed (one small dataclass per kind, :mod:`ddpcheck.evidence`); reports read its
    attributes and the JSON report writes it as the verdict's ``data``.
    """

    check: str
    status: Status
    detail: str = ""
    cause: str = ""
    ranks: tuple[int, ...] = ()
    epochs: tuple[int, ...] = ()
    examples: tuple[object, ...] = ()
    evidence: Evidence | None = None
    fix: str = ""

    @property
    def failed(self) -> bool:
        return self.status == FAIL


def passed(check: str, detail: str = "") -> Verdict:
    return Verdict(check, PASS, detail)


def skipped(check: str, why: str) -> Verdict:
    return Verdict(check, SKIP, why)


def failed(
    check: str, detail: str, *, cause: str = "", ranks: tuple[int, ...] = (), epochs: tuple[int, ...] = ()
) -> Verdict:
    return Verdict(check, FAIL, detail, cause, ranks, epochs)


def not_applicable(check: str, why: str) -> Verdict:
    return Verdict(check, NOT_APPLICABLE, why)


def allow(verdict: Verdict) -> Verdict:
    """``verdict`` reported as ``allowed`` when it failed (``--allow CHECK``); any other status as is.

    The failure text stays, so the report still says what happened; only the exit code forgives it.
    """
    return replace(verdict, status=ALLOWED) if verdict.status == FAIL else verdict
