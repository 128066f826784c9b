"""Why a script's evaluation reports another value at another world size (issue 41): the mechanism, read
from what the rank side recorded of the eval loader (each rank's samples against the single process's) and
of the evaluation (its collectives, each rank's value), with the fix in the user's own library.

One cause per bug, tried in this order: a value from one rank's shard (ranks report different values, or
no collective combined anything while rank 0 saw a part of the set), every rank evaluating the whole set
with counts added, samples dropped (``drop_last``), padding copies counted, a mean of per-rank means over
unequal shards, a mean of per-batch means over unequal batches; else the cause is not identified, and the
detail says what the recording rules out (a divergence all the same: the weights were equal).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from ddpcheck.messages import count_text
from ddpcheck.trace import EpochTrace, LoaderFacts

COMBINING = frozenset(
    {"all_reduce", "reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "gather",
     "gather_object", "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single"}
)  # fmt: skip

UNSYNCED = "the reported value comes from one rank's shard: it is not combined across ranks"
EVERY_RANK = "every rank evaluates the whole eval set and the reported value adds the ranks' counts"
DROPPED = "the eval loader drops samples: the value is over a subset that changes with the world size"
PADDED = "the eval loader repeats samples to give every rank an equal share, and the value counts the copies"
MEAN_OF_MEANS = "the reported value is a mean of the ranks' means over shards of different sizes"
BATCH_MEANS = "the reported value is a mean of per-batch means over batches of different sizes"
UNEXPLAINED = (
    "the reported value changes with the world size on the same weights; the cause was not identified"
)


@dataclass(frozen=True)
class Split:
    """How the data-parallel ranks split one evaluation's loader, against the single process's epoch:
    samples each evaluated (copies included; 0: none), copies, samples the single process evaluated that no
    rank did, the set's size, each rank's batch sizes, and the loader's facts."""

    loader: str
    shards: tuple[int, ...]
    copies: int
    dropped: int
    set_size: int
    batches: tuple[tuple[int, ...], ...]
    facts: LoaderFacts

    @property
    def every_rank(self) -> bool:
        """Every rank evaluated the whole set (no sharding at all)."""
        return len(self.shards) > 1 and all(s >= self.set_size > 0 for s in self.shards)


def split_of(
    loader: str, reference: EpochTrace | None, ranks: Sequence[EpochTrace | None], facts: LoaderFacts
) -> Split:
    """The split of ``loader``'s evaluation epoch over ``ranks`` (one per data-parallel coordinate)."""
    ref = set(_ids(reference)) if reference is not None else set()
    union: set[Hashable] = set()
    shards: list[int] = []
    for epoch in ranks:
        ids = _ids(epoch) if epoch is not None else []
        shards.append(len(ids))
        union.update(ids)
    copies = sum(shards) - len(union)
    dropped = len(ref - union) if ref else 0
    batches = tuple(tuple(int(b) for b in e.batch_sizes) if e is not None else () for e in ranks)
    return Split(loader, tuple(shards), copies, dropped, len(ref) or len(union), batches, facts)


def _ids(epoch: EpochTrace) -> list[Hashable]:
    ids = epoch.ids
    array = getattr(ids, "array", None)
    if callable(array):
        return [int(i) for i in array()]
    return list(ids)


@dataclass(frozen=True)
class Mechanism:
    """A cause of a value that differs, in words, with its fix."""

    cause: str
    detail: str
    fix: str


