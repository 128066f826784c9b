"""Model and batch helpers for DDP: wrap, unwrap, accumulate without syncing, move batches.

Each helper works the same with and without a process group where that makes sense, so training
code does not branch on ``is_ddp()``: ``unwrap_model`` and ``no_sync`` accept plain modules, and
``move_to_device`` knows nothing of distribution at all. ``wrap_model`` is the exception: wrapping
without a group is a mistake, and it says so.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterator
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DataParallel, DistributedDataParallel

from ddpcheck.reference.dist import is_ddp

T = TypeVar("T")


def wrap_model(
    model: nn.Module, *, device: str | torch.device | int | None = None, **ddp_kwargs: Any
) -> DistributedDataParallel:
    """Move ``model`` to ``device`` and wrap it in ``DistributedDataParallel``.

    ``find_unused_parameters`` defaults to ``False``, as in PyTorch and in Lightning since 2.0
    (Lightning 1.x defaulted to ``True`` "to be safe" and everyone paid for it): with ``True`` DDP
    walks the autograd graph after every forward to find parameters that will get no gradient,
    which costs time on every step, while with ``False`` a model that really has unused parameters
    fails loudly at its second backward with an error naming the fix. Pass
    ``find_unused_parameters=True`` for models whose forward skips parameters.

    ``device=None`` means the current CUDA device under NCCL and the model's own device otherwise.
    ``device_ids`` is set only for a CUDA device; for CPU modules DDP requires it to be ``None``.
    """
    if not is_ddp():
        raise RuntimeError("wrap_model needs a process group: call ddpcheck.reference.connect() first")
    if isinstance(model, DistributedDataParallel):
        raise ValueError("model is already wrapped in DistributedDataParallel; pass the inner module")
    if device is None:
        if dist.get_backend() == "nccl":
            target = torch.device("cuda", torch.cuda.current_device())
        else:
            first = next(model.parameters(), None)
            target = first.device if first is not None else torch.device("cpu")
    elif isinstance(device, int):
        target = torch.device("cuda", device)
    else:
        target = torch.device(device)
    if target.type == "cuda" and target.index is None:
        target = torch.device("cuda", torch.cuda.current_device())
    model = model.to(target)
    ddp_kwargs.setdefault("find_unused_parameters", False)
    if target.type == "cuda":
        ddp_kwargs.setdefault("device_ids", [target.index])
        ddp_kwargs.setdefault("output_device", target.index)
    else:
        if ddp_kwargs.get("device_ids") is not None:
            raise ValueError(f"device_ids must be None for a {target.type} model")
        ddp_kwargs["device_ids"] = None
    return DistributedDataParallel(model, **ddp_kwargs)


def _inner(model: nn.Module) -> nn.Module | None:
    """The module a known wrapper holds, or ``None`` when ``model`` is not a wrapper."""
    if isinstance(model, (DistributedDataParallel, DataParallel)):
        return model.module
    orig = getattr(model, "_orig_mod", None)  # torch.compile's OptimizedModule
    if isinstance(orig, nn.Module):
        return orig
    # Wrappers from other libraries follow the same convention (FSDP, apex DDP, ...).
    inner = getattr(model, "module", None)
    if isinstance(inner, nn.Module) and type(model).__name__.endswith("DataParallel"):
        return inner
    return None


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's module inside any nesting of DDP, DataParallel and ``torch.compile`` wrappers.

    Only known wrappers are peeled: a user model with a child called ``module`` is left alone.
    """
    inner = _inner(model)
    while inner is not None:
        model = inner
        inner = _inner(model)
    return model


@contextlib.contextmanager
def no_sync(model: nn.Module) -> Iterator[None]:
    """Skip the gradient all-reduce for the backward passes inside (gradient accumulation).

    Uses the ``no_sync`` of the outermost wrapper that has one (DDP, FSDP), looking through
    ``torch.compile``; for a plain module it does nothing, so the same loop runs with and without
    DDP. The backward *after* the block synchronises the accumulated gradients.
    """
    current: nn.Module | None = model
    while current is not None:
        method = getattr(current, "no_sync", None)
        if callable(method):
            with method():
                yield
            return
        current = _inner(current)
    yield


def _move(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        non_blocking = obj.device.type == "cpu" and device.type != "cpu" and obj.is_pinned()
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, dict):
        out = copy.copy(obj)  # keeps the mapping type (OrderedDict, defaultdict, ...)
        for key, value in obj.items():
            out[key] = _move(value, device)
        return out
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_move(v, device) for v in obj))
    if isinstance(obj, (list, tuple)):
        moved = [_move(v, device) for v in obj]
        return moved if type(obj) is list else type(obj)(moved)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        clone = copy.copy(obj)
        for f in dataclasses.fields(obj):
            object.__setattr__(clone, f.name, _move(getattr(obj, f.name), device))  # frozen ones too
        return clone
    return obj


def move_to_device(batch: T, device: str | torch.device | int) -> T:
    """A copy of ``batch`` with every tensor on ``device``; containers keep their types.

    Handles nested dicts, lists, tuples, namedtuples and dataclasses. Tensors in pinned memory
    are copied with ``non_blocking=True`` (that is what pinning is for); other leaves (strings,
    numbers, arrays) are left as they are. The input is not modified.
    """
    target = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    return _move(batch, target)  # type: ignore[no-any-return]


__all__ = ["move_to_device", "no_sync", "unwrap_model", "wrap_model"]
