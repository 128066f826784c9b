"""Merge per-rank results so that every rank holds the whole: ``sync_dicts_ddp`` and ``mp_sync``.

The names and defaults follow ``oml.ddp.utils.sync_dicts_ddp`` and AIToolbox's ``mp_sync``. One
call takes these collective steps, on every rank, in the same order:

1. *Schema.* Each rank describes its input (keys, kinds, dtypes, trailing shapes, lengths, the
   values of Python scalars, local errors) as JSON, sent as a ``uint8`` tensor: nothing is
   unpickled. Every rank then validates the same list of schemas, so a mismatch raises the same
   error on every rank instead of a hang or a backend error on some of them.
2. *Tensors.* Tensors, arrays and lists of ints or floats travel as raw bytes, so every dtype
   round-trips exactly. Small keys share one all-gather, padded to the longest rank and trimmed.
   A large key is all-gathered straight into its result when every rank holds the same number of
   rows, and otherwise broadcast by each rank into its final place: no pickling, no extra copy.
3. *Objects.* Flat lists of JSON scalars (str, bool, None, mixed numbers) travel as JSON bytes.
   Anything else goes through ``all_gather_object``, which *unpickles data sent by the other
   ranks*: only use it between trusted ranks, or pass ``allow_pickle=False`` to refuse it.

The schema step is :mod:`ddpcheck.reference.schema`, the bytes' way between ranks
:mod:`ddpcheck.reference.gather`. Collectives run on the backend's device (the current CUDA device for
NCCL, the CPU otherwise); merged tensors are then placed on ``device``.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ddpcheck.reference.dist import is_ddp
from ddpcheck.reference.gather import Rows, comm_device, exchange_json, gather_rows
from ddpcheck.reference.schema import (
    SAMPLE_KINDS,
    Local,
    by_rank,
    describe,
    describe_tensor,
    exchange_and_check,
    list_route,
    local_error,
)


class WarningDDP(UserWarning):
    """Emitted when a sync is asked for with ``world_size > 1`` but no process group exists."""


# --------------------------------------------------------------------------- ids ordering


def _id_order(ids: Any, ids_key: str) -> np.ndarray[Any, Any]:
    """Indices of the first occurrence of each id, in ascending id order."""
    if isinstance(ids, torch.Tensor):
        arr = ids.detach().cpu().numpy()
    elif isinstance(ids, np.ndarray):
        arr = ids
    else:
        seq = list(ids)
        if all(type(x) is int for x in seq) or all(type(x) is str for x in seq):
            try:
                arr = np.array(seq)
            except OverflowError:
                arr = np.array(seq, dtype=object)
        else:
            arr = np.array(seq, dtype=object)
    if arr.ndim != 1:
        raise ValueError(f"ids_key {ids_key!r} must hold a 1-d sequence of ids, got shape {arr.shape}")
    if arr.dtype == object:
        first: dict[Any, int] = {}
        for i, x in enumerate(arr.tolist()):
            first.setdefault(x, i)
        try:
            order = sorted(first, key=lambda x: x)
        except TypeError as e:
            raise ValueError(f"ids under {ids_key!r} cannot be sorted: {e}") from None
        return np.array([first[x] for x in order], dtype=np.int64)
    return np.unique(arr, return_index=True)[1]


def _take(value: Any, index: np.ndarray[Any, Any]) -> Any:
    if isinstance(value, torch.Tensor):
        return value.index_select(0, torch.from_numpy(index).to(value.device))
    if isinstance(value, np.ndarray):
        return value[index]
    picked = [value[i] for i in index.tolist()]
    return tuple(picked) if isinstance(value, tuple) else picked


def _order_by_ids(merged: dict[str, Any], ids_key: str, sample_keys: Sequence[str]) -> dict[str, Any]:
    """Drop repeated ids (keep the first) and sort every per-sample key by id, consistently."""
    if ids_key not in merged:
        raise ValueError(f"ids_key {ids_key!r} is not a key of the dict")
    index = _id_order(merged[ids_key], ids_key)
    total = len(merged[ids_key])
    for key in sample_keys:
        if len(merged[key]) != total:
            raise ValueError(
                f"key {key!r} has {len(merged[key])} rows but ids_key {ids_key!r} has {total}; "
                "with ids_key every list, tensor and array must hold one row per id"
            )
    if len(index) == total and bool((index == np.arange(total)).all()):
        return merged  # already unique and sorted
    out = dict(merged)
    for key in sample_keys:
        out[key] = _take(merged[key], index)
    return out


def _local_sample_keys(d: Mapping[str, Any]) -> list[str]:
    keys = []
    for k, v in d.items():
        if (isinstance(v, (torch.Tensor, np.ndarray)) and v.ndim >= 1) or isinstance(v, (list, tuple)):
            keys.append(k)
    return keys


# --------------------------------------------------------------------------- sync_dicts_ddp


def _from_rows(rows: torch.Tensor, spec: Mapping[str, Any], item: Local, device: torch.device) -> Any:
    """Rebuild one merged value from its bytes."""
    kind = spec["kind"]
    tail = spec.get("tail", [])
    if kind in ("tensor", "tensor0"):
        t = rows.view(_torch_dtype(spec["dtype"])).reshape(rows.shape[0], *tail).to(device)
        return list(t.unbind(0)) if kind == "tensor0" else t
    if kind in ("list", "tuple"):
        dtype = torch.int64 if spec["route"] == "int" else torch.float64
        values = rows.view(dtype).reshape(-1).cpu().tolist()
        return tuple(values) if kind == "tuple" else values
    assert item.np_dtype is not None
    arr = rows.cpu().numpy().view(item.np_dtype).reshape(rows.shape[0], *tail)
    if kind == "ndarray":
        return arr
    if kind == "ndarray0":
        return [arr[r, ...].copy() for r in range(arr.shape[0])]
    return [arr[r] for r in range(arr.shape[0])]  # numpy scalars


def sync_dicts_ddp(
    outputs_from_device: dict[str, Any],
    world_size: int,
    device: str | torch.device = "cpu",
    *,
    ids_key: str | None = None,
    allow_pickle: bool = True,
    group: Any = None,
) -> dict[str, Any]:
    """Merge every rank's dict; every rank gets the same merged dict.

    Lists and tuples are chained and tensors and numpy arrays concatenated on dim 0, in rank
    order; ranks may hold different lengths, including none. Python scalars, 0-d tensors, 0-d
    arrays and numpy scalars become a list with one entry per rank. Dtypes survive exactly. Merged
    tensors are placed on ``device``.

    ``ids_key`` names a key holding one id per sample: the merge then drops repeated ids (keeping
    the first; a padding ``DistributedSampler`` repeats samples to even out the ranks) and sorts
    every list, tuple, tensor and array by id, so a metric over the result equals the
    single-process metric exactly. This also applies without a process group.

    Every rank must pass the same keys with the same types, dtypes and shapes after dim 0; if not,
    every rank raises the same ``ValueError`` (``TypeError`` for unsupported values). Lists of
    arbitrary objects (and object arrays) are pickled, and unpickling runs code chosen by the
    sender: with ``allow_pickle=False`` those raise ``TypeError`` on every rank and nothing is
    ever unpickled.

    With ``world_size == 1`` or no process group a copy of the dict is returned unmerged (a
    ``WarningDDP`` is emitted when ``world_size > 1`` asks for a group that does not exist).

    ``group`` gathers over that process group only (``world_size`` is then its size): on a device mesh,
    the data-parallel group (``mesh["dp"].get_group()``), so that tensor-parallel replicas, which saw
    the same samples, are not counted twice. Only the group's members may call it.
    """
    if not isinstance(outputs_from_device, dict):
        raise TypeError(f"outputs_from_device must be a dict, got {type(outputs_from_device).__name__}")
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    target = torch.device(device)
    if world_size == 1 or not is_ddp():
        if world_size > 1:
            warnings.warn(
                f"sync_dicts_ddp(world_size={world_size}) called without a process group; "
                "returning this process's data unmerged",
                WarningDDP,
                stacklevel=2,
            )
        copied = dict(outputs_from_device)
        if ids_key is None:
            return copied
        return _order_by_ids(copied, ids_key, _local_sample_keys(copied))

    comm = comm_device()
    actual = dist.get_world_size(group)
    extra = []
    if world_size != actual:
        extra.append(("ValueError", f"world_size={world_size} but the process group has {actual} ranks"))
    local = {k: describe(k, v, comm) for k, v in outputs_from_device.items()}
    schemas, keys = exchange_and_check(
        "sync_dicts_ddp", local, extra, comm, allow_pickle=allow_pickle, ids_key=ids_key, group=group
    )
    routes, jobs = _routes(keys, schemas, local)
    gathered = _Gathered(schemas, gather_rows(jobs, comm, group))  # step 2: everything that travels as bytes
    # Step 3: JSON lists, then pickled values.
    json_keys = [k for k in keys if routes[k] == "json"]
    if json_keys:
        gathered.json = exchange_json({k: list(local[k].value) for k in json_keys}, comm, group)
    pickle_keys = [k for k in keys if routes[k] == "pickle"]
    if pickle_keys:
        gathered.pickled = [None] * actual
        dist.all_gather_object(gathered.pickled, {k: local[k].value for k in pickle_keys}, group=group)
    rank = dist.get_rank(group)
    out = {key: _merged(key, routes[key], gathered, rank, local[key], target) for key in keys}
    if ids_key is not None:
        sample_keys = [k for k in keys if schemas[0]["specs"][k]["kind"] in SAMPLE_KINDS]
        out = _order_by_ids(out, ids_key, sample_keys)
    return out


def _routes(
    keys: Sequence[str], schemas: Sequence[Mapping[str, Any]], local: Mapping[str, Local]
) -> tuple[dict[str, str], dict[str, Rows]]:
    """How each key travels ("scalar", "pickle", "rows", or a list's route: "json", "empty", "int",
    "float"), and the rows each key gathered as bytes sends."""
    routes: dict[str, str] = {}
    jobs: dict[str, Rows] = {}
    for key in keys:
        specs = [s["specs"][key] for s in schemas]
        kind = specs[0]["kind"]
        if kind in ("list", "tuple"):
            routes[key] = list_route(specs)
            if routes[key] in ("int", "float"):
                jobs[key] = Rows([sp["n"] for sp in specs], 8, local[key].rows)
        elif kind == "scalar":
            routes[key] = "scalar"
        elif specs[0].get("pickle"):
            routes[key] = "pickle"
        else:
            routes[key] = "rows"
            jobs[key] = Rows([sp["n"] for sp in specs], specs[0]["rowbytes"], local[key].rows)
    return routes, jobs


@dataclass
class _Gathered:
    """What every rank sent: its schema, the rows of every key sent as bytes (merged in rank order), the
    JSON lists, the pickled values (one dict per rank each)."""

    schemas: list[dict[str, Any]]
    rows: dict[str, torch.Tensor]
    json: list[Any] = field(default_factory=list)
    pickled: list[Any] = field(default_factory=list)


def _merged(key: str, route: str, gathered: _Gathered, rank: int, mine: Local, target: torch.device) -> Any:
    """One key's merged value, from what every rank sent by its route."""
    spec = dict(gathered.schemas[rank]["specs"][key], route=route)
    kind = spec["kind"]
    if route == "scalar":
        return [s["specs"][key]["value"] for s in gathered.schemas]
    if route == "empty":
        return () if kind == "tuple" else []
    if route == "json":
        chained = list(itertools.chain.from_iterable(p[key] for p in gathered.json))
        return tuple(chained) if kind == "tuple" else chained
    if route == "pickle":
        values = [p[key] for p in gathered.pickled]
        if kind in ("list", "tuple"):
            chained = list(itertools.chain.from_iterable(values))
            return tuple(chained) if kind == "tuple" else chained
        if kind == "ndarray":
            return np.concatenate(values, axis=0)
        return values
    return _from_rows(gathered.rows[key], spec, mine, target)


