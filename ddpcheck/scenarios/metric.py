"""Metric equivalence: evaluate the loader in every rank, gather naively and by id, compute the metric.

Why: the most common DDP data complaint is "my validation metric changes with the number of GPUs".
Padding repeats samples, ``drop_last`` drops some, and gathering concatenates in rank order. This
runs the user's evaluation under real gloo ranks and shows what each of those does to the metric.

Hooks a loader file may define (all optional)::

    def forward(batch) -> dict:          # per-sample outputs: tensors, arrays or lists, dim 0 = batch
        return {"pred": MODEL(batch[0]).argmax(1), "target": batch[1]}

    def metric(outputs: dict) -> float | dict[str, float]:   # over a whole gathered epoch
        return {"accuracy": (outputs["pred"] == outputs["target"]).double().mean().item()}

Without ``forward`` the outputs are the batch's per-sample fields when it is a dict, else the ids
(``id``) plus every numeric per-sample field (``field0``, ``field1``, ... of a tuple batch, e.g. the
targets of ``(x, y)``); numeric fields with more than one value per sample are reduced to their
per-sample mean, so the default gathers little. Without ``metric`` the metrics are ``samples`` (the
number of outputs) and ``mean(<key>)`` of every numeric output. ``metric`` runs on rank 0 only.

When it runs: when the file defines ``forward`` or ``metric`` (read from its source, so files
without them pay nothing), or when asked (``--metrics``, ``CheckOptions(metrics=True)``) with the
defaults; ``--no-metrics`` turns it off. It evaluates epoch 0 once per world size, on gloo ranks
whatever ``--backend`` says, and never under ``--simulate`` (the gathers need real collectives).

Per world size: the reference is the metric over the single-process epoch in loader order; the
naive DDP value gathers every rank's outputs with ``sync_dicts_ddp(outputs, world_size)`` (padding
copies kept, rank-major order, what most code does); the corrected value gathers with
``sync_dicts_ddp(outputs, world_size, ids_key="__ids__")``. Ids are those recording uses: the
``sample_ids`` hook, the dataset index for map-style datasets, an ``id``/``idx``/``index`` field, or
a content hash. :mod:`ddpcheck.checks.metric` turns the three values into rows and the verdict.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from ddpcheck.checker.face import OpenedLoader, open_loader
from ddpcheck.checker.loaderfile import LoaderSpec
from ddpcheck.checker.recipe import LoaderRecipe
from ddpcheck.checks.metric import Evaluation, judge_metrics, metric_rows
from ddpcheck.launch import GroupCall, TargetRef, report_progress, run_ranks
from ddpcheck.layout import Layout, shaped_like
from ddpcheck.scenarios.protocol import DataRun, Outcome, rank_failures
from ddpcheck.trace import RankFailure, compact_ids
from ddpcheck.verdict import METRIC_EQUIVALENCE, skipped

if TYPE_CHECKING:
    from ddpcheck.options import CheckOptions

ID_KEY = "__ids__"
METRIC_HOOKS = ("forward", "metric")
SIMULATE_SKIP = "needs real gloo ranks (the gathers are collectives); run without --simulate"


# --------------------------------------------------------------------------- default hooks


def _numeric(value: Any) -> bool:
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        return not value.is_complex()
    if isinstance(value, np.ndarray):
        return value.dtype.kind in "biuf"
    if isinstance(value, (list, tuple)):
        return all(isinstance(x, (int, float)) for x in value)
    return False


def _per_sample(value: Any, n: int, collated: bool) -> Any | None:
    """``value`` as ``n`` rows (multi-valued numeric rows reduced to their mean), or None."""
    import numpy as np
    import torch

    if not collated:  # one sample: make it a batch of one
        if isinstance(value, torch.Tensor):
            value = value.unsqueeze(0)
        elif isinstance(value, np.ndarray):
            value = value[None]
        elif isinstance(value, (int, float, str, bool)):
            value = [value]
        else:
            return None
    if isinstance(value, (torch.Tensor, np.ndarray)):
        if value.ndim == 0 or value.shape[0] != n:
            return None
        if value.ndim > 1 and _numeric(value):
            flat = torch.as_tensor(value).reshape(n, -1)
            return flat.double().mean(dim=1)
        return value.detach().cpu() if isinstance(value, torch.Tensor) else value
    scalars = isinstance(value, (list, tuple)) and all(isinstance(x, (int, float, str, bool)) for x in value)
    if scalars and len(value) == n:
        return list(value)
    return None


def default_outputs(batch: Any, ids: list[Hashable], collated: bool) -> dict[str, Any]:
    """The batch's per-sample fields (dict batches), else the ids plus its numeric per-sample fields."""
    n = len(ids)
    out: dict[str, Any] = {"id": list(ids)} if all(isinstance(i, (int, str)) for i in ids) else {}
    if isinstance(batch, dict):
        found = {str(k): _per_sample(v, n, collated) for k, v in batch.items()}
        return {k: v for k, v in found.items() if v is not None} or out
    for position, value in enumerate(batch if isinstance(batch, (list, tuple)) else [batch]):
        rows = _per_sample(value, n, collated)
        if rows is not None and _numeric(rows):
            out[f"field{position}"] = rows
    return out


