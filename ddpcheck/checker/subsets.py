"""Dataset indices as the samples they name, through ``torch.utils.data.Subset`` and HF ``datasets``'
indices mappings.

A sampler yields positions in the dataset it was given. When that dataset is a ``Subset`` (what
``random_split`` returns, or a manual shard ``Subset(data, range(rank, n, world_size))``), position i
is sample ``indices[i]`` of the dataset below, and the positions of two ranks' Subsets name different
samples. Identity must be the sample: ranks sharding by Subsets are correct although each counts from
0, and a ``random_split`` drawn differently on every rank (no seeded generator) puts other samples in
each rank's training set although the positions agree.
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable
from typing import Any


def base_indices(dataset: Any) -> array[int] | None:
    """For a (nested) ``Subset``: each position's index in the innermost dataset that is no Subset;
    None for any other dataset, or indices that are not plain integers."""
    try:
        from torch.utils.data import Subset
    except ImportError:  # pragma: no cover - torch is a dependency
        return None
    chain: array[int] | None = None
    while True:
        if isinstance(dataset, Subset):
            below, inner = _as_ints(dataset.indices), dataset.dataset
        else:
            below, inner = _hf_rows(dataset), None
        if below is None:
            return chain if inner is None else None
        if chain is None:
            chain = below
        else:
            size = len(below)
            if any(not 0 <= i < size for i in chain):
                return None
            chain = array("q", (below[i] for i in chain))
        if inner is None:
            return chain
        dataset = inner


def maps_indices(dataset: Any) -> bool:
    """The dataset renames its positions (a ``Subset``, an HF indices mapping): ids are not its indices."""
    try:
        from torch.utils.data import Subset
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    if isinstance(dataset, Subset):
        return True
    return (
        type(dataset).__module__ == "datasets.arrow_dataset"
        and getattr(dataset, "_indices", None) is not None
    )


def _hf_rows(dataset: Any) -> array[int] | None:
    """An HF ``datasets.Dataset`` with an indices mapping (``select``, ``shuffle``, ``train_test_split``,
    ``shard(contiguous=False)``): each position's row in its table. None without a mapping: a
    contiguous ``shard`` or ``select`` slices the table itself and keeps no trace of where (known limit)."""
    if type(dataset).__module__ != "datasets.arrow_dataset":
        return None
    mapping = getattr(dataset, "_indices", None)
    if mapping is None:
        return None
    try:
        import numpy as np

        rows = np.asarray(mapping.column(0).to_numpy(), dtype=np.int64)
    except Exception:  # another datasets version's private layout: positions stay positions
        return None
    out: array[int] = array("q")
    out.frombytes(rows.tobytes())
    return out


def to_base(ids: list[Hashable], base: array[int] | None) -> list[Hashable]:
    """``ids`` (positions a sampler yielded) as indices of the dataset below the Subsets."""
    if base is None:
        return ids
    size = len(base)
    return [base[i] if type(i) is int and 0 <= i < size else i for i in ids]


def _as_ints(indices: Any) -> array[int] | None:
    if isinstance(indices, range):
        return array("q", indices)
    values = indices.tolist() if hasattr(indices, "tolist") else indices
    try:
        values = list(values)
    except TypeError:
        return None
    if not all(type(v) is int for v in values):
        return None
    return array("q", values)