def merge_list_of_dicts(
    list_of_dicts: Sequence[dict[str, Any]], device: str | torch.device = "cpu"
) -> dict[str, Any]:
    """Merge already-gathered dicts locally, with ``sync_dicts_ddp``'s rules (OML's helper name)."""
    if not list_of_dicts:
        raise ValueError("merge_list_of_dicts needs at least one dict")
    keys = list(list_of_dicts[0])
    for i, d in enumerate(list_of_dicts):
        if set(d) != set(keys):
            raise ValueError(f"dict {i} has keys {sorted(d)} but dict 0 has {sorted(keys)}")
    target = torch.device(device)
    out: dict[str, Any] = {}
    for key in keys:
        values = [d[key] for d in list_of_dicts]
        types = {type(v) for v in values}
        if len(types) > 1:
            raise ValueError(
                f"key {key!r} has different types: {by_rank([type(v).__name__ for v in values])}"
            )
        first = values[0]
        if isinstance(first, torch.Tensor) and first.dim() > 0:
            out[key] = torch.cat([v.to(target) for v in values], dim=0)
        elif isinstance(first, np.ndarray) and first.ndim > 0:
            out[key] = np.concatenate(values, axis=0)
        elif isinstance(first, (list, tuple)):
            chained = list(itertools.chain.from_iterable(values))
            out[key] = tuple(chained) if isinstance(first, tuple) else chained
        else:
            out[key] = values
    return out


