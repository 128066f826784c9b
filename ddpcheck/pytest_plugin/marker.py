"""``@pytest.mark.ddp``: what a test asked for, merged with the command-line overrides.

Plain data and validation only (no torch), so collection stays fast and a wrong marker is reported
where it is written, as one line.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MARKER = "ddp"
WORLD_ARG = "ddp_world_size"
RANK_ARG = "ddp_rank"
MESH_ARG = "ddp_mesh"
DEFAULT_WORLD_SIZE = 2
DEFAULT_BACKEND = "gloo"
DEFAULT_TIMEOUT = 60.0
BACKENDS = ("gloo", "nccl")
MARKER_HELP = (
    "ddp(world_size=2, backend='gloo', timeout=60, mesh=None): run the test body in every rank of a real "
    "torch.distributed process group, one test per world size (ids [ddpN]); world_size may be a list; "
    "mesh={'dp': 2, 'tp': 2} (or a list of them) runs one test per device mesh, with a ddp_mesh fixture"
)
_KEYWORDS = ("world_size", "backend", "timeout", "mesh")


class MarkerError(ValueError):
    """A ``ddp`` marker or option that cannot be used; the message says what to write instead."""


@dataclass(frozen=True)
class Overrides:
    """Command-line values that replace every marker's own (``None``: keep the marker's)."""

    world_sizes: tuple[int, ...] | None = None
    backend: str | None = None
    timeout: float | None = None


@dataclass(frozen=True)
class DdpSpec:
    """One marked test's process groups: a group per world size (or per mesh), all on ``backend``.

    ``meshes``: specs such as ``dp=2,tp=2``; when given, the test runs once per mesh instead.
    """

    world_sizes: tuple[int, ...]
    backend: str = DEFAULT_BACKEND
    timeout: float = DEFAULT_TIMEOUT
    meshes: tuple[str, ...] = ()


@dataclass(frozen=True)
class MeshSpec:
    """A test's device mesh as plain data (names and sizes, outermost first): what ``ddp_mesh`` holds
    outside the ranks; each rank builds the real ``DeviceMesh`` from it."""

    spec: str

    @property
    def dims(self) -> tuple[tuple[str, int], ...]:
        return tuple((name, int(size)) for name, size in (part.split("=") for part in self.spec.split(",")))

    @property
    def world_size(self) -> int:
        size = 1
        for _, n in self.dims:
            size *= n
        return size

    def __repr__(self) -> str:
        return f"<ddp_mesh {self.spec}: built inside each rank>"


def mesh_id(spec: str) -> str:
    """The parametrization id of one mesh: ``test_x[mesh-dp2-tp2]``."""
    return "mesh-" + spec.replace("=", "").replace(",", "-")


def check_meshes(raw: object) -> tuple[str, ...]:
    """``{"dp": 2, "tp": 2}``, ``"dp=2,tp=2"`` or a list of them -> specs; one line on a bad one."""
    items = raw if isinstance(raw, (list, tuple)) else [raw]
    out: list[str] = []
    for item in items:
        if isinstance(item, str):
            pairs = [part.partition("=")[::2] for part in item.split(",")]
        elif isinstance(item, dict):
            pairs = [(str(k), v) for k, v in item.items()]
        else:
            raise MarkerError(
                f"mesh must be a dict such as {{'dp': 2, 'tp': 2}} or a list of them, got {raw!r}"
            )
        dims: list[tuple[str, int]] = []
        for name, size in pairs:
            name = str(name).strip()
            try:
                number = int(size)
            except (TypeError, ValueError):
                number = 0
            if not name.isidentifier() or number < 1 or isinstance(size, bool) or name in dict(dims):
                raise MarkerError(
                    f"mesh {item!r}: dimensions need distinct plain names and positive integer sizes"
                )
            dims.append((name, number))
        if not dims:
            raise MarkerError(f"mesh {item!r} has no dimension")
        spec = ",".join(f"{name}={size}" for name, size in dims)
        if spec not in out:
            out.append(spec)
    if not out:
        raise MarkerError(f"no mesh given ({raw!r}); write e.g. mesh={{'dp': 2, 'tp': 2}}")
    return tuple(out)


def param_id(world_size: int) -> str:
    """The parametrization id of one world size: ``test_x[ddp2]``."""
    return f"ddp{world_size}"


def parse_world_sizes(text: str) -> tuple[int, ...]:
    """``"1,2,4"`` -> ``(1, 2, 4)``; raises MarkerError for anything but positive integers."""
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise MarkerError(f"world sizes must be comma-separated positive integers, got {text!r}") from None
    return check_world_sizes(sizes, text)


def check_world_sizes(sizes: Iterable[Any], shown: object) -> tuple[int, ...]:
    """Positive ints, duplicates dropped, order kept."""
    out: list[int] = []
    for size in sizes:
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise MarkerError(f"world sizes must be positive integers, got {shown!r}")
        if size not in out:
            out.append(size)
    if not out:
        raise MarkerError(f"no world size given ({shown!r}); write e.g. world_size=2 or world_size=[1, 2]")
    return tuple(out)


def check_backend(backend: object) -> str:
    if backend not in BACKENDS:
        raise MarkerError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    return str(backend)


MAX_TIMEOUT = 7 * 24 * 3600.0  # one week, as the command line


def check_timeout(timeout: object) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_TIMEOUT:
        raise MarkerError(
            f"timeout must be a positive number of seconds (at most {MAX_TIMEOUT:.0f}), got {timeout!r}"
        )
    return float(timeout)


def spec_from_marker(args: Sequence[Any], kwargs: Mapping[str, Any], overrides: Overrides) -> DdpSpec:
    """The marker's ``args``/``kwargs`` (as pytest stores them) with the overrides applied."""
    unknown = sorted(set(kwargs) - set(_KEYWORDS))
    if unknown:
        raise MarkerError(
            f"@pytest.mark.ddp got unknown argument(s) {', '.join(unknown)}; it takes {', '.join(_KEYWORDS)}"
        )
    if len(args) > 1 or (args and "world_size" in kwargs):
        raise MarkerError("@pytest.mark.ddp takes one world size (or a list of them): ddp(2) or ddp([1, 2])")
    if "mesh" in kwargs and (args or "world_size" in kwargs):
        raise MarkerError("@pytest.mark.ddp takes world_size or mesh, not both: a mesh fixes its world size")
    backend = check_backend(kwargs.get("backend", DEFAULT_BACKEND))
    timeout = check_timeout(kwargs.get("timeout", DEFAULT_TIMEOUT))
    if "mesh" in kwargs:  # --ddp-world-sizes leaves meshes alone: a mesh is its own size
        meshes = check_meshes(kwargs["mesh"])
        per_mesh = tuple(MeshSpec(m).world_size for m in meshes)
        return DdpSpec(per_mesh, overrides.backend or backend, overrides.timeout or timeout, meshes=meshes)
    raw = args[0] if args else kwargs.get("world_size", DEFAULT_WORLD_SIZE)
    sizes = raw if isinstance(raw, (list, tuple, range)) else (raw,)
    world_sizes = check_world_sizes(sizes, raw)
    return DdpSpec(
        world_sizes=overrides.world_sizes or world_sizes,
        backend=overrides.backend or backend,
        timeout=overrides.timeout or timeout,
    )
