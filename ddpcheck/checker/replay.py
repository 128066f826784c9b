"""The reference replay: one process given, at each micro-step, the union of what every rank received.

The ranks of a recorded launch save what they were handed in each compared step (``DIR/step/rank<R>/``:
one file per step window, its batches and random draws), and rank 0 the weights at the window's first
batch (``DIR/step/params/``). A replay at world size 1 loads the weights at the same point and receives,
at each position of the window, the ranks' batches concatenated along the batch dimension (dict, tuple,
list and ``BatchEncoding`` batches leaf by leaf). Sequences padded to different lengths are padded to the
longest where the padding is known (``attention_mask`` 0, ``labels`` the ignore index, ``input_ids`` the
value found where the mask is 0, on the side the batches pad); otherwise :class:`NotReplayable` says
why, and the step is reported not comparable, never replayed wrongly. Re-reading ``dataset[i]`` instead
would re-draw random crops and noise.

Files hold plain containers, tensors and numbers only (``torch.load(weights_only=True)`` reads them).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ddpcheck.checker.draws import NotReplayable
from ddpcheck.options import IGNORE_INDEX
from ddpcheck.wire.files import params_path, step_rank_folder, step_ranks

_TAG = "__ddpcheck__"
PAD_KEYS = ("attention_mask", "labels", "input_ids")


# --- plain form -------------------------------------------------------------------------------------------


def to_plain(obj: Any) -> Any:
    """``obj`` as containers of tensors and numbers that ``torch.load(weights_only=True)`` reads back."""
    import torch

    if isinstance(obj, torch.Tensor):
        if hasattr(obj, "to_local"):  # a DTensor: its shards would need the ranks' mesh to mean anything
            laid = getattr(obj, "placements", "?")
            raise NotReplayable(f"it holds a {type(obj).__name__} laid out as {laid}")
        return obj.detach().cpu().clone()
    if type(obj).__module__ == "numpy" and hasattr(obj, "dtype"):
        if obj.dtype == object:
            raise NotReplayable("it holds a numpy array of Python objects")
        return {_TAG: "ndarray", "value": torch.from_numpy(obj.copy()) if obj.shape else torch.tensor(obj)}
    if isinstance(obj, Mapping) or _mapping_like(obj):
        return {_TAG: "mapping", "items": [[key, to_plain(obj[key])] for key in obj.keys()]}  # noqa: SIM118
    if isinstance(obj, tuple):
        return {_TAG: "tuple", "items": [to_plain(x) for x in obj]}
    if isinstance(obj, list):
        return [to_plain(x) for x in obj]
    if obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        return obj
    raise NotReplayable(f"it holds a {type(obj).__module__}.{type(obj).__qualname__}")


def _mapping_like(obj: Any) -> bool:
    return hasattr(obj, "keys") and hasattr(obj, "__getitem__") and not isinstance(obj, (str, bytes))


def from_plain(obj: Any, template: Any = None) -> Any:
    """The batch back, its containers of ``template``'s types where the structure matches."""
    if isinstance(obj, dict) and obj.get(_TAG) == "ndarray":
        return obj["value"].numpy()
    if isinstance(obj, dict) and obj.get(_TAG) == "mapping":
        inner = template if _mapping_like(template) else None
        return _rebuild_mapping(template, {k: from_plain(v, _get(inner, k)) for k, v in obj["items"]})
    if isinstance(obj, dict) and obj.get(_TAG) == "tuple":
        items = [from_plain(x, _at(template, i)) for i, x in enumerate(obj["items"])]
        if isinstance(template, tuple) and hasattr(template, "_fields") and len(template) == len(items):
            return type(template)(*items)
        return tuple(items)
    if isinstance(obj, list):
        return [from_plain(x, _at(template, i)) for i, x in enumerate(obj)]
    return obj


def _get(template: Any, key: Any) -> Any:
    try:
        return template[key] if template is not None and key in template else None
    except Exception:
        return None


def _at(template: Any, i: int) -> Any:
    return template[i] if isinstance(template, (list, tuple)) and i < len(template) else None


