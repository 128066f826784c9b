"""What a check measured, typed: one small frozen dataclass per kind of evidence (plain data, at the bottom).

A :class:`~ddpcheck.verdict.Verdict` carries one of these (:data:`Evidence`) or none. Reports and the checks
that read another's verdict (``--max-idle`` on work_balance, a mesh's cause on the data checks, the
pictures' replica groups) read their attributes; the JSON report writes :meth:`EvidenceBase.as_data`, the
fields in their order (a field marked :data:`OMIT_NONE` is left out while it is None), so the report's
``data`` keeps the shape it had when the checks filled dicts.

Nothing of ddpcheck is imported here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Union

OMIT_NONE = {"omit_none": True}  # field metadata: the key is absent from ``as_data()`` while None


def _plain(value: Any) -> Any:
    """``value`` as the dicts and lists the JSON report writes (nested evidence as dicts, tuples as lists)."""
    if isinstance(value, EvidenceBase):
        return value.as_data()
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class EvidenceBase:
    """The one way evidence becomes the JSON report's ``data``."""

    def as_data(self) -> dict[str, object]:
        """The fields in order, as plain dicts and lists; :data:`OMIT_NONE` fields left out while None."""
        out: dict[str, object] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.metadata.get("omit_none"):
                continue
            out[f.name] = _plain(value)
        return out


# --- coverage, single_process_equivalence, no_overlap, padding_bound ---------------------------------------


@dataclass(frozen=True)
class MissingSamples(EvidenceBase):
    """Samples no rank saw in an epoch: ``missing`` of ``items``, ``allowed`` of them by the sampler's
    padding or drop_last, in ``epochs_failing`` epochs."""

    missing: int
    allowed: int
    items: int
    epochs_failing: int


@dataclass(frozen=True)
class IndexOverflow(EvidenceBase):
    """An index outside the dataset (an overflowed index map): the first one, where, and how many."""

    rank: int
    epoch: int
    position: int
    value: int
    out_of_range: int
    negative: int  # of those, negative ones
    dataset_len: int
    overflow: bool = field(default=True, init=False)

    def as_data(self) -> dict[str, object]:
        data = super().as_data()
        return {"overflow": data.pop("overflow"), **data}


@dataclass(frozen=True)
class ReferenceShare(EvidenceBase):
    """One process receives only a share of the epoch (``seen`` of ``items``): its sampler was told of
    ``replicas`` replicas (0: not said)."""

    seen: int
    items: int
    replicas: int


@dataclass(frozen=True)
class ForeignSamples(EvidenceBase):
    """Samples a rank sees that the single process never yields: ``extra`` of them, in ``epochs_failing``."""

    extra: int
    epochs_failing: int


@dataclass(frozen=True)
class SharedSamples(EvidenceBase):
    """Samples that reach more than one rank: ``duplicates`` extra copies (``allowed`` as padding) of
    ``shared_items`` samples, in ``epochs_failing`` epochs."""

    duplicates: int
    allowed: int
    shared_items: int
    epochs_failing: int


@dataclass(frozen=True, kw_only=True)
class PaddingCost(EvidenceBase):
    """What padding costs: the most ``copies`` in an epoch of ``samples`` (counted in ``noun``); when over
    the sampler's ``bound``, the ``duplicates`` of the first epoch over it and how many epochs are."""

    duplicates: int | None = field(default=None, metadata=OMIT_NONE)
    bound: int | None = field(default=None, metadata=OMIT_NONE)
    epochs_failing: int | None = field(default=None, metadata=OMIT_NONE)
    copies: int
    samples: int
    noun: str


@dataclass(frozen=True, kw_only=True)
class TokenCoverage(EvidenceBase):
    """Packed rows: the epoch's ``tokens``, whether counted ``exact``ly, the most lost (and extra) in an
    epoch, and the epochs that fail."""

    tokens: int
    exact: bool
    tokens_extra: int | None = field(default=None, metadata=OMIT_NONE)
    tokens_lost: int
    epochs_failing: int | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True)
class FingerprintCounts(EvidenceBase):
    """A ``--fingerprint`` launch: per failing epoch the indices ``missing``, exact or lower bounds."""

    missing: tuple[int, ...]
    exact: bool


@dataclass(frozen=True)
class FingerprintCopies(EvidenceBase):
    """A ``--fingerprint`` launch: per failing epoch the ``extra`` copies, exact or lower bounds."""

    extra: tuple[int, ...]
    exact: bool


# --- equal_steps, reshuffle, determinism, batch_integrity, worker_sharding ---------------------------------


