"""The Verdict: one check's judgement on one world size. Reports render these and nothing else."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Literal

Status = Literal["pass", "fail", "skip", "n/a", "allowed"]
"""``skip``: could not be judged (a broken run, an option turned it off); ``n/a``: does not apply to
this loader (no workers, no custom batch sampler, no resume mechanism); ``allowed``: failed, and the
user declared that failure a design choice with ``--allow CHECK``."""


@dataclass(frozen=True)
class Verdict:
    """``detail`` is one plain sentence a user can act on; ``cause`` names the likely bug and ``fix``
    says what to change (:mod:`ddpcheck.checks.fixes`).

    ``ranks``, ``epochs`` and ``examples`` carry the concrete evidence (a few ids, not all of them),
    so a report can say "rank 1 and rank 3 both see samples 17, 42". ``evidence``: a check's typed
    evidence (:class:`StepEvidence`), which the reports read by attribute and the JSON report writes as
    the verdict's ``data``; ``data``: the untyped evidence of the checks not moved to a type yet.
    """

    check: str
    status: Status
    detail: str = ""
    cause: str = ""
    ranks: tuple[int, ...] = ()
    epochs: tuple[int, ...] = ()
    examples: tuple[object, ...] = ()
    data: dict[str, object] = field(default_factory=dict)
    fix: str = ""
    evidence: StepEvidence | MetricEvidence | None = None

    @property
    def failed(self) -> bool:
        return self.status == "fail"


@dataclass(frozen=True)
class ComparedStep:
    """One compared optimizer step: its index, the relative L2 difference of the DDP gradient from one
    process's (None: NaN), and per data-parallel rank its micro-batches, samples (-1: unknown) and
    supervised labels (None: the batches carry no labels)."""

    index: int
    rel: float | None
    micro: tuple[int, ...]
    samples: tuple[int, ...]
    supervised: tuple[int, ...] | None


@dataclass(frozen=True)
class StepEvidence:
    """What ``step_equivalence`` compared: the tolerance for the gradient's dtype, how the loss was scaled,
    and every compared step."""

    tolerance: float
    dtype: str
    loss_scale: str
    steps: tuple[ComparedStep, ...]

    def as_data(self) -> dict[str, object]:
        """As the JSON report writes a verdict's ``data``."""
        return asdict(self)


@dataclass(frozen=True)
class ComparedValue:
    """One value the script reported, at one process and at this layout: the evaluation (round) it came
    after, where it was read and its name, the single process's value and rank 0's, every rank's (None: that
    rank reported none), the printed precision (0.0 for a value read as a number), and whether they agree."""

    evaluation: int
    source: str
    name: str
    reference: float
    value: float
    ranks: tuple[float | None, ...]
    unit: float
    equal: bool


@dataclass(frozen=True)
class MetricEvidence:
    """What ``metric_equivalence`` compared on a script: the tolerance (relative and absolute float noise;
    printed values also one unit in their last digit), each compared evaluation in words (which loader,
    which epoch, on which weights), every compared value, and the eval loader's split at this layout (the
    samples each rank evaluated, the copies padding added, the samples dropped, the set's size)."""

    rel: float
    absolute: float
    evaluations: tuple[str, ...]
    values: tuple[ComparedValue, ...]
    shards: tuple[int, ...] = ()
    copies: int = 0
    dropped: int = 0
    set_size: int = 0

    def as_data(self) -> dict[str, object]:
        """As the JSON report writes a verdict's ``data``."""
        return asdict(self)


def passed(check: str, detail: str = "") -> Verdict:
    return Verdict(check, "pass", detail)


def skipped(check: str, why: str) -> Verdict:
    return Verdict(check, "skip", why)


def failed(
    check: str, detail: str, *, cause: str = "", ranks: tuple[int, ...] = (), epochs: tuple[int, ...] = ()
) -> Verdict:
    return Verdict(check, "fail", detail, cause, ranks, epochs)


def not_applicable(check: str, why: str) -> Verdict:
    return Verdict(check, "n/a", why)


def allow(verdict: Verdict) -> Verdict:
    """``verdict`` reported as ``allowed`` when it failed (``--allow CHECK``); any other status as is.

    The failure text stays, so the report still says what happened; only the exit code forgives it.
    """
    return replace(verdict, status="allowed") if verdict.status == "fail" else verdict
