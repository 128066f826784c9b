"""A sync's first step (:mod:`ddpcheck.reference.sync`): each rank describes its input (keys, kinds, dtypes,
trailing shapes, lengths, Python scalars' values, local errors) as JSON, and every rank validates the same
list of schemas, so a mismatch raises the same error everywhere instead of a hang on some ranks."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ddpcheck.reference.gather import exchange_json

_JSON_SCALARS = (str, int, float, bool, type(None))
_MAX_PROBLEMS = 8
SAMPLE_KINDS = ("tensor", "ndarray", "list", "tuple")


@dataclass
class Local:
    """What this rank knows about one value before anything is exchanged."""

    spec: dict[str, Any]
    rows: torch.Tensor | None = None  # (n, rowbytes) uint8 on the comm device
    value: Any = None
    np_dtype: np.dtype[Any] | None = None
    error: tuple[str, str] | None = None  # (exception class name, message)


def local_error(exc: str, msg: str) -> Local:
    return Local(spec={"kind": "error"}, error=(exc, msg))


def _tensor_rows(t: torch.Tensor, comm: torch.device) -> tuple[torch.Tensor | None, list[int], int]:
    """``t`` (at least 1-d) as ``(len, rowbytes)`` bytes: views only when it is contiguous already."""
    n, tail = t.shape[0], list(t.shape[1:])
    row = math.prod(tail)
    rowbytes = row * t.element_size()
    if rowbytes == 0:
        return None, tail, 0
    return t.to(comm).contiguous().view(n, row).view(torch.uint8), tail, rowbytes


def describe_tensor(key: str, value: torch.Tensor, comm: torch.device) -> Local:
    if value.layout != torch.strided or value.is_quantized:
        return local_error(
            "TypeError", f"key {key!r}: {value.layout} tensors are not supported; call .to_dense()"
        )
    t = value.detach().resolve_conj().resolve_neg()
    zero_d = t.dim() == 0
    if zero_d:
        t = t.reshape(1)
    rows, tail, rowbytes = _tensor_rows(t, comm)
    kind = "tensor0" if zero_d else "tensor"
    spec = {"kind": kind, "dtype": str(t.dtype), "tail": tail, "n": t.shape[0], "rowbytes": rowbytes}
    return Local(spec=spec, rows=rows)


def _describe_array(key: str, value: np.ndarray[Any, Any] | np.generic, comm: torch.device) -> Local:
    arr = np.asarray(value)
    kind = "npscalar" if isinstance(value, np.generic) else ("ndarray0" if arr.ndim == 0 else "ndarray")
    if arr.ndim == 0:
        arr = arr.reshape(1)
    n, tail = arr.shape[0], list(arr.shape[1:])
    spec: dict[str, Any] = {"kind": kind, "dtype": str(arr.dtype), "tail": tail, "n": n}
    if arr.dtype.hasobject:
        spec["pickle"] = True
        return Local(spec=spec, value=value)
    rowbytes = math.prod(tail) * arr.dtype.itemsize
    spec["rowbytes"] = rowbytes
    rows = None
    if rowbytes:
        flat = np.ascontiguousarray(arr).reshape(n, math.prod(tail)).view(np.uint8)
        if not flat.flags.writeable:
            flat = flat.copy()
        rows = torch.from_numpy(flat).to(comm)
    return Local(spec=spec, rows=rows, np_dtype=arr.dtype)


def _describe_sequence(value: list[Any] | tuple[Any, ...], comm: torch.device) -> Local:
    kind = "tuple" if isinstance(value, tuple) else "list"
    spec: dict[str, Any] = {"kind": kind, "n": len(value)}
    rows = None
    if not value:
        spec["enc"] = "empty"
    elif all(type(x) is int for x in value):
        try:
            rows = torch.tensor(value, dtype=torch.int64).view(-1, 1).view(torch.uint8).to(comm)
            spec["enc"] = "int"
        except (OverflowError, RuntimeError):
            spec["enc"] = "json"  # ints beyond 64 bits
    elif all(type(x) is float for x in value):
        rows = torch.tensor(value, dtype=torch.float64).view(-1, 1).view(torch.uint8).to(comm)
        spec["enc"] = "float"
    elif all(type(x) in _JSON_SCALARS for x in value):
        spec["enc"] = "json"
    else:
        spec["enc"] = "pickle"
    return Local(spec=spec, rows=rows, value=value)


def describe(key: Any, value: Any, comm: torch.device) -> Local:
    """Describe one value; never raises, because a rank that raised here would leave its peers hanging."""
    try:
        return _describe_value(key, value, comm)
    except Exception as e:  # reported on every rank after the schema exchange
        return local_error("ValueError", f"key {key!r}: cannot prepare the value ({type(e).__name__}: {e})")


def _describe_value(key: Any, value: Any, comm: torch.device) -> Local:
    if not isinstance(key, str):
        return local_error("TypeError", f"keys must be str, got {type(key).__name__} {key!r}")
    if isinstance(value, torch.Tensor):
        return describe_tensor(key, value, comm)
    if isinstance(value, (np.ndarray, np.generic)):
        return _describe_array(key, value, comm)
    if isinstance(value, (list, tuple)):
        return _describe_sequence(value, comm)
    if type(value) in _JSON_SCALARS:
        return Local(spec={"kind": "scalar", "type": type(value).__name__, "value": value})
    return local_error(
        "TypeError",
        f"key {key!r} holds a {type(value).__name__}; sync_dicts_ddp merges lists, tuples, tensors, "
        "numpy arrays and scalars (flatten nested dicts into top-level keys)",
    )


# --------------------------------------------------------------------------- validation


def by_rank(values: Sequence[Any]) -> str:
    """``'float32 on ranks 0, 2; float64 on rank 1'``."""
    groups: dict[str, list[int]] = {}
    for rank, v in enumerate(values):
        groups.setdefault(str(v), []).append(rank)
    parts = []
    for text, ranks in groups.items():
        label = "rank" if len(ranks) == 1 else "ranks"
        parts.append(f"{text} on {label} {', '.join(map(str, ranks))}")
    return "; ".join(parts)


def list_route(specs: Sequence[Mapping[str, Any]]) -> str:
    """How a list key travels, decided from every rank's local encoding."""
    encs = {sp["enc"] for sp in specs} - {"empty"}
    if not encs:
        return "empty"
    if len(encs) == 1 and encs <= {"int", "float"}:
        return next(iter(encs))
    return "pickle" if "pickle" in encs else "json"