# --------------------------------------------------------------------------- mp_sync


def _as_tensor(data: Any, double_precision: bool) -> tuple[torch.Tensor | None, str | None]:
    """``data`` as an at-least-1-d tensor, or an error message. Empty lists come back as ``None``."""
    if isinstance(data, torch.Tensor):
        t = data.detach()
        return (t.reshape(1) if t.dim() == 0 else t), None
    if isinstance(data, (np.ndarray, np.generic)):
        arr = np.asarray(data)
        if arr.dtype.hasobject:
            return None, "object arrays cannot be sent as tensors"
        arr = np.ascontiguousarray(arr.reshape(1) if arr.ndim == 0 else arr)
        try:
            return torch.from_numpy(arr.copy() if not arr.flags.writeable else arr), None
        except TypeError as e:
            return None, f"numpy dtype {arr.dtype} has no torch equivalent ({e})"
    float_dtype = torch.float64 if double_precision else torch.float32
    if type(data) is bool:
        return torch.tensor([data], dtype=torch.bool), None
    if type(data) is int:
        return torch.tensor([data], dtype=torch.int64), None
    if type(data) is float:
        return torch.tensor([data], dtype=float_dtype), None
    if isinstance(data, (list, tuple)):
        if len(data) == 0:
            return None, None
        try:
            t = torch.tensor(data)
            if t.is_floating_point():
                # Straight from the Python floats again: never rounded through float32.
                t = torch.tensor(data, dtype=float_dtype)
            elif t.is_complex():
                t = torch.tensor(data, dtype=torch.complex128 if double_precision else torch.complex64)
        except (TypeError, ValueError, RuntimeError) as e:
            return None, f"cannot make a tensor from the list ({e})"
        return t, None
    return None, f"cannot sync a {type(data).__name__}; pass a tensor, array, number or list of numbers"


