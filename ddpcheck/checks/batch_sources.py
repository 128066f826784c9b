"""Judging batches that come from no DataLoader (``ddpcheck run --batches NAME``; a pure function of traces).

A batch function has no epochs, sampler or workers: its windows of calls are the epochs, and what
applies of the data checks is judged from the rows each call returned (:class:`~ddpcheck.trace.SourceTrace`):

- identity is content: integer rows (tokens) are cut into units of the longest length that divides every
  row at every world size compared (a rank's 128-token slice is one unit, the single process's 256-token
  step two), so the same tokens are the same units wherever they were read; other rows by a digest each;
- the single-process run says what the source is: rows whose shifted targets (``y = x[1:]``) end where the
  next row begins read a stream in order (slicing: modded-nanogpt's generator, build-nanogpt's
  ``next_batch``); rows that do not are drawn at random (sampling with replacement: nanoGPT's
  ``get_batch``); without shifted targets it is not known;
- ``no_overlap``: within a window, units read by more than one rank (a tolerance of 2% or one unit for
  chance draws); every rank handed the same batch at a call is the seed or the rank left out;
- ``coverage`` (a stream only): a window's units over all ranks against the single-process stream's next
  units of the same number, less one call a rank (a rank that moves to the next shard a round early,
  as ``DataLoaderLite`` does, skips its shard's last round: the measured truth); sampling has none to prove;
- ``equal_steps``: every rank calls it as often; ``determinism``: a rerun hands every rank the same units.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise
from math import gcd
from typing import Any

from ddpcheck.layout import Layout
from ddpcheck.trace import ScriptRankTrace, SourceTrace
from ddpcheck.verdict import (
    COVERAGE,
    DATA_CHECKS,
    DETERMINISM,
    EQUAL_STEPS,
    NO_OVERLAP,
    Verdict,
    failed,
    not_applicable,
    passed,
    skipped,
)

MIN_UNIT = 8  # tokens: a shorter common unit would call any repeated phrase a shared read
SHARED_SHARE = 50  # no_overlap tolerates one unit in this many (chance draws of a sampler), and one
STREAM_SHARE = 0.5  # of the single process's consecutive rows that follow one another: a stream
NO_DATALOADER = "no DataLoader was iterated (nothing was checked)"
SAMPLING = "sampling"
STREAM = "stream"
UNKNOWN = "unknown"


# --- a clean run that recorded nothing ------------------------------------------------------------------


def nothing_iterated(traces: Sequence[ScriptRankTrace], printed: str, batches: str = "") -> str:
    """The one line for a launch whose ranks all ran to their end without iterating a DataLoader (nor
    calling the ``--batches`` function with gradients on): bad input, nothing to check, and where the
    model's inputs came from; "" when something was recorded or a rank did not end cleanly."""
    if not traces or any(t.loaders or t.sources or t.status != "ok" or t.fallback for t in traces):
        return ""
    first = min(traces, key=lambda t: t.rank)
    to_record = "pass --batches NAME to record the function that returns its batches (a name in the script, "
    to_record += "or module:qualname)"
    if batches:
        seen = f"; the model's first inputs came from {first.inputs_from}" if first.inputs_from else ""
        return (
            f"--batches {batches}: the script never called a function of that name defined in its own files "
            f"with gradients on{seen} (nothing was checked)"
        )
    if first.inputs_from:
        return (
            f"{NO_DATALOADER}: the model's first inputs came from {first.inputs_from}, at "
            f"{first.first_model_call}; pass --batches {first.inputs_from} to record the batches it returns"
        )
    if first.first_model_call:
        return f"{NO_DATALOADER}: the model's first inputs came from {first.first_model_call}; {to_record}"
    lines = [line.strip() for line in printed.splitlines() if line.strip()]
    last = f"; rank 0's last line: {lines[-1][:200]}" if lines else ""
    return f"{NO_DATALOADER} and no model was called{last}; {to_record}"


