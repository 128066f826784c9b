"""``ddpcheck judge DIR`` on a launch recorded with ``python -m ddpcheck.record --fingerprint``.

Such a launch writes no ids: its ranks proved coverage and overlap among themselves from fingerprint
tables (:mod:`ddpcheck.checker.fingerprint`) and each wrote the job's verdict to
``fingerprint-rankR.json``. Judging the directory turns those verdicts into the usual report (one row
group per loader), with the exit code of the verdict, and says which checks such a recording cannot
judge and why, instead of failing to find trace files or passing in silence.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

from ddpcheck.checker.fingerprint import REPORT_GLOB, EpochCheck
from ddpcheck.checks.ids import (
    COVERAGE,
    DATA_CHECKS,
    NO_OVERLAP,
    PADDING_BOUND,
    REPLICA_CONSISTENCY,
)
from ddpcheck.checks.verdict import Verdict, not_applicable
from ddpcheck.layout import Layout
from ddpcheck.messages import count_text
from ddpcheck.options import BadInput, CheckOptions
from ddpcheck.result import CheckResult, WorldResult
from ddpcheck.session.run import jsonable_options
from ddpcheck.tracefile import TRACE_GLOB

JUDGED = (COVERAGE, NO_OVERLAP, PADDING_BOUND)
NOT_KEPT = (
    "not kept by a --fingerprint recording (a count and hashes of each rank's ids, no batches, no order): "
    "record without --fingerprint to judge it"
)
WHY_NOT = {
    REPLICA_CONSISTENCY: "a --fingerprint recording judges every rank as data-parallel (no mesh): ranks that "
    "received the same stream are named under no_overlap",
}


def is_fingerprinted(directory: str | Path) -> bool:
    """A directory holding fingerprint verdicts and no trace files."""
    folder = Path(directory)
    return folder.is_dir() and any(folder.glob(REPORT_GLOB)) and not any(folder.glob(TRACE_GLOB))


def judge_fingerprinted(
    directory: str | Path,
    options: CheckOptions,
    *,
    reference: str | Path | None = None,
    replay: str | Path | None = None,
    layout: Layout | None = None,
) -> CheckResult:
    """The report of a ``--fingerprint`` launch, from the verdict its ranks wrote."""
    for flag, given in (("--reference", reference), ("--replay", replay)):
        if given is not None:
            raise BadInput(f"{flag}: {directory} was recorded with --fingerprint and holds no ids to compare")
    world, checks = _read(Path(directory))
    if layout is not None and layout.world_size != world:
        raise BadInput(
            f"mesh {layout.spec} has {layout.world_size} ranks, but {directory} holds a launch of {world}"
        )
    if layout is not None and layout.dp_world_size != world:
        raise BadInput(
            "a --fingerprint recording judges every rank as data-parallel: judge it without --mesh"
        )
    plain = Layout.plain(world)
    runs = []
    for loader in dict.fromkeys(c.loader for c in checks):
        mine = [c for c in checks if c.loader == loader]
        runs.append(WorldResult(world, "recorded", _verdicts(mine, world), layout=plain, loader=loader))
    notes = [
        f"judged from the fingerprint tables the {world} ranks exchanged inside the launch "
        "(ddpcheck.record --fingerprint): " + _unjudged_note()
    ]
    if not checks:
        notes.append("the ranks recorded no epoch of integer ids that every rank has: nothing was judged")
    return CheckResult(
        loader=str(directory),
        runs=tuple(runs),
        epochs=options.epochs,
        options={**jsonable_options(options), "judged": str(directory), "fingerprint": True},
        notes=tuple(notes),
    )


def _unjudged_note() -> str:
    others = [c for c in DATA_CHECKS if c not in JUDGED]
    return f"{', '.join(JUDGED)} are judged; {', '.join(others)} and {REPLICA_CONSISTENCY} are n/a"


def _read(folder: Path) -> tuple[int, list[EpochCheck]]:
    """(world size, epoch checks) from the lowest rank's verdict file (every rank writes the same one)."""
    known = {f.name for f in fields(EpochCheck)}
    for path in sorted(folder.glob(REPORT_GLOB), key=lambda p: (len(p.name), p.name)):
        try:
            data = json.loads(path.read_text())
            world = int(data["ranks"])
            checks = [EpochCheck(**{k: v for k, v in e.items() if k in known}) for e in data["epochs"]]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BadInput(f"{path} is not a verdict of ddpcheck.record --fingerprint ({exc})") from None
        if world < 1:
            raise BadInput(f"{path} says the launch had {world} ranks")
        return world, checks
    raise BadInput(f"{folder} holds no fingerprint verdicts (fingerprint-rank*.json)")


def _verdicts(checks: Sequence[EpochCheck], world: int) -> tuple[Verdict, ...]:
    out = [_coverage(checks), _overlap(checks, world), _padding(checks, world)]
    for check in (*DATA_CHECKS[:4], REPLICA_CONSISTENCY, *DATA_CHECKS[4:]):
        if check not in JUDGED:
            out.append(not_applicable(check, WHY_NOT.get(check, NOT_KEPT)))
    return tuple(out)


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
        data={"missing": [c.missing for c in bad], "exact": all(c.exact for c in bad)},
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
        data={"extra": [c.extra for c in bad], "exact": all(c.exact for c in bad)},
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