@dataclass(frozen=True, kw_only=True)
class UnevenSteps(EvidenceBase):
    """Epochs whose ranks take different numbers of batches, and ``len(loader)`` answers that differ from
    what was yielded: the first of each (``max``/``min`` batches; ``len_loader`` said, ``yielded``)."""

    uneven_epochs: int
    len_mismatches: int
    max_batches: int | None = field(default=None, metadata=OMIT_NONE)
    min_batches: int | None = field(default=None, metadata=OMIT_NONE)
    len_loader: int | None = field(default=None, metadata=OMIT_NONE)
    yielded: int | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True, kw_only=True)
class RepeatedOrder(EvidenceBase):
    """An order that does not change: ``repeated_ranks`` of ``ranks`` repeat an epoch, a stream replays its
    first pass (``pass_length``, ``replayed`` in order), or the shards freeze from ``epoch`` on."""

    pass_length: int | None = field(default=None, metadata=OMIT_NONE)
    replayed: int | None = field(default=None, metadata=OMIT_NONE)
    repeated_ranks: int | None = field(default=None, metadata=OMIT_NONE)
    ranks: int
    epoch: int | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True)
class RunsDiffer(EvidenceBase):
    """Two runs with the same seed part: the first rank, epoch and position, and how many ranks differ."""

    rank: int
    epoch: int
    position: int
    ranks_differing: int


@dataclass(frozen=True, kw_only=True)
class BatchShapes(EvidenceBase):
    """Batches the single process never forms (``foreign_batches`` on ``ranks_affected`` ranks), or larger
    than its ``largest``."""

    foreign_batches: int | None = field(default=None, metadata=OMIT_NONE)
    ranks_affected: int | None = field(default=None, metadata=OMIT_NONE)
    largest: int | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True)
class WorkerRepeats(EvidenceBase):
    """Samples a rank yields twice in an epoch: ``repeated`` copies on ``ranks_affected`` ranks, ``workers``
    workers a rank."""

    repeated: int
    ranks_affected: int
    workers: int


# --- work_balance, packing, mixture, supervision -----------------------------------------------------------


@dataclass(frozen=True)
class WorkBalance(EvidenceBase):
    """Per epoch: the idle fraction of rank-steps, the 99th percentile of random batching of the same data
    and its draws, each rank's work and supervised tokens, each rank's share of slowest steps, the steps."""

    source: str
    idle: tuple[float, ...]
    random_batching_p99: tuple[float, ...]
    draws: tuple[int, ...]
    rank_totals: tuple[tuple[float, ...], ...]
    slowest_share: tuple[tuple[float, ...], ...]
    supervised_totals: tuple[tuple[int, ...] | None, ...]
    steps_per_rank: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class PackingCounts(EvidenceBase):
    """What the packed batches showed: segments, boundaries without a reset, disagreeing metadata, cuts,
    and (with ``token_ids``) the tokens lost and unexpected (None: not counted)."""

    sources: tuple[str, ...]
    batches: int
    segments: int
    boundaries_without_reset: int
    resets_inside_a_segment: int
    batches_with_disagreeing_metadata: int
    position_jumps: int
    mixed_segments: int
    cuts_continued: int
    cuts_restarted: int
    tokens_lost: int | None = None
    tokens_unexpected: int | None = None


@dataclass(frozen=True)
class MixtureShares(EvidenceBase):
    """Counts per source summed over the epochs (the union, each rank, each rank's workers as ``[rank,
    worker, counts]``, the single process), what they are held against, and the tests run."""

    sources: tuple[str, ...]
    expected_from: str
    expected: tuple[float, ...]
    declared: tuple[float, ...] | None
    reference_counts: tuple[int, ...]
    union_counts: tuple[int, ...]
    rank_counts: tuple[tuple[int, ...], ...]
    worker_counts: tuple[tuple[int, int, tuple[int, ...]], ...]
    epochs: int
    tests: int
    alpha: float
    smallest_p: float | None


@dataclass(frozen=True)
class Supervision(EvidenceBase):
    """Micro-batches recorded, and how many held no sample or no supervised label."""

    micro_batches: int
    empty: int
    unsupervised: int


# --- replica_consistency --------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupDivergence(EvidenceBase):
    """One replica group for the pictures: its data coordinate, steps in epoch 0, where its replicas first
    differ (None: they agree) and the ranks shown."""

    where: str
    steps: int
    epoch: int | None
    step: int | None
    kind: str
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class FirstDivergence(EvidenceBase):
    """Where the first replica leaves its group."""

    dp_rank: int
    epoch: int
    step: int
    kind: str


@dataclass(frozen=True, kw_only=True)
class ReplicaGroups(EvidenceBase):
    """The mesh's replica groups: how many, of how many ranks, whether content was compared, how many
    differ, each group for the pictures; on a failure the mesh's own bug (``mesh_cause``, "" none) and the
    first divergence."""

    groups: int
    replicas: int
    content: bool
    diverging_groups: int
    per_group: tuple[GroupDivergence, ...]
    mesh_cause: str | None = field(default=None, metadata=OMIT_NONE)
    first: FirstDivergence | None = field(default=None, metadata=OMIT_NONE)