def default_metric(outputs: dict[str, Any]) -> dict[str, float]:
    """``samples`` and ``mean(<key>)`` of every numeric per-sample output."""
    import numpy as np

    lengths = [len(v) for v in outputs.values() if hasattr(v, "__len__") and not isinstance(v, str)]
    values: dict[str, float] = {"samples": lengths[0] if lengths else 0}
    for key, value in outputs.items():
        if _numeric(value) and len(value):
            array = (
                value.double().numpy() if hasattr(value, "double") else np.asarray(value, dtype=np.float64)
            )
            values[f"mean({key})"] = float(array.mean())
    return values


# --------------------------------------------------------------------------- outputs


def _rows(value: Any) -> int | None:
    if hasattr(value, "shape"):
        return int(value.shape[0]) if len(value.shape) else None
    if isinstance(value, (list, tuple)):
        return len(value)
    return None


def check_outputs(out: Any, n: int, batch_number: int) -> dict[str, Any]:
    """``forward``'s result must be a dict of per-sample values, one row per sample of the batch."""
    if not isinstance(out, dict):
        raise TypeError(f"forward(batch) must return a dict of per-sample outputs, got {type(out).__name__}")
    for key, value in out.items():
        if not isinstance(key, str) or key == ID_KEY:
            raise ValueError(f"forward(batch) returned key {key!r}; use str keys other than {ID_KEY!r}")
        rows = _rows(value)
        if rows != n:
            got = "no rows" if rows is None else f"{rows} rows"
            raise ValueError(
                f"forward(batch) key {key!r} has {got} but batch {batch_number} has {n} samples; "
                "return one row per sample (tensors, arrays or lists, dim 0 = batch)"
            )
    return out


def _concat(parts: list[Any]) -> Any:
    import numpy as np
    import torch

    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.cat([p.detach().cpu() for p in parts])
    if isinstance(first, np.ndarray):
        return np.concatenate(parts)
    return list(itertools.chain.from_iterable(parts))


def _empty_like(value: Any) -> Any:
    return value[:0] if hasattr(value, "shape") else []


def collect_outputs(opened: OpenedLoader, forward: Callable[[Any], Any] | None) -> dict[str, Any]:
    """Epoch 0 of this rank's outputs (the epoch set first), keys concatenated over batches, ids under
    ``__ids__``."""
    import torch

    collated = opened.collated
    parts: dict[str, list[Any]] = {}
    ids: list[Hashable] = []
    with torch.no_grad():
        for count, (batch, batch_ids, _) in enumerate(opened.batches(0), start=1):
            out = forward(batch) if forward is not None else default_outputs(batch, batch_ids, collated)
            out = check_outputs(out, len(batch_ids), count)
            if parts and set(out) != set(parts):
                raise ValueError(
                    f"forward(batch) returned keys {sorted(out)} for batch {count} but {sorted(parts)} before"
                )
            for key, value in out.items():
                parts.setdefault(key, []).append(value.detach() if isinstance(value, torch.Tensor) else value)
            ids.extend(batch_ids)
            report_progress(f"evaluation, batch {count}")
    merged = {key: _concat(values) for key, values in parts.items()}
    merged[ID_KEY] = list(ids)
    return merged


def _fill_empty(local: dict[str, Any], world_size: int) -> dict[str, Any]:
    """A rank without batches adopts another rank's keys (empty), so every rank gathers the same keys."""
    import torch.distributed as dist

    template = {k: _empty_like(v) for k, v in local.items()} if len(local[ID_KEY]) else None
    templates: list[Any] = [None] * world_size
    dist.all_gather_object(templates, template)
    if template is None:
        found = next((t for t in templates if t is not None), None)
        if found is not None:
            return dict(found)
    return local


# --------------------------------------------------------------------------- metric values


def _scalar(value: Any, name: str) -> float:
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return value
    raise TypeError(f"metric {name!r} is a {type(value).__name__}; metric(outputs) must return numbers")


