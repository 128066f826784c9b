"""``metric_equivalence`` for a training script (issue 41): at every data-parallel layout, the values the
script's own evaluation reports equal the single process's, on the same weights.

Pure: plain traces in (:class:`~ddpcheck.trace.EvalRecord` per rank, with the loaders' epochs), a Verdict
with typed evidence (:class:`~ddpcheck.evidence.MetricEvidence`) out. The k-th evaluation (round) of
a run is compared with the k-th of the single process when both ran whole and their weights' fingerprints
agree; a value is compared when both reported it under the same key (source, name, position in its line,
occurrence in the round) and it is not left alone (:mod:`ddpcheck.checks.reported`: timings, learning
rates, the layout, steps and epochs, per-rank counts, training values; a printed number or logger key that
names no metric; printed line templates seen outside any evaluation; keys reported while a loop still ran).
Two values agree within float noise (relative :data:`REL`, absolute :data:`ABSOLUTE`; summation order
differs across partitions) plus, for printed ones, one unit in the last printed digit; NaN equals NaN only.
A difference fails with its mechanism (:mod:`ddpcheck.checks.eval_causes`), or saying that none was
identified (what was compared and what was ruled out): on equal weights, a value read as a metric that
moves beyond float noise is a divergence whatever its cause; an evaluation that drew random numbers while
its loop ran cannot be told from its draws and is ``n/a``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ddpcheck.checks.eval_causes import COMBINING, Ratio, Split, mechanism, split_of
from ddpcheck.checks.reported import close, left_alone, reports_metric, words
from ddpcheck.eval_trace import EvalRecord, EvalRound, ReportedValue
from ddpcheck.evidence import ComparedValue, MetricEvidence
from ddpcheck.layout import Layout
from ddpcheck.messages import count_text
from ddpcheck.trace import EpochTrace, LoaderFacts, ScriptRankTrace
from ddpcheck.verdict import METRIC_EQUIVALENCE, Verdict, not_applicable

REL = 1e-5  # float32 sums over other shares differ by up to ~1e-6 (benchmarks/bench_metric_noise.py)
ABSOLUTE = 1e-8
PRINTED = ("print", "log")
LOGGERS = (
    "tensorboard",
    "wandb",
    "mlflow",
)  # a key there may be a training value: compared when it names a metric
NOT_RECORDED = "the script's evaluation was not recorded (--no-metrics, or recorded with --eval-rounds 0)"
NO_EVALUATION = (
    "the script ran no evaluation: no loader was iterated with gradients off or its model in eval mode"
)
NO_VALUES = (
    "the evaluation reported no value read as a metric (a printed or logged line naming one, torchmetrics, "
    "HF evaluate or Trainer.evaluate(), Lightning's validation logs, SummaryWriter, wandb, mlflow)"
)
STOPPED_FIRST = (
    " before ddpcheck stopped it after --epochs epochs of its main loader (an evaluation after more training "
    "is reached with --epochs N, the script's own count)"
)
Key = tuple[str, str, int, int]
UNREAD = -1  # the fingerprint of weights the rank side could not read (never compared)


@dataclass(frozen=True)
class MetricJudgement:
    """The verdict, and the eval loader it belongs with ("": the script iterated none)."""

    loader: str
    verdict: Verdict


@dataclass
class _Round:
    """One compared evaluation at this layout."""

    index: int
    words: str
    values: list[ComparedValue] = field(default_factory=list)
    split: Split | None = None
    combined: bool = False
    drew: tuple[str, ...] = ()
    differ: str = ""  # how the ranks' values differ ("" they agree)


def judge_metric(
    reference: Mapping[int, ScriptRankTrace], run: Mapping[int, ScriptRankTrace], layout: Layout
) -> MetricJudgement:
    """``metric_equivalence`` of ``run`` (every rank's trace at ``layout``) against ``reference`` (the single
    process's)."""
    record = reference[0].evaluation if 0 in reference else None
    if record is None:
        return MetricJudgement("", not_applicable(METRIC_EQUIVALENCE, NOT_RECORDED))
    loader = next((r.epochs[0][0] for r in record.rounds if r.epochs), "")
    if not record.rounds:
        why = NO_EVALUATION + (STOPPED_FIRST if reference[0].stopped else "")
        return MetricJudgement(loader, not_applicable(METRIC_EQUIVALENCE, why))
    whole = [r for r in record.rounds if r.whole]
    if not whole:
        why = (
            "no evaluation of the single process ran whole (each loop left its loader early, as Lightning's "
            "sanity check does): nothing complete to compare"
        )
        return MetricJudgement(loader, not_applicable(METRIC_EQUIVALENCE, why))
    said = sum(len(_kept(r, record)) for r in whole)
    if not said:
        return MetricJudgement(loader, not_applicable(METRIC_EQUIVALENCE, NO_VALUES))
    if layout.dp_world_size < 2:
        values = count_text(said, "values")
        why = f"one data-parallel rank: the reference ({values} reported after its evaluations)"
        return MetricJudgement(loader, not_applicable(METRIC_EQUIVALENCE, why))
    compared: list[_Round] = []
    reasons: list[str] = []
    for mine in whole:
        found = _compare(mine, reference, run, layout)
        if isinstance(found, str):
            reasons.append(found)
        else:
            compared.append(found)
    if not compared or not any(r.values for r in compared):
        why = "; ".join(dict.fromkeys(reasons)) or "no value was reported at both"
        return MetricJudgement(loader, not_applicable(METRIC_EQUIVALENCE, f"nothing compared: {why}"))
    libraries = tuple(sorted({*record.libraries, *_libraries(run)}))
    return MetricJudgement(loader, _verdict(compared, layout, libraries))


# --- one evaluation ---------------------------------------------------------------------------------------


def _compare(
    single: EvalRound,
    reference: Mapping[int, ScriptRankTrace],
    run: Mapping[int, ScriptRankTrace],
    layout: Layout,
) -> _Round | str:
    """The k-th evaluation compared (or why it cannot be)."""
    nth = _ordinal(single.index + 1)
    theirs = {r: _round(t.evaluation, single.index) for r, t in run.items()}
    mine = theirs.get(0)
    record = run[0].evaluation if 0 in run else None
    if mine is None or record is None:
        return f"rank 0 ran no {nth} evaluation at this layout"
    if not mine.whole:
        return f"rank 0's {nth} evaluation did not run whole (its loop left the loader early)"
    if single.weights != mine.weights or UNREAD in mine.weights:
        why = mine.held if mine.held not in ("saved", "loaded") else "the model evaluated differs"
        return f"the {nth} evaluation ran on other weights than the single process's ({why})"
    ref_record = reference[0].evaluation
    assert ref_record is not None
    ours, kept = _kept(single, ref_record), _kept(mine, record)
    found = _Round(single.index, _describe(single, mine, theirs))
    others = {r: _kept(rd, _record(run[r])) for r, rd in theirs.items() if rd is not None and r != 0}
    for key, value in ours.items():
        at = kept.get(key)
        if at is None:
            continue
        unit = max(value.unit, at.unit)
        ranks = tuple(at.value if r == 0 else _value(others.get(r), key) for r in sorted(run))
        equal = close(value.value, at.value, unit, rel=REL, absolute=ABSOLUTE)
        name = _name(value)
        found.values.append(
            ComparedValue(single.index, value.source, name, value.value, at.value, ranks, unit, equal)
        )
        if not found.differ:
            found.differ = _ranks_differ(name, ranks, unit)
    found.split = _split(single, reference, run, layout)
    found.combined = any(name in COMBINING for name, n in mine.collectives if n)
    found.drew = tuple(sorted({*single.drew, *mine.drew}))
    return found


def _record(trace: ScriptRankTrace) -> EvalRecord:
    return trace.evaluation or EvalRecord()


def _value(kept: Mapping[Key, ReportedValue] | None, key: Key) -> float | None:
    found = kept.get(key) if kept is not None else None
    return found.value if found is not None else None


def _ranks_differ(name: str, ranks: Sequence[float | None], unit: float) -> str:
    first = ranks[0]
    for rank, value in enumerate(ranks[1:], start=1):
        if (
            first is not None
            and value is not None
            and not close(first, value, unit, rel=REL, absolute=ABSOLUTE)
        ):
            return f"the ranks report different {name}: rank 0 {_num(first)}, rank {rank} {_num(value)}"
    return ""


def _round(record: EvalRecord | None, index: int) -> EvalRound | None:
    if record is None:
        return None
    return next((r for r in record.rounds if r.index == index), None)


def _kept(round_: EvalRound, record: EvalRecord) -> dict[Key, ReportedValue]:
    """The round's values that are compared, by key."""
    progress = set(round_.progress)
    outside = set(record.outside)
    kept: dict[Key, ReportedValue] = {}
    for value in round_.values:
        if (value.source, value.name) in progress:
            continue
        if value.source in PRINTED:
            label = value.label
            if (
                value.name in outside
                or left_alone(label.replace("|", " "))
                or not reports_metric(label, value.name)
            ):
                continue
        elif left_alone(value.name) or (value.source in LOGGERS and not reports_metric(value.name, "")):
            continue
        kept[(value.source, value.name, value.position, value.occurrence)] = value
    return kept


def _name(value: ReportedValue) -> str:
    """How a value is named in a report: its key, or a printed number's label and line."""
    if value.source not in PRINTED:
        return f"{value.name or value.source} ({value.source})"
    label = " ".join(words(value.label.split("|")[0])) or f"number {value.position + 1}"
    return f"{label} (printed: {value.name!r})"


def _describe(single: EvalRound, mine: EvalRound, theirs: Mapping[int, EvalRound | None]) -> str:
    loaders = ", ".join(f"{name} epoch {epoch}" for name, epoch in single.epochs)
    held = "loaded on every rank" if all(r is None or r.held == "loaded" for r in theirs.values()) else ""
    weights = (
        f"on the weights the single process evaluated there ({held})"
        if held
        else "on the same weights as the single process (their fingerprints agree)"
    )
    if not single.weights:
        weights = "calling no model (no weights to hold)"
    return f"the {_ordinal(single.index + 1)} evaluation ({loaders}), {weights}"


def _split(
    single: EvalRound,
    reference: Mapping[int, ScriptRankTrace],
    run: Mapping[int, ScriptRankTrace],
    layout: Layout,
) -> Split | None:
    """How the ranks split the evaluation's first loader (one rank per data-parallel coordinate)."""
    if not single.epochs:
        return None
    loader, epoch = single.epochs[0]
    ref_epoch, facts = _epoch(reference.get(0), loader, epoch)
    per_rank: list[EpochTrace | None] = []
    for rank in layout.representatives():
        mine = _round(run[rank].evaluation, single.index) if rank in run else None
        at = next((e for name, e in mine.epochs if name == loader), None) if mine is not None else None
        per_rank.append(_epoch(run.get(rank), loader, at)[0] if at is not None else None)
        if rank == 0:
            facts = _epoch(run.get(0), loader, at if at is not None else -1)[1] or facts
    return split_of(loader, ref_epoch, per_rank, facts or LoaderFacts())


def _epoch(
    trace: ScriptRankTrace | None, loader: str, epoch: int
) -> tuple[EpochTrace | None, LoaderFacts | None]:
    if trace is None:
        return None, None
    for item in trace.loaders:
        if item.name == loader:
            found = next((e for e in item.trace.epochs if e.epoch == epoch), None)
            return found, item.trace.facts
    return None, None


def _libraries(run: Mapping[int, ScriptRankTrace]) -> set[str]:
    return {lib for t in run.values() if t.evaluation is not None for lib in t.evaluation.libraries}


# --- the verdict ----------------------------------------------------------------------------------------


def _verdict(compared: list[_Round], layout: Layout, libraries: tuple[str, ...]) -> Verdict:
    values = [v for r in compared for v in r.values]
    first = next(r for r in compared if r.values)
    evidence = MetricEvidence(
        rel=REL,
        absolute=ABSOLUTE,
        evaluations=tuple(r.words for r in compared),
        values=tuple(values),
        shards=first.split.shards if first.split else (),
        copies=first.split.copies if first.split else 0,
        dropped=first.split.dropped if first.split else 0,
        set_size=first.split.set_size if first.split else 0,
    )
    even = _even(first.split, layout.dp_world_size)
    differing = [(r, v) for r in compared for v in r.values if not v.equal]
    if not differing:
        after = "; ".join(evidence.evaluations)
        said = f"{count_text(len(values), 'values')} equal to the single process's after {after}"
        return Verdict(METRIC_EQUIVALENCE, "pass", _sentence(said, even), evidence=evidence)
    round_, value = differing[0]
    ws = layout.dp_world_size
    shown = f"{value.name}: {_num(value.value)} at ws={ws} vs {_num(value.reference)} at one process"
    drew = round_.drew
    if drew:
        why = (
            f"{shown}, but the evaluation drew random numbers while its loop ran ({', '.join(drew)} "
            "global stream): the difference cannot be told from the draws (seed the draws per sample, or "
            "switch sampling off in evaluation)"
        )
        return Verdict(METRIC_EQUIVALENCE, "n/a", why, evidence=evidence)
    ratio = Ratio.of(value.value, value.reference, value.unit)
    found = mechanism(round_.split, round_.differ, round_.combined, layout.dp_world_size, libraries, ratio)
    more = f" ({count_text(len(differing), 'values')} differ)" if len(differing) > 1 else ""
    detail = f"{shown}{more}, after {round_.words}"
    short = value.name.split(" (")[0]
    measured = f"the reported {short} is {_num(value.value)} vs {_num(value.reference)} at one process"
    cause = f"{found.cause}: {'; '.join(filter(None, [found.detail, measured]))}"
    return Verdict(METRIC_EQUIVALENCE, "fail", detail, cause, ranks=(0,), fix=found.fix, evidence=evidence)


def _even(split: Split | None, world_size: int) -> str:
    """A note where the eval set splits evenly: padding, drops and unequal shards cannot show."""
    if split is None or not split.set_size or split.set_size % world_size:
        return ""
    other = revealing(split.set_size)
    at = f"; world size {other} would show them" if other else ""
    return (
        f"the eval set's {split.set_size:,} samples split evenly over {world_size} ranks, so padding, "
        f"dropped samples and unequal shards cannot show at this layout{at}"
    )


def revealing(size: int) -> int:
    """The smallest world size above 1 that does not divide ``size`` (0: none up to 64)."""
    return next((w for w in range(2, 65) if size % w), 0)


def _sentence(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _num(value: float) -> str:
    return "NaN" if value != value else f"{value:.6g}"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def evenly_note(evidences: Sequence[tuple[int, MetricEvidence]]) -> str:
    """A note for the whole run when every compared layout split the eval set evenly ("" otherwise)."""
    sizes = [(ws, e.set_size) for ws, e in evidences if e.set_size]
    if not sizes or any(size % ws for ws, size in sizes):
        return ""
    size = sizes[0][1]
    other = revealing(size)
    names = ", ".join(str(ws) for ws, _ in sizes)
    tail = f": run --world-sizes 1,{other} too, where {size:,} does not divide" if other else ""
    return (
        f"metric_equivalence: the eval set ({size:,} samples) splits evenly at every world size compared "
        f"({names}), so equal metrics there prove nothing about padding, dropped samples or unequal "
        f"shards{tail}"
    )
