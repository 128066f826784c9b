"""move_to_device, wrap_model/unwrap_model and no_sync, the last ones under a real 2-rank gloo group."""

from __future__ import annotations

import collections
import copy
import dataclasses
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn.parallel import DataParallel, DistributedDataParallel

from ddpcheck.launch import GroupCall, run_ranks
from ddpcheck.reference.model import move_to_device, no_sync, unwrap_model, wrap_model

GPUS = torch.cuda.device_count()
needs_cuda = pytest.mark.skipif(GPUS == 0, reason=f"needs CUDA, found {GPUS} GPUs")


class Pair(NamedTuple):
    x: torch.Tensor
    label: str


@dataclasses.dataclass(frozen=True)
class Sample:
    image: torch.Tensor
    meta: dict[str, Any]
    tag: str = "t"


def _batch() -> dict[str, Any]:
    return {
        "x": torch.ones(2, 3),
        "nested": [torch.zeros(1), (torch.arange(3), "leaf", 7)],
        "pair": Pair(torch.tensor([1.0]), "a"),
        "sample": Sample(torch.ones(1), {"mask": torch.tensor([True]), "path": "p.png"}),
        "ordered": collections.OrderedDict(a=torch.ones(1)),
        "default": collections.defaultdict(list, k=[torch.ones(1)]),
        "array": np.ones(2),
        "none": None,
    }


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [t for f in dataclasses.fields(obj) for t in _tensors(getattr(obj, f.name))]
    return []


def test_move_to_device_moves_every_tensor_and_keeps_containers() -> None:
    batch = _batch()
    moved = move_to_device(batch, "meta")  # a real device move that needs no accelerator
    assert len(_tensors(moved)) == len(_tensors(batch)) == 8
    assert all(t.device.type == "meta" for t in _tensors(moved))
    assert all(t.device.type == "cpu" for t in _tensors(batch))  # the input is untouched
    assert type(moved["pair"]) is Pair and moved["pair"].label == "a"
    assert (
        type(moved["sample"]) is Sample
        and moved["sample"].meta["path"] == "p.png"
        and moved["sample"].tag == "t"
    )
    assert type(moved["ordered"]) is collections.OrderedDict
    assert type(moved["default"]) is collections.defaultdict and moved["default"].default_factory is list
    assert type(moved["nested"][1]) is tuple and moved["nested"][1][1:] == ("leaf", 7)
    assert moved["array"] is batch["array"] and moved["none"] is None


def test_move_to_device_cpu_to_cpu_keeps_values() -> None:
    batch = _batch()
    moved = move_to_device(batch, torch.device("cpu"))
    for a, b in zip(_tensors(moved), _tensors(batch), strict=True):
        assert torch.equal(a, b)


@needs_cuda
def test_move_to_device_cuda_and_back() -> None:
    batch: dict[str, Any] = {"x": torch.arange(4.0).pin_memory(), "y": [torch.ones(2)]}
    on_gpu = move_to_device(batch, 0)
    assert all(t.device == torch.device("cuda", 0) for t in _tensors(on_gpu))
    torch.cuda.synchronize()
    back = move_to_device(on_gpu, "cpu")
    assert torch.equal(back["x"], torch.arange(4.0)) and torch.equal(back["y"][0], torch.ones(2))


class _Compiled(nn.Module):
    def __init__(self, mod: nn.Module) -> None:
        super().__init__()
        self._orig_mod = mod


class WithModuleChild(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.module = nn.Linear(2, 2)


def test_unwrap_model_peels_known_wrappers_only() -> None:
    inner = nn.Linear(2, 2)
    assert unwrap_model(inner) is inner
    assert unwrap_model(DataParallel(DataParallel(inner))) is inner
    # torch.compile's OptimizedModule keeps the original as `_orig_mod` (importing dynamo costs ~6 s).
    compiled = _Compiled(DataParallel(inner))
    assert unwrap_model(compiled) is inner
    user = WithModuleChild()
    assert unwrap_model(user) is user  # a child called `module` is not a wrapper


def test_wrap_model_without_a_group_says_what_to_do() -> None:
    with pytest.raises(RuntimeError, match=r"call ddpcheck.reference.connect\(\) first"):
        wrap_model(nn.Linear(2, 2))


def test_no_sync_on_a_plain_module_accumulates_like_one_batch() -> None:
    grads_acc, grads_big, _ = _accumulate(_model(seed=0), wrap=False)
    assert max((a - b).abs().max().item() for a, b in zip(grads_acc, grads_big, strict=True)) <= 1e-12


# --------------------------------------------------------------------------- under a real group


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 1)).double()


