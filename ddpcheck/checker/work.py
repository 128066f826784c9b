"""The rank side of ``work_balance`` and ``packing``: what one batch costs and how it is packed.

In language-model training the unit of work is a token: two loaders that split every sample exactly
once can still leave GPUs idle (one rank gets the long sequences) or corrupt inputs (packed documents
whose positions do not restart). Each rank measures its batches as they pass and keeps only plain
numbers: per batch the work of each document (a row, or a packed segment), the supervised tokens,
and for packed batches a tally of boundaries and, with a ``token_ids`` hook, which tokens it held as
runs of ``(document, first offset, length)``. No tensor leaves the rank.

Work of a batch, in this order: the file's ``batch_work(batch)`` hook; for dict batches the real
tokens (``attention_mask`` summed per row; packed batches per segment; else ``input_ids`` per row
without the padding, where something says what padding is: the pad token of the collate function or
the tokenizer, or ``labels`` -100 at a row's tail); else nothing is measured. ``input_ids`` whose
padding nothing tells are measured by their width, and the source says so: ``work_balance`` then
judges nothing (the collator's padding is not the sampler's imbalance). ``cost="attention"`` squares
each document's length (the usual proxy for attention cost).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import pairwise
from typing import Any

from ddpcheck.checker.loaderfile import BadLoaderFile
from ddpcheck.options import IGNORE_INDEX
from ddpcheck.trace import PADDED_WIDTH, PackingTally

WORK_HOOK = "batch_work"
TOKEN_HOOK = "token_ids"
TOKEN_KEYS = ("input_ids", "attention_mask", "position_ids")
# other names for them: torchtitan's batches are ({"input": tokens, "positions": positions}, labels)
KEY_ALIASES = {"input": "input_ids", "positions": "position_ids"}
CU_KEYS = ("cu_seqlens", "cu_seq_lens_q", "cu_seq_lens_k")
DOC_ID_KEYS = ("document_ids", "doc_ids", "seq_idx")
SEQ_LEN_KEYS = ("seq_lens", "seq_lengths")
COSTS = ("tokens", "attention")
# where a collate function or tokenizer keeps its pad token: names, not guesses about values
PAD_NAMES = frozenset(
    ("pad", "pad_id", "pad_idx", "pad_index", "pad_token_id", "padding_idx", "padding_value", "pad_value")
)


@dataclass
class Measured:
    """One batch: each document's work (rows, or packed segments), the supervised tokens (None:
    no labels), and the packing facts of a batch with ``position_ids``."""

    units: tuple[float, ...]
    supervised: int | None = None
    packing: PackingTally | None = None
    source: str = ""

    @property
    def total(self) -> float:
        return float(sum(self.units))


@dataclass
class WorkMeter:
    """Measures batches for one rank: which source it uses is decided by the first batch."""

    hook: Callable[[Any], Any] | None = None
    token_hook: Callable[[Any], Any] | None = None
    cost: str = "tokens"
    source: str = ""  # "" until a batch was measured; "none": these batches carry no work
    pad_id: int | None = None  # the collate function's or tokenizer's pad token (:func:`pad_token_of`)
    ignore_index: int = IGNORE_INDEX  # the label value that supervises nothing (--ignore-index)

    batches: int = 0  # batches measured so far on this rank (names the batch a bad hook value came from)

    def measure(self, batch: Any) -> Measured | None:
        if self.source == "none":
            return None
        self.batches += 1
        try:
            measured = measure_batch(
                batch, self.hook, self.token_hook, self.cost, self.pad_id, ignore_index=self.ignore_index
            )
        except BadWorkValue as exc:
            where = f"batch {self.batches} of rank {_rank()} (every epoch's batches counted from 1)"
            raise BadLoaderFile(f"{exc} at {where}") from None
        if measured is None:
            self.source = "none"
            return None
        self.source = self.source or measured.source
        return measured


def looks_like_tokens(item: Any) -> bool:
    """A sample or batch that carries token fields (a dict-like with input_ids / attention_mask /
    position_ids, or torchtitan's names): its work is tokens, not samples."""
    keys = _keys(token_view(item))
    return bool(keys) and any(k in keys for k in TOKEN_KEYS)


def token_view(batch: Any) -> Any:
    """``batch`` with its token fields under the names above: torchtitan's ``(inputs, labels)`` pair
    becomes one dict (``labels`` added); any other batch is returned as it is."""
    pair = isinstance(batch, (tuple, list)) and len(batch) == 2
    inputs = batch[0] if pair else batch
    keys = _keys(inputs)
    if not keys & set(KEY_ALIASES) or keys & set(TOKEN_KEYS):
        return batch
    view = {KEY_ALIASES.get(k, k): inputs[k] for k in keys}
    if pair:
        view.setdefault("labels", batch[1])
    return view


def _keys(item: Any) -> set[str]:
    if isinstance(item, Mapping) or (hasattr(item, "keys") and hasattr(item, "__getitem__")):
        try:
            return {k for k in item.keys() if isinstance(k, str)}  # noqa: SIM118 - BatchEncoding, UserDict
        except Exception:
            return set()
    return set()


def _get(batch: Any, key: str) -> Any:
    try:
        return batch[key] if key in _keys(batch) else None
    except Exception:
        return None


def _as_2d(value: Any) -> Any:
    import torch

    tensor = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    if tensor.dim() == 0:
        tensor = tensor.reshape(1, 1)
    elif tensor.dim() == 1:
        tensor = tensor.reshape(1, -1)
    elif tensor.dim() > 2:
        tensor = tensor.reshape(tensor.shape[0], -1)
    return tensor


def measure_batch(
    batch: Any,
    hook: Callable[[Any], Any] | None = None,
    token_hook: Callable[[Any], Any] | None = None,
    cost: str = "tokens",
    pad_id: int | None = None,
    *,
    ignore_index: int = IGNORE_INDEX,
) -> Measured | None:
    """What one batch costs (None: it carries no token fields and the file has no ``batch_work``).
    ``pad_id``: the pad token, where the loader's collate function or tokenizer names one; a label equal
    to ``ignore_index`` supervises nothing."""
    if hook is None and token_view(batch) is not batch:  # the hooks are the file's: they get its batch
        original, batch = batch, token_view(batch)
        if token_hook is not None:
            token_hook = partial(_on_original, token_hook, original)
    labels = _get(batch, "labels")
    supervised = int((_as_2d(labels) != ignore_index).sum()) if labels is not None else None
    if hook is not None:
        return Measured((work_value(hook(batch)),), supervised, source=f"{WORK_HOOK}(batch)")
    if not looks_like_tokens(batch):
        return None
    positions = _get(batch, "position_ids")
    mask = _get(batch, "attention_mask")
    ids = _get(batch, "input_ids")
    packing = None
    if positions is not None:
        packing, lengths = pack_facts(batch, token_hook)
        source = "packed segments (position_ids)"
    elif mask is not None:
        lengths = [int(n) for n in _as_2d(mask).sum(dim=1).tolist()]
        source = "attention_mask"
    elif ids is not None:
        lengths, source = unpadded_lengths(_as_2d(ids), labels, pad_id, ignore_index)
    else:
        return None
    units = tuple(float(n * n) if cost == "attention" else float(n) for n in lengths)
    return Measured(units, supervised, packing, source + (" squared" if cost == "attention" else ""))


def unpadded_lengths(
    ids: Any, labels: Any, pad_id: int | None, ignore_index: int = IGNORE_INDEX
) -> tuple[list[int], str]:
    """Each row's real tokens without an attention mask, and what told them: the span between the
    first and the last token other than ``pad_id`` (padding on either side), else the row up to the
    tail of ``labels`` that is -100 (a padded label row), else the row's width (:data:`PADDED_WIDTH`:
    a batch padded to its longest row looks as long on every row)."""
    rows, width = int(ids.shape[0]), int(ids.shape[1])
    if pad_id is not None:
        real = (ids != pad_id).int()
        first = real.argmax(dim=1)
        last = width - 1 - real.flip(dims=(1,)).argmax(dim=1)
        spans = [int(b - a + 1) if int(r.sum()) else 0 for a, b, r in zip(first, last, real, strict=True)]
        return spans, f"input_ids without pad token {pad_id}"
    if labels is not None:
        shaped = _as_2d(labels)
        if tuple(shaped.shape) == (rows, width):
            kept = (shaped != ignore_index).int()
            tail = (width - 1 - kept.flip(dims=(1,)).argmax(dim=1)).tolist()
            lengths = [int(t) + 1 if int(r.sum()) else 0 for t, r in zip(tail, kept, strict=True)]
            return lengths, "input_ids up to the labels' -100 tail"
    return [width] * rows, PADDED_WIDTH


def pad_token_of(loader: Any) -> int | None:
    """The pad token a loader's batches are padded with, where its collate function or a tokenizer says
    it by name (:data:`PAD_NAMES`): an attribute of the collate object, of its or the dataset's
    ``tokenizer``/``processing_class``; a ``functools.partial``'s keyword; a variable the collate
    function's own code reads (a closure cell or a module global). None unless exactly one int is named."""
    collate = getattr(loader, "collate_fn", None)
    dataset = getattr(loader, "dataset", None)
    holders = [collate, dataset]
    holders += [
        getattr(h, name, None) for h in (collate, dataset) for name in ("tokenizer", "processing_class")
    ]
    found: set[int] = set()
    for holder in holders:
        if holder is not None:
            found |= _named_pads({name: _attribute(holder, name) for name in PAD_NAMES})
    found |= _named_pads(getattr(collate, "keywords", None) or {})
    function = getattr(collate, "func", collate)
    code = getattr(function, "__code__", None)
    if code is not None:
        cells = dict(zip(code.co_freevars, getattr(function, "__closure__", None) or (), strict=False))
        closed = {name: _cell(cell) for name, cell in cells.items()}
        module = getattr(function, "__globals__", {})
        found |= _named_pads(closed) | _named_pads({name: module.get(name) for name in code.co_names})
    return found.pop() if len(found) == 1 else None


def _attribute(holder: Any, name: str) -> Any:
    try:
        return getattr(holder, name, None)
    except Exception:  # a property that needs state the object lacks
        return None


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def _named_pads(names: Mapping[str, Any]) -> set[int]:
    return {
        value
        for name, value in names.items()
        if name.lower() in PAD_NAMES and isinstance(value, int) and not isinstance(value, bool)
    }


def _on_original(hook: Callable[[Any], Any], original: Any, _view: Any) -> Any:
    return hook(original)


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class BadWorkValue(ValueError):
    """``batch_work`` returned something that is not a work (the meter adds which batch)."""


def work_value(raw: Any) -> float:
    """``batch_work``'s value as a float: a finite number >= 0, else :class:`BadWorkValue`.

    NaN would pass every comparison (``work_balance`` would report "idle nan%" as balanced), inf and
    negative work mean nothing, and a non-number has no amount: each is a broken hook, said as such."""
    import math

    value = raw.item() if hasattr(raw, "item") and getattr(raw, "ndim", 0) == 0 else raw
    number = None
    if not isinstance(value, (bool, str, bytes)):
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            number = None
    if number is None or not math.isfinite(number) or number < 0:
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        kind = "not a number" if number is None else "not a finite number >= 0"
        raise BadWorkValue(f"{WORK_HOOK}(batch) returned {shown} ({type(value).__name__}, {kind})")
    return number


def _flat_ints(value: Any) -> list[int]:
    import torch

    tensor = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    return [int(v) for v in tensor.reshape(-1).tolist()]


def _changes(values: Sequence[int], row_starts: set[int]) -> set[int]:
    return {i for i in range(len(values)) if i in row_starts or values[i] != values[i - 1]}


def pack_facts(batch: Any, token_hook: Callable[[Any], Any] | None = None) -> tuple[PackingTally, list[int]]:
    """The packing of one batch with ``position_ids`` (rows flattened row-major): where documents
    start by each metadata source and by the positions, and the segments' lengths."""
    positions = _as_2d(_get(batch, "position_ids"))
    rows, width = int(positions.shape[0]), int(positions.shape[1])
    pos = [int(v) for v in positions.reshape(-1).tolist()]
    n = len(pos)
    mask = _get(batch, "attention_mask")
    valid = [True] * n if mask is None or _as_2d(mask).numel() != n else [bool(v) for v in _flat_ints(mask)]
    row_starts = {r * width for r in range(rows)}
    sources: dict[str, set[int]] = {}
    for key in CU_KEYS:
        cu = _get(batch, key)
        if cu is not None:
            edges = _flat_ints(cu)
            sources[key] = set(edges[:-1]) if edges and edges[-1] == n else set(edges)
    for key in SEQ_LEN_KEYS:
        lens = _get(batch, key)
        if lens is not None:
            starts, at = set(), 0
            for length in _flat_ints(lens):
                starts.add(at)
                at += length
            sources[key] = starts
    for key in DOC_ID_KEYS:
        docs = _get(batch, key)
        if docs is not None and _as_2d(docs).numel() == n:
            sources[key] = _changes(_flat_ints(docs), row_starts)
    tally = PackingTally(batches=1, sources=tuple(sorted(sources)))
    kept = {i for i in range(n) if valid[i]}
    marked = {name: (starts | row_starts) & kept for name, starts in sources.items()}
    if marked and len({frozenset(s) for s in marked.values()}) > 1:
        tally.disagree = 1
    resets = {i for i in kept if pos[i] == 0}
    if marked:
        boundaries = set().union(*marked.values())
        tally.no_reset = sum(1 for b in boundaries if b not in row_starts and pos[b] != 0)
        tally.reset_inside = sum(1 for r in resets if r not in boundaries)
    else:
        boundaries = (resets | row_starts) & kept
    tokens: list[Any] | None = None
    if token_hook is not None:
        tokens = [_token_pair(t) for t in token_hook(batch)]
        if len(tokens) != len(kept):
            raise ValueError(f"token_ids(batch) gave {len(tokens)} ids for the batch's {len(kept)} tokens")
    where = {i: k for k, i in enumerate(sorted(kept))}
    lengths: list[int] = []
    runs: list[tuple[Any, int, int]] = []
    i = 0
    while i < n:
        if not valid[i]:
            i += 1
            continue
        j = i + 1
        while j < n and valid[j] and j not in boundaries:
            j += 1
        seg = pos[i:j]
        tally.jumps += sum(1 for a, b in pairwise(seg) if b not in (a + 1, 0))
        lengths.append(j - i)
        if tokens is not None:
            held = [tokens[where[k]] for k in range(i, j)]
            docs = {d for d, _ in held}
            if len(docs) > 1:
                tally.mixed += 1
            doc, first = held[0]
            if first > 0:  # a document cut earlier continues here
                if seg[0] == first:
                    tally.cut_continued += 1
                elif seg[0] == 0:
                    tally.cut_restarted += 1
            runs.append((doc, first, j - i))
        i = j
    tally.segments = len(lengths)
    tally.runs = runs if tokens is not None else None
    return tally, lengths


def _token_pair(token: Any) -> tuple[Any, int]:
    if hasattr(token, "tolist"):
        token = token.tolist()
    if isinstance(token, (list, tuple)) and len(token) == 2:
        doc = token[0].item() if hasattr(token[0], "item") else token[0]
        return doc, int(token[1])
    return (token.item() if hasattr(token, "item") else token), 0


def add_tally(into: PackingTally | None, batch: PackingTally, index: int) -> PackingTally:
    """Sum one batch's tally into the epoch's (the first batch with a problem remembered)."""
    if into is None:
        into = PackingTally(runs=[] if batch.runs is not None else None)
    return into.add(batch, index)
