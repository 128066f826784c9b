"""The Verdict: one check's judgement on one world size. Reports render these and nothing else."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
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
    so a report can say "rank 1 and rank 3 both see samples 17, 42".
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

    @property
    def failed(self) -> bool:
        return self.status == "fail"


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
