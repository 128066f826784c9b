"""The gradient an optimizer step applies, kept as plain numbers.

Kept as float32 values of the optimizer's parameters flattened in param-group order: every coordinate
up to :data:`KEEP_LIMIT`, else an evenly spaced sample of that many, the same positions in every run of
the same model (they follow from the parameter shapes alone), so a rank's step and a replay's compare
coordinate by coordinate. The L2 norm is of the whole gradient. A parameter without a gradient counts
as zeros, as ``optimizer.step`` treats it.

A parameter that is a DTensor (tensor parallelism, FSDP2) is read through its local shard, never
gathered (no collective runs inside the user's step): its positions are the whole tensor's, as in a
run that holds it whole, and a rank keeps the values of the positions its shard holds (``held``); the
checks put the ranks' shards back together. A subclass that is not a DTensor, or a gradient that is a
partial sum (a pending reduction), is not read: the step says why (``unreadable``).
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


class Unreadable(Exception):
    """A parameter or gradient whose values this rank cannot read as plain numbers; the message says why."""


def local_part(tensor: Any) -> tuple[Any, tuple[int, ...] | None]:
    """The plain tensor this rank holds of ``tensor`` and where it sits in the whole tensor (its offset
    along each dimension; None: the rank holds the whole tensor). A DTensor's shard is a box of the
    whole (``__create_chunk_list__``, which checkpointing relies on; strided FSDP2 x TP shards too)."""
    import torch

    if type(tensor) in (torch.Tensor, torch.nn.Parameter):
        return tensor, None
    if hasattr(tensor, "to_local") and hasattr(tensor, "placements"):
        if any(p.is_partial() for p in tensor.placements):
            raise Unreadable("a gradient is a partial sum on this rank (a DTensor with a Partial placement)")
        local = tensor.to_local()
        if all(p.is_replicate() for p in tensor.placements):
            return local, None
        chunks = tensor.__create_chunk_list__()
        if len(chunks) != 1 or tuple(chunks[0].sizes) != tuple(local.shape):
            raise Unreadable(f"a DTensor shard laid out as {tensor.placements} is not one box of the tensor")
        return local, tuple(int(o) for o in chunks[0].offsets)
    if type(tensor).__torch_dispatch__ is not torch.Tensor.__torch_dispatch__:
        raise Unreadable(f"a {type(tensor).__name__} (a tensor subclass that is not a DTensor)")
    return tensor.as_subclass(torch.Tensor), None


def box_positions(shape: Sequence[int], offsets: Sequence[int], local: Sequence[int], where: Any) -> Any:
    """For flat positions ``where`` (int64) of a tensor of ``shape``, the flat index of each in the box
    of size ``local`` at ``offsets`` (-1 where the box does not hold it)."""
    import torch

    inside = torch.ones_like(where, dtype=torch.bool)
    index = torch.zeros_like(where)
    rest, scale = where, 1
    for size, offset, length in reversed(list(zip(shape, offsets, local, strict=True))):
        coord, rest = rest % max(size, 1), rest // max(size, 1)
        inside &= (coord >= offset) & (coord < offset + length)
        index = index + (coord - offset) * scale
        scale *= length
    return torch.where(inside, index, torch.full_like(index, -1))


@dataclass(frozen=True)
class KeptGrad:
    values: array[float]  # array('f')
    norm: float | None  # None: this rank holds a shard of it
    parameters: int
    dtype: str
    held: bytes | None = None  # packed bits, one per kept value: this rank's shard holds it (None: all)
    unreadable: str = ""  # why the gradient was not read ("": it was)


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
        """The gradient of ``params`` now: every planned position's value, or where a parameter is sharded
        (a DTensor), the values this rank's shard holds and which those are (``held``)."""
        import torch

        shapes = tuple(tuple(p.shape) for p in params)
        plan = self._plans.get(shapes)
        if plan is None:
            plan = self._plans[shapes] = self.positions([p.numel() for p in params])
        total = sum(p.numel() for p in params)
        dtype = str(params[0].dtype).replace("torch.", "") if params else ""
        parts, held = [], []
        squares, sharded = 0.0, False
        with torch.no_grad():
            for param, where in zip(params, plan, strict=True):
                count = param.numel() if where is None else len(where)
                mask = torch.ones(count, dtype=torch.bool)
                if param.grad is None:
                    parts.append(torch.zeros(count, dtype=torch.float32))
                    held.append(mask)
                    continue
                try:
                    local, offsets = local_part(param.grad)
                except Unreadable as exc:
                    return KeptGrad(array("f"), None, total, dtype, unreadable=str(exc))
                flat = (local.to_dense() if local.is_sparse else local).detach().reshape(-1)
                squares += float(torch.linalg.vector_norm(flat, dtype=torch.float64)) ** 2
                if offsets is None:
                    picked = flat if where is None else flat[where.to(flat.device)]
                else:
                    sharded = True
                    wanted = torch.arange(param.numel()) if where is None else where
                    index = box_positions(tuple(param.grad.shape), offsets, tuple(local.shape), wanted)
                    mask = index >= 0
                    picked = torch.zeros(count, dtype=flat.dtype, device=flat.device)
                    picked[mask.to(flat.device)] = flat[index[mask].to(flat.device)]
                parts.append(picked.to(device="cpu", dtype=torch.float32))
                held.append(mask)
            joined = torch.cat(parts) if parts else torch.zeros(0)
        values = array("f")
        values.frombytes(joined.contiguous().numpy().tobytes())
        if not sharded:
            return KeptGrad(values, math.sqrt(squares), total, dtype)
        import numpy as np

        bits = np.packbits(torch.cat(held).numpy()).tobytes()
        return KeptGrad(values, None, total, dtype, held=bits)  # a shard's norm is not the gradient's
