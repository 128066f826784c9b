"""The models and optimizers of one rank's script, as the step watcher learns them.

Submodules are named by their qualified name in the model: the module ``DistributedDataParallel``
wraps (its ``__init__`` is watched), else the outermost module the script calls, else the module in the
user's frames that holds the optimizer's first parameter. A replay of a launch at world size 1 names
them the same way with or without DDP. The weights a replay starts a step from are the optimizers'
parameters (in param-group order) and the models' buffers, taken from rank 0 of the recorded launch, or
where the parameters are DTensors (tensor parallelism, FSDP2) from every rank's shard, put together.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

from ddpcheck.checker.grads import local_part, optimizer_params

WRAPPERS = ("DistributedDataParallel", "DataParallel", "FullyShardedDataParallel")


class Models:
    """What one rank's script trains: its optimizers (weakly held) and models, and names."""

    def __init__(self) -> None:
        self.optimizers: list[weakref.ref[Any]] = []
        self.roots: list[Any] = []
        self.names: dict[int, str] = {}  # id(submodule holding parameters) -> qualified name
        self.seen: dict[int, Any] = {}  # id -> module, so ids stay unique while named
        self.per_rank_norm: dict[str, None] = {}  # BatchNorm normalising over the rank's batch

    def optimizer_made(self, optimizer: Any) -> None:
        self.optimizers.append(weakref.ref(optimizer))

    def optimizers_alive(self) -> list[Any]:
        return [o for o in (ref() for ref in self.optimizers) if o is not None]

    def called(self, module: Any, outermost: bool) -> str | None:
        """``module``'s forward starts: its name where it holds parameters (None: it holds none)."""
        key = id(module)
        if outermost and key not in self.names and key not in self.seen:
            self.adopt(module)
        name = self.names.get(key)
        if name is not None and module.training and _per_rank_norm(module):
            self.per_rank_norm[name] = None
        return name

    def adopt(self, module: Any) -> None:
        """``module`` (or the model it wraps) is a model: name its submodules that hold parameters."""
        self.seen[id(module)] = module
        module = unwrap_model(module)
        if any(root is module for root in self.roots):
            return
        self.roots.append(module)
        for name, sub in module.named_modules():
            self.seen[id(sub)] = sub
            if id(sub) not in self.names and any(p is not None for p in sub._parameters.values()):
                self.names[id(sub)] = name or type(sub).__name__

    def params(self) -> list[Any]:
        """Every optimizer's parameters, in creation and param-group order, each once."""
        out: list[Any] = []
        ids: set[int] = set()
        for optimizer in self.optimizers_alive():
            for param in optimizer_params(optimizer):
                if id(param) not in ids:
                    ids.add(id(param))
                    out.append(param)
        return out

    def find_roots(self) -> None:
        """No model known yet (no DDP, no forward so far): the module in the user's frames that holds the
        optimizer's first parameter, the largest such."""
        params = self.params()
        if self.roots or not params:
            return
        first = params[0]
        best: Any = None
        frame: Any = sys._getframe(1)
        while frame is not None and best is None:
            for value in (*frame.f_locals.values(), *frame.f_globals.values()):
                holds = _is_module(value) and any(p is first for p in value.parameters())
                if holds and (best is None or _size(value) > _size(best)):
                    best = value
            frame = frame.f_back
        if best is not None:
            self.adopt(best)

    def buffers(self) -> dict[str, Any]:
        out = {}
        for i, root in enumerate(self.roots):
            prefix = f"{i}." if i else ""
            for name, buffer in root.named_buffers():
                if buffer is not None:
                    out[prefix + name] = buffer
        return out

    def weights(self) -> dict[str, Any] | None:
        """The parameters and buffers, copied to the CPU (None: no optimizer made yet). A sharded
        parameter (a DTensor) is this rank's shard, with its offset in the whole tensor and the whole
        tensor's shape (``offsets``, ``shapes``): a replay puts the ranks' shards back together."""
        import torch

        self.find_roots()
        params = self.params()
        if not params:
            return None
        values, offsets = [], []
        with torch.no_grad():
            for param in params:
                local, offset = local_part(param)
                values.append(local.detach().cpu().clone())
                offsets.append(None if offset is None else list(offset))
            buffers = {}
            for name, buffer in self.buffers().items():
                local, offset = local_part(buffer)
                if offset is None:  # a buffer sharded over ranks is left as the replay's own
                    buffers[name] = local.detach().cpu().clone()
        return {
            "params": values,
            "offsets": offsets,
            "shapes": [list(p.shape) for p in params],
            "buffers": buffers,
        }

    def sharded(self) -> bool:
        """Whether some parameter is held in shards across ranks (a DTensor not replicated everywhere)."""
        for param in self.params():
            placements = getattr(param, "placements", None)
            if placements is not None and not all(p.is_replicate() for p in placements):
                return True
        return False

    def load(self, params: list[Any], buffers: dict[str, Any] | None) -> str:
        """Start from these weights (whole tensors); "" done, else why not. A parameter of this process that
        is itself a DTensor takes the box of the whole tensor its local shard holds."""
        import torch

        self.find_roots()
        own = self.params()
        if [tuple(p.shape) for p in own] != [tuple(t.shape) for t in params]:
            return (
                f"the optimizer steps {len(own)} tensors here and {len(params)} in the recorded launch, "
                "or their shapes differ"
            )
        with torch.no_grad():
            for param, value in zip(own, params, strict=True):
                local, offset = local_part(param)
                if offset is not None:
                    value = value[tuple(slice(o, o + n) for o, n in zip(offset, local.shape, strict=True))]
                local.copy_(value)
            mine = self.buffers()
            for name, value in (buffers or {}).items():
                if name in mine and tuple(mine[name].shape) == tuple(value.shape):
                    local, offset = local_part(mine[name])
                    if offset is None:
                        local.copy_(value)
        return ""


def unwrap_model(module: Any) -> Any:
    """The model inside DDP/DataParallel wrappers and ``torch.compile``."""
    for _ in range(8):
        if type(module).__name__ in WRAPPERS and hasattr(module, "module"):
            module = module.module
        elif hasattr(module, "_orig_mod"):
            module = module._orig_mod
        else:
            break
    return module


def _is_module(value: Any) -> bool:
    import torch.nn as nn

    return isinstance(value, nn.Module)


def _size(module: Any) -> int:
    return sum(1 for _ in module.parameters())


def _per_rank_norm(module: Any) -> bool:
    from torch.nn.modules.batchnorm import SyncBatchNorm, _BatchNorm

    return isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm)
