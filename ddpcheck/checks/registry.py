"""Check id -> check function, and ``run_checks``, which runs them in report order on one shared view."""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

from ddpcheck.checks.batches import check_batch_integrity
from ddpcheck.checks.context import Context
from ddpcheck.checks.coverage import check_coverage
from ddpcheck.checks.determinism import check_determinism
from ddpcheck.checks.equivalence import check_single_process_equivalence
from ddpcheck.checks.fixes import with_fix
from ddpcheck.checks.groups import check_prompt_groups
from ddpcheck.checks.mixture import check_mixture
from ddpcheck.checks.overlap import check_no_overlap, check_padding_bound
from ddpcheck.checks.reshuffle import check_reshuffle
from ddpcheck.checks.rng import check_rng_independence_run
from ddpcheck.checks.steps import check_equal_steps
from ddpcheck.checks.supervision import check_supervision
from ddpcheck.checks.work import check_packing, check_work_balance
from ddpcheck.checks.workers import check_worker_sharding
from ddpcheck.trace import RunTrace
from ddpcheck.verdict import (
    ALL_CHECKS,
    BATCH_INTEGRITY,
    COVERAGE,
    DATA_CHECKS,
    DETERMINISM,
    EQUAL_STEPS,
    MIXTURE,
    NO_OVERLAP,
    PACKING,
    PADDING_BOUND,
    PROMPT_GROUPS,
    RESHUFFLE,
    RNG_INDEPENDENCE,
    SINGLE_PROCESS_EQUIVALENCE,
    SUPERVISION,
    WORK_BALANCE,
    WORKER_SHARDING,
    Verdict,
)


class Check(Protocol):
    """A pure judgement of one run against the single-process reference (and an optional rerun).

    ``ctx`` lets ``run_checks`` hand every check the same cached sets; called alone, a check builds its own.
    """

    def __call__(
        self, reference: RunTrace, run: RunTrace, rerun: RunTrace | None = None, *, ctx: Context | None = None
    ) -> Verdict: ...


REGISTRY: dict[str, Check] = {
    COVERAGE: check_coverage,
    NO_OVERLAP: check_no_overlap,
    PADDING_BOUND: check_padding_bound,
    EQUAL_STEPS: check_equal_steps,
    RESHUFFLE: check_reshuffle,
    DETERMINISM: check_determinism,
    BATCH_INTEGRITY: check_batch_integrity,
    WORKER_SHARDING: check_worker_sharding,
    SINGLE_PROCESS_EQUIVALENCE: check_single_process_equivalence,
    WORK_BALANCE: check_work_balance,
    PACKING: check_packing,
    MIXTURE: check_mixture,
    SUPERVISION: check_supervision,
    RNG_INDEPENDENCE: check_rng_independence_run,
    PROMPT_GROUPS: check_prompt_groups,
}
assert tuple(REGISTRY) == DATA_CHECKS


def _selected(only: Collection[str] | None) -> tuple[str, ...]:
    if only is None:
        return DATA_CHECKS
    if isinstance(only, str):
        raise TypeError(
            f"only must be a collection of check ids, not the string {only!r}; use only=[{only!r}]"
        )
    unknown = sorted(set(only) - set(ALL_CHECKS))
    if unknown:
        raise ValueError(
            f"unknown check id(s) {', '.join(map(repr, unknown))}; choose from {', '.join(ALL_CHECKS)}"
        )
    return tuple(c for c in DATA_CHECKS if c in only)


def run_checks(
    reference: RunTrace,
    run: RunTrace,
    rerun: RunTrace | None = None,
    *,
    only: Collection[str] | None = None,
) -> list[Verdict]:
    """One Verdict per data check, in ``DATA_CHECKS`` order (``only`` narrows the set).

    ``reference`` is the single-process run of the same loader factory; ``rerun`` a second run of
    ``run``'s world size with the same seed (``None``: determinism is skipped). Metric and training
    ids in ``only`` are accepted and ignored here: those checks run elsewhere.
    """
    selected = _selected(only)
    ctx = Context(reference, run, rerun)
    return [with_fix(REGISTRY[check](reference, run, rerun, ctx=ctx)) for check in selected]
