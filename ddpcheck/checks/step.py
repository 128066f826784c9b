"""The training step against one process: ``step_equivalence`` (issue 35).

It judges what the rank side's step watcher recorded, one :class:`~ddpcheck.trace.StepTrace` per rank,
indexed by global rank; pure functions, no processes.

``step_equivalence`` compares, at every optimizer step whose gradient was kept, the gradient the DDP step
applied (after DDP's average, before clipping) with the gradient of the one-process replay, which was fed
at each micro-step the union of what the ranks received at that micro-step and started from the same
weights. The measure is the relative L2 difference ``|g - r| / |r|``, held to a tolerance derived from the
gradient's dtype (:data:`TOLERANCE`). The float noise of an exact replay, measured on the correct fixtures
of ``fixtures/steps`` under torchrun (float32, CPU, 2 ranks, 37 exact steps of 9 scripts), is 2.9e-8 to 2.7e-7
(NOTES.md there); float32's bound 1e-5 leaves a margin of 37, and the smallest bug there differs by 0.07.
bf16 autocast on CPU (exact splits of the same models) shows up to 3.7e-3, float16 4.6e-4: their bounds
are 5e-2 and 1e-2 (no GPU was lent to measure CUDA's). A loss that sums over a fixed normaliser (the
replay's ``loss_scale`` is ``sum``) is compared with the replay's gradient divided by the world size: fed
every rank's batch, one process takes a step that many times larger. ``ddpcheck run`` learns the scale
where the replay's loss is the ranks' sum (:func:`wants_loss_probe`): a second replay feeds every batch
twice, and a loss that doubles is a sum (:func:`loss_scale`), one that stays is a mean.

Causes, from the evidence: a NaN gradient spread by the all-reduce; ranks holding different gradients after
it (or different values of one part of a sharded gradient); an exact scalar factor (``c = <g, r> / <r, r>``
with a tiny residual: the world size, its inverse, the micro-batch count); BatchNorm normalising per rank
against a replay that normalised the global batch; only the epoch's last window differing where the ranks'
windows differ; the ranks' supervised-token (or sample) counts differing under a per-rank mean. A replay
that normalised each rank's part of the union by its own statistics (``StepTrace.per_rank_norm`` of the
replay: BatchNorm without SyncBatchNorm, as the ImageNet references train) is compared so, and says so.
(``equal_microsteps``, the ranks' backward passes and forward calls, is :mod:`ddpcheck.checks.microsteps`.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ddpcheck.checks.sequence_split import CONTEXT_PREFIX
from ddpcheck.checks.shards import join_shards, sharded, with_whole_gradients
from ddpcheck.evidence import ComparedStep, StepEvidence
from ddpcheck.layout import Layout
from ddpcheck.messages import count_text
from ddpcheck.trace import MicroStep, OptimizerStep, StepTrace
from ddpcheck.verdict import STEP_EQUIVALENCE, Verdict, not_applicable, skipped

# relative L2 difference an exact replay may show, by the dtype the step computed in (module docstring);
# float16/bfloat16 autocast on CPU, exact splits of the fixtures' models: at most 4.6e-4 / 3.7e-3
TOLERANCE = {"float64": 1e-9, "float32": 1e-5, "float16": 1e-2, "bfloat16": 5e-2}
DEFAULT_DTYPE = "float32"
FACTOR_SLACK = 0.01  # a fitted factor within 1% of a named number is that number
MAX_LISTED = 4  # steps listed in a detail

NAN = (
    "the DDP gradient is NaN while one process's is not: a rank's loss was NaN (a mean over a micro-batch "
    "without labels or samples: see supervision) and DDP's all-reduce spread it to every rank"
)
RANKS_APART = (
    "the ranks hold different gradients when the optimizer steps: the gradient was not averaged over the "
    "data-parallel group (the model is not wrapped in DDP, or the window's last backward ran under no_sync)"
)
FACTOR = "the gradient is exactly {factor} one process's, {why}"
FACTOR_WHY = {
    "world": "the world size: the ranks' gradients are summed instead of averaged (an all_reduce without "
    "dividing by the world size), or the loss is multiplied by the world size on top of a mean over the "
    "global batch",
    "inverse world": "1 / the world size: the loss is divided by the global batch's count and DDP's average "
    "divides it once more (multiply it by the world size)",
    "micro": "the micro-batch count: each micro-batch's loss is scaled by the number of micro-batches, "
    "which differs between one process and the ranks",
    "other": "a constant: the loss is scaled by a number that depends on the world size",
}
UNPROBED = (
    "; a loss summed over a fixed per-rank normaliser would show the same factor, and the replay did not "
    "probe the loss"
)
BATCHNORM = (
    "BatchNorm normalises each rank's batch by that batch's own statistics ({modules}); one process "
    "normalises the global batch"
)
PER_RANK_NORM = "BatchNorm statistics are per rank, as DDP without SyncBatchNorm computes them; compared so"
TAIL = (
    "only the epoch's last {window} differs, where the ranks' windows differ ({windows}): the "
    "loss is normalised per rank or by a constant (the accumulation steps), not by the window's count over "
    "all ranks"
)
RANK_MEAN = (
    "ranks' {what} counts differ ({counts}) and the loss is a mean per rank: DDP averages the ranks' means, "
    "which weighs each rank's {noun} unequally"
)
SHARDS_APART = (
    "ranks holding the same part of a sharded gradient (tensor peers of a replicated parameter, or "
    "data-parallel replicas) hold different values: they computed on different data, or the gradient "
    "was not reduced over the group that shares it"
)
CONTEXT = (
    "the step differs from one process's on the whole sequences: a context-parallel rank computes something "
    "over its slice alone (labels shifted inside each slice, positions or a causal mask built per slice, a "
    "loss normalised per slice, attention that does not see the other slices)"
)
OTHER = (
    "the step depends on how the global batch is split over the ranks: something in the loss or the model "
    "is computed over the rank's batch alone (a per-rank normaliser, batch statistics, in-batch negatives)"
)
FIXES = {
    NAN: "drop samples without a supervised token before sharding, and divide the summed loss by the token "
    "count all-reduced over the data-parallel group",
    RANKS_APART: "wrap the model in DistributedDataParallel and run each window's last backward outside "
    "no_sync (or all-reduce the gradients and divide by the world size before optimizer.step)",
    "factor": "scale the loss so that DDP's average of the ranks gives the global batch's mean: sum the "
    "loss, divide by the count all-reduced over the data-parallel group, multiply by the world size",
    BATCHNORM: "convert the model with torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) (or use "
    "GroupNorm or LayerNorm, which do not depend on the batch)",
    TAIL: "normalise each window by its sample (or token) count over all ranks: sum the loss, divide by the "
    "all-reduced count of the window, multiply by the world size",
    RANK_MEAN: "divide the summed loss by the {noun} count all-reduced over the data-parallel group (times "
    "the world size that DDP's average divides by)",
    SHARDS_APART: "feed tensor and context peers the same batch (shard the data by the data-parallel "
    "rank), and reduce every gradient over the ranks that hold its copies",
    CONTEXT: "shift the labels and build position_ids over the whole sequence before the split, slice every "
    "tensor alike, and normalise the loss by the token count all-reduced over the context-parallel group",
    OTHER: "compute every normaliser and batch statistic over the data-parallel group (an all-reduce), or "
    "--allow step_equivalence where a per-rank batch is meant (in-batch negatives)",
}


def tolerance_for(dtype: str) -> float:
    """The relative L2 difference an exact replay may show for gradients of ``dtype`` (float32 if unknown)."""
    return TOLERANCE.get(dtype.replace("torch.", ""), TOLERANCE[DEFAULT_DTYPE])


def _vector(values: Sequence[float]) -> Any:
    """float64 numpy; an ``array('f')`` or ``array('d')`` is read in place (no Python float per value)."""
    import numpy as np

    code = getattr(values, "typecode", "")
    if code in ("f", "d"):
        return np.frombuffer(values, dtype=np.float32 if code == "f" else np.float64).astype(np.float64)  # type: ignore[call-overload]
    return np.asarray(values, dtype=np.float64)


def _same_values(a: Sequence[float], b: Sequence[float]) -> bool:
    """Equal values, compared by numpy for float arrays (``array == array`` makes a float per value)."""
    import numpy as np

    codes = getattr(a, "typecode", ""), getattr(b, "typecode", "")
    if codes[0] == codes[1] and codes[0] in ("f", "d"):  # views in place, no copy
        dtype = np.float32 if codes[0] == "f" else np.float64
        return bool(np.array_equal(np.frombuffer(a, dtype=dtype), np.frombuffer(b, dtype=dtype)))  # type: ignore[call-overload]
    if codes[0] or codes[1]:
        return bool(np.array_equal(_vector(a), _vector(b)))
    return a == b


def _has_nan(values: Sequence[float]) -> bool:
    import numpy as np

    return bool(np.isnan(_vector(values)).any())


def relative_difference(g: Sequence[float], r: Sequence[float]) -> float:
    """``|g - r| / |r|`` (inf when ``r`` is zero and ``g`` is not; NaN when ``g`` holds a NaN)."""
    import numpy as np

    a, b = _vector(g), _vector(r)
    if a.shape != b.shape:
        raise ValueError(f"gradients of {a.size} and {b.size} values cannot be compared")
    diff, ref = float(np.linalg.norm(a - b)), float(np.linalg.norm(b))
    return diff / ref if ref else (0.0 if diff == 0 else math.inf)


def fit_factor(g: Sequence[float], r: Sequence[float]) -> tuple[float, float]:
    """The scalar ``c`` that best maps ``r`` onto ``g`` (least squares) and the relative residual
    ``|g - c r| / |g|``: a tiny residual means ``g`` is ``r`` scaled."""
    import numpy as np

    a, b = _vector(g), _vector(r)
    rr = float(b @ b)
    if not rr:
        return 0.0, 1.0
    c = float(a @ b) / rr
    gg = float(np.linalg.norm(a))
    return c, (float(np.linalg.norm(a - c * b)) / gg if gg else 0.0)


@dataclass(frozen=True)
class StepDiff:
    """One compared optimizer step: how far the DDP gradient is from the replay's, and the windows."""

    index: int
    rel: float  # NaN: the DDP gradient holds a NaN
    factor: float
    residual: float
    micro: tuple[int, ...]  # micro-steps per data-parallel rank
    samples: tuple[int, ...]  # samples per data-parallel rank (-1 unknown)
    supervised: tuple[int, ...] | None  # supervised labels per data-parallel rank (None: no labels)
    # per micro-step position, each rank's count (supervised labels where known, else samples; -1 unknown
    # or no such micro-step): a per-rank mean weighs the ranks apart where these differ
    per_micro: tuple[tuple[int, ...], ...] = ()