# --- the step's equal_microsteps and step_equivalence ------------------------------------------------------


@dataclass(frozen=True)
class MicroMismatch(EvidenceBase):
    """A step whose ranks ran other micro-steps: where ("in step 3"), the module ("" backward passes), the
    counts per rank."""

    where: str
    module: str
    counts: tuple[int, ...]


@dataclass(frozen=True)
class MicroMismatches(EvidenceBase):
    mismatches: tuple[MicroMismatch, ...]


@dataclass(frozen=True)
class ComparedStep(EvidenceBase):
    """One compared optimizer step: its index, the relative L2 difference of the DDP gradient from one
    process's (None: NaN), and per data-parallel rank its micro-batches, samples (-1: unknown) and
    supervised labels (None: the batches carry no labels)."""

    index: int
    rel: float | None
    micro: tuple[int, ...]
    samples: tuple[int, ...]
    supervised: tuple[int, ...] | None


@dataclass(frozen=True)
class StepEvidence(EvidenceBase):
    """What ``step_equivalence`` compared: the tolerance for the gradient's dtype, how the loss was scaled,
    and every compared step."""

    tolerance: float
    dtype: str
    loss_scale: str
    steps: tuple[ComparedStep, ...]


# --- training, metric, resume (the checks with their own runs) ---------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TrainingDiffs(EvidenceBase):
    """Training equivalence: the steps, batches and tolerance, the relative weight difference after every
    step (plain and accumulated), the first step each parts at (None: never), and for a ``(sum, count)``
    loss that parts, the difference when dividing by the count over all ranks."""

    steps: int
    per_rank_batch: int
    global_batch: int
    accumulation: int
    tolerance: float
    max_relative_difference: tuple[float, ...]
    accumulation_max_relative_difference: tuple[float, ...]
    first_parting_step: int | None = None
    accumulation_first_parting_step: int | None = None
    global_normalisation_max_relative_difference: tuple[float, ...] | None = field(
        default=None, metadata=OMIT_NONE
    )


@dataclass(frozen=True)
class MetricValues(EvidenceBase):
    """Metric equivalence: each metric at one process, through the naive gather and the ids_key one; what
    the naive gather duplicated, dropped or added; the tolerance; the samples evaluated."""

    reference: dict[str, float]
    naive: dict[str, float]
    corrected: dict[str, float]
    duplicated: int
    dropped: int
    extra: int
    order_differs: bool
    tolerance: str
    samples: int


@dataclass(frozen=True)
class ComparedValue(EvidenceBase):
    """One value a script's evaluation reported, at one process and at this layout: the evaluation (round)
    it came after, where it was read and its name, the single process's value and rank 0's, every rank's
    (None: that rank reported none), the printed precision (0.0 for a value read as a number), and whether
    they agree."""

    evaluation: int
    source: str
    name: str
    reference: float
    value: float
    ranks: tuple[float | None, ...]
    unit: float
    equal: bool


@dataclass(frozen=True)
class MetricEvidence(EvidenceBase):
    """What ``metric_equivalence`` compared on a script (issue 41): the tolerance (relative and absolute float
    noise; printed values also one unit in their last digit), each compared evaluation in words (which
    loader, which epoch, on which weights), every compared value, and the eval loader's split at this layout
    (the samples each rank evaluated, the copies padding added, the samples dropped, the set's size)."""

    rel: float
    absolute: float
    evaluations: tuple[str, ...]
    values: tuple[ComparedValue, ...]
    shards: tuple[int, ...] = ()
    copies: int = 0
    dropped: int = 0
    set_size: int = 0


@dataclass(frozen=True)
class GroupEvidence(EvidenceBase):
    """What ``prompt_groups`` judged: the group size the single-process loader repeats each sample, the
    steps (batch positions) judged, those holding a broken group, and those whose groups are split
    across ranks (whole in the gather)."""

    size: int
    steps: int
    broken: int
    split: int


@dataclass(frozen=True)
class RestoreLog(EvidenceBase):
    """What the library itself logged while restoring (``rank R: line``)."""

    logged: tuple[str, ...]


Evidence = Union[  # noqa: UP007  # a runtime alias older type checkers read too
    MissingSamples,
    IndexOverflow,
    ReferenceShare,
    ForeignSamples,
    SharedSamples,
    PaddingCost,
    TokenCoverage,
    FingerprintCounts,
    FingerprintCopies,
    UnevenSteps,
    RepeatedOrder,
    RunsDiffer,
    BatchShapes,
    WorkerRepeats,
    WorkBalance,
    PackingCounts,
    MixtureShares,
    Supervision,
    ReplicaGroups,
    MicroMismatches,
    StepEvidence,
    GroupEvidence,
    TrainingDiffs,
    MetricValues,
    MetricEvidence,
    RestoreLog,
]
"""Every kind of evidence a verdict can carry."""
