"""The fingerprint's rule, written once: ``ddpcheck.record --fingerprint`` ranks print it in the launch
(:mod:`ddpcheck.checker.fingerprint` counts, this module decides), and ``ddpcheck judge DIR`` turns the
epochs the ranks wrote into coverage, no_overlap and padding_bound verdicts.

An epoch (:class:`EpochCheck`) holds what the ranks' summed fingerprint tables showed: how many ids were
yielded more than once (``extra``), which indices no rank yielded (``missing``), the ids outside the
dataset's indices and the ranks that received one stream. :func:`epoch_status` says whether that is every
index exactly once (pass), what a padding or drop_last sampler does by design (allowed), or a bug (fail);
:func:`fingerprint_verdicts` says the same per check over every epoch of a loader.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ddpcheck.evidence import FingerprintCopies, FingerprintCounts
from ddpcheck.messages import count_text
from ddpcheck.verdict import (
    COVERAGE,
    DATA_CHECKS,
    NO_OVERLAP,
    PADDING_BOUND,
    REPLICA_CONSISTENCY,
    Verdict,
    not_applicable,
)

JUDGED = (COVERAGE, NO_OVERLAP, PADDING_BOUND)
NOT_KEPT = (
    "not kept by a --fingerprint recording (a count and hashes of each rank's ids, no batches, no order): "
    "record without --fingerprint to judge it"
)
WHY_NOT = {
    REPLICA_CONSISTENCY: "a --fingerprint recording judges every rank as data-parallel (no mesh): ranks that "
    "received the same stream are named under no_overlap",
}


@dataclass
class EpochCheck:
    """One (loader, epoch) judged over the job: the counts the ranks filled in, and :func:`epoch_status`'s
    status and detail."""

    loader: str
    epoch: int
    ids: int = 0  # ids yielded by all ranks together
    dataset: int | None = None  # the indices' range, where the ids are the dataset's indices
    buckets_differing: int = 0
    extra: int = 0  # ids yielded more often than once (a lower bound where buckets mix both)
    missing: int = 0  # indices no rank yielded (a lower bound, likewise)
    twice: list[tuple[int, list[int]]] = field(default_factory=list)  # (id, ranks holding it)
    never: list[int] = field(default_factory=list)
    outside: list[int] = field(default_factory=list)  # ids that are no index of the dataset
    exact: bool = True  # the counts are exact (every differing bucket looked into), else lower bounds
    same_streams: list[list[int]] = field(default_factory=list)  # ranks that received one stream
    status: str = "pass"  # pass, allowed, fail, or n/a (ids that are not indices)
    detail: str = ""


@dataclass
class FingerprintReport:
    """The job's verdict every rank of a ``--fingerprint`` launch writes and rank 0 prints."""

    ranks: int
    seconds: float
    cpu_seconds: float  # this rank's
    state_bytes: int
    epochs: list[EpochCheck]

    @property
    def ok(self) -> bool:
        return all(e.status != "fail" for e in self.epochs)

    def lines(self) -> list[str]:
        head = (
            f"ddpcheck.record --fingerprint: {len(self.epochs)} epochs on {self.ranks} ranks checked in "
            f"{self.seconds:.2f} s ({self.cpu_seconds:.2f} s of CPU on rank 0; "
            f"{self.state_bytes / 1e6:.1f} MB of summary a rank)"
        )
        return [head, *(f"  {e.loader} epoch {e.epoch}: {e.status.upper()}: {e.detail}" for e in self.epochs)]


@dataclass(frozen=True)
class SamplerSays:
    """What the loader's sampler says it does at the epoch's end: pads to a multiple of the ranks, drops
    the tail, with batches of ``batch_size``."""

    padding: bool = False
    drop_last: bool = False
    batch_size: int | None = None


def epoch_status(check: EpochCheck, sampler: SamplerSays, world: int) -> tuple[str, str]:
    """(status, detail) of one epoch: pass: every index exactly once; allowed: the copies a padding
    sampler adds or the tail a drop_last one leaves (fewer than one a rank, or a batch a rank); fail:
    anything else; n/a: ids that are not the dataset's indices."""
    if check.dataset is None:
        return "n/a", f"{check.ids:,} ids that are not the dataset's indices: nothing to hold them against"
    if not check.buckets_differing:
        return "pass", f"every index of 0..{check.dataset - 1:,} yielded exactly once over {world} ranks"
    streams = "; ".join(
        f"ranks {', '.join(map(str, g))} received the same stream" for g in check.same_streams
    )
    parts = []
    if check.outside:
        parts.append(f"ids outside 0..{check.dataset - 1:,}: {', '.join(map(str, check.outside))}")
    least = _least(check)
    if check.extra:
        named = "; ".join(f"{x} on ranks {', '.join(map(str, rs))}" for x, rs in check.twice)
        parts.append(f"{least}{check.extra:,} extra copies" + (f" (e.g. {named})" if named else ""))
    if check.missing:
        shown = ", ".join(map(str, check.never))
        parts.append(
            f"{least}{check.missing:,} indices no rank yielded" + (f" (e.g. {shown})" if shown else "")
        )
    if streams:
        parts.append(streams)
    if not parts:
        parts.append(f"{check.buckets_differing} buckets hold other ids than the dataset's indices")
    step = max(sampler.batch_size or 1, 1)
    padding = sampler.padding and 0 < check.extra < world and not check.missing
    dropped = sampler.drop_last and not check.extra and 0 < check.missing < world * step
    clean = not check.outside and not streams
    status = "allowed" if clean and (padding or dropped) else "fail"
    if status == "allowed":
        parts.append("within what the sampler says it " + ("pads" if padding else "drops"))
    return status, "; ".join(parts)