def _fed(step: OptimizerStep) -> list[MicroStep]:
    """The micro-steps a loader fed (a padding pass the loop builds itself holds no data)."""
    return [m for m in step.micro if m.batches]


def _samples(step: OptimizerStep) -> int:
    counts = [m.samples for m in _fed(step)]
    return -1 if any(c < 0 for c in counts) else sum(counts)


def _supervised(step: OptimizerStep) -> int | None:
    counts = [m.supervised for m in _fed(step)]
    return None if not counts or any(c is None for c in counts) else sum(c for c in counts if c is not None)


def _step_diff(index: int, heads: Sequence[StepTrace], reference: OptimizerStep, scale: float) -> StepDiff:
    steps = [next(s for s in h.steps if s.index == index) for h in heads]
    g = steps[0].grad
    assert g is not None and reference.grad is not None
    expected = reference.grad if scale == 1.0 else [v * scale for v in reference.grad]
    rel = relative_difference(g, expected) if not _has_nan(g) else math.nan
    norm_g, norm_r = steps[0].grad_norm, reference.grad_norm
    if norm_g is not None and norm_r and not math.isnan(rel):  # kept coordinates: the whole norm counts too
        rel = max(rel, abs(norm_g - norm_r * scale) / (norm_r * scale))
    factor, residual = fit_factor(g, expected) if not math.isnan(rel) else (math.nan, math.nan)
    sup = [_supervised(s) for s in steps]
    labelled = not any(c is None for c in sup)
    return StepDiff(
        index,
        rel,
        factor,
        residual,
        tuple(len(s.micro) for s in steps),
        tuple(_samples(s) for s in steps),
        tuple(c for c in sup if c is not None) if labelled else None,
        _per_micro(steps, labelled),
    )


