"""sequence_split: context-parallel peers' slices reassemble each sequence exactly once (issue 42).

Under context parallelism every rank of a data-parallel coordinate is handed the same sequences and feeds
its model a slice of each (contiguous, or head-tail "zigzag": chunk ``c`` and chunk ``2n - 1 - c`` of ``2n``
for load balance); the loss adds up over the slices. What each rank fed its model (``input_ids``,
``position_ids``, ``labels`` read at the model's call: :class:`~ddpcheck.trace.ModelFeed`) must put each
sequence of the batch it was handed back together exactly once:

- with ``position_ids``, a rank's tokens must sit where its positions say, and the peers' positions must
  cover every position of the sequence once (a next-token shift may leave the last one out);
- without them, each rank's tokens must be chunks of the sequence, every chunk held by one rank.

Peers are the ranks that differ in one non-data coordinate (a line of the mesh); a line whose ranks were
all fed the same tokens replicates the sequence (tensor peers) and is not a split. Causes: a chunk held
twice and one held by no rank (a head-tail split off by one chunk), positions restarted per slice
(``arange(local_len)``), positions that do not say where the tokens sit, slices of one key mixed with
whole sequences of another. Labels shifted inside each slice are invisible here (the data and positions
are right); the step comparison with one process on the whole sequence finds them. Pure functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ddpcheck.layout import Layout
from ddpcheck.trace import MicroStep, ModelFeed, StepTrace, TokenRows
from ddpcheck.verdict import SEQUENCE_SPLIT, Verdict, not_applicable, passed, skipped

HELD_TWICE = (
    "the context-parallel slices do not reassemble the sequence: {twice} is held by two ranks and {none} by "
    "none (a head-tail split off by one chunk: rank c takes chunks c and 2n - 1 - c of 2n)"
)
HELD_UNEVEN = (
    "the context-parallel slices do not reassemble the sequence exactly once: {what} (each position must "
    "reach one rank of the context-parallel group)"
)
RESTARTED = (
    "positions restarted per slice: rank {rank} feeds the model position_ids 0..{last} (arange(local_len)) "
    "for tokens that sit at {where} of the sequence; every rank after the first reads its tokens at the "
    "wrong places (rotary or learned position embeddings, the causal mask)"
)
MISPLACED = (
    "rank {rank} feeds position_ids that do not say where its tokens sit in the sequence (position {pos} "
    "holds another token there): positions are built after the split, or from another split than the tokens'"
)
MIXED = (
    "sharded and unsharded tensors mixed: rank {rank} feeds {sliced} sliced to {width} tokens but {whole} "
    "whole ({full} tokens): every tensor of a position must be split alike"
)
FIXES = {
    HELD_TWICE: "take chunks c and 2n - 1 - c of 2n equal chunks on context-parallel rank c (n ranks): "
    "every chunk once",
    HELD_UNEVEN: "split every sequence into the context-parallel ranks' slices once, each position on one "
    "rank",
    RESTARTED: "build position_ids for the whole sequence before the split and slice them with the tokens",
    MISPLACED: "slice position_ids, input_ids and labels with the same indices",
    MIXED: "slice input_ids, position_ids and labels together (shift the labels before the split)",
}
CONTEXT_PREFIX = "cp"  # dimensions whose names start with this are context-parallel ones


@dataclass(frozen=True)
class Found:
    """What one line of peers did with one sequence: "" fine, else the cause and its fix."""

    cause: str
    fix: str
    ranks: tuple[int, ...]
    detail: str


def _rows(feed: tuple[tuple[str, TokenRows], ...]) -> dict[str, TokenRows]:
    return dict(feed)


def _row(rows: TokenRows, i: int) -> list[int]:
    start = (i if rows.rows > 1 else 0) * rows.width  # a (1, L) position_ids is every row's
    return list(rows.values[start : start + rows.width])


def lines(layout: Layout) -> list[tuple[str, list[int]]]:
    """Every line of peers: the ranks that differ in one non-data coordinate only (dimension name, ranks in
    coordinate order)."""
    out = []
    for axis, (name, size) in enumerate(layout.dims):
        if name in layout.data_dims or size < 2:
            continue
        by_rest: dict[tuple[int, ...], list[int]] = {}
        for rank in range(layout.world_size):
            coords = layout.coords(rank)
            by_rest.setdefault(coords[:axis] + coords[axis + 1 :], []).append(rank)
        out += [(name, ranks) for ranks in by_rest.values()]
    return out


def _micro(trace: StepTrace) -> list[MicroStep]:
    return [m for s in trace.steps for m in s.micro] + list(trace.open_micro)


def _by_positions(whole: list[int], pieces: list[tuple[int, list[int], list[int]]]) -> Found | None:
    """Coverage read off position_ids: ``pieces`` are (rank, tokens, positions)."""
    for rank, tokens, positions in pieces:
        inside = all(0 <= p < len(whole) for p in positions)
        if inside and all(whole[p] == t for p, t in zip(positions, tokens, strict=False)):
            continue
        width = len(tokens)
        if positions == list(range(width)):
            where = _placed(whole, tokens)
            return Found(
                RESTARTED.format(rank=rank, last=width - 1, where=where), FIXES[RESTARTED], (rank,), where
            )
        pairs = zip(positions, tokens, strict=False)
        bad = next((p for p, t in pairs if not 0 <= p < len(whole) or whole[p] != t), 0)
        return Found(MISPLACED.format(rank=rank, pos=bad), FIXES[MISPLACED], (rank,), f"position {bad}")
    counts = [0] * len(whole)
    holders: dict[int, list[int]] = {}
    for rank, _, positions in pieces:
        for p in positions:
            counts[p] += 1
            holders.setdefault(p, []).append(rank)
    return _coverage(counts, holders, len(pieces))


def _coverage(counts: list[int], holders: dict[int, list[int]], peers: int) -> Found | None:
    """Every position once; a next-token shift before the split may leave the last position to no rank."""
    if counts and counts[-1] == 0 and all(c == 1 for c in counts[:-1]):
        return None
    twice = [p for p, c in enumerate(counts) if c > 1]
    none = [p for p, c in enumerate(counts) if c == 0]
    if not twice and not none:
        return None
    length = len(counts)
    ranks = tuple(sorted({r for p in twice for r in holders.get(p, ())}))
    if twice and none:
        held, lost = _span(twice, length, peers), _span(none, length, peers)
        cause = HELD_TWICE.format(twice=held, none=lost)
        return Found(cause, FIXES[HELD_TWICE], ranks, f"{held} is held by two ranks, {lost} by none")
    what = f"{_span(twice, length, peers)} is held by two ranks" if twice else ""
    what = what or f"{_span(none, length, peers)} is held by no rank"
    return Found(HELD_UNEVEN.format(what=what), FIXES[HELD_UNEVEN], ranks, what)


def _span(positions: list[int], length: int, peers: int) -> str:
    """``chunk 3 of 4 (positions 12-15)`` where the positions are whole chunks of a head-tail split, else
    ``positions 12-15``."""
    runs: list[list[int]] = []
    for p in positions:
        if runs and p == runs[-1][-1] + 1:
            runs[-1].append(p)
        else:
            runs.append([p])
    chunks = 2 * peers
    size = length // chunks if length % chunks == 0 else 0
    parts = []
    for run in runs[:3]:
        shown = f"position {run[0]}" if len(run) == 1 else f"positions {run[0]}-{run[-1]}"
        if size and run[0] % size == 0 and len(run) % size == 0:
            first, last = run[0] // size, (run[-1] + 1) // size - 1
            which = f"chunk {first}" if first == last else f"chunks {first}-{last}"
            shown = f"{which} of {chunks} ({shown})"
        parts.append(shown)
    return ", ".join(parts) + (" ..." if len(runs) > 3 else "")


def _placed(whole: list[int], tokens: list[int]) -> str:
    """Where ``tokens`` occur in ``whole`` as one run (``positions 8-15``), or "other positions"."""
    width = len(tokens)
    for start in range(len(whole) - width + 1):
        if whole[start : start + width] == tokens:
            return f"positions {start}-{start + width - 1}"
    return "other positions"


def _by_chunks(whole: list[int], pieces: list[tuple[int, list[int]]]) -> Found | str | None:
    """Coverage read off the tokens alone: each rank's tokens cut into chunks of the sequence (contiguous:
    n chunks; head-tail: 2n); a str says why they cannot be read so."""
    peers = len(pieces)
    total = sum(len(t) for _, t in pieces)
    if total not in (len(whole), len(whole) - 1):
        return f"the slices hold {total} tokens of a {len(whole)}-token sequence"
    whole = whole[:total]  # a next-token shift before the split leaves the last token out
    for chunks in (peers, 2 * peers):
        if total % chunks:
            continue
        found = _chunked(whole, pieces, total // chunks)
        if not isinstance(found, str):
            return found
    return "the slices are not chunks of the sequence (no position_ids were fed to place them)"


def _chunked(whole: list[int], pieces: list[tuple[int, list[int]]], size: int) -> Found | str | None:
    """Each rank's tokens as chunks of ``size``; a chunk that equals several of the sequence's (padding)
    goes to one not taken yet, so only a chunk really held twice counts twice."""
    parts = [whole[c * size : (c + 1) * size] for c in range(len(whole) // size)]
    counts = [0] * len(whole)
    holders: dict[int, list[int]] = {}
    taken: set[int] = set()
    for rank, tokens in pieces:
        if len(tokens) % size:
            return "uneven"
        for k in range(len(tokens) // size):
            piece = tokens[k * size : (k + 1) * size]
            matches = [c for c, part in enumerate(parts) if part == piece]
            if not matches:
                return "not a chunk"
            c = next((c for c in matches if c not in taken), matches[0])
            taken.add(c)
            for p in range(c * size, (c + 1) * size):
                counts[p] += 1
                holders.setdefault(p, []).append(rank)
    return _coverage(counts, holders, len(pieces))


def _mixed(rank: int, fed: dict[str, TokenRows], full: int) -> Found | None:
    """Keys of one rank's feed cut to different widths, one of them the whole sequence's."""
    widths = {key: rows.width for key, rows in fed.items()}
    if len(set(widths.values())) < 2 or full not in widths.values():
        return None
    whole = [k for k, w in widths.items() if w == full]
    sliced = [k for k, w in widths.items() if w != full]
    cause = MIXED.format(
        rank=rank, sliced=", ".join(sliced), width=widths[sliced[0]], whole=", ".join(whole), full=full
    )
    return Found(cause, FIXES[MIXED], (rank,), cause)


def _steps(trace: StepTrace) -> list[tuple[str, int, MicroStep]]:
    """Every micro-step with where it is: ("optimizer step 3", its index in the step, the micro-step)."""
    out = [(f"optimizer step {s.index}", k, m) for s in trace.steps for k, m in enumerate(s.micro)]
    return out + [("the open window", k, m) for k, m in enumerate(trace.open_micro)]


def _judge_line(feeds: list[ModelFeed], line: list[int]) -> tuple[Found | None, int, str]:
    """One micro-step of one line of peers: the first finding, the sequences judged, why none could be."""
    handed = _rows(feeds[0].handed).get("input_ids")
    fed = [_rows(f.fed) for f in feeds]
    inputs = [f.get("input_ids") for f in fed]
    if handed is None or any(x is None for x in inputs):
        return None, 0, "the batch handed or the model's call holds no input_ids"
    if any(_rows(f.handed).get("input_ids") != handed for f in feeds[1:]):
        return None, 0, "the peers were handed different sequences (replica_consistency says how)"
    if all(x == inputs[0] for x in inputs):
        return None, 0, ""  # every peer fed the same tokens: they replicate the sequence
    for rank, keys in zip(line, fed, strict=True):
        mixed = _mixed(rank, keys, handed.width)
        if mixed is not None:
            return mixed, 1, ""
    if any(x is not None and x.rows != handed.rows for x in inputs):
        return None, 0, "the model was given another number of rows than the batch holds"
    positions = [f.get("position_ids") for f in fed]
    judged, why = 0, ""
    for i in range(handed.rows):
        whole = _row(handed, i)
        tokens = [_row(x, i) for x in inputs if x is not None]
        if all(p is not None for p in positions):
            found: Found | str | None = _by_positions(
                whole, [(r, t, _row(p, i)) for r, t, p in zip(line, tokens, positions, strict=True) if p]
            )
        else:
            found = _by_chunks(whole, list(zip(line, tokens, strict=True)))
        if isinstance(found, str):
            why = why or found
            continue
        judged += 1
        if found is not None:
            return Found(found.cause, found.fix, found.ranks, f"sequence {i}: {found.detail}"), judged, why
    return None, judged, why


def check_sequence_split(run: Sequence[StepTrace | None], layout: Layout) -> Verdict:
    """The peers of every line of the mesh that were fed slices of their sequences reassemble each
    sequence of the batch they were handed exactly once (see the module docstring); ``run``: each rank's
    StepTrace by global rank."""
    missing = [r for r, t in enumerate(run) if t is None]
    if missing:
        return skipped(SEQUENCE_SPLIT, f"rank {missing[0]} recorded no training step")
    traces = [t for t in run if t is not None]
    if len(traces) != layout.world_size or layout.replicas < 2:
        return not_applicable(SEQUENCE_SPLIT, "no rank shares its sequences with a context-parallel peer")
    judged, why = 0, ""
    for name, line in lines(layout):
        steps = [_steps(traces[r]) for r in line]
        for at in range(min(len(s) for s in steps)):
            feeds = [s[at][2].feed for s in steps]
            if any(f is None for f in feeds):
                continue
            found, count, reason = _judge_line([f for f in feeds if f is not None], line)
            judged, why = judged + count, why or reason
            if found is not None:
                where, k, _ = steps[0][at]
                detail = (
                    f"{name} peers {', '.join(map(str, line))} in micro-batch {k} of {where}, {found.detail}"
                )
                return Verdict(SEQUENCE_SPLIT, "fail", detail, found.cause, found.ranks, fix=found.fix)
    if not judged:
        said = f" ({why})" if why else ""
        return not_applicable(SEQUENCE_SPLIT, f"no rank fed its model a slice of its sequences{said}")
    return passed(
        SEQUENCE_SPLIT,
        f"the context-parallel slices put each of {judged} sequences back together exactly once "
        "(input_ids and position_ids as fed to the model)",
    )