def _accumulate(
    model: nn.Module, wrap: bool, k: int = 4, rows: int = 8
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[bool]]:
    """Gradients after k accumulated micro-batches, and after one batch of all rows (on a copy)."""
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else 0
    gen = torch.Generator().manual_seed(100 + rank)  # every rank gets different data
    x = torch.randn(rows, 4, generator=gen, dtype=torch.float64)
    y = torch.randn(rows, 1, generator=gen, dtype=torch.float64)
    big = copy.deepcopy(model)
    acc_model = wrap_model(model) if wrap else model
    big_model = wrap_model(big) if wrap else big
    diverged: list[bool] = []
    for i, (xs, ys) in enumerate(zip(x.chunk(k), y.chunk(k), strict=True)):
        if i < k - 1:
            with no_sync(acc_model):
                (nn.functional.mse_loss(acc_model(xs), ys) / k).backward()
            if wrap and i == 0:
                diverged.append(_differs_across_ranks(unwrap_model(acc_model)))
        else:
            (nn.functional.mse_loss(acc_model(xs), ys) / k).backward()
    nn.functional.mse_loss(big_model(x), y).backward()
    grads_acc = [_grad(p) for p in unwrap_model(acc_model).parameters()]
    grads_big = [_grad(p) for p in unwrap_model(big_model).parameters()]
    return grads_acc, grads_big, diverged


def _grad(p: torch.Tensor) -> torch.Tensor:
    assert p.grad is not None
    return p.grad.detach().clone()


def _differs_across_ranks(model: nn.Module) -> bool:
    import torch.distributed as dist

    local = torch.cat([_grad(p).reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    return not torch.equal(gathered[0], gathered[1])


def _no_sync_body() -> dict[str, Any]:
    import torch.distributed as dist

    torch.set_num_threads(1)
    grads_acc, grads_big, diverged = _accumulate(_model(seed=0), wrap=True)
    err = max((a - b).abs().max().item() for a, b in zip(grads_acc, grads_big, strict=True))
    flat = torch.cat([g.reshape(-1) for g in grads_acc])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    return {"err": err, "diverged": diverged, "ranks_agree": torch.equal(gathered[0], gathered[1])}


def test_no_sync_accumulation_equals_one_large_batch_across_ranks() -> None:
    result = run_ranks(GroupCall(_no_sync_body, world_size=2, timeout=60))
    result.raise_for_failures()
    for got in result.values:
        assert got["diverged"] == [True]  # inside no_sync nothing was all-reduced
        assert got["ranks_agree"]  # the last backward synchronised the accumulated gradients
        assert got["err"] <= 1e-12


def _wrap_body() -> dict[str, Any]:
    torch.set_num_threads(1)
    inner = _model(seed=1)
    ddp = wrap_model(inner)
    errors = []
    for call in (lambda: wrap_model(ddp), lambda: wrap_model(_model(2), device_ids=[0])):
        try:
            call()
        except ValueError as e:
            errors.append(str(e))
    loose = wrap_model(_model(3), find_unused_parameters=True)
    # DataParallel probes the CUDA devices where there are some, and CUDA cannot start in a forked rank:
    # there, test_unwrap_model_through_data_parallel_on_cuda covers it in the main process
    nested = unwrap_model(DataParallel(ddp)) is inner if GPUS == 0 else None
    return {
        "type": type(ddp).__name__,
        "find_unused": ddp.find_unused_parameters,
        "device_ids": ddp.device_ids,
        "unwrapped_is_inner": unwrap_model(ddp) is inner,
        "nested": nested,
        "override": loose.find_unused_parameters,
        "errors": errors,
    }


def test_wrap_model_defaults_and_errors_under_a_group() -> None:
    result = run_ranks(GroupCall(_wrap_body, world_size=2, timeout=60))
    result.raise_for_failures()
    for got in result.values:
        assert got["type"] == DistributedDataParallel.__name__
        assert got["find_unused"] is False and got["device_ids"] is None
        assert got["unwrapped_is_inner"] and got["nested"] is (True if GPUS == 0 else None)
        assert got["override"] is True
        assert got["errors"] == [
            "model is already wrapped in DistributedDataParallel; pass the inner module",
            "device_ids must be None for a cpu model",
        ]


@needs_cuda
def test_unwrap_model_through_data_parallel_on_cuda() -> None:
    inner = _model(seed=4)
    assert unwrap_model(DataParallel(DataParallel(inner))) is inner
