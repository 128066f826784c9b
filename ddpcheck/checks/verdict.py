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
    evidence (:class:`StepEvidence`, :class:`GroupEvidence`), which the reports read by attribute and
    the JSON report writes as the verdict's ``data``; ``data``: the untyped evidence of the checks not
    moved to a type yet.
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
    evidence: StepEvidence | GroupEvidence | None = None

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
class GroupEvidence:
    """What ``prompt_groups`` judged: the group size the single-process loader repeats each sample, the
    steps (batch positions) judged, those holding a broken group, and those whose groups are split
    across ranks (whole in the gather)."""

    size: int
    steps: int
    broken: int
    split: int

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