def _sync_tensors(
    op: str, items: dict[str, Any], double_precision: bool
) -> tuple[dict[str, torch.Tensor], dict[str, list[int]]]:
    """Gather several values as tensors in one exchange; returns merged tensors and per-rank counts."""
    comm = comm_device()
    local: dict[str, Local] = {}
    devices: dict[str, torch.device] = {}
    for key, value in items.items():
        t, err = _as_tensor(value, double_precision)
        devices[key] = value.device if isinstance(value, torch.Tensor) else torch.device("cpu")
        if err is not None:
            local[key] = local_error("TypeError", err if op == "mp_sync" else f"key {key!r}: {err}")
        elif t is None:  # an empty list: adopts the other ranks' dtype and shape
            local[key] = Local(spec={"kind": "tensor", "dtype": None, "tail": None, "n": 0, "rowbytes": None})
        else:
            local[key] = describe_tensor(key, t, comm)
            local[key].spec["kind"] = "tensor"
    single = op == "mp_sync"
    schemas, keys = exchange_and_check(op, local, [], comm, allow_pickle=False, single=single)
    jobs: dict[str, Rows] = {}
    specs_of: dict[str, dict[str, Any]] = {}
    for key in keys:
        specs = [s["specs"][key] for s in schemas]
        known = [sp for sp in specs if sp["dtype"] is not None]
        if known:
            spec = dict(known[0])
        else:
            dtype = torch.float64 if double_precision else torch.float32  # every rank sent []
            spec = {"dtype": str(dtype), "tail": [], "rowbytes": dtype.itemsize}
        specs_of[key] = spec
        jobs[key] = Rows([sp["n"] for sp in specs], spec["rowbytes"], local[key].rows)
    merged = gather_rows(jobs, comm)
    out: dict[str, torch.Tensor] = {}
    for key in keys:
        spec = specs_of[key]
        rows = merged[key]
        out[key] = (
            rows.view(_torch_dtype(spec["dtype"])).reshape(rows.shape[0], *spec["tail"]).to(devices[key])
        )
    return out, {key: jobs[key].counts for key in keys}


