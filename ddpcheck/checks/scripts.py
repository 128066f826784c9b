"""What the checks say of a training script (``ddpcheck run``, ``ddpcheck judge``) rather than a loader file.

The loader-file texts that name a loader file's hooks or ``CheckOptions`` are said in a script's words;
a script whose ranks never joined a process group is told to start them with its framework's launcher
(a DistributedSampler cannot split without a group); launcher variables left in the environment, which
make a framework believe in another number of processes, are named. Once the checks have judged, the
rules only a script needs turn verdicts around: a loop that never calls ``set_epoch``, a framework that
builds another sampler at one process (:func:`framework_sampler`), a launch judged without a
single-process run (:func:`standin_reference`, :func:`script_cause`) or recorded once (:data:`RECORDED_ONCE`).
The judge (:mod:`ddpcheck.checks.judge`) applies them in its one order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ddpcheck.checks.diagnose import IGNORES_RANK, TOLD_REPLICAS
from ddpcheck.checks.fixes import FIXES
from ddpcheck.checks.mixture import NO_SOURCE
from ddpcheck.checks.replicas import (
    GLOBAL_RANK,
    LAYOUT_MISMATCH,
    LOADER_GLOBAL,
    MESH_FIXES,
    REPLICA_IDS,
    TOLD,
    TOLD_GLOBAL,
    told_global,
    told_split,
)
from ddpcheck.checks.reshuffle import NOT_FORWARDED, STALE_EPOCH, evaluation_order
from ddpcheck.checks.work import NO_WORK
from ddpcheck.evidence import IndexOverflow
from ddpcheck.layout import Layout
from ddpcheck.trace import EpochTrace, RankTrace, RunTrace, UnionIds
from ddpcheck.verdict import (
    COVERAGE,
    DETERMINISM,
    RESHUFFLE,
    RNG_INDEPENDENCE,
    SINGLE_PROCESS_EQUIVALENCE,
    Verdict,
)

_NOT_FORWARDED_FIX = next(fix for text, fix in FIXES if text == NOT_FORWARDED.split("{")[0])
SCRIPT_WORDS: dict[str, str] = {
    NO_SOURCE: "batches carry no source: give dict batches a 'source' field, or define sample_source(batch) "
    "in a --hooks file, to check a mixture",
    NO_WORK: "batches carry no tokens (input_ids, attention_mask, position_ids) and no --hooks file defines "
    "batch_work(batch): every sample counts the same, balanced when the steps are",
    _NOT_FORWARDED_FIX: "call the wrapped part's set_epoch in the loop (the loader does not pass it on)",
}

ALONE = "no rank joined a process group: each process trains alone on everything its loader yields"
LIGHTNING_ALONE = (
    "; Lightning ran one device per process (under torchrun it takes devices and strategy from its "
    "arguments or from fabric run's LT_DEVICES/LT_STRATEGY, not from the launch)"
)
ALONE_FIX = (
    "start the processes as the script's framework expects, so they join one group: Lightning: "
    'Fabric(devices=N, strategy="ddp") then fabric.launch(), or fabric run --devices N train.py '
    '(Trainer: devices=N, strategy="ddp"); plain torch: init_process_group() in every process; a '
    "DistributedSampler cannot split without a group"
)
SAMPLER = "the sampler "
AT_THE_SAMPLER = (TOLD, GLOBAL_RANK, TOLD_REPLICAS)  # causes that name the loader's sampler
# variables a launcher sets that a framework reads over the script's own arguments
LAUNCHER_VARIABLES = ("LT_DEVICES", "LT_NUM_NODES", "LT_STRATEGY", "LT_ACCELERATOR", "LT_PRECISION")


def in_script_words(verdict: Verdict) -> Verdict:
    """``verdict`` with loader-file words (its hooks, CheckOptions) said as a script's."""
    changed = {}
    for name in ("detail", "cause", "fix"):
        text = getattr(verdict, name)
        for loader_file, script in SCRIPT_WORDS.items():
            if loader_file in text:
                text = text.replace(loader_file, script)
        if text != getattr(verdict, name):
            changed[name] = text
    return replace(verdict, **changed) if changed else verdict