class _Problems:
    """Errors found in the schemas; identical on every rank because the schemas are."""

    def __init__(self, op: str) -> None:
        self.op = op
        self.type_errors: list[str] = []
        self.value_errors: list[str] = []

    def add(self, exc: str, msg: str) -> None:
        (self.type_errors if exc == "TypeError" else self.value_errors).append(msg)

    def raise_any(self) -> None:
        items = self.type_errors + self.value_errors
        if not items:
            return
        shown = items[:_MAX_PROBLEMS]
        more = f"; and {len(items) - len(shown)} more" if len(items) > len(shown) else ""
        msg = f"{self.op}: " + "; ".join(shown) + more
        raise (TypeError if self.type_errors else ValueError)(msg)


def _check_keys(schemas: Sequence[Mapping[str, Any]], problems: _Problems) -> list[str]:
    """Keys present on every rank, in rank 0's order; reports keys some ranks lack."""
    key_sets = [set(s["keys"]) for s in schemas]
    union = set().union(*key_sets)
    lacking = [f"rank {r} lacks {sorted(union - keys)}" for r, keys in enumerate(key_sets) if union - keys]
    if lacking:
        problems.add("ValueError", f"every rank must pass the same keys, but {', '.join(lacking)}")
    common = set.intersection(*key_sets)
    return [k for k in schemas[0]["keys"] if k in common]


def _check_key(
    key: str, specs: Sequence[Mapping[str, Any]], allow_pickle: bool, problems: _Problems, single: bool
) -> None:
    name = "the value" if single else f"key {key!r}"
    kinds = [sp["kind"] for sp in specs]
    if "error" in kinds:
        return  # already reported by the rank that found it
    if len(set(kinds)) > 1:
        problems.add("ValueError", f"{name} has different types: {by_rank(kinds)}")
        return
    kind = kinds[0]
    if kind == "scalar":
        types = [sp["type"] for sp in specs]
        if len(set(types)) > 1:
            problems.add("ValueError", f"{name} has different scalar types: {by_rank(types)}")
        return
    if kind in ("list", "tuple"):
        if list_route(specs) == "pickle" and not allow_pickle:
            ranks = [r for r, sp in enumerate(specs) if sp["enc"] == "pickle"]
            problems.add(
                "TypeError",
                f"{name} holds values that need pickling (rank(s) {ranks}) but allow_pickle=False; "
                "send tensors, arrays or flat lists of str/int/float/bool/None",
            )
        return
    dtypes = [sp["dtype"] for sp in specs if sp["dtype"] is not None]
    if len(set(dtypes)) > 1:
        shown = by_rank([sp["dtype"] or "any" for sp in specs])
        problems.add("ValueError", f"{name} has different dtypes: {shown}")
    tails = [sp["tail"] for sp in specs if sp["tail"] is not None]
    if len({tuple(t) for t in tails}) > 1:
        shapes = [tuple(sp["tail"]) if sp["tail"] is not None else "any" for sp in specs]
        problems.add(
            "ValueError",
            f"{name} has different shapes after dim 0: {by_rank(shapes)} (only dim 0 may differ)",
        )
    if specs[0].get("pickle") and not allow_pickle:
        problems.add("TypeError", f"{name} is an object array, which needs pickling, but allow_pickle=False")


def exchange_and_check(
    op: str,
    local: dict[Any, Local],
    extra_errors: list[tuple[str, str]],
    comm: torch.device,
    *,
    allow_pickle: bool,
    ids_key: str | None = None,
    single: bool = False,
    group: Any = None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Step 1: exchange schemas and raise the same error everywhere; returns them and the keys."""
    errors = [list(e) for e in extra_errors] + [list(item.error) for item in local.values() if item.error]
    schema = {
        "keys": [k for k in local if isinstance(k, str)],
        "specs": {k: item.spec for k, item in local.items() if isinstance(k, str)},
        "errors": errors,
    }
    schemas = exchange_json(schema, comm, group)
    problems = _Problems(op)
    for rank, s in enumerate(schemas):
        for exc, msg in s["errors"]:
            problems.add(exc, f"rank {rank}: {msg}")
    keys = _check_keys(schemas, problems)
    for key in keys:
        _check_key(key, [s["specs"][key] for s in schemas], allow_pickle, problems, single)
    if ids_key is not None and not problems.value_errors and not problems.type_errors:
        spec = schemas[0]["specs"].get(ids_key)
        if spec is None:
            problems.add("ValueError", f"ids_key {ids_key!r} is not a key of the dict")
        elif spec["kind"] not in SAMPLE_KINDS or spec.get("tail"):
            problems.add("ValueError", f"ids_key {ids_key!r} must name a 1-d tensor, array, list or tuple")
    problems.raise_any()
    return schemas, keys