def _rebuild_mapping(template: Any, items: dict[Any, Any]) -> Any:
    kind = type(template)
    if template is None or kind is dict:
        return items
    try:
        return kind(items)
    except Exception:
        return items


# --- the union of the ranks' batches --------------------------------------------------------------------


def union(parts: Sequence[Any], ignore_index: int = IGNORE_INDEX) -> Any:
    """The ranks' plain batches as one plain batch (rank order), or :class:`NotReplayable`."""
    if not parts:
        raise NotReplayable("no rank saved a batch here")
    return _union(list(parts), ignore_index, "the batch")


def _union(parts: list[Any], ignore_index: int, where: str) -> Any:
    import torch

    first = parts[0]
    if isinstance(first, torch.Tensor):
        if not all(isinstance(p, torch.Tensor) for p in parts):
            raise NotReplayable(f"{where} is a tensor on some ranks only")
        return _cat(parts, where)
    tag = first.get(_TAG) if isinstance(first, dict) else None
    if tag == "ndarray":
        values = [p["value"] if isinstance(p, dict) and p.get(_TAG) == "ndarray" else None for p in parts]
        if any(v is None for v in values):
            raise NotReplayable(f"{where} is a numpy array on some ranks only")
        return {_TAG: "ndarray", "value": _cat(values, where)}
    if tag == "mapping":
        return _union_mapping(parts, ignore_index, where)
    if tag == "tuple":
        items = [p["items"] if isinstance(p, dict) and p.get(_TAG) == "tuple" else None for p in parts]
        return {_TAG: "tuple", "items": _union_sequence(items, ignore_index, where)}
    if isinstance(first, list):
        return _union_sequence(parts, ignore_index, where)
    if all(p == first for p in parts):
        return first
    raise NotReplayable(f"{where} differs across ranks ({', '.join(repr(p) for p in parts[:4])})")


def _union_sequence(parts: list[Any], ignore_index: int, where: str) -> list[Any]:
    """Columns (a collated tuple or list, each leaf a batch) leaf by leaf; a list of samples joined."""
    if any(not isinstance(p, list) for p in parts):
        raise NotReplayable(f"{where} has another structure on some ranks")
    if _columns(parts):
        return [_union([p[i] for p in parts], ignore_index, f"{where}[{i}]") for i in range(len(parts[0]))]
    return [item for part in parts for item in part]


def _columns(parts: list[list[Any]]) -> bool:
    import torch

    if len({len(p) for p in parts}) != 1 or not parts[0]:
        return False
    for part in parts:
        leads = {_lead(x) for x in part}
        if None in leads or len(leads) != 1:
            return False
        if any(not isinstance(x, (torch.Tensor, dict)) for x in part):
            return False
    return True


def _lead(item: Any) -> int | None:
    """The batch dimension of a collated leaf (a tensor's first dim; a plain dict's first tensor)."""
    import torch

    if isinstance(item, torch.Tensor):
        return int(item.shape[0]) if item.dim() else None
    if isinstance(item, dict):
        inner = item.get("value") if item.get(_TAG) == "ndarray" else None
        if isinstance(inner, torch.Tensor):
            return _lead(inner)
        for _, value in item.get("items", ()):
            found = _lead(value)
            if found is not None:
                return found
        for value in item.get("items", ()) if item.get(_TAG) == "tuple" else ():
            found = _lead(value)
            if found is not None:
                return found
    return None


def _cat(values: list[Any], where: str) -> Any:
    import torch

    shapes = [tuple(v.shape) for v in values]
    if any(len(s) == 0 for s in shapes):
        if all(torch.equal(values[0], v) for v in values[1:]):
            return values[0]
        raise NotReplayable(f"{where} is a number that differs across ranks")
    if len({s[1:] for s in shapes}) != 1:
        raise NotReplayable(f"{where} has shapes {', '.join(str(list(s)) for s in shapes)} across ranks")
    return torch.cat(values)