def _per_micro(steps: Sequence[OptimizerStep], labelled: bool) -> tuple[tuple[int, ...], ...]:
    def count(step: OptimizerStep, m: int) -> int:
        if m >= len(step.micro):
            return -1
        micro = step.micro[m]
        value = micro.supervised if labelled else micro.samples
        return -1 if value is None else value

    width = max((len(s.micro) for s in steps), default=0)
    return tuple(tuple(count(s, m) for s in steps) for m in range(width))


LOSS_SLACK = 0.01  # relative: losses at the same weights agree far closer; sum and mean differ 2x


def wants_loss_probe(run: Sequence[StepTrace | None], replay: StepTrace, layout: Layout) -> bool:
    """Whether only a probe can say how the loss scales: at every compared micro-step with losses, the
    replay's loss on the union is the sum of the data-parallel ranks' losses (a mean gives their mean). A
    sum over a fixed per-rank normaliser and a mean over a count all-reduced without the world size both
    show that; fed every batch twice, the first doubles and the second does not (:func:`loss_scale`)."""
    heads = [t for t in _heads(run, layout) if t is not None]
    if replay.loss_scale or len(heads) < 2:
        return False
    sums = []
    for index in _compared(heads, replay):
        steps = [next(s for s in t.steps if s.index == index) for t in (*heads, replay)]
        if any(s.not_comparable or len(s.micro) != len(steps[-1].micro) for s in steps):
            continue
        for micro in zip(*(s.micro for s in steps), strict=True):
            losses = [m.loss for m in micro]
            if any(x is None or not math.isfinite(x) for x in losses):
                continue
            ranks, union = [float(x) for x in losses[:-1] if x is not None], float(losses[-1] or 0.0)
            total = sum(ranks)
            if abs(total - total / len(ranks)) <= LOSS_SLACK * abs(total):  # sum and mean alike: no answer
                continue
            sums.append(abs(union - total) <= LOSS_SLACK * abs(total))
    return bool(sums) and all(sums)


