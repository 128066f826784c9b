"""pytest plugin (entry point ``pytest11``): the ``ddp`` marker, rank fixtures and the ``ddpcheck`` fixture.

Only the pytest surface lives here (hooks, options, fixtures), as in pytest-xdist's plugin.py; the
machinery is beside it in :mod:`ddpcheck.pytest_plugin`. torch and the launch layer are imported when a
marked test runs, so a session without ``ddp`` tests pays nothing for having the plugin installed.

    @pytest.mark.ddp(world_size=[1, 2, 4], backend="gloo", timeout=60)
    def test_all_reduce(ddp_rank, ddp_world_size):   # runs in every rank of a real process group
        ...
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ddpcheck.pytest_plugin.check import CheckSession
from ddpcheck.pytest_plugin.marker import (
    MARKER,
    MARKER_HELP,
    MESH_ARG,
    RANK_ARG,
    WORLD_ARG,
    DdpSpec,
    MarkerError,
    MeshSpec,
    Overrides,
    check_backend,
    mesh_id,
    param_id,
    parse_world_sizes,
    spec_from_marker,
)
from ddpcheck.pytest_plugin.options import add_ini, argtype, overrides, parse_timeout

if TYPE_CHECKING:
    from ddpcheck.pytest_plugin.check import DdpCheck

_overrides_key = pytest.StashKey[Overrides]()
_session_key = pytest.StashKey[CheckSession]()  # this session's ddpcheck state: nothing module-global


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ddpcheck", "ddpcheck: tests that run in real torch.distributed process groups")
    group.addoption(
        "--ddp-world-sizes",
        type=argtype(parse_world_sizes),
        default=None,
        metavar="N,N,...",
        help="run every @pytest.mark.ddp test at these world sizes instead of the marker's (e.g. 1,2); "
        "ini: ddp_world_sizes",
    )
    group.addoption(
        "--ddp-backend",
        type=argtype(check_backend),
        default=None,
        metavar="NAME",
        help="process group backend for every @pytest.mark.ddp test (gloo or nccl); ini: ddp_backend",
    )
    group.addoption(
        "--ddp-timeout",
        type=argtype(parse_timeout),
        default=None,
        metavar="SECONDS",
        help="seconds a rank of every @pytest.mark.ddp test may go without progress (a batch, a "
        "collective, an optimizer step) before the test fails as a hang; ini: ddp_timeout",
    )
    group.addoption(
        "--ddp-max-time",
        type=argtype(parse_timeout),
        default=None,
        metavar="SECONDS",
        help="seconds every @pytest.mark.ddp test's process group may run in all, progress or not (default: "
        "no limit); ini: ddp_max_time",
    )
    group.addoption(
        "--ddpcheck-report",
        default=None,
        metavar="DIR",
        help="write JSON and Markdown reports of every ddpcheck fixture / assert_ddp_safe check into DIR",
    )
    add_ini(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_HELP)
    config.stash[_overrides_key] = overrides(config)
    report = config.getoption("ddpcheck_report")
    report_dir = None
    if report:
        report_dir = Path(report).expanduser()
        if not report_dir.is_absolute():
            report_dir = config.invocation_params.dir / report_dir
    config.stash[_session_key] = CheckSession(report_dir=report_dir, rootdir=Path(config.rootpath))
    from ddpcheck.pytest_plugin.junit import SuiteProperties, needs_relocation

    if needs_relocation(config):
        config.pluginmanager.register(SuiteProperties(config), "ddpcheck-junit-properties")


def _spec(node: Any, config: pytest.Config) -> DdpSpec | None:
    mark = node.get_closest_marker(MARKER)
    if mark is None:
        return None
    try:
        return spec_from_marker(mark.args, mark.kwargs, config.stash[_overrides_key])
    except MarkerError as exc:
        raise pytest.Collector.CollectError(f"{node.nodeid}: {exc}") from None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    spec = _spec(metafunc.definition, metafunc.config)
    if spec is None:
        return
    if spec.meshes:  # one test per mesh; its world size follows from the mesh
        if MESH_ARG not in metafunc.fixturenames:
            metafunc.fixturenames.append(MESH_ARG)
        meshes = [MeshSpec(m) for m in spec.meshes]
        metafunc.parametrize(MESH_ARG, meshes, ids=[mesh_id(m) for m in spec.meshes])
        return
    if WORLD_ARG not in metafunc.fixturenames:
        metafunc.fixturenames.append(WORLD_ARG)  # so every item carries its world size
    metafunc.parametrize(WORLD_ARG, spec.world_sizes, ids=[param_id(ws) for ws in spec.world_sizes])


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    spec = _spec(item, item.config)
    if spec is None or spec.backend != "nccl":
        return
    import torch

    world_size = _world_size(item)
    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if found < world_size:
        pytest.skip(f"NCCL world size {world_size} needs {world_size} GPUs, found {found}")


def _world_size(item: Any) -> int:
    params = item.callspec.params
    mesh = params.get(MESH_ARG)
    return mesh.world_size if isinstance(mesh, MeshSpec) else int(params[WORLD_ARG])


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    spec = _spec(pyfuncitem, pyfuncitem.config)
    if spec is None:
        return None
    from ddpcheck.pytest_plugin.failure import raise_outcome
    from ddpcheck.pytest_plugin.junit import add_properties
    from ddpcheck.pytest_plugin.ranks import run_in_ranks

    world_size = _world_size(pyfuncitem)
    capture = pyfuncitem.config.getoption("capture", "fd") != "no"
    result = run_in_ranks(pyfuncitem, spec, world_size, capture=capture)
    mesh = pyfuncitem.callspec.params.get(MESH_ARG)
    add_properties(
        pyfuncitem,
        [
            *([("ddp.mesh", mesh.spec)] if isinstance(mesh, MeshSpec) else []),
            ("ddp.world_size", str(world_size)),
            ("ddp.backend", spec.backend),
            ("ddp.seconds", f"{result.seconds:.3f}"),
            ("ddp.failed_ranks", ",".join(str(o.rank) for o in result.failures()) or "none"),
        ],
    )
    raise_outcome(result, spec.timeout, spec.max_time)
    return True


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
    session = item.config.stash.get(_session_key, None)
    if session is None:
        return (yield)
    from ddpcheck.pytest_plugin.check import running_item

    with running_item(session, item):
        return (yield)


def _needs_marker(request: pytest.FixtureRequest, name: str) -> None:
    if request.node.get_closest_marker(MARKER) is None:
        pytest.fail(f"the {name} fixture needs a test marked @pytest.mark.ddp(world_size=...)", pytrace=False)


@pytest.fixture
def ddp_rank(request: pytest.FixtureRequest) -> Any:
    """This rank's index in the process group (0 .. ddp_world_size - 1), inside ``ddp``-marked tests.

    Known only inside the ranks: other fixtures run once in the pytest process and see a placeholder.
    """
    _needs_marker(request, RANK_ARG)
    from ddpcheck.pytest_plugin.ranks import RankUnknown

    return RankUnknown()


@pytest.fixture
def ddp_world_size(request: pytest.FixtureRequest) -> int:
    """The number of ranks in the process group of a ``ddp``-marked test (its ``[ddpN]``)."""
    _needs_marker(request, WORLD_ARG)
    mesh = getattr(getattr(request.node, "callspec", None), "params", {}).get(MESH_ARG)
    if isinstance(mesh, MeshSpec):
        return mesh.world_size
    return int(getattr(request, "param", 1))  # marked tests are parametrized, which replaces this value


@pytest.fixture
def ddp_mesh(request: pytest.FixtureRequest) -> Any:
    """The device mesh of a test marked ``@pytest.mark.ddp(mesh={"dp": 2, "tp": 2})``: inside each rank a
    real ``DeviceMesh`` over the test's process group (named dimensions, outermost first); outside the
    ranks (in other fixtures) only its spec."""
    if not isinstance(getattr(request, "param", None), MeshSpec):
        pytest.fail("the ddp_mesh fixture needs a test marked @pytest.mark.ddp(mesh={...})", pytrace=False)
    return request.param


@pytest.fixture
def ddpcheck(request: pytest.FixtureRequest) -> DdpCheck:
    """Check a DataLoader factory or loader file with every ddpcheck check: ``ddpcheck.check(make_loader)``.

    Fails the test with the report table on any finding; results go to JUnit properties and, with
    ``--ddpcheck-report DIR``, to report files named after the test.
    """
    from ddpcheck.pytest_plugin.check import DdpCheck

    return DdpCheck(request.node, request.config.stash.get(_session_key, None))
