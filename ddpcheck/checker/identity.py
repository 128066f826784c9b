"""Sample identity: which sample is which, so checks compare identities rather than positions.

Order of preference: the file's ``sample_ids(batch)`` hook; the dataset index (map-style datasets);
an ``id``/``idx``/``index`` field of dict batches; else a content hash of each sample. Content hashes
make equal samples look like duplicates, so the report says when they are in use.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from ddpcheck.checker.loaderfile import BadLoaderFile

ID_FIELDS = ("id", "idx", "index")


_PLAIN = (int, str, bytes, float, bool, type(None))
CANONICAL_NOTE = (
    "user-class ids travel as plain data: dataclasses and named tuples as tuples, others as repr()"
)


def canonical_id(value: Any) -> Hashable:
    """``value`` in a plain form that needs no user module to unpickle, equal exactly when the ids are.

    Ranks send ids to the parent, which never imports the loader file: an instance of a class defined
    there could not be read back. Dataclasses become ``(class name, *fields)``, named tuples and
    tuples their items, enums ``Class.NAME``; anything else its ``repr()`` (content-based for most
    value types; identity-based objects compare by identity anyway).
    """
    import dataclasses
    import enum

    if type(value) in _PLAIN:
        return value  # type: ignore[no-any-return]
    if isinstance(value, enum.Enum):
        return f"{type(value).__qualname__}.{value.name}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = (canonical_id(getattr(value, f.name)) for f in dataclasses.fields(value))
        return (type(value).__qualname__, *fields)
    if isinstance(value, tuple):
        return tuple(canonical_id(v) for v in value)
    if isinstance(value, frozenset):
        return frozenset(canonical_id(v) for v in value)
    for plain in (bool, int, float, str, bytes):  # subclasses (IntEnum aside): their plain value
        if isinstance(value, plain):
            return plain(value)  # type: ignore[call-overload,arg-type]
    if type(value).__repr__ is object.__repr__:  # "<Key object at 0x...>" differs in every process
        state = getattr(value, "__dict__", None)
        if not isinstance(state, dict):
            raise BadLoaderFile(
                f"sample ids of class {type(value).__qualname__} have neither a value-based repr nor "
                "attributes to compare (return ints or strings from sample_ids)"
            )
        items = sorted((str(k), canonical_id(v)) for k, v in state.items())
        return (type(value).__qualname__, *items)
    return repr(value)


def plain_id(value: Any) -> Hashable:
    """A cheap, comparable id: tensors/numpy scalars become Python scalars; unhashable is an error;
    instances of user classes take their canonical plain form (:func:`canonical_id`)."""
    if type(value) is int or type(value) is str:
        return value  # type: ignore[no-any-return]
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    elif hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
        if isinstance(value, list):
            value = _freeze(value)
    try:
        hash(value)
    except TypeError:
        raise BadLoaderFile(
            f"sample ids must be hashable, got {type(value).__name__} "
            "(return ints or strings from sample_ids)"
        ) from None
    if isinstance(value, float) and value != value:
        raise BadLoaderFile(
            "a sample id is NaN, which equals nothing, not even itself (return ints or strings)"
        )
    return canonical_id(value)


OBJECT_ITEMS = "sampler items (their id attribute, else their content)"  # an id source


def sampler_item_id(item: Any) -> Hashable:
    """One item a sampler yielded, as an id: an index as itself; an object (lhotse's samplers yield
    ``CutSet``s of cuts) by its ``id`` attribute when it has a plain one, else by its plain form.

    A number that is not an integer (``0.0``, a float tensor, a bool) is no object but a broken
    index: ``dataset[0.0]`` fails at the first batch of training, so it is bad input, not an id."""
    if type(item) is int:
        return item
    if hasattr(item, "item") and getattr(item, "ndim", 1) == 0:
        refuse_numeric_index(item.item())
        return plain_id(item)
    refuse_numeric_index(item)
    ident = getattr(item, "id", None)
    if type(ident) in (int, str):
        return ident  # type: ignore[no-any-return]
    return plain_id(item)


def refuse_numeric_index(value: Any) -> None:
    """Raise :class:`BadLoaderFile` for a sampler item that is a number but not an integer index."""
    import numbers

    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return
    if isinstance(value, (bool, numbers.Number)) or type(value).__name__ in ("bool_", "bool"):
        raise BadLoaderFile(
            f"the sampler yielded {value!r} ({type(value).__name__}) as a sample index: datasets are "
            f"indexed by ints and dataset[{value!r}] fails at the first batch (yield int indices)"
        )


def _freeze(value: Any) -> Any:
    return tuple(_freeze(v) for v in value) if isinstance(value, list) else value


def batch_length(batch: Any) -> int | None:
    """Samples in a collated batch (dim 0 of its first tensor-like leaf), or None if unknowable."""
    if hasattr(batch, "shape") and getattr(batch, "ndim", 0) > 0:
        return int(batch.shape[0])
    if isinstance(batch, dict):
        for value in batch.values():
            n = batch_length(value)
            if n is not None:
                return n
        return None
    if isinstance(batch, (list, tuple)) and batch:
        first = batch[0]
        if hasattr(first, "shape") and getattr(first, "ndim", 0) > 0:
            return int(first.shape[0])
        if isinstance(first, (list, tuple, dict)):
            return batch_length(first)
        return len(batch)
    return None


def split_samples(batch: Any) -> list[Any]:
    """Undo collation: one entry per sample (rows of tensors, zipped tuples, per-key dict rows)."""
    n = batch_length(batch)
    if n is None:
        return [batch]
    if hasattr(batch, "shape"):
        return [batch[i] for i in range(n)]
    if isinstance(batch, dict):
        return [{k: _row(v, i) for k, v in batch.items()} for i in range(n)]
    if isinstance(batch, (list, tuple)):
        first = batch[0]
        if hasattr(first, "shape") or isinstance(first, (list, tuple, dict)):
            return [tuple(_row(field, i) for field in batch) for i in range(n)]
        return list(batch)
    return [batch]


def _row(value: Any, i: int) -> Any:
    try:
        return value[i]
    except (TypeError, IndexError, KeyError):
        return value


def content_hash(sample: Any) -> int:
    """A stable 63-bit hash of a sample's content (tensor bytes, dtype and shape; or its repr)."""
    digest = hashlib.blake2b(digest_size=8)
    _feed(digest, sample)
    return int.from_bytes(digest.digest(), "little") >> 1