def _union_mapping(parts: list[Any], ignore_index: int, where: str) -> Any:
    import torch

    keyed = []
    for part in parts:
        if not (isinstance(part, dict) and part.get(_TAG) == "mapping"):
            raise NotReplayable(f"{where} is a mapping on some ranks only")
        keyed.append(dict(part["items"]))
    keys = list(keyed[0])
    if any(list(k) != keys for k in keyed[1:]):
        raise NotReplayable(f"{where} has different keys across ranks")
    padded = _padding(keyed, ignore_index)
    out = []
    for key in keys:
        values = [k[key] for k in keyed]
        if padded is not None and all(isinstance(v, torch.Tensor) and v.dim() >= 2 for v in values):
            lengths = {int(v.shape[1]) for v in values}
            if len(lengths) > 1:
                values = [_pad(v, max(lengths), key, padded) for v in values]
        out.append([key, _union(values, ignore_index, f"'{key}'")])
    return {_TAG: "mapping", "items": out}


@dataclass
class _Padding:
    side: str  # "right" | "left" | "" (no padded row seen)
    values: dict[str, Any] = field(default_factory=dict)  # key -> pad value (None: unknown)


def _padding(keyed: list[dict[str, Any]], ignore_index: int) -> _Padding | None:
    """What the batches pad with, read off their ``attention_mask``, else off their ``labels``; None when
    they carry neither."""
    import torch

    masks: list[Any] = [k.get("attention_mask") for k in keyed]
    if not all(isinstance(m, torch.Tensor) and m.dim() == 2 for m in masks):
        return _padding_from_labels(keyed, ignore_index)
    sides = set()
    for mask in masks:
        for row in mask.bool():
            if bool(row.all()):
                continue
            ones = torch.nonzero(row).flatten()
            if len(ones) == 0:
                continue
            first, last = int(ones[0]), int(ones[-1])
            if first == 0 and bool(row[: last + 1].all()):
                sides.add("right")
            elif last == len(row) - 1 and bool(row[first:].all()):
                sides.add("left")
            else:
                sides.add("inside")
    side = sides.pop() if len(sides) == 1 else ("" if not sides else "mixed")
    padding = _Padding(side, {"attention_mask": 0, "labels": ignore_index})
    for key in keyed[0]:
        if key in padding.values:
            continue
        found: set[Any] = set()
        for part, mask in zip(keyed, masks, strict=True):
            value = part.get(key)
            if isinstance(value, torch.Tensor) and tuple(value.shape[:2]) == tuple(mask.shape):
                found.update(value[~mask.bool()].unique().tolist())
        padding.values[key] = found.pop() if len(found) == 1 else None
    return padding


def _padding_from_labels(keyed: list[dict[str, Any]], ignore_index: int) -> _Padding | None:
    """Right padding read off ``labels`` where the batches carry no mask: in each row, the run of ignored
    labels after its last supervised one. Another key's pad value is the one value it holds at those
    positions in every batch (unknown when it holds several: a real token with an ignored label, such as
    an end-of-sequence token, would be taken for padding). The collate that padded each rank's rows pads
    the union's the same way, so one process fed the union gets what its own collate would give it."""
    import torch

    labels: list[Any] = [k.get("labels") for k in keyed]
    if not all(isinstance(lab, torch.Tensor) and lab.dim() == 2 for lab in labels):
        return None
    tails = [_ignored_tail(lab, ignore_index) for lab in labels]
    padded = any(bool(t.any()) for t in tails)
    padding = _Padding("right" if padded else "", {"labels": ignore_index})
    for key in keyed[0]:
        if key in padding.values:
            continue
        found: set[Any] = set()
        for part, tail in zip(keyed, tails, strict=True):
            value = part.get(key)
            if isinstance(value, torch.Tensor) and tuple(value.shape[:2]) == tuple(tail.shape):
                found.update(value[tail].unique().tolist())
        padding.values[key] = found.pop() if len(found) == 1 else None
    return padding


def _ignored_tail(labels: Any, ignore_index: int) -> Any:
    """Per row, the positions after its last label that is not ``ignore_index`` (a row with none: nothing,
    its extent is not known)."""
    import torch

    kept = labels != ignore_index
    positions = torch.arange(labels.shape[1]).expand_as(labels)
    last = torch.where(kept, positions, torch.full_like(positions, -1)).max(dim=1).values
    return (positions > last.unsqueeze(1)) & (last >= 0).unsqueeze(1)