def metric_values(value: Any) -> dict[str, float]:
    """A metric's result as ``{name: number}`` (ints stay ints, so they compare exactly)."""
    if isinstance(value, dict):
        return {str(k): _scalar(v, str(k)) for k, v in value.items()}
    try:
        return {"metric": _scalar(value, "metric")}
    except TypeError:
        raise TypeError(
            f"metric(outputs) must return a number or a dict of numbers, got {type(value).__name__}"
        ) from None


def evaluate_rank(recipe: LoaderRecipe) -> Evaluation | None:
    """Entry point inside a rank: evaluate epoch 0, gather twice, rank 0 computes the metric.

    ``recipe`` is the data run's own (:meth:`LoaderRecipe.from_options`) in this group's layout, never a
    copy rebuilt field by field: the loader is the one the data checks judged.
    """
    from ddpcheck.reference.sync import sync_dicts_ddp

    report_progress("evaluation: building the loader")
    opened = open_loader(recipe)
    rank, world_size = opened.rank, opened.world_size
    metric = opened.hooks.metric or default_metric
    facts = opened.facts
    local = collect_outputs(opened, opened.hooks.forward)
    if world_size > 1:
        local = _fill_empty(local, world_size)
    report_progress("evaluation: gathering")
    naive = sync_dicts_ddp(local, world_size)
    corrected = sync_dicts_ddp(local, world_size, ids_key=ID_KEY)
    if rank != 0:
        return None
    ids = naive.pop(ID_KEY)
    corrected.pop(ID_KEY)
    report_progress("evaluation: metric")
    return Evaluation(
        world_size=world_size,
        naive=metric_values(metric(naive)),
        corrected=metric_values(metric(corrected)),
        ids=compact_ids(list(ids)),
        drops=bool(facts.drop_last) or facts.padding is False,
    )


# --------------------------------------------------------------------------- parent side


class MetricEquivalence:
    """Parent side: the single-process evaluation once, then one gloo group per world size."""

    def __init__(self, spec: LoaderSpec, options: CheckOptions) -> None:
        self.spec = spec
        self.recipe = LoaderRecipe.from_options(spec, options)  # the data run's, never a copy
        self.timeout, self.max_time = options.timeout, options.max_time
        self.tolerance = options.metric_tolerance
        self.simulate = options.simulate
        self.meshes = options.layouts
        self._reference: Evaluation | None = None
        self._reference_failed = False

    @classmethod
    def maybe(
        cls, spec: LoaderSpec, options: CheckOptions, names: frozenset[str]
    ) -> MetricEquivalence | None:
        """The check when the file defines ``forward`` or ``metric`` or it was asked for, else None."""
        wanted = options.metrics if options.metrics is not None else bool(names & set(METRIC_HOOKS))
        return cls(spec, options) if wanted else None

    def _evaluate(self, layout: Layout) -> tuple[Evaluation | None, tuple[RankFailure, ...]]:
        group = run_ranks(
            GroupCall(
                TargetRef.of(evaluate_rank),
                layout.world_size,
                timeout=self.timeout,
                max_time=self.max_time,
                kwargs={"recipe": self.recipe.evolve(layout=layout)},
            )
        )
        failures = rank_failures(group, METRIC_EQUIVALENCE)
        value = group.outcomes[0].value if group.outcomes and group.outcomes[0].ok else None
        return (value if isinstance(value, Evaluation) else None), failures

    def finish(self) -> dict[str, Outcome]:
        return {}

    def world(self, ctx: DataRun) -> Outcome:
        # on a mesh, at its data-parallel size: replicas gather nothing new (replica_consistency checks them)
        layout = (ctx.layout or Layout.plain(ctx.world_size)).without_replicas()
        world_size = layout.world_size
        if self.simulate:
            return Outcome(verdicts=(skipped(METRIC_EQUIVALENCE, SIMULATE_SKIP),))
        failures: tuple[RankFailure, ...] = ()
        if self._reference is None and not self._reference_failed:
            self._reference, failures = self._evaluate(shaped_like(self.meshes, 1))
            self._reference_failed = self._reference is None
            if self._reference is None:
                return Outcome(failures=failures)
        if self._reference is None:
            why = "the single-process evaluation failed (see its rank failure)"
            return Outcome(verdicts=(skipped(METRIC_EQUIVALENCE, why),))
        if world_size == 1:
            run: Evaluation | None = self._reference
        else:
            run, failures = self._evaluate(layout)
        if run is None:
            return Outcome(failures=failures)
        rows = metric_rows(self._reference, run, self.tolerance)
        verdict = judge_metrics(self._reference, run, rows, self.tolerance)
        return Outcome(verdicts=(verdict,), divergence=rows, failures=failures)
