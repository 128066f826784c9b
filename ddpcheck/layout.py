"""A layout: how the ranks of one run are laid out. Plain data, imported by every layer.

A plain world size ``W`` is a layout in which every rank is a data replica of its own. A device mesh
(``dp=2,tp=2``, dimensions outermost first, as ``init_device_mesh`` takes them) is a layout in which only
the *data-parallel* dimensions split the data: ranks that differ only in another coordinate (tensor,
context, pipeline or expert parallel) are *replicas* and must receive identical batches. Ranks are
numbered row-major over the mesh (``torch.arange(W).view(shape)``), and a rank's data-parallel rank is
its row-major coordinate over the data dimensions alone, which is how torchtitan flattens
``dp_replicate`` and ``dp_shard`` into one ``dp`` dimension.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DATA_PREFIX = "dp"  # dimensions whose names start with this split the data (dp, dp_replicate, dp_shard)
SEQUENCE_PREFIX = "sp"  # ... with this, the loader slices each sequence (DeepSpeed Ulysses): same samples
PLAIN_DIM = "dp"  # the one dimension of a plain world size


class LayoutError(ValueError):
    """A mesh spec that cannot describe ranks; the message is one line a user can act on."""


@dataclass(frozen=True)
class Layout:
    """One layout: ``dims`` (name, size) outermost first; ``data_dims`` the names that split the data.

    ``mesh`` is False for a plain world size (one dimension, every rank a data replica): reports then
    say "world size 4", not "dp=4".
    """

    dims: tuple[tuple[str, int], ...]
    data_dims: tuple[str, ...]
    mesh: bool = True
    # replicas along these dimensions get the same samples but each its own slice of every sequence
    # (a loader that shards the sequence, as DeepSpeed's Ulysses adapter does): contents may differ
    sequence_dims: tuple[str, ...] = ()

    @classmethod
    def plain(cls, world_size: int) -> Layout:
        return cls(((PLAIN_DIM, world_size),), (PLAIN_DIM,), mesh=False)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.dims)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(size for _, size in self.dims)

    @property
    def world_size(self) -> int:
        return math.prod(self.shape)

    @property
    def dp_world_size(self) -> int:
        """How many data replicas: the product of the data dimensions."""
        return math.prod(size for name, size in self.dims if name in self.data_dims)

    @property
    def replicas(self) -> int:
        """Ranks per data replica: the product of every other dimension (1 for a plain world size)."""
        return self.world_size // self.dp_world_size

    @property
    def label(self) -> str:
        """``4`` for a plain world size, ``dp=2,tp=2`` for a mesh: how every report names the layout."""
        if not self.mesh:
            return str(self.world_size)
        return ",".join(f"{name}={size}" for name, size in self.dims)

    @property
    def spec(self) -> str:
        """The mesh spec as ``--mesh`` takes it (a plain world size as its one data dimension)."""
        return ",".join(f"{name}={size}" for name, size in self.dims)

    def coords(self, rank: int) -> tuple[int, ...]:
        """``rank``'s coordinate along each dimension (row-major, as ``init_device_mesh`` numbers ranks)."""
        out = []
        for size in reversed(self.shape):
            rank, c = divmod(rank, size)
            out.append(c)
        return tuple(reversed(out))

    def dp_rank(self, rank: int) -> int:
        """``rank``'s data-parallel rank: its row-major coordinate over the data dimensions alone."""
        index = 0
        for (name, size), c in zip(self.dims, self.coords(rank), strict=True):
            if name in self.data_dims:
                index = index * size + c
        return index

    def replica_coords(self, rank: int) -> str:
        """``tp=1`` / ``cp=0,tp=1``: where ``rank`` sits among its replicas (its non-data coordinates)."""
        parts = [
            f"{name}={c}"
            for (name, _), c in zip(self.dims, self.coords(rank), strict=True)
            if name not in self.data_dims
        ]
        return ",".join(parts)

    def data_coords(self, rank: int) -> str:
        """``dp=1`` / ``dp_replicate=0,dp_shard=1``: the data-parallel coordinates of ``rank``."""
        parts = [
            f"{name}={c}"
            for (name, _), c in zip(self.dims, self.coords(rank), strict=True)
            if name in self.data_dims
        ]
        return ",".join(parts)

    def sequence_coords(self, rank: int) -> tuple[int, ...]:
        """``rank``'s coordinates along the sequence-sharding dimensions (() when there are none)."""
        return tuple(
            c for (name, _), c in zip(self.dims, self.coords(rank), strict=True) if name in self.sequence_dims
        )

    def replica_groups(self) -> list[list[int]]:
        """Ranks grouped by data-parallel rank (index = dp rank), each group in rank order."""
        groups: list[list[int]] = [[] for _ in range(self.dp_world_size)]
        for rank in range(self.world_size):
            groups[self.dp_rank(rank)].append(rank)
        return groups

    def without_replicas(self) -> Layout:
        """The same dimensions with every non-data one of size 1: the data-parallel world alone, where
        rank and data-parallel rank coincide (metric and training equivalence run there)."""
        dims = tuple((name, size if name in self.data_dims else 1) for name, size in self.dims)
        return Layout(dims, self.data_dims, self.mesh, self.sequence_dims)

    def representatives(self) -> list[int]:
        """One rank per data-parallel rank (the first of its replicas), in data-parallel rank order."""
        return [group[0] for group in self.replica_groups()]