def _pad(value: Any, length: int, key: str, padding: _Padding) -> Any:
    import torch

    missing = length - int(value.shape[1])
    if missing == 0:
        return value
    differ = f"'{key}' has sequences of different lengths across ranks and"
    if padding.side not in ("right", "left"):
        seen = {"": "no padded row to learn the side from", "mixed": "rows padded on both sides"}
        raise NotReplayable(f"{differ} {seen.get(padding.side, 'padding inside rows')}")
    fill = padding.values.get(key)
    if fill is None:
        raise NotReplayable(f"{differ} its padding value is not known")
    shape = (value.shape[0], missing, *value.shape[2:])
    pad = torch.full(shape, fill, dtype=value.dtype)
    return torch.cat([value, pad] if padding.side == "right" else [pad, value], dim=1)


# --- the ranks' draws, replayed ---------------------------------------------------------------------------


def union_draw(call: str, values: Sequence[Any], result: Any) -> Any:
    """What a replayed draw returns: the ranks' values at the same call index, concatenated when the
    replay's shape is theirs summed along the first dimension, or theirs when every rank drew the same."""
    import torch

    if not values:
        raise NotReplayable("no rank made this draw")
    if isinstance(result, torch.Tensor):
        tensors = [v if isinstance(v, torch.Tensor) else None for v in values]
        if any(t is None for t in tensors):
            raise NotReplayable("the ranks' draws were no tensors")
        return _union_tensor(call, tensors, tuple(result.shape)).to(dtype=result.dtype, device=result.device)
    import numpy as np

    if isinstance(result, np.ndarray):
        arrays = [np.asarray(v) for v in values]
        merged = _union_tensor(call, [torch.from_numpy(a.copy()) for a in arrays], tuple(result.shape))
        return merged.numpy().astype(result.dtype)
    if all(_same(v, values[0]) for v in values):
        return values[0]
    raise NotReplayable("the ranks drew different values and the draw has no batch dimension")


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:
        return False


def _union_tensor(call: str, tensors: Sequence[Any], shape: tuple[int, ...]) -> Any:
    import torch

    shapes = [tuple(t.shape) for t in tensors]
    if all(s == shape for s in shapes) and all(torch.equal(tensors[0], t) for t in tensors[1:]):
        return tensors[0]
    stacked = shape and all(len(s) == len(shape) and s[1:] == shape[1:] for s in shapes)
    if stacked and sum(s[0] for s in shapes) == shape[0]:
        if call.endswith("randperm"):  # each rank permuted its own part: offsets keep that exact
            offsets, start = [], 0
            for t in tensors:
                offsets.append(t + start)
                start += len(t)
            return torch.cat(offsets)
        return torch.cat(list(tensors))
    drew = ", ".join(str(list(s)) for s in shapes)
    raise NotReplayable(f"the replay draws {list(shape)} and the ranks drew {drew}")


# --- files ------------------------------------------------------------------------------------------------


def save(path: str, payload: Any) -> None:
    import torch

    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = f"{path}.{os.getpid()}.part"
    torch.save(payload, partial)
    os.replace(partial, path)


def load(path: str) -> Any:
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


@dataclass
class RecordedWindow:
    """Every rank's record of one window, as a replay reads it (rank order)."""

    name: str
    ranks: list[int]
    handoffs: list[list[str]]  # per rank, the batches it was handed ("loader|epoch|position")
    batches: list[dict[str, Any]]  # per rank, handoff -> plain batch (absent: not saved)
    # per rank, in call order: (call, value, (stream, state, shape) or None where the record has no key)
    draws: list[list[tuple[str, Any, tuple[str, int, tuple[int, ...]] | None]]]
    notes: list[list[str]] = field(default_factory=list)  # per rank, why some batch was not saved
    params: list[Any] | None = None
    buffers: dict[str, Any] | None = None
    no_weights: str = ""  # why the weights are not there ("": they are, or none were saved)


