"""Issue 36 item 7: loaders that name POSIX shared memory machine-wide (mosaicml-streaming's
``/000000_locals``). Two of ddpcheck's groups side by side are two jobs on one machine: their
registrations race (``FileExistsError: '/000000_locals'``), which the user's single job never meets.

mosaicml-streaming cannot be imported here (it imports torchvision): ``fixtures/streaming/
named_shm_registry.py`` reproduces its registration in plain torch (its docstring says how, from the
0.13.0 wheel's source). Real ranks, real process groups; the race is shown without ddpcheck first.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import signal
import time
import uuid
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path
from typing import Any

import pytest

from ddpcheck.launch import GroupCall, run_groups, run_ranks
from ddpcheck.options import CheckOptions
from ddpcheck.session import check_loader
from tests.conftest import FIXTURES
from tests.proc_utils import children_of

FIXTURE = FIXTURES / "streaming" / "named_shm_registry.py"
SHM = Path("/dev/shm")

pytestmark = pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm: POSIX shared memory is Linux's here")


def _fixture() -> Any:
    spec = importlib.util.spec_from_file_location("named_shm_registry", FIXTURE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _own_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests run side by side (pytest -n) are jobs on one machine too: each gets its own names."""
    monkeypatch.setenv("SHM_NAMESPACE", f"t{uuid.uuid4().hex[:8]}-")


def _registered() -> set[str]:
    return {p.name for p in SHM.glob(f"{os.environ['SHM_NAMESPACE']}0*_locals")}


def _one_job(results: Any) -> None:
    import atexit

    module = _fixture()
    try:
        loader = module.make_loader(0, 1)
        next(iter(loader))
        time.sleep(module.WINDOW_S)  # the job goes on (training) holding its registration
        results.put("ok")
    except Exception as exc:
        results.put(type(exc).__name__)
    finally:
        atexit._run_exitfuncs()


def test_two_jobs_at_once_race_for_the_name_without_ddpcheck() -> None:
    """The mechanism is real: two processes that register at once, as Streaming does, collide."""
    before = _registered()
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    procs = [context.Process(target=_one_job, args=(queue,)) for _ in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(30)
    assert sorted(queue.get(timeout=5) for _ in procs) == ["FileExistsError", "ok"]
    assert _registered() == before  # each job unlinked its own at exit


def _register_and_hold(record: str) -> str:
    """A rank's job: register as Streaming does, train one batch, note when it held the name."""
    module = _fixture()
    started = time.monotonic()
    loader = module.make_loader(0, 1)
    next(iter(loader))
    with open(record, "a") as out:
        out.write(f"{started} {time.monotonic()}\n")
    return "ok"


def test_groups_side_by_side_that_name_shared_memory_are_run_one_after_another(tmp_path: Path) -> None:
    record = str(tmp_path / "held")
    call = GroupCall(_register_and_hold, 1, kwargs={"record": record}, timeout=60)
    results = run_groups([call, call])
    assert [r.ok for r in results] == [True, True], [r.describe_failures() for r in results]
    assert [r.named_memory for r in results] == [(0,), (0,)]
    spans = sorted(tuple(map(float, line.split())) for line in Path(record).read_text().splitlines())
    last_two = spans[-2:]  # the groups that count: run again, each alone
    assert last_two[0][1] <= last_two[1][0], spans  # no overlap


def _anonymous(size: int) -> int:
    segment = shared_memory.SharedMemory(create=True, size=size)  # a random name: no one else's
    segment.close()
    segment.unlink()
    return size


def test_groups_that_name_nothing_are_not_flagged() -> None:
    results = run_groups([GroupCall(_anonymous, 1, kwargs={"size": 8}, timeout=60)] * 2)
    assert [r.values for r in results] == [[8], [8]] and [r.named_memory for r in results] == [(), ()]


def _create_and_die(name: str) -> None:
    segment = shared_memory.SharedMemory(name=name, create=True, size=16)
    segment.buf[:4] = b"held"
    # a launcher that kills the job kills Python's resource tracker with it: the name is then on no one's list
    resource_tracker.unregister(segment._name, "shared_memory")  # type: ignore[attr-defined]
    os.kill(os.getpid(), signal.SIGKILL)  # no exit handler runs: the name would outlive the job


def test_a_killed_rank_leaves_no_named_segment_behind() -> None:
    name = f"ddpcheck-test-{uuid.uuid4().hex[:12]}"
    # without ddpcheck: a process killed after creating the segment leaves it in /dev/shm
    context = multiprocessing.get_context("fork")
    proc = context.Process(target=_create_and_die, args=(name + "-plain",))
    proc.start()
    proc.join(30)
    assert (SHM / f"{name}-plain").exists()
    shared_memory.SharedMemory(name=name + "-plain").unlink()
    group = run_ranks(GroupCall(_create_and_die, 2, kwargs={"name": name}, timeout=30))
    assert not group.ok and group.named_memory
    assert not (SHM / name).exists()


@pytest.mark.parametrize(
    ("factory", "world_sizes", "meshes"),
    [
        ("make_loader", (1, 2), ()),
        ("make_loader", (1,), ("dp=2,tp=2",)),
        ("make_loader_cleaning", (1, 2), ()),
    ],
    ids=["plain", "mesh", "cleaning"],
)
def test_a_loader_that_registers_like_streaming_passes_and_leaves_nothing(
    factory: str, world_sizes: tuple[int, ...], meshes: tuple[str, ...]
) -> None:
    """A correct loader: every check passes with the determinism reruns on (they used to run beside
    their runs), and when the call returns no rank and no registration is left."""
    before, ours = _registered(), children_of(os.getpid())  # e.g. this process's resource tracker
    options = CheckOptions(  # type: ignore[arg-type]
        world_sizes=world_sizes, meshes=meshes, epochs=2, timeout=120, resume=False, factory=factory
    )
    result = check_loader(str(FIXTURE), options)
    assert result.exit_code == 0, [(r.label, [f.message for f in r.failures]) for r in result.runs]
    assert all(v.status != "fail" for r in result.runs for v in r.verdicts)
    assert children_of(os.getpid()) <= ours
    assert _registered() == before