# --- units ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankUnits:
    """One rank's calls of a source as units: per call, the unit ids (int64 arrays)."""

    rank: int
    calls: list[Any]  # numpy int64 arrays
    window: int

    def windows(self) -> int:
        return -(-len(self.calls) // self.window) if self.window else 0

    def window_units(self, window: int) -> list[Any]:
        return self.calls[window * self.window : (window + 1) * self.window]


def unit_size(traces: Sequence[SourceTrace]) -> int | None:
    """Tokens per unit: the greatest length dividing every row of every trace compared; None: rows by
    content (not token rows, or no common unit of :data:`MIN_UNIT` tokens)."""
    if any(t.kind != "tokens" for t in traces):
        return None
    size = 0
    for trace in traces:
        for length in set(trace.lengths):
            size = gcd(size, int(length))
    return size if size >= MIN_UNIT else None


def units_of(trace: SourceTrace, rank: int, size: int | None) -> RankUnits:
    import numpy as np

    counts = np.asarray(trace.calls, dtype=np.int64)
    if trace.kind != "tokens":
        ids = np.asarray(trace.digests, dtype=np.int64)
        per_row = np.ones(len(ids), dtype=np.int64)
    else:
        tokens = np.frombuffer(_buffer(trace.tokens), dtype=np.int64)
        lengths = np.asarray(trace.lengths, dtype=np.int64)
        if size is not None:
            ids = _hash_chunks(tokens.reshape(-1, size))
            per_row = lengths // size
        else:
            starts = np.concatenate([[0], np.cumsum(lengths)])
            ids = np.array(
                [_hash_chunks(tokens[a:b].reshape(1, -1))[0] for a, b in pairwise(starts)],
                dtype=np.int64,
            )
            per_row = np.ones(len(lengths), dtype=np.int64)
    row_ends = np.cumsum(counts)
    unit_ends = np.concatenate([[0], np.cumsum(per_row)])[row_ends]
    calls = np.split(ids, unit_ends[:-1]) if len(unit_ends) else []
    return RankUnits(rank, calls, trace.window or 1)


def _buffer(values: Sequence[int]) -> bytes:
    from array import array

    return values.tobytes() if isinstance(values, array) else array("q", values).tobytes()


def _hash_chunks(chunks: Any) -> Any:
    """A 64-bit content hash of each row of ``chunks`` (a polynomial over the tokens, then mixed)."""
    import numpy as np

    width = chunks.shape[1]
    with np.errstate(over="ignore"):
        weights = np.cumprod(np.full(width, 0x9E3779B97F4A7C15, dtype=np.uint64), dtype=np.uint64)
        h = (chunks.astype(np.uint64) * weights).sum(axis=1, dtype=np.uint64) + np.uint64(width)
        h ^= h >> np.uint64(31)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(29)
    return h.view(np.int64)


def mode_of(reference: SourceTrace) -> str:
    """:data:`STREAM`, :data:`SAMPLING` or :data:`UNKNOWN`, from the single process's rows in order."""
    if reference.kind != "tokens" or not reference.follows:
        return UNKNOWN
    follows, lengths, tokens = reference.follows, reference.lengths, reference.tokens
    known = continuing = 0
    start = 0
    for row in range(len(lengths) - 1):
        start_next = start + int(lengths[row])
        if follows[row] >= 0:
            known += 1
            continuing += int(follows[row] == tokens[start_next])
        start = start_next
    if known * 2 < max(1, len(lengths) - 1):
        return UNKNOWN
    return STREAM if continuing >= STREAM_SHARE * known else SAMPLING


# --- the verdicts -----------------------------------------------------------------------------------------


def judge_sources(
    reference: Mapping[int, ScriptRankTrace],
    run: Mapping[int, ScriptRankTrace],
    rerun: Mapping[int, ScriptRankTrace] | None,
    layout: Layout,
) -> list[tuple[str, list[Verdict]]]:
    """Each batch source the run recorded, with its verdicts against the single-process run's."""
    names: dict[str, None] = {}
    for rank in sorted(run):
        names.update(dict.fromkeys(s.name for s in run[rank].sources))
    return [
        (name, judge_source(name, _of(reference, name), _of(run, name), _of(rerun, name), layout))
        for name in names
    ]


def _of(traces: Mapping[int, ScriptRankTrace] | None, name: str) -> dict[int, SourceTrace]:
    out: dict[int, SourceTrace] = {}
    for rank, trace in (traces or {}).items():
        for source in trace.sources:
            if source.name == name:
                out[rank] = source
    return out


def judge_source(
    name: str,
    reference: dict[int, SourceTrace],
    run: dict[int, SourceTrace],
    rerun: dict[int, SourceTrace],
    layout: Layout,
) -> list[Verdict]:
    ws = layout.world_size
    other = f"batches come from {name}, not a DataLoader: no sampler, epochs or workers to check"
    rest = [not_applicable(c, other) for c in DATA_CHECKS if c not in (COVERAGE, NO_OVERLAP, EQUAL_STEPS,
                                                                       DETERMINISM)]  # fmt: skip
    missing = [r for r in range(ws) if r not in run]
    if missing or any(t.kind == "mixed" for t in run.values()) or not any(t.calls for t in run.values()):
        why = (
            f"ranks {', '.join(map(str, missing))} never called {name} with gradients on"
            if missing
            else f"{name} returned batches of changing form, or none with gradients on"
        )
        return [skipped(c, why) for c in (COVERAGE, NO_OVERLAP, EQUAL_STEPS, DETERMINISM)] + rest
    single = reference.get(min(reference)) if reference else None
    size = unit_size([*run.values(), *([single] if single is not None else [])])
    units = {r: units_of(t, r, size) for r, t in sorted(run.items())}
    mode = mode_of(single) if single is not None else UNKNOWN
    unit = f"units of {size} tokens" if size is not None else "rows"
    windows = min(u.windows() for u in units.values())
    coverage = _coverage(name, single, units, size, windows, mode, unit, ws)
    overlap = _overlap(name, units, windows, mode, unit, ws)
    if coverage.failed and overlap.failed:  # what two ranks both read is what none of them read: one cause
        coverage = replace(coverage, cause=overlap.cause, fix=overlap.fix)
    return [coverage, overlap, _equal_calls(name, run), _determinism(name, run, rerun, size), *rest]


def _overlap(name: str, units: dict[int, RankUnits], windows: int, mode: str, unit: str, ws: int) -> Verdict:
    import numpy as np

    if ws == 1:
        return not_applicable(NO_OVERLAP, "one rank: nothing to share")
    for window in range(windows):
        per_rank = {r: u.window_units(window) for r, u in units.items()}
        sets = [np.unique(np.concatenate(c)) if c else np.empty(0, np.int64) for c in per_rank.values()]
        together = np.concatenate(sets)
        _, counts = np.unique(together, return_counts=True)
        shared = int((counts[counts > 1] - 1).sum())
        if shared <= max(1, len(together) // SHARED_SHARE):
            continue
        calls = min(len(c) for c in per_rank.values())
        same = sum(
            1 for i in range(calls) if all(np.array_equal(c[i], per_rank[0][i]) for c in per_rank.values())
        )
        detail = (
            f"window {window} ({calls} calls of {name} a rank): {shared} of {len(together)} {unit} were read "
            f"by more than one rank; at {same} of {calls} calls every rank was handed the same batch"
        )
        cause, fix = _overlap_cause(mode, same * 2 >= calls)
        return Verdict(NO_OVERLAP, "fail", detail, cause, tuple(units), (window,), fix=fix)
    what = "draw apart" if mode == SAMPLING else "read apart"
    return passed(NO_OVERLAP, f"the ranks {what}: no {unit} of a window on two ranks beyond chance")


def _overlap_cause(mode: str, same: bool) -> tuple[str, str]:
    if mode == STREAM and same:
        return (
            "every rank reads the same slice of the stream: the slice does not depend on the rank",
            "start rank r's slice at r x its share of the step's tokens, and advance every rank by the whole "
            "step (its share x the world size)",
        )
    if mode == STREAM:
        return (
            "the ranks' slices of the stream overlap: a rank advances by less than the step's tokens over "
            "all ranks (its share x the world size), or the starts collide",
            "advance every rank by its share x the world size each step, from a start of rank x its share",
        )
    if same:
        return (
            "every rank draws the same batches: the random generator that picks them is seeded alike on "
            "every rank",
            "seed the generator that draws the batches with the rank (nanoGPT: torch.manual_seed(1337 + "
            "rank))",
        )
    return (
        "the ranks' batches overlap more than independent draws would",
        "draw each rank's batches from its own seed (the rank added to it), or slice the data by rank",
    )


def _coverage(
    name: str,
    single: SourceTrace | None,
    units: dict[int, RankUnits],
    size: int | None,
    windows: int,
    mode: str,
    unit: str,
    ws: int,
) -> Verdict:
    import numpy as np

    if single is None:
        return skipped(COVERAGE, f"not judged without a single-process run that called {name}")
    if mode == SAMPLING:
        return not_applicable(
            COVERAGE,
            f"{name} samples with replacement (its rows are drawn at random, not read in order): no coverage "
            "to prove; the ranks must draw apart (no_overlap)",
        )
    if mode == UNKNOWN:
        return not_applicable(
            COVERAGE,
            f"{name}'s batches carry no targets shifted by one token (y = x[1:]): whether it reads a stream "
            "in order or samples it is not known; overlap is judged",
        )
    if ws == 1:
        return passed(COVERAGE, f"{name} reads its stream in order: the single-process run is the reference")
    stream = np.concatenate(units_of(single, 0, size).calls or [np.empty(0, np.int64)])
    allowance = (ws - 1) * max((len(c) for u in units.values() for c in u.calls), default=0)
    offset = judged = most = 0
    for window in range(windows):
        per_rank = [u.window_units(window) for u in units.values()]
        read = [c for calls in per_rank for c in calls]
        count = sum(len(c) for c in read)
        if offset + count > len(stream):
            break
        expected = np.unique(stream[offset : offset + count])
        offset += count
        judged += 1
        missed = np.setdiff1d(expected, np.concatenate(read))
        most = max(most, len(missed))
        if len(missed) > allowance:
            detail = (
                f"window {window}: {len(missed)} of the {len(expected)} {unit} one process reads at these "
                f"steps were read by no rank (more than the {allowance} of a round a rank may skip at a "
                "shard's end)"
            )
            cause = (
                "the ranks read other parts of the stream than one process does at the same steps: their "
                "slices skip part of it"
            )
            fix = "tile the stream: rank r starts at r x its share, and every rank advances by its share x "
            fix += "the world size"
            return Verdict(COVERAGE, "fail", detail, cause, tuple(units), (window,), fix=fix)
    if not judged:
        return skipped(COVERAGE, f"the single-process run read fewer {unit} than a window of the ranks")
    return passed(
        COVERAGE,
        f"{name} reads a stream in order: the ranks together read what one process reads at the same steps "
        f"({judged} windows; {most} {unit} missed in a window at most, of the {allowance} of a round a rank "
        "may skip at a shard's end)",
    )


def _equal_calls(name: str, run: dict[int, SourceTrace]) -> Verdict:
    counts = {r: len(t.calls) for r, t in sorted(run.items())}
    if len(set(counts.values())) == 1:
        return passed(EQUAL_STEPS, f"every rank called {name} {next(iter(counts.values()))} times")
    shown = ", ".join(f"rank {r}: {n}" for r, n in counts.items())
    return failed(
        EQUAL_STEPS,
        f"the ranks called {name} a different number of times ({shown}): a collective waits for the rank "
        "that stopped",
        ranks=tuple(counts),
    )


def _determinism(
    name: str, run: dict[int, SourceTrace], rerun: dict[int, SourceTrace], size: int | None
) -> Verdict:
    import numpy as np

    if not rerun:
        return skipped(DETERMINISM, "not rerun at this layout")
    for rank, trace in sorted(run.items()):
        again = rerun.get(rank)
        first = units_of(trace, rank, size).calls
        second = units_of(again, rank, size).calls if again is not None else []
        calls = min(len(first), len(second))
        if calls == 0 or any(not np.array_equal(first[i], second[i]) for i in range(calls)):
            return failed(
                DETERMINISM,
                f"rank {rank} was handed other batches by {name} in a second run of this layout",
                ranks=(rank,),
            )
    return passed(DETERMINISM, f"a second run hands every rank the same batches from {name}")
