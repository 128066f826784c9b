"""A sharded gradient put back together: the ranks' shards of one optimizer step, as one gradient.

Where the parameters are DTensors (tensor parallelism, FSDP2), each rank keeps the gradient values its
shard holds (``OptimizerStep.held``, one bit per kept value) and zeros elsewhere. The whole gradient is,
at each kept position, the value of the ranks that hold it: one rank under pure sharding, several where a
placement replicates it (the tensor peers of a bias that FSDP2 shards over the data-parallel ranks).
Ranks that hold the same position must agree (they hold one averaged gradient); a position no rank holds
leaves the gradient unknown. Pure functions over the StepTraces, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ddpcheck.trace import OptimizerStep, StepTrace


@dataclass(frozen=True)
class Joined:
    """The ranks' shards of each step put together.

    ``steps``: step index -> the whole gradient (float32 values; absent: some rank kept none there);
    ``apart``: the first step where two ranks hold the same position with different values, as (step,
    rank, other rank, relative L2 difference over the positions both hold); ``uncovered``: (step, values
    held by some rank, values kept) where some position is held by no rank."""

    steps: dict[int, Any]
    apart: tuple[int, int, int, float] | None = None
    uncovered: tuple[int, int, int] | None = None


def sharded(run: Sequence[StepTrace | None]) -> bool:
    """Whether some rank kept only its shard of a gradient."""
    return any(s.held is not None for t in run if t is not None for s in t.steps)


def _held(step: OptimizerStep, count: int) -> Any:
    import numpy as np

    if step.held is None:
        return np.ones(count, dtype=bool)
    return np.unpackbits(np.frombuffer(step.held, dtype=np.uint8), count=count).astype(bool)


def _values(step: OptimizerStep) -> Any:
    import numpy as np

    grad = step.grad
    assert grad is not None
    if getattr(grad, "typecode", "") == "f":
        return np.frombuffer(grad, dtype=np.float32).astype(np.float64)  # type: ignore[call-overload]
    return np.asarray(grad, dtype=np.float64)


def join_shards(run: Sequence[StepTrace | None], tol: float) -> Joined:
    """Every step that every rank kept, its shards put together (see :class:`Joined`); ``tol``: the relative
    L2 difference two holders of the same positions may show."""
    import numpy as np

    traces = [t for t in run if t is not None]
    by_rank = [{s.index: s for s in t.steps if s.grad is not None} for t in traces]
    common = sorted(set.intersection(*(set(k) for k in by_rank))) if by_rank else []
    out: dict[int, Any] = {}
    apart: tuple[int, int, int, float] | None = None
    uncovered: tuple[int, int, int] | None = None
    for index in common:
        count = len(by_rank[0][index].grad or ())
        if any(len(steps[index].grad or ()) != count for steps in by_rank):
            continue
        whole = np.zeros(count)
        owner = np.full(count, -1)
        for rank, steps in enumerate(by_rank):
            step = steps[index]
            held, values = _held(step, count), _values(step)
            both = held & (owner >= 0)
            if apart is None and both.any():
                rel = _difference(values[both], whole[both])
                if not (rel <= tol):
                    apart = (index, int(owner[both][0]), rank, rel)
            fresh = held & (owner < 0)
            whole[fresh] = values[fresh]
            owner[fresh] = rank
        held_count = int((owner >= 0).sum())
        if held_count < count:
            uncovered = uncovered or (index, held_count, count)
            continue
        out[index] = whole.astype(np.float32)
    return Joined(out, apart, uncovered)


def _difference(a: Any, b: Any) -> float:
    """Relative L2 difference of ``a`` from ``b`` where both are numbers (NaN where only one is NaN: a NaN
    on every holder is the gradient's own, the step check names it)."""
    import numpy as np

    nan_a, nan_b = np.isnan(a), np.isnan(b)
    if (nan_a != nan_b).any():
        return float("nan")
    a, b = a[~nan_a], b[~nan_b]
    diff, ref = float(np.linalg.norm(a - b)), float(np.linalg.norm(b))
    return diff / ref if ref else (0.0 if diff == 0 else float("inf"))


def with_whole_gradients(heads: Sequence[StepTrace | None], joined: Joined, parameters: int) -> list[Any]:
    """The data-parallel ranks' traces, each step's gradient the whole one (its norm too where every
    coordinate was kept); steps without a whole gradient keep none."""
    from array import array

    import numpy as np

    out: list[Any] = []
    for head in heads:
        if head is None:
            out.append(None)
            continue
        steps = []
        for step in head.steps:
            whole = joined.steps.get(step.index)
            if whole is None:
                steps.append(replace(step, grad=None, grad_norm=None, held=None))
                continue
            values = array("f")
            values.frombytes(whole.tobytes())
            norm = float(np.linalg.norm(whole.astype(np.float64))) if len(whole) == parameters else None
            steps.append(replace(step, grad=values, grad_norm=norm, held=None))
        out.append(replace(head, steps=tuple(steps)))
    return out