def told_cause(verdict: Verdict, run: RunTrace, layout: Layout) -> Verdict:
    """A mesh failure the data reads as a split by a non-data coordinate, named from what the script's
    samplers were given (:func:`~ddpcheck.checks.replicas.told_split`): ``dist.get_rank()`` and the
    data-parallel rank it needs. A transposed-looking split may also be a ``--mesh`` declared in another
    order than the script's own mesh: the cause says both."""
    mesh_causes = (GLOBAL_RANK, REPLICA_IDS, LAYOUT_MISMATCH)
    if not layout.mesh or not verdict.failed or verdict.cause not in mesh_causes:
        return verdict
    told = told_split(run, layout) or (told_global(layout) if verdict.cause == GLOBAL_RANK else "")
    if not told:
        return verdict
    if verdict.cause == LAYOUT_MISMATCH and not told.startswith(TOLD_GLOBAL):
        told += f"; or --mesh {layout.spec} is declared in another order than the script builds its mesh"
    return replace(verdict, cause=told, fix=MESH_FIXES[GLOBAL_RANK])


def at_loader(verdict: Verdict, name: str) -> Verdict:
    """A cause that blames the loader's sampler (or its split), said at the line that built the loader
    (``name``)."""
    if verdict.cause.startswith(LOADER_GLOBAL):
        said = verdict.cause.removeprefix("the loader ")
        return replace(verdict, cause=f"the loader built at {name} {said}")
    if not verdict.cause.startswith(AT_THE_SAMPLER) or not verdict.cause.startswith(SAMPLER):
        return verdict
    where = f"the sampler of the loader built at {name} "
    return replace(verdict, cause=where + verdict.cause.removeprefix(SAMPLER))


def alone(verdict: Verdict, joined: bool, frameworks: Iterable[str]) -> Verdict:
    """A failure of ranks that never joined a process group (``joined`` False), named as that, with the
    launcher as its fix; any other verdict as it is."""
    if joined or not verdict.failed:
        return verdict
    # ranks alone draw alike too (each seeds and shuffles as the only process): the same cause
    if IGNORES_RANK not in verdict.cause and verdict.check != RNG_INDEPENDENCE:
        return verdict
    cause = ALONE + (LIGHTNING_ALONE if "lightning" in frameworks else "")
    return replace(verdict, cause=cause, fix=ALONE_FIX)


def launcher_note(environ: Mapping[str, str]) -> str:
    """A note naming the launcher variables set in the environment every rank inherits, or ""."""
    found = [f"{name}={environ[name]}" for name in LAUNCHER_VARIABLES if environ.get(name)]
    if not found:
        return ""
    return (
        f"the environment sets {', '.join(found)} (Lightning Fabric's launcher variables, what fabric run "
        "sets): Fabric reads them over the script's own arguments, at every world size ddpcheck runs"
    )


# --- a script judged: verdicts said of the script once the checks have judged ---


def standin_reference(run: RunTrace) -> RunTrace:
    """What every rank saw together, as if one process had seen it: a reference for the checks that
    only need the epoch's samples (the ones that need a real single-process run are skipped). The ids
    are a :class:`UnionIds` of the ranks': read a chunk at a time, or counted by the checks' tally with
    the ranks themselves, never held whole."""
    epochs = []
    for e in range(run.num_epochs):
        ids = UnionIds(tuple(trace.ids for trace in run.epoch(e)))
        epochs.append(EpochTrace(epoch=e, ids=ids, batch_sizes=WholeEpoch(ids), len_loader=None))
    facts = run.ranks[0].facts if run.ranks else None
    rank = RankTrace(rank=0, epochs=tuple(epochs)) if facts is None else RankTrace(0, tuple(epochs), facts)
    return RunTrace(world_size=1, backend=run.backend, ranks=(rank,), id_source=run.id_source)


