"""``prompt_groups``: the copies of a prompt stay one group in every step's gather (GRPO, RLOO, DAPO).

Group-relative RL repeats each prompt G times and normalises its completions' rewards over the G copies.
Where the single-process loader yields runs of copies (each sample G times in a row: TRL's
``RepeatSampler``), the rows a step trains on come from every data-parallel rank, and a gather
(``all_gather`` of the rewards) assembles them in rank order: rank 0's rows of that step, then rank 1's.
TRL then normalises each run of G gathered rows (``rewards.view(-1, G)``). The rule: at every step (every
batch position of the epoch), each prompt's copies among the gathered rows are whole groups (a multiple of
G), so all of a group's copies sit in one step. A group split across ranks is fine (TRL's layout does it;
the statistics need the gather), and the pass counts those steps; where the groups are whole but not runs
of G in rank order (a split that deals rows out one by one) the pass says that a fixed stride would mix
them. A prompt whose copies straddle steps, so that a gathered "group" holds two prompts, fails.

The likely bug is named from the shape: each rank's rows, read alone, still a repeat sampler's order while
the ranks' orders disagree (copies that reach no rank, or a prompt's copies on different steps although
every step gathers whole multiples of G rows): the repeat sampler is seeded per rank (``coverage`` names it
too); a step's rows not a multiple of G: partial groups straddle steps, and a normalisation by a fixed
stride of G rows mixes prompts (AReaL #1419). Where a step differs from one process's and its groups are
split across ranks, ``step_equivalence`` names per-rank group statistics (:func:`step_group_cause`).

Not judged (``n/a``): a single-process loader without runs of copies (or with so few runs that a shuffle
of repeated ids would line them up by chance), a sampler that was told the ranks (``num_replicas``/
``rank``) and places a sample's copies itself, as repeated augmentation does (timm's ``RepeatAugSampler``
spreads copies over ranks on purpose), and samples identified by a hash of their content (equal samples in
a row may be duplicates in the data). Pure functions, no processes.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from ddpcheck.checks.context import Context, EpochView
from ddpcheck.checks.tally import int_ids, values_of
from ddpcheck.evidence import GroupEvidence
from ddpcheck.messages import count_text
from ddpcheck.trace import EpochTrace, RunTrace
from ddpcheck.verdict import PROMPT_GROUPS, Verdict, not_applicable, skipped

NO_RUNS = (
    "the single-process loader yields no runs of copies (each sample G times in a row, in every epoch, "
    "more runs than chance lines up): there are no prompt groups to keep whole"
)
SPREAD = (
    "the sampler was told the ranks (num_replicas={replicas}) and places each sample's copies itself, as "
    "repeated augmentation does (timm's RepeatAugSampler spreads them over ranks on purpose): no gather "
    "assembles them into groups"
)
CONTENT = "content-hash"
BY_CONTENT = (
    "samples are identified by their content: equal samples in a row may be duplicates in the data, not "
    "a repeat sampler's copies of one prompt (give them ids: an 'id' field or a sample_ids hook)"
)
RANK_SEEDED = (
    "the repeat sampler yields a different order on each rank (its seed depends on the rank): each rank "
    "cuts its batches from its own order, so the rows a gather assembles in rank order mix prompts, one "
    "prompt's copies land on different steps, and some prompts reach no rank"
)
PARTIAL = (
    "a step gathers {rows} rows, not a multiple of the group size {size}: groups straddle steps (partial "
    "groups), and a normalisation by a fixed stride of {size} rows mixes two prompts' copies (AReaL #1419)"
)
APART = (
    "the copies of every group are in one step, though not as runs of {size} rows in rank order (the "
    "loader splits the repeated order row by row): normalise each prompt's rows, not a fixed stride of "
    "{size} gathered rows"
)
BROKEN = (
    "the ranks' rows, gathered in rank order, do not hold whole groups of {size} copies: the split does not "
    "follow the repeat sampler's groups"
)
FIXES = {
    RANK_SEEDED: "seed the repeat sampler alike on every rank (TRL seeds RepeatSampler with args.seed on "
    "every process) and let the loader split its batches between the ranks",
    PARTIAL: "make the rows a step gathers over all ranks a multiple of the group size (per-rank batch x "
    "world size divisible by G, as TRL requires), and normalise by the groups' real sizes",
    BROKEN: "lay the global batch out as TRL does: one RepeatSampler seeded alike, its batches split between "
    "the ranks whole (Accelerate's BatchSamplerShard), every step's rows a multiple of G",
}


def group_size(ids: Sequence[Hashable]) -> int:
    """G where ``ids`` (one process's epoch, in order) is runs of copies, each run G copies or a multiple
    of G, G >= 2 and at least two runs (0: not such a stream)."""
    if int_ids(ids) and len(ids) >= 2:
        head = values_of(ids)[:2]
        if head[0] != head[1]:  # a first run of one: no groups (most loaders), told without a copy
            return 0
    codes = _encode([ids])[0][0]
    if len(codes) < 4:
        return 0
    lengths = np.diff(np.flatnonzero(np.r_[True, codes[1:] != codes[:-1], True]))
    size = int(lengths.min())
    if size < 2 or len(lengths) < 2 or bool((lengths % size).any()):
        return 0
    return size


CHANCE = 1e-6  # runs of copies this likely in a shuffled epoch of repeated ids are no groups


def reference_groups(views: Sequence[EpochView]) -> int:
    """G where every epoch of the single-process loader is runs of G copies (:func:`group_size`) and so
    many runs that a shuffle of repeated ids (equal samples hashed alike) would line them up by chance
    less than once in a million (:data:`CHANCE`); 0 otherwise."""
    sizes = {group_size(v.ref_trace.ids) for v in views}
    if len(sizes) != 1 or not next(iter(sizes)):
        return 0
    chance = 0.0  # log of the chance that shuffled rows fall into runs, every epoch
    for view in views:
        codes = _encode([view.ref_trace.ids])[0][0]
        lengths = np.diff(np.flatnonzero(np.r_[True, codes[1:] != codes[:-1], True]))
        runs = len(lengths)
        chance += (
            math.lgamma(runs + 1) + sum(math.lgamma(n + 1) for n in lengths) - math.lgamma(len(codes) + 1)
        )
    return next(iter(sizes)) if chance < math.log(CHANCE) else 0


def _encode(seqs: Sequence[Sequence[Hashable]]) -> tuple[list[np.ndarray], list[Hashable] | None]:
    """Each sequence as int64 codes: ints as they are (None), anything else numbered in one table."""
    if all(int_ids(s) for s in seqs):  # arrays as arrays: a 1e8-id epoch never becomes Python ints
        return [np.asarray(values_of(s), dtype=np.int64) for s in seqs], None
    try:
        arrays = [np.asarray(s, dtype=np.int64) for s in seqs]
        shaped = all(a.ndim == 1 and len(a) == len(s) for a, s in zip(arrays, seqs, strict=True))
        if shaped and all(type(x) is int for s in seqs for x in s[:8]):
            return arrays, None
    except (TypeError, ValueError, OverflowError):
        pass
    table: dict[Hashable, int] = {}
    names: list[Hashable] = []
    out = []
    for seq in seqs:
        codes = np.empty(len(seq), dtype=np.int64)
        for i, x in enumerate(seq):
            code = table.get(x)
            if code is None:
                code = table[x] = len(names)
                names.append(x)
            codes[i] = code
        out.append(codes)
    return out, names


@dataclass(frozen=True)
class Gathered:
    """One epoch's rows as the gathers assemble them: step by step, the ranks' rows in rank order."""

    ids: np.ndarray  # int64 codes, in gathered order
    step: np.ndarray  # each row's step (batch position)
    rank: np.ndarray  # the data-parallel rank that holds it
    place: np.ndarray  # its row within that rank's batch
    starts: np.ndarray  # where each step begins (steps + 1 offsets)
    names: list[Hashable] | None  # codes -> ids where the ids are no ints

    def shown(self, codes: Sequence[int]) -> list[Hashable]:
        return [self.names[c] if self.names is not None else int(c) for c in codes]


def gathered(traces: Sequence[EpochTrace]) -> Gathered:
    """Every rank's epoch (data-parallel rank order) as the step-by-step gather sees it."""
    codes, names = _encode([t.ids for t in traces])
    steps, ranks, places = [], [], []
    for r, trace in enumerate(traces):
        sizes = np.asarray(trace.batch_sizes, dtype=np.int64)
        steps.append(np.repeat(np.arange(len(sizes)), sizes)[: len(codes[r])])
        ranks.append(np.full(len(codes[r]), r, dtype=np.int64))
        offsets = np.repeat(np.cumsum(sizes) - sizes, sizes)[: len(codes[r])]
        places.append(np.arange(len(codes[r])) - offsets)
    step = np.concatenate(steps) if steps else np.empty(0, dtype=np.int64)
    order = np.argsort(step, kind="stable")  # by step; within a step rank order, then the rank's order
    step = step[order]
    count = int(step.max()) + 1 if len(step) else 0
    starts = np.searchsorted(step, np.arange(count + 1))
    return Gathered(
        np.concatenate(codes)[order] if codes else step,
        step,
        np.concatenate(ranks)[order] if ranks else step,
        np.concatenate(places)[order] if places else step,
        starts,
        names,
    )


def step_counts(g: Gathered) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per (step, prompt) the prompt's copies in that step's gather: steps, prompt codes, counts."""
    if not len(g.ids):
        empty = np.empty(0, dtype=np.int64)
        return empty, empty, empty
    pairs = np.stack([g.step, g.ids], axis=1)
    found, counts = np.unique(pairs, axis=0, return_counts=True)
    return found[:, 0], found[:, 1], counts


def broken_steps(g: Gathered, size: int) -> np.ndarray:
    """The steps where a prompt's copies are no whole groups of ``size`` (some of a group's copies land on
    another step): a prompt's count in the step's gather is not a multiple of ``size``."""
    steps, _, counts = step_counts(g)
    return np.unique(steps[counts % size != 0])


def apart_steps(g: Gathered, size: int) -> np.ndarray:
    """The steps whose gathered rows are not runs of ``size`` copies aligned at multiples of ``size`` (a
    fixed stride of ``size`` rows mixes prompts there)."""
    if not len(g.ids):
        return np.empty(0, dtype=np.int64)
    at = np.arange(len(g.ids)) - g.starts[g.step]  # each row's place in its step's gather
    head = g.starts[g.step] + (at // size) * size  # the first row of its run of ``size``
    bad = np.zeros(len(g.starts) - 1, dtype=bool)
    bad[np.unique(g.step[g.ids != g.ids[head]])] = True
    bad |= np.diff(g.starts) % size != 0
    return np.flatnonzero(bad)


Split = tuple[int, int, tuple[int, ...]]  # a step, a prompt's code, the ranks holding its copies


def split_groups(g: Gathered, size: int, steps: Sequence[int] | None = None) -> list[Split]:
    """Whole groups whose copies lie on several ranks: (step, the prompt's code, the ranks), in step order;
    ``steps``: only these."""
    out = []
    wanted = None if steps is None else set(steps)
    for s in range(len(g.starts) - 1):
        if wanted is not None and s not in wanted:
            continue
        lo, hi = int(g.starts[s]), int(g.starts[s + 1])
        for head in range(lo, hi - size + 1, size):
            ranks = tuple(sorted(set(g.rank[head : head + size].tolist())))
            if len(ranks) > 1 and len(set(g.ids[head : head + size].tolist())) == 1:
                out.append((s, int(g.ids[head]), ranks))
    return out


def own_orders(traces: Sequence[EpochTrace], size: int) -> bool:
    """Each rank's rows, read alone, are a repeat sampler's order cut into batches: within a batch a
    prompt's rows are one run, and a run that touches neither end of its batch holds a multiple of
    ``size`` copies."""
    codes, _ = _encode([t.ids for t in traces])
    for trace, ids in zip(traces, codes, strict=True):
        start = 0
        for n in trace.batch_sizes:
            rows = ids[start : start + n]
            start += n
            if not len(rows):
                continue
            edges = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1], True])
            lengths = np.diff(edges)
            if len(np.unique(rows)) != len(lengths):  # a prompt in two runs of one batch
                return False
            inner = lengths[1:-1]
            if len(inner) and bool((inner % size).any()):
                return False
    return True


@dataclass(frozen=True)
class EpochFinding:
    epoch: int
    gather: Gathered
    bad: np.ndarray  # broken steps


def rank_seeded(view: EpochView, size: int) -> bool:
    """Whether ``view``'s ranks read a repeat sampler's order each (runs intact) while their orders disagree:
    copies of the reference reach no rank, or a prompt's copies straddle steps although every step gathers
    a whole multiple of ``size`` rows."""
    if len(view.rank_traces) < 2 or not own_orders(view.rank_traces, size):
        return False
    if view.missing_count > 0:
        return True
    g = gathered(view.rank_traces)
    return not bool((np.diff(g.starts) % size).any()) and len(broken_steps(g, size)) > 0


def repeat_seed_cause(ctx: Context, view: EpochView) -> str:
    """The per-rank seed of a repeat sampler, where that explains missing or over-shared copies ("": not)."""
    if ctx.facts.sampler_replicas is not None or ctx.batch_level or ctx.reference.id_source == CONTENT:
        return ""
    size = reference_groups(ctx.views())
    return RANK_SEEDED if size and rank_seeded(view, size) else ""


def _cause(finding: EpochFinding, view: EpochView, size: int) -> str:
    if rank_seeded(view, size):
        return RANK_SEEDED
    odd = [int(n) for n in np.diff(finding.gather.starts) if n % size]
    if odd:
        return PARTIAL.format(rows=odd[0], size=size)
    return BROKEN.format(size=size)


def _rows(g: Gathered, where: np.ndarray) -> str:
    """The rows ``where`` selects, as "rank 0's rows 4-5 and rank 1's rows 0-1"."""
    parts = []
    for r in sorted(set(g.rank[where].tolist())):
        places = g.place[where & (g.rank == r)]
        lo, hi = int(places.min()), int(places.max())
        parts.append(f"rank {r}'s rows {lo if lo == hi else f'{lo}-{hi}'}")
    return " and ".join(parts)


def _where(g: Gathered, step: int, size: int) -> tuple[str, tuple[int, ...], tuple[Hashable, ...]]:
    """The first prompt at ``step`` whose copies there are no whole groups: words, ranks, the prompt."""
    steps, codes, counts = step_counts(g)
    at = np.flatnonzero((steps == step) & (counts % size != 0))
    code, count = int(codes[at[0]]), int(counts[at[0]])
    here = (g.step == step) & (g.ids == code)
    elsewhere = sorted(set(steps[(codes == code) & (steps != step) & (counts % size != 0)].tolist()))
    prompt = g.shown([code])[0]
    text = f"prompt {prompt} has {count} copies here ({_rows(g, here)}), not a whole group of {size}"
    if elsewhere:
        other = (g.ids == code) & (g.step == elsewhere[0])
        shown = ", ".join(map(str, elsewhere[:4]))
        text += f"; its other copies land on step {shown} ({_rows(g, other)})"
    rows = g.ids[g.starts[step] : g.starts[step + 1]]
    first = int(np.flatnonzero(rows == code)[0])
    run = rows[first - first % size : first - first % size + size]
    if len(set(run.tolist())) > 1:
        held = ", ".join(map(str, g.shown(run.tolist())))
        text += f"; the gather's run of {size} rows there holds prompts {held}"
    return text, tuple(sorted(set(g.rank[here].tolist()))), (prompt,)


def check_prompt_groups(
    reference: RunTrace, run: RunTrace, rerun: RunTrace | None = None, *, ctx: Context | None = None
) -> Verdict:
    """Every step's gathered rows are whole groups of the single-process loader's copies (module doc)."""
    ctx = ctx or Context(reference, run, rerun)
    if ctx.unjudgeable:
        return skipped(PROMPT_GROUPS, ctx.unjudgeable)
    views = ctx.views()
    size = reference_groups(views)
    if not size:
        return not_applicable(PROMPT_GROUPS, NO_RUNS)
    replicas = ctx.facts.sampler_replicas
    if replicas is not None:
        return not_applicable(PROMPT_GROUPS, SPREAD.format(replicas=replicas))
    if ctx.reference.id_source == CONTENT:
        return not_applicable(PROMPT_GROUPS, BY_CONTENT)
    if ctx.run.rank_sample:
        return not_applicable(PROMPT_GROUPS, "only a sample of the ranks was recorded: no gather to assemble")
    findings = []
    for view in views:
        g = gathered(view.rank_traces)
        findings.append(EpochFinding(view.epoch, g, broken_steps(g, size)))
    steps = sum(len(f.gather.starts) - 1 for f in findings)
    bad = [f for f in findings if len(f.bad)]
    if not bad:
        evidence = GroupEvidence(size, steps, 0, _split_count(findings, size))
        detail = _pass_detail(findings, size, steps, ctx.world_size)
        return Verdict(PROMPT_GROUPS, "pass", detail, evidence=evidence)
    first = bad[0]
    step = int(first.bad[0])
    where, ranks, ids = _where(first.gather, step, size)
    count = sum(len(f.bad) for f in bad)
    detail = (
        f"in epoch {first.epoch} step {step} the ranks' rows, gathered in rank order, break the groups of "
        f"{size} copies the single-process loader yields: {where} ({count} of {count_text(steps, 'steps')} "
        "hold a broken group)"
    )
    cause = _cause(first, views[findings.index(first)], size)
    template = next(t for t in FIXES if cause.startswith(t.split("{")[0]))
    return Verdict(
        PROMPT_GROUPS,
        "fail",
        detail,
        cause,
        ranks,
        tuple(f.epoch for f in bad),
        ids,
        fix=FIXES[template],
        evidence=GroupEvidence(size, steps, count, _split_count(findings, size)),
    )


def _split_count(findings: Sequence[EpochFinding], size: int) -> int:
    return len({(f.epoch, s) for f in findings for s, _, _ in split_groups(f.gather, size)})


def _pass_detail(findings: Sequence[EpochFinding], size: int, steps: int, ranks: int) -> str:
    split = _split_count(findings, size)
    groups = sum(len(f.gather.ids) for f in findings) // size
    across = (
        f"; groups are split across ranks at {split} of them (their statistics need the gathered rows)"
        if split
        else ("; each group is whole on one rank" if ranks > 1 else "")
    )
    apart = any(len(apart_steps(f.gather, size)) for f in findings)
    return (
        f"every step's rows, gathered in rank order, hold whole groups of {size} copies of one prompt "
        f"({count_text(groups, 'groups')} in {count_text(steps, 'steps')}){across}"
        + (f"; {APART.format(size=size)}" if apart else "")
    )


# --- the step's cause where the rows are prompt groups ----------------------------------------------------

GROUPS_SPLIT = (
    "the rows are prompt groups of {size} copies split across ranks ({example}), and each rank normalises "
    "the copies it holds with their own statistics (per-rank group mean and std): one process holding the "
    "whole group computes other advantages"
)
GROUPS_WHOLE = (
    "the rows are prompt groups of {size} copies, each whole on one rank, so a group's own statistics "
    "match; a statistic over several groups (a batch-wide reward mean or std, a count) is computed over "
    "the rank's rows alone, not synchronised across the data-parallel group"
)
STEP_FIXES = {
    GROUPS_SPLIT: "gather the rewards over the data-parallel group before each group's mean and std (TRL: "
    "gather, normalise each run of G rows, keep this rank's slice), or give each rank whole groups",
    GROUPS_WHOLE: "all-reduce (or gather) every statistic that spans groups over the data-parallel group "
    "before using it",
}


def group_size_of(verdicts: Sequence[Verdict]) -> int:
    """The group size a loader's ``prompt_groups`` verdict found (0: none, or not judged)."""
    for verdict in verdicts:
        if verdict.check == PROMPT_GROUPS and isinstance(verdict.evidence, GroupEvidence):
            return verdict.evidence.size
    return 0


def step_group_cause(
    size: int, epochs: Sequence[Sequence[EpochTrace]], positions: Sequence[tuple[int, int]]
) -> tuple[str, str]:
    """Why a step over prompt groups differs from one process's, from the groups at its batches.

    ``epochs``: per data-parallel rank (rank order) the fed loader's recorded epochs; ``positions``: the
    failing steps' batches as (epoch, batch position). A group split across ranks there: per-rank group
    statistics; else whole groups: a statistic across groups computed per rank. ("", "") without groups."""
    if size < 2 or not positions or not epochs:
        return "", ""
    for number in sorted({e for e, _ in positions}):
        traces = [next((t for t in rank if t.epoch == number), None) for rank in epochs]
        if any(t is None for t in traces):
            continue
        g = gathered([t for t in traces if t is not None])
        split = split_groups(g, size, sorted({p for e, p in positions if e == number}))
        if split:
            step, code, _ = split[0]
            held = (g.step == step) & (g.ids == code)
            example = f"prompt {g.shown([code])[0]} at step {step} of epoch {number}: {_rows(g, held)}"
            return GROUPS_SPLIT.format(size=size, example=example), STEP_FIXES[GROUPS_SPLIT]
    return GROUPS_WHOLE.format(size=size), STEP_FIXES[GROUPS_WHOLE]
