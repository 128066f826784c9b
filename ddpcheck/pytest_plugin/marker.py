"""``@pytest.mark.ddp``: what a test asked for, merged with the command-line overrides.

Plain data and validation only (no torch), so collection stays fast and a wrong marker is reported
where it is written, as one line.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ddpcheck.layout import Layout, LayoutError, check_ranks, parse_meshes

MARKER = "ddp"
WORLD_ARG = "ddp_world_size"
RANK_ARG = "ddp_rank"
MESH_ARG = "ddp_mesh"
DEFAULT_WORLD_SIZE = 2
DEFAULT_BACKEND = "gloo"
DEFAULT_TIMEOUT = 60.0
BACKENDS = ("gloo", "nccl")
MARKER_HELP = (
    "ddp(world_size=2, backend='gloo', timeout=60, mesh=None, max_time=None): run the test body in every "
    "rank of a real torch.distributed process group, one test per world size (ids [ddpN]); world_size may "
    "be a list; mesh={'dp': 2, 'tp': 2} (or a list of them) runs one test per device mesh, with a "
    "ddp_mesh fixture; timeout: seconds a rank may go without progress (a batch, a collective, an "
    "optimizer step); max_time: seconds the group may run in all"
)
_KEYWORDS = ("world_size", "backend", "timeout", "mesh", "max_time")


class MarkerError(ValueError):
    """A ``ddp`` marker or option that cannot be used; the message says what to write instead."""


@dataclass(frozen=True)
class Overrides:
    """Command-line values that replace every marker's own (``None``: keep the marker's)."""

    world_sizes: tuple[int, ...] | None = None
    backend: str | None = None
    timeout: float | None = None
    max_time: float | None = None


@dataclass(frozen=True)
class DdpSpec:
    """One marked test's process groups: a group per world size (or per mesh), all on ``backend``.

    ``meshes``: parsed meshes (``dp=2,tp=2``); when given, the test runs once per mesh instead.
    """

    world_sizes: tuple[int, ...]
    backend: str = DEFAULT_BACKEND
    timeout: float = DEFAULT_TIMEOUT  # seconds a rank may go without progress
    meshes: tuple[Layout, ...] = ()
    max_time: float | None = None  # seconds the group may run in all (None: no cap)


class MeshSpec:
    """A test's device mesh as plain data (names and sizes, outermost first): what ``ddp_mesh`` holds
    outside the ranks; each rank builds the real ``DeviceMesh`` from it. Made from a Layout (as
    :class:`DdpSpec` holds them) or a spec string, through the one parser
    (:func:`ddpcheck.layout.parse_meshes`)."""

    def __init__(self, spec: str | Layout) -> None:
        (self.layout,) = _parse(spec)
        self.spec: str = self.layout.spec

    @property
    def dims(self) -> tuple[tuple[str, int], ...]:
        return self.layout.dims

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MeshSpec) and other.layout == self.layout

    def __hash__(self) -> int:
        return hash(self.layout)

    def __repr__(self) -> str:
        return f"<ddp_mesh {self.spec}: built inside each rank>"


def mesh_id(mesh: str | Layout) -> str:
    """The parametrization id of one mesh: ``test_x[mesh-dp2-tp2]`` (short and unique, as file names)."""
    (layout,) = _parse(mesh)
    return "mesh-" + layout.file_name


def _parse(raw: object) -> list[Layout]:
    try:  # a marker's mesh need not name a data dimension: the test body decides what each one means
        return parse_meshes(raw, need_data=False)
    except LayoutError as exc:
        raise MarkerError(str(exc)) from None


def check_meshes(raw: object) -> tuple[Layout, ...]:
    """``{"dp": 2, "tp": 2}``, ``"dp=2,tp=2"``, a Layout or a list of them -> Layouts; one line on a bad
    one (the rules and their messages are the command line's: :func:`ddpcheck.layout.parse_mesh`)."""
    meshes = tuple(_parse(raw))
    if not meshes:
        raise MarkerError(f"no mesh given ({raw!r}); write e.g. mesh={{'dp': 2, 'tp': 2}}")
    return meshes


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
    max_time = overrides.max_time or (
        None if kwargs.get("max_time") is None else check_timeout(kwargs["max_time"])
    )
    if "mesh" in kwargs:  # --ddp-world-sizes leaves meshes alone: a mesh is its own size
        meshes = check_meshes(kwargs["mesh"])
        per_mesh = tuple(m.world_size for m in meshes)
        _real_ranks(per_mesh, mesh=True)
        return DdpSpec(
            per_mesh,
            overrides.backend or backend,
            overrides.timeout or timeout,
            meshes=meshes,
            max_time=max_time,
        )
    raw = args[0] if args else kwargs.get("world_size", DEFAULT_WORLD_SIZE)
    sizes = raw if isinstance(raw, (list, tuple, range)) else (raw,)
    world_sizes = overrides.world_sizes or check_world_sizes(sizes, raw)
    _real_ranks(world_sizes, mesh=False)
    return DdpSpec(
        world_sizes=world_sizes,
        backend=overrides.backend or backend,
        timeout=overrides.timeout or timeout,
        max_time=max_time,
    )


def _real_ranks(sizes: Iterable[int], *, mesh: bool) -> None:
    """The command line's limit on forked ranks: every rank of a marked test is a process here."""
    try:
        for size in sizes:
            check_ranks(size, mesh=mesh, instead="a ddp test forks every rank on this machine")
    except LayoutError as exc:
        raise MarkerError(str(exc)) from None