def shaped_like(meshes: list[Layout], world_size: int) -> Layout:
    """A plain world size shaped like ``meshes``: their dimension names, the first data dimension of
    size ``world_size`` and every other one of size 1, so a factory that indexes its mesh by name
    (``mesh["tp"]``) runs at plain world sizes and in the single-process reference too."""
    if not meshes:
        return Layout.plain(world_size)
    names = list(dict.fromkeys(name for mesh in meshes for name in mesh.names))
    data = tuple(dict.fromkeys(name for mesh in meshes for name in mesh.data_dims))
    first = next(name for name in names if name in data)
    dims = tuple((name, world_size if name == first else 1) for name in names)
    return Layout(dims, data, mesh=False)


def parse_mesh(
    text: str, data_dims: tuple[str, ...] | None = None, sequence_dims: tuple[str, ...] | None = None
) -> Layout:
    """``"dp=2,tp=2"`` -> a mesh layout; raises :class:`LayoutError` with one line for a bad spec.

    ``data_dims`` overrides which names split the data (default: the names that start with ``dp``);
    ``sequence_dims`` which ones slice every sequence (default: the names that start with ``sp``).
    """
    dims: list[tuple[str, int]] = []
    for part in text.split(","):
        name, sep, size_text = part.strip().partition("=")
        name = name.strip()
        if not sep or not name or not size_text.strip():
            raise LayoutError(f"mesh {text!r}: expected NAME=SIZE[,NAME=SIZE...], e.g. dp=2,tp=2")
        if not name.isidentifier():
            raise LayoutError(
                f"mesh {text!r}: dimension name {name!r} is not a plain name (letters, digits, _)"
            )
        try:
            size = int(size_text.strip())
        except ValueError:
            raise LayoutError(
                f"mesh {text!r}: size of {name} must be an integer, got {size_text.strip()!r}"
            ) from None
        if size < 1:
            raise LayoutError(f"mesh {text!r}: size of {name} must be at least 1, got {size}")
        if any(name == seen for seen, _ in dims):
            raise LayoutError(f"mesh {text!r}: dimension {name} is named twice")
        dims.append((name, size))
    names = [name for name, _ in dims]
    if data_dims is None:
        chosen = tuple(name for name in names if name.startswith(DATA_PREFIX))
    else:  # names another mesh has are no error here (check_names checks them against every mesh)
        chosen = tuple(name for name in names if name in data_dims)
    if not chosen:
        raise LayoutError(
            f"mesh {text!r} has no data-parallel dimension: name one dp, dp_replicate or dp_shard, "
            "or say which with --data-dims"
        )
    if sequence_dims is None:
        sequence = tuple(n for n in names if n.startswith(SEQUENCE_PREFIX) and n not in chosen)
    else:
        both = [n for n in sequence_dims if n in chosen]
        if both:
            raise LayoutError(f"mesh {text!r}: {both[0]} cannot both split the data and slice sequences")
        sequence = tuple(n for n in names if n in sequence_dims)
    return Layout(tuple(dims), chosen, mesh=True, sequence_dims=sequence)


def parse_meshes(
    specs: tuple[str, ...] | list[str],
    data_dims: tuple[str, ...] = (),
    sequence_dims: tuple[str, ...] | None = None,
) -> list[Layout]:
    """Every ``--mesh`` with the ``--data-dims`` and ``--sequence-dims`` given for all of them; a name in
    those that no mesh has is an error (a typo must not pass silently)."""
    known = {part.partition("=")[0].strip() for spec in specs for part in spec.split(",")}
    for option, names in (("--data-dims", data_dims), ("--sequence-dims", sequence_dims or ())):
        unknown = [name for name in names if name not in known]
        if unknown:
            raise LayoutError(f"{option} names {unknown[0]}, a dimension of no mesh given")
    return [parse_mesh(spec, data_dims or None, sequence_dims) for spec in specs]
