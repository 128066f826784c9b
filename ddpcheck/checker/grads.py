"""The gradient an optimizer step applies, kept as plain numbers.

Kept as float32 values of the optimizer's parameters flattened in param-group order: every coordinate
up to :data:`KEEP_LIMIT`, else an evenly spaced sample of that many, the same positions in every run of
the same model (they follow from the parameter shapes alone), so a rank's step and a replay's compare
coordinate by coordinate. The L2 norm is of the whole gradient. A parameter without a gradient counts
as zeros, as ``optimizer.step`` treats it.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

KEEP_LIMIT = 1 << 20


def optimizer_params(optimizer: Any) -> list[Any]:
    """The parameters an optimizer steps, in param-group order, each once."""
    seen: set[int] = set()
    out = []
    for group in getattr(optimizer, "param_groups", ()):
        for param in group.get("params", ()):
            if id(param) not in seen:
                seen.add(id(param))
                out.append(param)
    return out


@dataclass(frozen=True)
class KeptGrad:
    values: array[float]  # array('f')
    norm: float
    parameters: int
    dtype: str


class GradKeeper:
    """Keeps gradients of at most ``limit`` coordinates per step (positions cached per model shape)."""

    def __init__(self, limit: int = KEEP_LIMIT) -> None:
        self.limit = limit
        self._plans: dict[tuple[tuple[int, ...], ...], list[Any]] = {}

    def positions(self, sizes: Sequence[int]) -> list[Any]:
        """Per parameter, the flat indices kept (None: all of it)."""
        total = sum(sizes)
        if total <= self.limit:
            return [None] * len(sizes)
        import torch

        # limit evenly spaced positions over [0, total): exact integer arithmetic, identical everywhere
        picked = (torch.arange(self.limit, dtype=torch.int64) * (total - 1)) // max(self.limit - 1, 1)
        out = []
        start = 0
        for size in sizes:
            lo = int(torch.searchsorted(picked, start))
            hi = int(torch.searchsorted(picked, start + size))
            out.append(picked[lo:hi] - start)
            start += size
        return out

    def keep(self, params: Sequence[Any]) -> KeptGrad:
        import torch

        shapes = tuple(tuple(p.shape) for p in params)
        plan = self._plans.get(shapes)
        if plan is None:
            plan = self._plans[shapes] = self.positions([p.numel() for p in params])
        parts = []
        squares = 0.0
        with torch.no_grad():
            for param, where in zip(params, plan, strict=True):
                grad = param.grad
                count = param.numel() if where is None else len(where)
                if grad is None:
                    parts.append(torch.zeros(count, dtype=torch.float32))
                    continue
                if grad.is_sparse:
                    grad = grad.to_dense()
                flat = grad.detach().reshape(-1)
                squares += float(torch.linalg.vector_norm(flat, dtype=torch.float64)) ** 2
                picked = flat if where is None else flat[where.to(flat.device)]
                parts.append(picked.to(device="cpu", dtype=torch.float32))
            joined = torch.cat(parts) if parts else torch.zeros(0)
        values = array("f")
        values.frombytes(joined.contiguous().numpy().tobytes())
        dtype = str(params[0].dtype).replace("torch.", "") if params else ""
        return KeptGrad(values, math.sqrt(squares), sum(p.numel() for p in params), dtype)
