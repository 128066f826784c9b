"""A script's launch read back: each rank's trace file, and why a rank has none (it failed, hung, waited
in a collective for a rank that did, or was stopped after another failed).

A launch started here (:func:`read_launch`, from what :mod:`ddpcheck.launch.script` watched) and a launch
recorded elsewhere (:func:`read_trace_dir`, ``ddpcheck judge DIR``) become the same plain
:class:`~ddpcheck.recorded.Recorded`, which the judge reads.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ddpcheck.launch.script import ScriptLaunch, ScriptRank, output_tail
from ddpcheck.launch.userfiles import is_user_file, shown_path
from ddpcheck.launch.watchdog import Silence, overtime_message, stall_message
from ddpcheck.layout import Layout
from ddpcheck.messages import one_line
from ddpcheck.options import BadInput
from ddpcheck.recorded import Recorded
from ddpcheck.trace import RankFailure, ScriptRankTrace
from ddpcheck.tracefile import BadTraceFile, read_rank
from ddpcheck.wire.files import TRACE_GLOB, trace_path


def read_launch(launch: ScriptLaunch, layout: Layout) -> Recorded:
    """Each rank's trace file, and a failure for every rank that has none or failed."""
    traces: dict[int, ScriptRankTrace] = {}
    failures: list[RankFailure] = []
    hung = [e for e in launch.ranks if e.hung]
    # a rank whose stack shows it in a collective waits for the others, unless every hung rank does
    waiting = (
        {e.rank for e in hung if _in_collective(e.stacks)}
        if any(not _in_collective(e.stacks) for e in hung)
        else set()
    )
    for entry in launch.ranks:
        trace = _read_trace(trace_path(launch.out, entry.rank))
        if trace is not None:
            traces[entry.rank] = trace
        if entry.waited or entry.rank in waiting:
            failures.append(
                RankFailure(
                    entry.rank,
                    "secondary",
                    f"rank {entry.rank} waited for the other ranks ({_causes(hung, waiting)} hung)",
                    entry.stacks or entry.output,
                    entry.progress,
                )
            )
        elif entry.hung or entry.overtime:
            failures.append(_stopped(entry, launch))
        elif trace is not None and trace.status != "ok":
            failures.append(RankFailure(entry.rank, "error", trace.message, trace.stack))
        elif trace is None and entry.killed_after_failure:
            failures.append(
                RankFailure(
                    entry.rank,
                    "secondary",
                    f"rank {entry.rank} was stopped after another rank failed",
                    entry.stacks or entry.output,
                )
            )
        elif trace is None:
            code = entry.returncode
            why = f"killed by signal {-code}" if code is not None and code < 0 else f"exited with {code}"
            failures.append(
                RankFailure(
                    entry.rank,
                    "killed" if code and code < 0 else "error",
                    f"rank {entry.rank} {why} before writing its trace: {_last_line(entry.output)}",
                    entry.output,
                )
            )
    outputs = {entry.rank: output_tail(entry.output) for entry in launch.ranks}
    printed = {entry.rank: entry.output for entry in launch.ranks}  # shown whole as the stack already
    failures = [f if f.stack == printed[f.rank] else replace(f, output=outputs[f.rank]) for f in failures]
    return Recorded(layout, traces, tuple(failures), launch.seconds, outputs=outputs)


def _stopped(entry: ScriptRank, launch: ScriptLaunch) -> RankFailure:
    """A rank that made no progress for the timeout (hang), or ran past ``max_time`` (overtime)."""
    silence = entry.silence or Silence(0.0, 0.0)
    if entry.overtime:
        kind, what = "overtime", f"was {overtime_message(launch.max_time or 0.0, silence)}"
    else:
        kind, what = "hang", f"made {stall_message(silence, launch.timeout)}"
    return RankFailure(
        entry.rank,
        kind,
        f"rank {entry.rank} {what}{_where(entry.stacks)}",
        entry.stacks or entry.output,
        entry.progress,
    )


def _causes(hung: list[ScriptRank], waiting: set[int]) -> str:
    ranks = [e.rank for e in hung if e.rank not in waiting]
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}" if ranks else "a rank"


COLLECTIVE_FILES = ("distributed_c10d.py", "c10d_logger.py")


def _in_collective(stacks: str) -> bool:
    """The main thread's innermost frames are torch.distributed's: it waits for the other ranks."""
    head = stacks.split("\n\n", 1)[0].splitlines()[1:3]
    return any(name in line for line in head for name in COLLECTIVE_FILES)


def _where(stacks: str) -> str:
    """``, in train.py line 17`` where the stack names a line of the user's code, else ""; and what
    ddpcheck was doing there when it was draining an epoch that never ended."""
    main = stacks.split("\n\n", 1)[0]
    draining = " in _drain" in main or " in drain_rest" in main
    suffix = (
        ": an epoch of its loader has not ended (an endless loader? judge it in windows with --steps N)"
        if draining
        else ""
    )
    for line in main.splitlines()[1:]:
        parts = line.strip().split('"')
        if len(parts) >= 3 and parts[0] == "File " and is_user_file(parts[1]):
            return (
                f", in {shown_path(parts[1])}{parts[2].split(' in ')[0].replace(', line', ' line')}{suffix}"
            )
    return suffix


def _last_line(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    return one_line(lines[-1], 300) if lines else "no output"


def _read_trace(path: str, *, untrusted: bool = False) -> ScriptRankTrace | None:
    """A rank's trace file (its ids left on disk); ``untrusted`` (a directory given to ``ddpcheck judge``):
    plain data only. None for a file that is no trace of this version or names ids files that do not
    match it."""
    try:
        return read_rank(path, untrusted=untrusted)
    except BadTraceFile:
        return None


def read_trace_dir(directory: str | Path, layout: Layout | None = None) -> Recorded:
    """The trace files of one recorded launch (``python -m ddpcheck.record --out DIR``)."""
    folder = Path(directory)
    if not folder.is_dir():
        raise BadInput(f"no such directory: {directory}")
    traces: dict[int, ScriptRankTrace] = {}
    paths: dict[int, Path] = {}
    for path in sorted(folder.glob(TRACE_GLOB)):
        trace = _read_trace(str(path), untrusted=True)
        if trace is None:
            raise BadInput(f"{path} is not a ddpcheck trace of this version (record it again)")
        if trace.rank in paths:  # a stale copy beside the launch: keeping either one would be a guess
            raise BadInput(
                f"{paths[trace.rank]} and {path} both hold rank {trace.rank}: one launch per directory"
            )
        traces[trace.rank], paths[trace.rank] = trace, path
    if not traces:
        raise BadInput(
            f"{directory} holds no trace files ({TRACE_GLOB}): record with python -m ddpcheck.record"
        )
    sizes = {t.world_size for t in traces.values()}
    if len(sizes) != 1:
        raise BadInput(f"{directory} mixes launches of world sizes {sorted(sizes)}: one launch per directory")
    world_size = sizes.pop()
    layout = layout or Layout.plain(world_size)
    if layout.world_size != world_size:
        raise BadInput(
            f"mesh {layout.spec} has {layout.world_size} ranks, but {directory} holds a launch of "
            f"{world_size}"
        )
    failures = tuple(
        RankFailure(t.rank, "error", t.message, t.stack) for t in traces.values() if t.status != "ok"
    )
    missing = [r for r in range(world_size) if r not in traces]
    failures += tuple(RankFailure(r, "error", f"rank {r} wrote no trace file") for r in missing)
    return Recorded(layout, traces, failures)