def read_window(replay: str, name: str, only: Sequence[int] | None = None) -> RecordedWindow | None:
    """The recorded window ``name`` of every rank of the launch in ``replay`` (None: none saved it);
    ``only``: of these ranks alone (one per data-parallel coordinate of a mesh: their batches are the
    samples, their tensor and context peers hold the same ones)."""
    try:
        ranks = step_ranks(replay)
    except OSError:
        return None
    if only is not None:
        ranks = [r for r in ranks if r in set(only)]
    found = RecordedWindow(name, [], [], [], [], [])
    for rank in ranks:
        path = os.path.join(step_rank_folder(replay, rank), name)
        if not os.path.exists(path):
            continue
        payload = load(path)
        found.ranks.append(rank)
        found.handoffs.append(list(payload["handoffs"]))
        found.batches.append(dict(payload["batches"]))
        found.draws.append([(d[0], from_plain(d[1]), _draw_key(d)) for d in payload["draws"]])
        found.notes.append(list(payload.get("notes", ())))
    if not found.ranks:
        return None
    found.params, found.buffers, found.no_weights = read_weights(replay, name)
    return found


def _draw_key(saved: Sequence[Any]) -> tuple[str, int, tuple[int, ...]] | None:
    """A saved draw's stream, state fingerprint and shape (``[call, value, stream, state, shape]``)."""
    if len(saved) < 5 or not saved[3]:
        return None
    return str(saved[2]), int(saved[3]), tuple(int(n) for n in saved[4])


def read_weights(replay: str, name: str) -> tuple[list[Any] | None, dict[str, Any] | None, str]:
    """The weights at window ``name``'s first batch as whole tensors, its buffers, and why not ("")."""
    whole = params_path(replay, name)
    if os.path.exists(whole):
        payload = load(whole)
        return payload["params"], payload.get("buffers"), ""
    folder = os.path.dirname(whole)
    prefix = f"{name}.rank"
    try:
        ranks = sorted(int(n[len(prefix) :]) for n in os.listdir(folder) if n.startswith(prefix))
    except (OSError, ValueError):
        return None, None, ""
    if not ranks:
        return None, None, ""
    payloads = [load(params_path(replay, name, rank)) for rank in ranks]
    params, why = whole_tensors(payloads)
    return params, payloads[0].get("buffers"), why


def whole_tensors(payloads: Sequence[dict[str, Any]]) -> tuple[list[Any] | None, str]:
    """Each parameter whole again from the ranks' shards (``params``, ``offsets``, ``shapes`` per rank);
    None and why where the shards do not cover a parameter or disagree on the shapes."""
    import torch

    shapes = payloads[0]["shapes"]
    if any(p["shapes"] != shapes for p in payloads[1:]):
        return None, "the ranks saved parameters of different shapes"
    out = []
    for i, shape in enumerate(shapes):
        whole = [p["params"][i] for p in payloads if p["offsets"][i] is None]
        if whole:
            out.append(whole[0])
            continue
        first = payloads[0]["params"][i]
        value = torch.zeros(shape, dtype=first.dtype)
        covered = torch.zeros(shape, dtype=torch.bool)
        for payload in payloads:
            local = payload["params"][i]
            box = tuple(slice(o, o + n) for o, n in zip(payload["offsets"][i], local.shape, strict=True))
            value[box] = local
            covered[box] = True
        if not bool(covered.all()):
            held = int(covered.sum())
            return None, f"the ranks' shards of parameter {i} hold {held} of its {covered.numel()} values"
        out.append(value)
    return out, ""


def twice(window: RecordedWindow) -> RecordedWindow:
    """The window as if every rank had run twice: the union holds each rank's batch and draws twice. A
    loss that is a mean answers with the same value, one summed over a fixed normaliser with twice it."""
    return RecordedWindow(
        window.name,
        window.ranks * 2,
        window.handoffs * 2,
        window.batches * 2,
        window.draws * 2,
        window.notes * 2,
        window.params,
        window.buffers,
        window.no_weights,
    )