def _torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown torch dtype {name!r}")
    return dtype


def _finish(t: torch.Tensor, counts: list[int], concat: bool) -> torch.Tensor | list[torch.Tensor]:
    return t if concat else list(torch.split(t, counts))


def mp_sync(
    data: Any, *, double_precision: bool = False, concat: bool = True
) -> torch.Tensor | list[torch.Tensor]:
    """Gather one value from every rank: the values concatenated on dim 0 in rank order.

    ``data`` may be a tensor, numpy array, Python number or (nested) list of numbers; 0-d tensors
    and scalars count as one element, and ranks may contribute different lengths (an empty list
    adopts the other ranks' dtype). Tensors keep their dtype; ints become int64, and Python
    floats become float32, or float64 with ``double_precision=True`` (converted directly, never
    rounded through float32). The result lives on the input tensor's device (CPU for
    non-tensors); ``concat=False`` returns one tensor per rank instead. Nothing is pickled.
    """
    if not is_ddp():
        t, err = _as_tensor(data, double_precision)
        if err is not None:
            raise TypeError(f"mp_sync: {err}")
        if t is None:
            t = torch.empty(0, dtype=torch.float64 if double_precision else torch.float32)
        return _finish(t, [t.shape[0]], concat)
    merged, counts = _sync_tensors("mp_sync", {"data": data}, double_precision)
    return _finish(merged["data"], counts["data"], concat)


def mp_sync_dict(
    d: Mapping[str, Any], *, double_precision: bool = False, concat: bool = True
) -> dict[str, torch.Tensor | list[torch.Tensor]]:
    """``mp_sync`` for each value of ``d``, in one exchange; every rank must pass the same keys."""
    if not is_ddp():
        return {k: mp_sync(v, double_precision=double_precision, concat=concat) for k, v in d.items()}
    merged, counts = _sync_tensors("mp_sync_dict", dict(d), double_precision)
    return {k: _finish(merged[k], counts[k], concat) for k in merged}


__all__ = ["WarningDDP", "merge_list_of_dicts", "mp_sync", "mp_sync_dict", "sync_dicts_ddp"]