def batch_digest(batch: Any) -> int:
    """A stable 63-bit digest of a whole batch (every tensor's bytes, dtype and shape, every value):
    equal on two ranks exactly when they received the same batch, augmentation and noise included."""
    return content_hash(batch)


def _tensor_bytes(value: Any) -> tuple[str, bytes]:
    flat = value.detach().cpu().contiguous()
    try:
        array = flat.numpy()
        return f"{array.dtype}{array.shape}", array.tobytes()
    except (TypeError, RuntimeError):  # bfloat16 and other dtypes numpy cannot hold: their raw bytes
        import torch

        raw = flat.reshape(-1).view(torch.uint8).numpy()
        return f"{flat.dtype}{tuple(flat.shape)}", raw.tobytes()


def _feed(digest: Any, value: Any) -> None:
    if hasattr(value, "detach") and hasattr(value, "numpy"):
        head, data = _tensor_bytes(value)
        digest.update(head.encode())
        digest.update(data)
    elif hasattr(value, "tobytes") and hasattr(value, "dtype"):
        digest.update(f"{value.dtype}{getattr(value, 'shape', ())}".encode())
        digest.update(value.tobytes())
    elif isinstance(value, dict):
        for key in sorted(value, key=str):
            digest.update(str(key).encode())
            _feed(digest, value[key])
    elif isinstance(value, (list, tuple)):
        digest.update(b"[")
        for item in value:
            _feed(digest, item)
        digest.update(b"]")
    elif type(value).__repr__ is object.__repr__ and isinstance(getattr(value, "__dict__", None), dict):
        # "<Cut object at 0x...>" differs in every process: its attributes say what it holds
        digest.update(type(value).__qualname__.encode())
        _feed(digest, {str(k): v for k, v in vars(value).items()})
    else:
        digest.update(repr(value).encode())


def id_field(batch: Any) -> str | None:
    if isinstance(batch, dict):
        for name in ID_FIELDS:
            if name in batch:
                return name
    return None


def make_id_extractor(
    hook: Callable[[Any], Sequence[Hashable]] | None, first_batch: Any, collated: bool = True
) -> tuple[str, Callable[[Any], list[Hashable]]]:
    """Pick the identity source from the hook or the first item; returns (source, item -> ids).

    ``collated`` False means the loader yields single samples (``batch_size=None``).
    """
    if hook is not None:
        raw = _as_list(hook(first_batch))
        user_class = any(type(i) not in _PLAIN and not hasattr(i, "item") for i in raw)
        source = f"hook ({CANONICAL_NOTE})" if user_class else "hook"
        return source, lambda batch: [plain_id(i) for i in _as_list(hook(batch))]
    field = id_field(first_batch)
    if field is not None:
        return f"field:{field}", lambda batch: [plain_id(i) for i in _as_list(batch[field])]
    if not collated:
        return "content-hash", lambda sample: [content_hash(sample)]
    return "content-hash", lambda batch: [content_hash(s) for s in split_samples(batch)]


def _as_list(ids: Any) -> list[Any]:
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        return [ids]
    return list(ids)