class WholeEpoch(Sequence[int]):
    """The stand-in's batch sizes: one batch of the whole epoch (none when empty), sized only if asked."""

    def __init__(self, ids: UnionIds) -> None:
        self.ids = ids

    def __len__(self) -> int:
        return 1 if any(len(p) for p in self.ids.parts) else 0

    def __getitem__(self, index: Any) -> Any:
        sizes = [len(self.ids)] if len(self) else []
        return sizes[index]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]


NEEDS_REFERENCE = (COVERAGE, SINGLE_PROCESS_EQUIVALENCE)


def framework_sampler(verdict: Verdict, reference: RunTrace, run: RunTrace) -> Verdict:
    """A stale-epoch finding (one process repeats its epoch although "its" sampler shuffles and
    set_epoch is called) reads the sampler facts of the run's ranks. A loader file builds the same
    sampler at every world size; a script's framework need not: Lightning wraps a custom sampler in its
    shuffling DistributedSamplerWrapper only when distributed. Where the single-process run's own sampler
    does not say it shuffles, its repeated order is that sampler's, not a stale epoch: nothing is compared
    (fixtures/scripts/frameworks/lightning_good.py; stale_iterator.py, whose one-process sampler does
    shuffle, still fails)."""
    if verdict.check != RESHUFFLE or verdict.cause != STALE_EPOCH or not reference.ranks or not run.ranks:
        return verdict
    own, theirs = reference.ranks[0].facts, run.ranks[0].facts
    if own.shuffles:
        return verdict
    return Verdict(
        RESHUFFLE,
        "pass",
        f"one process keeps its order: there its {own.sampler or 'sampler'} does not say it shuffles (the "
        f"script's framework builds a {theirs.sampler or 'sampler'} at {run.world_size} ranks); nothing to "
        "compare",
    )


def script_cause(verdict: Verdict, run: RunTrace, name: str, standin: str, single: bool) -> Verdict:
    """Causes said of the script; checks a stand-in reference cannot decide, skipped with the reason."""
    if (
        standin and verdict.check in NEEDS_REFERENCE and not isinstance(verdict.evidence, IndexOverflow)
    ):  # the dataset decides
        return Verdict(verdict.check, "skip", f"not judged without a single-process run: {standin}")
    if verdict.check == DETERMINISM and verdict.status == "skip" and not single:
        return verdict
    if verdict.check == RESHUFFLE and not run.set_epoch:
        repeated = verdict.epochs if verdict.failed else repeats_without_set_epoch(run)
        harmless = evaluation_order(run.ranks[0].facts) if run.ranks else ""
        if repeated and harmless:
            return Verdict(RESHUFFLE, "pass", f"{harmless} (the loop never calls set_epoch on it)")
        if repeated:
            cause = f"the loop never calls set_epoch on the sampler of the loader built at {name}"
            fix = f"call set_epoch(epoch) on that loader's sampler at the start of every epoch ({name})"
            detail = (
                verdict.detail
                if verdict.failed
                else (
                    f"epoch {repeated[1]} repeats epoch {repeated[0]} on every rank: its sampler shuffles, "
                    "but only when set_epoch gives it a new epoch, and the script never calls it"
                )
            )
            return replace(
                verdict, status="fail", detail=detail, cause=cause, fix=fix, epochs=tuple(repeated)
            )
    return verdict


def repeats_without_set_epoch(run: RunTrace) -> tuple[int, int] | None:
    """The first pair of epochs that every rank sees in the same order, for a sampler that says it
    shuffles and has a set_epoch the loop never called (the single-process run of the same script
    repeats too, so the loader-file rule, which compares with one process, cannot see it)."""
    if not run.ranks or run.num_epochs < 2:
        return None
    facts = run.ranks[0].facts
    if not (facts.shuffles and facts.has_set_epoch) or facts.steps is not None:
        return None
    for e in range(run.num_epochs - 1):
        pairs = [(t.epochs[e].ids, t.epochs[e + 1].ids) for t in run.ranks]
        if all(len(a) >= 2 and list(a) == list(b) for a, b in pairs):
            return (e, e + 1)
    return None


RECORDED_ONCE = "a recorded launch runs once: record it twice to check determinism"
