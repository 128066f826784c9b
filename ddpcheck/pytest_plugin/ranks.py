"""Running a marked test's body in every rank of a fresh process group.

Fixtures are set up once, in the pytest process; each rank gets the values (a forked copy, or a
pickled one under spawn) with ``ddp_rank`` and ``ddp_world_size`` replaced by the rank's own. Under
fork the rank calls the very function object pytest collected (assertion rewriting included); under
spawn it finds the test again by module and name, from the file when the module is not importable.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import pickle
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddpcheck.pytest_plugin.marker import MESH_ARG, RANK_ARG, WORLD_ARG, DdpSpec, MeshSpec

if TYPE_CHECKING:
    import pytest

    from ddpcheck.launch import GroupResult, TargetRef


class RankUnknown:
    """``ddp_rank`` as seen outside the ranks: fixtures run in the pytest process, before any rank exists.

    Using it there (as an int, in a comparison) raises instead of silently acting as rank 0.
    """

    def _refuse(self, *_args: object) -> Any:
        raise RuntimeError(
            "ddp_rank is only known inside a rank: read it in the test body, not in another fixture "
            "(fixtures are set up once, in the pytest process)"
        )

    __int__ = __index__ = __float__ = __bool__ = __format__ = _refuse
    __eq__ = __ne__ = __lt__ = __gt__ = __le__ = __ge__ = _refuse  # type: ignore[assignment]
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _refuse
    __floordiv__ = __rfloordiv__ = __truediv__ = __rtruediv__ = __mod__ = __rmod__ = _refuse
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return "<ddp_rank: known inside a rank only>"


@dataclass(frozen=True)
class ItemRef:
    """A test function, or a method of a test class, named so a spawned rank can find it."""

    target: TargetRef
    method: str | None = None

    def resolve(self) -> Callable[..., Any]:
        if self.target.path and self.target.module not in sys.modules:
            load_rewritten(self.target.module, self.target.path)
        found = self.target.resolve()
        return getattr(found(), self.method) if self.method else found  # type: ignore[no-any-return]


def load_rewritten(name: str, path: str) -> None:
    """Import a test file in a spawned rank with pytest's assertion rewriting, as pytest itself would.

    Without it a failing ``assert`` in a spawned rank says only "AssertionError". Falls back to a
    plain import (by ``TargetRef``) when the file cannot be rewritten or executed this way (e.g. a
    relative import inside a test package).
    """
    try:
        from _pytest.assertion.rewrite import rewrite_asserts

        source = Path(path).read_bytes()
        tree = ast.parse(source, filename=path)
        rewrite_asserts(tree, source, path)
        code = compile(tree, path, "exec", dont_inherit=True)
        spec = importlib.util.spec_from_file_location(name, path)
    except Exception:
        return
    if spec is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        exec(code, module.__dict__)
    except Exception:
        sys.modules.pop(name, None)


def run_test_body(test: Callable[..., Any] | ItemRef, funcargs: dict[str, Any]) -> None:
    """Rank entry point: call the test with this rank's arguments; its return value is ignored."""
    import torch.distributed as dist

    func = test.resolve() if isinstance(test, ItemRef) else test
    args = dict(funcargs)
    if RANK_ARG in args:
        args[RANK_ARG] = dist.get_rank()
    if WORLD_ARG in args:
        args[WORLD_ARG] = dist.get_world_size()
    if isinstance(args.get(MESH_ARG), MeshSpec):
        args[MESH_ARG] = build_mesh(args[MESH_ARG])
    func(**args)


def build_mesh(spec: MeshSpec) -> Any:
    """The test's ``DeviceMesh`` over this rank's group (cuda for nccl, else cpu)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    names = tuple(name for name, _ in spec.dims)
    return init_device_mesh(device, tuple(size for _, size in spec.dims), mesh_dim_names=names)


def call_arguments(item: pytest.Function) -> dict[str, Any]:
    """The arguments pytest would pass to the test function (its own parameters only)."""
    info = getattr(item, "_fixtureinfo", None)
    names = getattr(info, "argnames", None)
    if names is None:
        names = tuple(inspect.signature(item.obj).parameters)
    return {name: item.funcargs[name] for name in names if name in item.funcargs}


def item_ref(item: pytest.Function) -> ItemRef:
    from ddpcheck.launch import TargetRef

    module = item.module
    path = str(getattr(module, "__file__", None) or item.path)
    name = getattr(item, "originalname", None) or item.name
    if item.cls is not None:
        return ItemRef(TargetRef(module.__name__, item.cls.__qualname__, path), name)
    return ItemRef(TargetRef(module.__name__, name, path))


def picklable(funcargs: dict[str, Any], nodeid: str) -> dict[str, Any]:
    """Arguments for a spawned rank; a fixture value that cannot be pickled is a clear error."""
    out: dict[str, Any] = {}
    bad: list[str] = []
    for name, value in funcargs.items():
        if name in (RANK_ARG, WORLD_ARG):
            out[name] = None  # filled in by the rank
            continue
        try:
            pickle.dumps(value)
        except Exception:
            bad.append(f"{name} ({type(value).__name__})")
            continue
        out[name] = value
    if bad:
        raise TypeError(
            f"{nodeid}: spawned ranks (backend nccl) receive fixture values by pickling, and these do not "
            f"pickle: {', '.join(bad)}; build them inside the test body instead"
        )
    return out


def run_in_ranks(item: pytest.Function, spec: DdpSpec, world_size: int, *, capture: bool) -> GroupResult:
    """One process group of ``world_size`` ranks, each running the item's test body once."""
    from ddpcheck.launch import GroupCall, TargetRef, default_start_method, run_ranks

    funcargs = call_arguments(item)
    if inspect.iscoroutinefunction(item.obj) or inspect.isasyncgenfunction(item.obj):
        raise TypeError(f"{item.nodeid}: @pytest.mark.ddp tests must be plain (synchronous) functions")
    if default_start_method(spec.backend) == "fork":
        return run_ranks(
            GroupCall(
                run_test_body,
                world_size,
                backend=spec.backend,
                timeout=spec.timeout,
                max_time=spec.max_time,
                kwargs={"test": item.obj, "funcargs": funcargs},
                start_method="fork",
                capture=capture,
            )
        )
    return run_ranks(
        GroupCall(
            TargetRef.of(run_test_body),
            world_size,
            backend=spec.backend,
            timeout=spec.timeout,
            max_time=spec.max_time,
            kwargs={"test": item_ref(item), "funcargs": picklable(funcargs, item.nodeid)},
            capture=capture,
        )
    )