def mechanism(
    split: Split | None,
    ranks_differ: str,
    combined: bool,
    world_size: int,
    libraries: Sequence[str],
    ratio: Ratio | None = None,
) -> Mechanism:
    """The cause of a difference (``ranks_differ``: how the ranks' values differ, "" when they agree;
    ``combined``: a collective combined data during the evaluation on rank 0; ``ratio``: the layout's value
    over the single process's where both are positive, within printed precision, else None)."""
    fixes = Fixes(tuple(libraries))
    part = split is not None and 0 < (split.shards[0] if split.shards else 0) < split.set_size
    if ranks_differ or (not combined and part):
        seen = f"rank 0 evaluated {_of(split)}" if split is not None else ""
        why = ranks_differ or "no collective combined anything during the evaluation"
        return Mechanism(UNSYNCED, "; ".join(filter(None, [why, seen])), fixes.unsynced())
    if split is None:
        return Mechanism(UNEXPLAINED, "the eval loader's split was not recorded", fixes.unexplained())
    if split.every_rank and combined:
        detail = f"each of the {world_size} ranks evaluated all {split.set_size:,} samples"
        return Mechanism(EVERY_RANK, detail, fixes.every_rank())
    if split.dropped:
        detail = (
            f"{count_text(split.dropped, 'samples')} of {split.set_size:,} never evaluated at ws={world_size}"
        )
        return Mechanism(DROPPED, detail + _drop_last(split.facts), fixes.dropped())
    if split.copies:
        total = sum(split.shards)
        sampler = split.facts.sampler or "the sampler"
        detail = (
            f"the eval loader's sampler repeats {count_text(split.copies, 'samples')} at ws={world_size} "
            f"({sampler} pads {split.set_size:,} to {total:,})"
        )
        return Mechanism(PADDED, detail, fixes.padded())
    evaluated = {s for s in split.shards if s}  # a rank that evaluated nothing averages nothing in
    if len(evaluated) > 1 and _could_average(ratio, split):
        sizes = " and ".join(f"{s:,}" for s in sorted(evaluated, reverse=True))
        return Mechanism(MEAN_OF_MEANS, f"the ranks evaluated {sizes} samples", fixes.mean_of_means())
    uneven = [b for b in split.batches if len(set(b)) > 1]
    if uneven and _could_average_batches(ratio, split):
        shown = ", ".join(map(str, uneven[0][-3:]))
        detail = f"rank 0's batches hold {shown} samples (the last ones), the single process's others"
        return Mechanism(BATCH_MEANS, detail, fixes.batch_means())
    return Mechanism(UNEXPLAINED, _ruled_out(split, combined, ratio), fixes.unexplained())


def _ruled_out(split: Split, combined: bool, ratio: Ratio | None) -> str:
    """What the recording shows the difference is not: no copy, no drop, and shards and batches either
    equal or unable to move a mean by ``ratio``."""
    shards = " and ".join(f"{s:,}" for s in split.shards)
    said = f"every sample of {split.set_size:,} evaluated once (shards of {shards}), so no padding copy or "
    said += "dropped sample explains it"
    even = len({s for s in split.shards if s}) < 2 and not any(len(set(b)) > 1 for b in split.batches)
    if even:
        said += ", nor unequal shards or batches (each rank's batches of one size)"
    elif ratio is not None:
        moved = f"{ratio.low:.3g}" if ratio.low > 1 else f"{ratio.high:.3g}"
        said += f", nor a mean of means over unequal shards or batches (none moves a mean {moved}-fold)"
    return said + ("; the ranks combined their results" if combined else "")


@dataclass(frozen=True)
class Ratio:
    """A layout's value over the single process's, both positive: the least and greatest it can be
    within their printed precision (equal for values read as numbers)."""

    low: float
    high: float

    @classmethod
    def of(cls, value: float, reference: float, unit: float) -> Ratio | None:
        """None where either value is not above its precision (a sign change, zero, NaN)."""
        if not (value - unit > 0 and reference - unit > 0):
            return None
        return cls((value - unit) / (reference + unit), (value + unit) / (reference - unit))


def _between(ratio: Ratio | None, factors: Sequence[float]) -> bool:
    """For values of one sign, a mean of part-means over the whole mean is a weighted average of the
    parts' ``factors`` (N / (parts x n_part)), so it lies between their least and greatest. Unknown
    ratio (None): it could be any."""
    if ratio is None or not factors:
        return True
    slack = 1e-3  # float noise, well inside a share's step
    return ratio.high >= min(factors) * (1 - slack) and ratio.low <= max(factors) * (1 + slack)


def _could_average(ratio: Ratio | None, split: Split) -> bool:
    """Whether a mean of the ranks' means could give ``ratio`` times the mean (a value twice the truth
    over shards of 11 and 10 is not one: those move it by 21/22 to 21/20)."""
    shares = [s for s in split.shards if s]
    return _between(ratio, [sum(shares) / (len(shares) * s) for s in shares])