def fingerprint_verdicts(checks: Sequence[EpochCheck], world: int) -> tuple[Verdict, ...]:
    """Every data check of one loader's fingerprinted epochs: coverage, no_overlap and padding_bound
    judged, the others n/a with why."""
    out = [_coverage(checks), _overlap(checks, world), _padding(checks, world)]
    for check in (*DATA_CHECKS[:4], REPLICA_CONSISTENCY, *DATA_CHECKS[4:]):
        if check not in JUDGED:
            out.append(not_applicable(check, WHY_NOT.get(check, NOT_KEPT)))
    return tuple(out)


def unjudged_note() -> str:
    """Which checks a fingerprint recording judges, and which it cannot."""
    others = [c for c in DATA_CHECKS if c not in JUDGED]
    return f"{', '.join(JUDGED)} are judged; {', '.join(others)} and {REPLICA_CONSISTENCY} are n/a"


def _unindexed(checks: Sequence[EpochCheck]) -> EpochCheck | None:
    return next((c for c in checks if c.dataset is None), None)


def _least(check: EpochCheck) -> str:
    return "" if check.exact else "at least "


def _coverage(checks: Sequence[EpochCheck]) -> Verdict:
    odd = _unindexed(checks)
    if odd is not None:
        return not_applicable(COVERAGE, f"epoch {odd.epoch}: {odd.detail}")
    bad = [c for c in checks if (c.missing and c.status == "fail") or c.outside]
    if not bad:
        dropped = [c for c in checks if c.missing]
        tail = (
            f"; {dropped[0].missing:,} indices left out in epoch {dropped[0].epoch}, within what the sampler "
            "drops (drop_last)"
            if dropped
            else ""
        )
        return Verdict(COVERAGE, "pass", f"every index of 0..{checks[0].dataset - 1:,} reached a rank in "  # type: ignore[operator]
                       f"{count_text(len(checks), 'epochs')}{tail}")  # fmt: skip
    first = bad[0]
    parts = []
    if first.outside:
        parts.append(
            f"ids outside the dataset's {first.dataset:,} indices in epoch {first.epoch}: "
            f"{', '.join(map(str, first.outside))}"
        )
    if first.missing:
        shown = f" (e.g. {', '.join(map(str, first.never))})" if first.never else ""
        parts.append(
            f"{_least(first)}{first.missing:,} indices no rank yielded in epoch {first.epoch}{shown}"
        )
    return Verdict(
        COVERAGE,
        "fail",
        "; ".join(parts),
        epochs=tuple(c.epoch for c in bad),
        examples=tuple(first.outside or first.never),
        evidence=FingerprintCounts(tuple(c.missing for c in bad), all(c.exact for c in bad)),
    )


def _overlap(checks: Sequence[EpochCheck], world: int) -> Verdict:
    odd = _unindexed(checks)
    if odd is not None:
        return not_applicable(NO_OVERLAP, f"epoch {odd.epoch}: {odd.detail}")
    bad = [c for c in checks if c.status == "fail" and (c.extra or c.same_streams)]
    if not bad:
        padded = [c for c in checks if c.extra]
        tail = f" beyond {padded[0].extra:,} padding copies the sampler adds" if padded else ""
        return Verdict(NO_OVERLAP, "pass", f"no sample reached two ranks{tail} ({world} ranks)")
    first = bad[0]
    parts = []
    if first.twice:
        named = "; ".join(f"sample {x} on ranks {', '.join(map(str, rs))}" for x, rs in first.twice)
        parts.append(f"in epoch {first.epoch}: {named}")
    if first.extra:
        parts.append(f"{_least(first)}{first.extra:,} extra copies")
    parts.extend(f"ranks {', '.join(map(str, g))} received the same stream" for g in first.same_streams)
    ranks = sorted({r for _, rs in first.twice for r in rs} | {r for g in first.same_streams for r in g})
    return Verdict(
        NO_OVERLAP,
        "fail",
        "; ".join(parts),
        ranks=tuple(ranks),
        epochs=tuple(c.epoch for c in bad),
        examples=tuple(x for x, _ in first.twice),
        evidence=FingerprintCopies(tuple(c.extra for c in bad), all(c.exact for c in bad)),
    )


def _padding(checks: Sequence[EpochCheck], world: int) -> Verdict:
    odd = _unindexed(checks)
    if odd is not None:
        return not_applicable(PADDING_BOUND, f"epoch {odd.epoch}: {odd.detail}")
    padded = [c for c in checks if c.extra and c.status == "allowed"]
    over = [c for c in checks if c.extra and c.status == "fail"]
    if over:
        c = over[0]
        return Verdict(PADDING_BOUND, "fail", f"{_least(c)}{c.extra:,} extra copies in epoch {c.epoch}, more "
                       f"than the padding a sampler adds over {world} ranks (fewer than one a rank)",
                       epochs=tuple(x.epoch for x in over))  # fmt: skip
    if padded:
        return Verdict(PADDING_BOUND, "pass", f"{padded[0].extra:,} padding copies, fewer than one a rank")
    return Verdict(PADDING_BOUND, "pass", "no padding copies")