def loss_scale(replay: StepTrace, twice: StepTrace) -> str:
    """How the loss answers every rank's batch given twice, from a replay and its probe (``twice``) at the
    same weights: ``sum`` (twice the loss), ``mean`` (the same loss), "" (no losses, or neither)."""
    probe = {s.index: s for s in twice.steps}
    ratios = []
    for step in replay.steps:
        other = probe.get(step.index)
        if other is None or step.not_comparable or other.not_comparable:
            continue
        for a, b in zip(step.micro, other.micro, strict=False):
            if a.loss is None or b.loss is None or not math.isfinite(a.loss) or not math.isfinite(b.loss):
                continue
            if abs(a.loss) > 1e-12:
                ratios.append(b.loss / a.loss)
    if ratios and all(abs(r - 2.0) <= 2 * LOSS_SLACK for r in ratios):
        return "sum"
    if ratios and all(abs(r - 1.0) <= LOSS_SLACK for r in ratios):
        return "mean"
    return ""


def _heads(run: Sequence[StepTrace | None], layout: Layout) -> list[StepTrace | None]:
    """One trace per data-parallel rank: its first replica's."""
    if len(run) != layout.world_size:
        return list(run)
    return [run[r] for r in layout.representatives()]


def _compared(heads: Sequence[StepTrace], replay: StepTrace) -> list[int]:
    """Step indices with a kept gradient on every data-parallel rank and in the replay."""
    kept = [{s.index for s in h.steps if s.grad is not None} for h in heads]
    mine = {s.index for s in replay.steps if s.grad is not None}
    return sorted(mine.intersection(*kept))