def _could_average_batches(ratio: Ratio | None, split: Split) -> bool:
    """Whether a mean of per-batch means (over all batches, or per rank then over the ranks) could give
    ``ratio`` times the mean."""
    ranks = [b for b in split.batches if b]
    total = sum(sum(b) for b in ranks)
    count = sum(len(b) for b in ranks)
    factors = [total / (count * n) for b in ranks for n in b if n]
    factors += [total / (len(ranks) * len(b) * n) for b in ranks for n in b if n]
    return _between(ratio, factors)


def _of(split: Split | None) -> str:
    if split is None or not split.shards:
        return ""
    return f"{split.shards[0]:,} of {split.set_size:,} samples"


def _drop_last(facts: LoaderFacts) -> str:
    if facts.drop_last:
        return " (DataLoader(drop_last=True))"
    if facts.padding is False:
        return f" ({facts.sampler or 'the sampler'} drops the remainder: drop_last=True)"
    return ""


@dataclass(frozen=True)
class Fixes:
    """The fix for each cause, in the libraries the script imported (plain torch always)."""

    libraries: tuple[str, ...]

    def _join(self, by_library: dict[str, str], plain: str) -> str:
        said = [text for name, text in by_library.items() if name in self.libraries]
        return "; ".join([*said, f"plain torch: {plain}"])

    def padded(self) -> str:
        return self._join(
            {
                "accelerate": "gather with accelerator.gather_for_metrics(...) (it drops the copies)",
                "transformers": "Trainer.evaluate() drops the copies' predictions (gather_for_metrics), "
                "but its eval_loss repeats each batch's mean loss per row, so a padded last batch counts "
                "them: compute the loss per sample in compute_metrics, or per_device_eval_batch_size=1",
                "lightning": "Lightning's eval DistributedSampler pads: evaluate with "
                "Trainer(use_distributed_sampler=False) and a sampler that does not pad, or on one device",
                "torchmetrics": "torchmetrics counts every sample it is given: feed it from a sampler that "
                "does not pad",
            },
            "evaluate with a sampler that does not pad (rank r takes indices r, r + W, ...) and all_reduce "
            "the sum and the count, or gather (id, value) pairs and drop repeated ids",
        )

    def mean_of_means(self) -> str:
        return self._join(
            {
                "lightning": "self.log(..., sync_dist=True) averages the ranks' means: log a torchmetrics "
                "Metric object (self.log('val_acc', self.val_acc)), which sums and counts",
                "accelerate": "gather the per-sample values with accelerator.gather_for_metrics and "
                "average them",
                "torchmetrics": "update a torchmetrics Metric per batch and compute() once: it syncs sums "
                "and counts",
            },
            "all_reduce the sum and the count, then divide",
        )

    def unsynced(self) -> str:
        return self._join(
            {
                "torchmetrics": "keep compute()'s sync (sync_on_compute=True, the default) and call it on "
                "every rank",
                "lightning": "log a torchmetrics Metric object, or self.log(..., sync_dist=True) of a sum "
                "and a count",
                "accelerate": "gather predictions and labels with accelerator.gather_for_metrics before "
                "computing",
            },
            "all_reduce the sum and the count on every rank before rank 0 reports (or evaluate the whole "
            "set on rank 0)",
        )

    def dropped(self) -> str:
        return self._join(
            {"accelerate": "keep drop_last=False on the eval loader; gather_for_metrics drops the padding"},
            "keep every sample in the eval loader: DataLoader(drop_last=False) and a sampler with "
            "drop_last=False that does not pad",
        )

    def every_rank(self) -> str:
        return self._join({}, "shard the eval set (DistributedSampler) or report without reducing")

    def batch_means(self) -> str:
        return self._join(
            {"torchmetrics": "update a torchmetrics Metric per batch and compute() once"},
            "weight each batch by its samples: sum the values and count the samples",
        )

    def unexplained(self) -> str:
        return (
            "look for a divisor or weight that depends on the rank or the world size (a sum all-reduced but "
            "divided by this rank's own count, a value scaled by the world size, ranks left out of a "
            "gather), or a metric that depends on batch composition (BatchNorm in train mode, per-batch "
            "normalisation); compare the per-sample values at one process and at this layout"
        )
