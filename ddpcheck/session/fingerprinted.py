"""``ddpcheck judge DIR`` on a launch recorded with ``python -m ddpcheck.record --fingerprint``.

Such a launch writes no ids: its ranks exchanged fingerprint tables among themselves
(:mod:`ddpcheck.checker.fingerprint`) and each wrote the epochs they counted to
``fingerprint-rankR.json``. This reads them back and the judge (:mod:`ddpcheck.checks.judge`, with the
rule of :mod:`ddpcheck.checks.fingerprint`) turns them into the usual report (one row group per loader),
with the exit code of the verdict, saying which checks such a recording cannot judge and why, instead of
failing to find trace files or passing in silence.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

from ddpcheck.checks.fingerprint import EpochCheck, unjudged_note
from ddpcheck.checks.judge import Launch, LoaderRecord, Rules, judge
from ddpcheck.layout import Layout
from ddpcheck.options import BadInput, CheckOptions
from ddpcheck.result import CheckResult, RunRecord, WorldResult
from ddpcheck.wire.files import FINGERPRINT_GLOB, TRACE_GLOB, fingerprint_paths


def is_fingerprinted(directory: str | Path) -> bool:
    """A directory holding fingerprint verdicts and no trace files."""
    folder = Path(directory)
    return folder.is_dir() and bool(fingerprint_paths(folder)) and not any(folder.glob(TRACE_GLOB))


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
    loaders = tuple(
        LoaderRecord(loader, fingerprints=tuple(c for c in checks if c.loader == loader))
        for loader in dict.fromkeys(c.loader for c in checks)
    )
    runs = [
        WorldResult(world, "recorded", judged.verdicts, layout=plain, loader=judged.loader)
        for judged in judge(Launch(plain, loaders), Rules.of(options))
    ]
    notes = [
        f"judged from the fingerprint tables the {world} ranks exchanged inside the launch "
        "(ddpcheck.record --fingerprint): " + unjudged_note()
    ]
    if not checks:
        notes.append("the ranks recorded no epoch of integer ids that every rank has: nothing was judged")
    return CheckResult(
        loader=str(directory),
        runs=tuple(runs),
        epochs=options.epochs,
        options=RunRecord(options, judged=str(directory), fingerprint=True),
        notes=tuple(notes),
    )


def _read(folder: Path) -> tuple[int, list[EpochCheck]]:
    """(world size, epoch checks) from the lowest rank's verdict file (every rank writes the same one)."""
    known = {f.name for f in fields(EpochCheck)}
    for path in fingerprint_paths(folder):
        try:
            data = json.loads(path.read_text())
            world = int(data["ranks"])
            checks = [EpochCheck(**{k: v for k, v in e.items() if k in known}) for e in data["epochs"]]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BadInput(f"{path} is not a verdict of ddpcheck.record --fingerprint ({exc})") from None
        if world < 1:
            raise BadInput(f"{path} says the launch had {world} ranks")
        return world, checks
    raise BadInput(f"{folder} holds no fingerprint verdicts ({FINGERPRINT_GLOB})")