def _why_not(index: int, heads: Sequence[StepTrace], replay: StepTrace) -> str:
    """Why step ``index`` cannot be compared, as the run's ranks or the replay recorded it ("": it can)."""
    for where, trace in (*((f"rank {r}: ", h) for r, h in enumerate(heads)), ("", replay)):
        step = next((s for s in trace.steps if s.index == index), None)
        if step is not None and step.not_comparable:
            return where + step.not_comparable
    return ""


def _unjudgeable(run: Sequence[StepTrace | None], replay: StepTrace | None, layout: Layout) -> Verdict | None:
    missing = [r for r, t in enumerate(run) if t is None]
    if missing:
        return skipped(STEP_EQUIVALENCE, f"rank {missing[0]} recorded no training step")
    if replay is None:
        return skipped(
            STEP_EQUIVALENCE, "the one-process replay did not run: nothing to compare the step with"
        )
    heads = [t for t in _heads(run, layout) if t is not None]
    wanted = tuple(layout.representatives())
    if layout.replicas > 1 and replay.replay_ranks != wanted:
        joined = "every rank's" if replay.replay_ranks is None else f"ranks {list(replay.replay_ranks)}'"
        return not_applicable(
            STEP_EQUIVALENCE,
            f"the replay joined {joined} batches, where mesh {layout.spec} needs one rank per data-parallel "
            f"coordinate ({list(wanted)}): record it with --mesh {layout.spec}",
        )
    if layout.replicas > 1 and any(h.parameters != replay.parameters for h in heads):
        return not_applicable(
            STEP_EQUIVALENCE,
            f"the ranks of mesh {layout.spec} hold shards of the parameters ({heads[0].parameters} values on "
            f"rank 0, {replay.parameters} at one process): compare at a plain world size",
        )
    indices = _compared(heads, replay)
    if not indices:
        why = f" ({replay.notes[0]})" if replay.notes else ""
        return not_applicable(
            STEP_EQUIVALENCE, f"no optimizer step kept its gradient on every rank and in the replay{why}"
        )
    reasons = [_why_not(i, heads, replay) for i in indices]
    if all(reasons):
        return not_applicable(STEP_EQUIVALENCE, f"the one-process replay is not faithful: {reasons[0]}")
    sizes = {len(s.grad or ()) for t in (*heads, replay) for s in t.steps if s.index in indices}
    if len(sizes) > 1:
        shown = ", ".join(map(str, sorted(sizes)))
        return not_applicable(
            STEP_EQUIVALENCE,
            f"the ranks and the replay kept gradients of different sizes ({shown} values): not the same "
            "parameters",
        )
    return None


