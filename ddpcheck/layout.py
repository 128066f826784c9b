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

import hashlib
import math
import operator
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

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
    def name(self) -> str:
        """``world size 4`` or ``mesh dp=2,tp=2``: how progress lines, notes and reports name a layout."""
        return f"mesh {self.label}" if self.mesh else f"world size {self.world_size}"

    @property
    def file_name(self) -> str:
        """A short, unique, filesystem-safe form of :attr:`label` for file names: ``ws4``, ``dp2-tp2``;
        a readable prefix and a hash where the plain form would be long or ambiguous (``dp=12`` and
        ``dp1=2``, names beyond ASCII letters)."""
        if not self.mesh:
            return f"ws{self.world_size}"
        compact = "-".join(f"{name}{size}" for name, size in self.dims)
        plain = all(_PLAIN_NAME.fullmatch(name) for name in self.names)
        if plain and len(compact) <= 40 and not re.fullmatch(r"ws\d+", compact):
            return compact  # decodable: a name ends where its size's digits begin
        digest = hashlib.sha256(self.label.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        prefix = re.sub(r"[^A-Za-z0-9_]+", "-", compact).strip("-")[:24].strip("-")
        return f"{prefix}-{digest}" if prefix else digest

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


def shaped_like(meshes: Sequence[Layout], world_size: int) -> Layout:
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


MAX_REAL_RANKS = 256  # forked processes on one machine; beyond this simulated ranks (--simulate)
MAX_SIMULATED_RANKS = 65536  # the most ranks any layout may have

MeshLike = Union[str, Mapping[str, Any], "Layout"]
"""What names one mesh: a spec ``"dp=2,tp=2"``, a mapping ``{"dp": 2, "tp": 2}`` or a :class:`Layout`."""


def _shown(spec: object, limit: int = 60) -> str:
    """The spec as error messages quote it: its repr, cut in the middle when long (one readable line)."""
    text = repr(spec.spec if isinstance(spec, Layout) else spec)
    return text if len(text) <= limit else f"{text[: limit - 20]}...{text[-15:]}"


def _size(value: object, name: str, shown: str) -> int:
    if isinstance(value, str):
        try:
            size = int(value.strip())
        except ValueError:
            raise LayoutError(
                f"mesh {shown}: size of {name} must be an integer, got {value.strip()!r}"
            ) from None
    elif isinstance(value, bool) or not hasattr(value, "__index__"):
        raise LayoutError(f"mesh {shown}: size of {name} must be an integer, got {value!r}")
    else:
        size = operator.index(value)  # type: ignore[call-overload]
    if size < 1:
        raise LayoutError(f"mesh {shown}: size of {name} must be at least 1, got {size}")
    return size


def _pairs(spec: object, shown: str) -> list[tuple[str, object]]:
    """(name, size) in the order given, for a spec string or a mapping."""
    if isinstance(spec, str):
        pairs: list[tuple[str, object]] = []
        for part in spec.split(","):
            name, sep, size_text = part.partition("=")
            if not sep or not name.strip() or not size_text.strip():
                raise LayoutError(f"mesh {shown}: expected NAME=SIZE[,NAME=SIZE...], e.g. dp=2,tp=2")
            pairs.append((name.strip(), size_text))
        return pairs
    if isinstance(spec, Mapping):
        if not spec:
            raise LayoutError(f"mesh {shown}: expected NAME=SIZE[,NAME=SIZE...], e.g. dp=2,tp=2")
        return [(str(name).strip(), size) for name, size in spec.items()]
    raise LayoutError(
        "a mesh is a spec such as 'dp=2,tp=2', a mapping such as {'dp': 2, 'tp': 2} or a Layout, "
        f"got {type(spec).__name__} {shown}"
    )


def parse_mesh(
    spec: MeshLike,
    data_dims: tuple[str, ...] | None = None,
    sequence_dims: tuple[str, ...] | None = None,
    *,
    need_data: bool = True,
) -> Layout:
    """The one mesh parser: ``"dp=2,tp=2"``, ``{"dp": 2, "tp": 2}`` or a Layout -> a mesh :class:`Layout`.

    Raises :class:`LayoutError` with one line per rule broken (form, name, integer size, size at least 1,
    a name twice, more than :data:`MAX_SIMULATED_RANKS` ranks, no data dimension, a dimension both
    splitting the data and slicing sequences). Linear in the number of dimensions.

    ``data_dims`` overrides which names split the data (default: a Layout's own, else the names that
    start with ``dp``); ``sequence_dims`` which ones slice every sequence (default: a Layout's own, else
    the names that start with ``sp``). ``need_data=False`` accepts a mesh without a data dimension (a
    ``@pytest.mark.ddp`` mesh, or a ``--mesh`` before ``--data-dims`` is known).
    """
    shown = _shown(spec)
    if isinstance(spec, Layout):
        dims = spec.dims
        if data_dims is None and spec.data_dims:
            data_dims = spec.data_dims
        if sequence_dims is None and spec.sequence_dims:
            sequence_dims = spec.sequence_dims
        pairs: list[tuple[str, object]] = list(dims)
    else:
        pairs = _pairs(spec, shown)
    out: list[tuple[str, int]] = []
    seen: set[str] = set()
    world = 1
    for name, value in pairs:
        if not isinstance(name, str) or not name.isidentifier():
            raise LayoutError(
                f"mesh {shown}: dimension name {name!r} is not a plain name (letters, digits, _)"
            )
        size = _size(value, name, shown)
        if name in seen:
            raise LayoutError(f"mesh {shown}: dimension {name} is named twice")
        seen.add(name)
        out.append((name, size))
        world *= size
        if world > MAX_SIMULATED_RANKS:
            raise LayoutError(
                f"mesh {shown} has more than {MAX_SIMULATED_RANKS} ranks (the most ddpcheck simulates)"
            )
    names = [name for name, _ in out]
    if data_dims is None:
        chosen = tuple(name for name in names if name.startswith(DATA_PREFIX))
    else:  # names another mesh has are no error here (parse_meshes checks them against every mesh)
        wanted = set(data_dims)
        chosen = tuple(name for name in names if name in wanted)
    if not chosen and need_data:
        raise _no_data(shown)
    data = set(chosen)
    if sequence_dims is None:
        sequence = tuple(n for n in names if n.startswith(SEQUENCE_PREFIX) and n not in data)
    else:
        both = [n for n in sequence_dims if n in data]
        if both:
            raise LayoutError(f"mesh {shown}: {both[0]} cannot both split the data and slice sequences")
        wanted = set(sequence_dims)
        sequence = tuple(n for n in names if n in wanted)
    return Layout(tuple(out), chosen, mesh=True, sequence_dims=sequence)


def _no_data(shown: str) -> LayoutError:
    return LayoutError(
        f"mesh {shown} has no data-parallel dimension: name one dp, dp_replicate or dp_shard, "
        "or say which with --data-dims"
    )


def mesh_specs(raw: object) -> list[MeshLike]:
    """One mesh or several: a spec string, a mapping or a Layout is one mesh; a list or tuple of them
    several. (A single TOML table ``{dp_replicate = 2, dp_shard = 2}`` is one mesh, never two.)"""
    if raw is None:
        return []
    if isinstance(raw, (str, Mapping, Layout)):
        return [raw]
    if isinstance(raw, (list, tuple)):
        return list(raw)
    raise LayoutError(
        "meshes must be a spec such as 'dp=2,tp=2', a mapping such as {'dp': 2, 'tp': 2}, a Layout, "
        f"or a list of them; got {type(raw).__name__} {_shown(raw)}"
    )


def parse_meshes(
    specs: object,
    data_dims: tuple[str, ...] = (),
    sequence_dims: tuple[str, ...] | None = None,
    *,
    need_data: bool = True,
) -> list[Layout]:
    """Every mesh (see :func:`mesh_specs`) with the ``--data-dims`` and ``--sequence-dims`` given for all
    of them, duplicates dropped (order kept); a name in those that no mesh has is an error (a typo must
    not pass silently)."""
    layouts = [
        parse_mesh(spec, data_dims or None, sequence_dims, need_data=False) for spec in mesh_specs(specs)
    ]
    known = {name for layout in layouts for name in layout.names}
    for option, names in (("--data-dims", data_dims), ("--sequence-dims", sequence_dims or ())):
        unknown = [name for name in names if name not in known]
        if unknown:
            raise LayoutError(f"{option} names {unknown[0]}, a dimension of no mesh given")
    for layout in layouts:
        if need_data and not layout.data_dims:
            raise _no_data(_shown(layout))
    return list(dict.fromkeys(layouts))


def check_ranks(world_size: int, *, mesh: bool, instead: str | None = None) -> None:
    """The one limit on real ranks (processes forked on this machine), for the command line and the
    pytest marker alike; ``instead`` says what to do (default: simulate the ranks)."""
    if world_size > MAX_REAL_RANKS:
        what = f"a mesh of {world_size} ranks" if mesh else f"world size {world_size}"
        tail = instead or f"use --simulate for up to {MAX_SIMULATED_RANKS} simulated ranks"
        raise LayoutError(f"{what} exceeds {MAX_REAL_RANKS} real ranks (processes on this machine); {tail}")


_PLAIN_NAME = re.compile(r"[A-Za-z_]+")
_SAFE = re.compile(r"[A-Za-z0-9._-]+")


def file_safe(text: str, limit: int = 40) -> str:
    """A short, filesystem-safe and unique form of ``text`` for file names: ``text`` itself when it is
    plain ASCII (letters, digits, ``. _ -``) of at most ``limit`` characters, else a readable ASCII prefix
    and eight hex digits of its hash (``train.py-42-1a2b3c4d``)."""
    if _SAFE.fullmatch(text) and len(text) <= limit and not text.startswith("."):
        return text
    prefix = re.sub(r"[^A-Za-z0-9_]+", "-", text).strip("-")[: max(1, limit - 9)].strip("-")
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{prefix}-{digest}" if prefix else digest