def check_step_equivalence(
    run: Sequence[StepTrace | None],
    replay: StepTrace | None,
    layout: Layout,
    tolerance: float | None = None,
) -> Verdict:
    """The DDP step's gradient against the one-process replay's, at every step both kept.

    ``run``: each rank's StepTrace by global rank (None: the rank recorded none); ``replay``: the StepTrace
    of one process fed, micro-step by micro-step, the union of the ranks' micro-batches from the same
    weights (its ``notes`` say why it is not faithful: then ``n/a``); ``layout``: the run's layout (the
    data-parallel ranks are compared, one replica each); ``tolerance``: the relative L2 difference allowed
    (default: :func:`tolerance_for` the gradient's dtype).
    """
    run, refused = _whole(run, tolerance)
    refused = refused or _unjudgeable(run, replay, layout)
    if refused is not None:
        return refused
    assert replay is not None
    heads = [t for t in _heads(run, layout) if t is not None]
    dtype = _dtype(heads[0])
    tol = tolerance if tolerance is not None else tolerance_for(dtype)
    candidates = _compared(heads, replay)
    reasons = {i: _why_not(i, heads, replay) for i in candidates}
    indices = [i for i in candidates if not reasons[i]]
    apart = _ranks_apart(heads, indices, tol)
    if apart is not None:
        return apart
    scale = 1.0 / layout.dp_world_size if replay.loss_scale == "sum" else 1.0
    by_index = {s.index: s for s in replay.steps if s.grad is not None}
    # a replayed step whose gradient is NaN compares with nothing (it started from NaN weights, or its
    # loss is NaN at one process too)
    finite = [i for i in indices if not _has_nan(by_index[i].grad or ())]
    dropped = len(indices) - len(finite)
    indices = finite
    if not indices:
        return not_applicable(
            STEP_EQUIVALENCE, "the one-process replay's gradient is NaN: the loss is NaN at one process too"
        )
    diffs = [_step_diff(i, heads, by_index[i], scale) for i in indices]
    note = " (the loss sums over a fixed normaliser: compared with the replay's step / world size)"
    note = note if scale != 1.0 else ""
    if dropped:
        note += (
            f"; {count_text(dropped, 'later steps')} not compared: the replay from the run's weights is NaN"
        )
    per_part = bool(replay.per_rank_norm)
    if per_part:
        shown = ", ".join(replay.per_rank_norm[:4])
        note += f"; {PER_RANK_NORM} ({shown})"
    unfaithful = [i for i in candidates if reasons[i]]
    if unfaithful:
        note += f"; {count_text(len(unfaithful), 'steps')} not compared: {reasons[unfaithful[0]]}"
    return _judged(diffs, heads, layout, Settings(tol, dtype, replay.loss_scale, note, per_part))


def _dtype(trace: StepTrace) -> str:
    """The dtype whose noise the step carries: the coarser of the gradient's and the autocast one."""
    return max(trace.grad_dtype or DEFAULT_DTYPE, trace.compute_dtype or DEFAULT_DTYPE, key=tolerance_for)


def _whole(
    run: Sequence[StepTrace | None], tolerance: float | None
) -> tuple[Sequence[StepTrace | None], Verdict | None]:
    """The ranks' traces with each step's whole gradient where they kept shards of it (DTensors), or the
    verdict where the shards say something first: two ranks holding one part apart, or parts no rank
    holds."""
    if not sharded(run) or any(t is None for t in run):
        return run, None
    traces = [t for t in run if t is not None]
    tol = tolerance if tolerance is not None else tolerance_for(_dtype(traces[0]))
    joined = join_shards(traces, tol)
    if joined.apart is not None:
        index, first, other, rel = joined.apart
        shown = "NaN on one of them" if math.isnan(rel) else f"{rel:.2g} (rel. L2)"
        return run, Verdict(
            STEP_EQUIVALENCE,
            "fail",
            f"rank {other}'s shard of the gradient differs from rank {first}'s where both hold the same "
            f"values by {shown} at optimizer step {index}, when they should hold one averaged gradient",
            SHARDS_APART,
            ranks=(first, other),
            examples=(index,),
            fix=FIXES[SHARDS_APART],
        )
    if not joined.steps and joined.uncovered is not None:
        index, held, kept = joined.uncovered
        return run, not_applicable(
            STEP_EQUIVALENCE,
            f"the ranks' shards of the gradient hold {held} of its {kept} kept values at step {index}: "
            "it cannot be put together",
        )
    return with_whole_gradients(run, joined, traces[0].parameters), None


@dataclass(frozen=True)
class Settings:
    """How the compared steps are judged and described."""

    tol: float
    dtype: str
    loss_scale: str
    note: str  # appended to the detail
    norm_per_part: bool = False  # the replay normalised each rank's part of the union on its own


def _judged(diffs: Sequence[StepDiff], heads: Sequence[StepTrace], layout: Layout, how: Settings) -> Verdict:
    bad = [d for d in diffs if math.isnan(d.rel) or d.rel > how.tol]
    evidence = StepEvidence(
        how.tol,
        how.dtype,
        how.loss_scale,
        tuple(
            ComparedStep(
                d.index, None if math.isnan(d.rel) else d.rel, d.micro, d.samples, d.supervised or None
            )
            for d in diffs
        ),
    )
    tolerance = f"tolerance {how.tol:g} for {how.dtype}"
    if not bad:
        worst = max(d.rel for d in diffs)
        return Verdict(
            STEP_EQUIVALENCE,
            "pass",
            f"the DDP gradient equals one process's on the union of the ranks' micro-batches at "
            f"{count_text(len(diffs), 'compared steps')} ({_windows_text(diffs)}; largest rel. difference "
            f"{worst:.2g}, {tolerance}){how.note}",
            evidence=evidence,
        )
    cause, fix = _cause(diffs, bad, heads, layout, how)
    detail = (
        f"the DDP gradient differs from one process's on the union of the ranks' micro-batches by "
        f"{_diffs_text(bad)} ({len(bad)} of {count_text(len(diffs), 'compared steps')}; "
        f"{_windows_text(bad)}; {tolerance}){how.note}"
    )
    examples = tuple(d.index for d in bad[:MAX_LISTED])
    ranks = tuple(range(len(heads)))
    return Verdict(
        STEP_EQUIVALENCE, "fail", detail, cause, ranks, examples=examples, fix=fix, evidence=evidence
    )


def _ranks_apart(heads: Sequence[StepTrace], indices: Sequence[int], tol: float) -> Verdict | None:
    """Every data-parallel rank should hold rank 0's gradient; a fail naming the first that does not."""
    for index in indices:
        grads = [next(s.grad for s in h.steps if s.index == index) for h in heads]
        first = grads[0]
        assert first is not None
        for dp, other in enumerate(grads[1:], start=1):
            assert other is not None
            if other is first or _same_values(other, first):  # the usual answer: bit for bit the same
                continue
            rel = relative_difference(other, first)
            both_nan = _has_nan(other) and _has_nan(first)
            if not both_nan and (math.isnan(rel) or rel > tol):
                shown = "NaN on one of them" if math.isnan(rel) else f"{rel:.2g} (rel. L2)"
                return Verdict(
                    STEP_EQUIVALENCE,
                    "fail",
                    f"data-parallel rank {dp}'s gradient differs from rank 0's by {shown} at optimizer step "
                    f"{index}, when every rank should hold the same averaged gradient",
                    RANKS_APART,
                    ranks=(0, dp),
                    examples=(index,),
                    fix=FIXES[RANKS_APART],
                )
    return None


def _cause(
    diffs: Sequence[StepDiff],
    bad: Sequence[StepDiff],
    heads: Sequence[StepTrace],
    layout: Layout,
    how: Settings,
) -> tuple[str, str]:
    """The likeliest cause of the failing steps ``bad`` among the compared ``diffs``, and its fix."""
    if any(math.isnan(d.rel) for d in bad):
        return NAN, FIXES[NAN]
    factor = _exact_factor(bad, layout.dp_world_size, how.tol, how.loss_scale)
    if factor:
        return factor, FIXES["factor"]
    modules = sorted({m for h in heads for m in h.per_rank_norm})
    if modules and not how.norm_per_part:  # a replay that normalised the global batch
        return BATCHNORM.format(modules=", ".join(modules[:4])), FIXES[BATCHNORM]
    good = [d for d in diffs if d not in bad]
    if good and bad[-1] is diffs[-1] and all(map(_differ, bad)) and not any(map(_differ, good)):
        window = "accumulation window" if max(bad[-1].micro) > 1 else "step"
        return TAIL.format(window=window, windows=_window_counts(bad[-1])), FIXES[TAIL]
    if all(_counts_differ(d) for d in bad) and not any(_counts_differ(d) for d in good):
        d = bad[0]
        what, noun = ("supervised-token", "tokens") if d.supervised is not None else ("sample", "samples")
        counts = _counts_differ(d)
        shown = " vs ".join(str(c) for c in counts[:4]) + (" ..." if len(counts) > 4 else "")
        if len(d.per_micro) > 1:
            position = next(m for m, c in enumerate(d.per_micro) if c == counts)
            shown += f" in micro-batch {position} of step {d.index}"
        return RANK_MEAN.format(what=what, counts=shown, noun=noun), FIXES[RANK_MEAN].format(noun=what)
    if any(name.startswith(CONTEXT_PREFIX) for name in layout.names if name not in layout.data_dims):
        return CONTEXT, FIXES[CONTEXT]
    return OTHER, FIXES[OTHER]


def _exact_factor(bad: Sequence[StepDiff], world: int, tol: float, loss_scale: str) -> str:
    """The cause when every failing step is the replay's gradient times one constant ("" when not)."""
    factors = [d.factor for d in bad]
    if any(d.residual > max(10 * tol, 1e-4) for d in bad) or any(abs(c - 1) <= FACTOR_SLACK for c in factors):
        return ""
    c = factors[0]
    if any(abs(f - c) > FACTOR_SLACK * abs(c) for f in factors):
        return ""
    candidates: list[tuple[str, float]] = []
    if world > 1:
        candidates += [("world", float(world)), ("inverse world", 1.0 / world)]
    micro = {m for d in bad for m in d.micro}
    if len(micro) == 1 and next(iter(micro)) > 1:
        k = float(next(iter(micro)))
        candidates += [("micro", k), ("micro", 1.0 / k)]
    for key, value in candidates:
        if abs(c - value) <= FACTOR_SLACK * value:
            why = FACTOR_WHY[key]
            if key == "inverse world" and loss_scale != "mean":
                why += UNPROBED
            return FACTOR.format(factor=_factor_text(c), why=why)
    return FACTOR.format(factor=_factor_text(c), why=FACTOR_WHY["other"])


def _factor_text(c: float) -> str:
    if c >= 1:
        return f"{c:.3g}x"
    inverse = 1 / c if c else math.inf
    return f"1/{inverse:.3g} of" if abs(inverse - round(inverse)) < 0.01 * inverse else f"{c:.3g}x"


def _differ(d: StepDiff) -> bool:
    return len(set(d.micro)) > 1 or len(set(d.samples)) > 1


def _counts_differ(d: StepDiff) -> tuple[int, ...]:
    """The first micro-step's per-rank counts that differ (all known); () when none do."""
    for counts in d.per_micro:
        if min(counts) >= 0 and len(set(counts)) > 1:
            return counts
    return ()


def _window_counts(d: StepDiff) -> str:
    parts = [
        f"rank {r}: {count_text(m, 'micro-batches')} of {count_text(s, 'samples') if s >= 0 else '? samples'}"
        for r, (m, s) in enumerate(zip(d.micro, d.samples, strict=True))
    ]
    return ", ".join(parts[:4]) + (" ..." if len(parts) > 4 else "")


def _diffs_text(bad: Sequence[StepDiff]) -> str:
    parts = [
        ("NaN" if math.isnan(d.rel) else f"{d.rel:.2g}") + f" at step {d.index}" for d in bad[:MAX_LISTED]
    ]
    more = f" and {len(bad) - MAX_LISTED} more" if len(bad) > MAX_LISTED else ""
    return ", ".join(parts) + more


def _windows_text(diffs: Sequence[StepDiff]) -> str:
    """How many micro-batches the compared steps took: "1 micro-batch each", or per step where they vary."""
    shapes = {d.micro for d in diffs}
    if len(shapes) == 1 and len(set(next(iter(shapes)))) == 1:
        n = next(iter(shapes))[0]
        return f"{count_text(n, 'micro-batches')} each"
    parts = []
    for d in diffs[:MAX_LISTED]:
        per = d.micro[0] if len(set(d.micro)) == 1 else "/".join(map(str, d.micro[:4]))
        parts.append(f"step {d.index}: {per}")
    return "micro-batches per rank " + ", ".join(parts)
