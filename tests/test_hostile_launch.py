"""Every promise of the launch layer under hostile user code, faults and signals, real and simulated.

Real process groups, real DataLoader workers, real helper processes; nothing here is mocked. A test
whose failure on older code would be a hang runs the scenario behind a deadline of its own.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from ddpcheck.launch import GroupCall, run_ranks
from ddpcheck.launch.simulate import simulate_ranks
from ddpcheck.launch.watchdog import Limits
from tests.conftest import HOSTILE
from tests.proc_utils import (
    children_of,
    listening_addresses,
    processes_with_env,
    socket_inodes,
    wait_until_gone,
)

TAG = "DDPCHECK_HOSTILE_TAG"
TORCHRUN_KEYS = (
    "MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
    "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "OMP_NUM_THREADS",
    "TORCHELASTIC_ERROR_FILE", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
)  # fmt: skip


def _cli(
    loader: str, *args: str, tmp: Path, timeout: float = 120
) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run ``python -m ddpcheck`` on a hostile loader with a tag, a private TMPDIR and its own deadline."""
    tag = uuid.uuid4().hex
    tmpdir = tmp / "tmpdir"
    tmpdir.mkdir(exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "ddpcheck", str(HOSTILE / loader), "--report-dir", str(tmp),
         "--format", "json", *args],
        env={**os.environ, TAG: tag, "TMPDIR": str(tmpdir)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )  # fmt: skip
    return proc, tag


def _tagged(tag: str) -> set[int]:
    return processes_with_env(TAG, tag)


# 1. torchrun's environment in every rank ------------------------------------------------------------


def _environment() -> dict[str, str]:
    import torch.distributed as dist

    env = {k: os.environ.get(k, "<unset>") for k in TORCHRUN_KEYS}
    env["store_answers"] = "no"
    if dist.get_backend() != "fake":  # MASTER_PORT is the group's own store: a client can use it
        from datetime import timedelta

        store = dist.TCPStore(
            env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=10)
        )
        store.add(f"probe-{dist.get_rank()}", 1)
        env["store_answers"] = "yes"
    return env


def _expected(rank: int, world: int) -> dict[str, str]:
    return {
        "MASTER_ADDR": "127.0.0.1", "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world), "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world), "ROLE_NAME": "default", "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_USE_AGENT_STORE": "False",
    }  # fmt: skip


def test_real_ranks_carry_torchruns_environment_and_master_port_is_the_groups_store() -> None:
    result = run_ranks(GroupCall(_environment, 3, timeout=60))
    result.raise_for_failures()
    for rank, env in enumerate(result.values):
        assert {k: env[k] for k in _expected(rank, 3)} == _expected(rank, 3)
        assert env["store_answers"] == "yes"
        assert env["OMP_NUM_THREADS"] != "<unset>" and env["TORCHELASTIC_RUN_ID"] != "<unset>"
    assert len({env["TORCHELASTIC_RUN_ID"] for env in result.values}) == 1
    assert len({env["MASTER_PORT"] for env in result.values}) == 1


def test_simulated_ranks_carry_torchruns_environment_too() -> None:
    result = simulate_ranks(_environment, 5, limits=Limits(60))
    result.raise_for_failures()
    for rank, env in enumerate(result.values):
        assert {k: env[k] for k in _expected(rank, 5)} == _expected(rank, 5)
    assert "MASTER_PORT" not in os.environ or os.environ["MASTER_PORT"] != result.values[0]["MASTER_PORT"]


def _accelerate_prepares_a_loader() -> dict[str, Any]:
    import torch.distributed as dist
    from accelerate import Accelerator
    from torch.utils.data import DataLoader

    group = dist.distributed_c10d._get_default_group()
    accelerator = Accelerator(cpu=True)
    loader = accelerator.prepare(DataLoader(list(range(16)), batch_size=2))
    seen = [int(x) for batch in loader for x in batch]
    return {
        "index": accelerator.process_index,
        "processes": accelerator.num_processes,
        "type": str(accelerator.distributed_type),
        "same_group": dist.distributed_c10d._get_default_group() is group,
        "seen": seen,
    }


def test_accelerate_sets_itself_up_from_the_environment_and_reuses_ddpchecks_group() -> None:
    pytest.importorskip("accelerate", reason="accelerate is an optional integration library")
    result = run_ranks(GroupCall(_accelerate_prepares_a_loader, 2, timeout=90))
    result.raise_for_failures()
    first, second = result.values
    assert (first["index"], second["index"]) == (0, 1)
    assert first["processes"] == second["processes"] == 2
    assert "MULTI_CPU" in first["type"]
    assert first["same_group"] and second["same_group"], "accelerate initialised a second process group"
    assert sorted(first["seen"] + second["seen"]) == list(range(16)), "the loader was not sharded by rank"


# 2. --simulate is isolated from user code -----------------------------------------------------------


def test_sys_exit_in_a_simulated_factory_is_a_failure_not_a_pass(tmp_path: Path) -> None:
    proc, _ = _cli("sys_exit.py", "--simulate", "--world-sizes", "2,4", tmp=tmp_path)
    assert proc.returncode == 3, proc.stderr[-2000:]
    report = json.loads((tmp_path / "ddpcheck.json").read_text())
    failures = [f for run in report["runs"] for f in run["failures"]]
    assert failures and all("sys.exit(0)" in f["message"] for f in failures), failures


def test_os_exit_in_a_simulated_factory_is_reported_as_exited(tmp_path: Path) -> None:
    proc, _ = _cli("os_exit.py", "--simulate", "--world-sizes", "2", tmp=tmp_path)
    assert proc.returncode == 3, proc.stderr[-2000:]
    report = json.loads((tmp_path / "ddpcheck.json").read_text())
    (run,) = report["runs"]
    assert [(f["rank"], f["kind"]) for f in run["failures"]] == [(1, "exited")]


def _spin_on_rank(spin: int) -> int:
    import torch.distributed as dist

    while dist.get_rank() == spin:
        pass
    return dist.get_rank()


def test_a_simulated_rank_that_loops_forever_ends_at_its_deadline_with_a_stack() -> None:
    before = children_of(os.getpid())  # e.g. multiprocessing's resource tracker, started by an earlier test
    started = time.monotonic()
    result = simulate_ranks(_spin_on_rank, 4, kwargs={"spin": 1}, limits=Limits(2))
    assert time.monotonic() - started < 30
    assert [o.kind for o in result.outcomes] == ["ok", "hang", "secondary", "secondary"]
    assert "_spin_on_rank" in result.outcomes[1].stack
    assert "not run" in result.outcomes[2].message
    assert not children_of(os.getpid()) - before


def _spin_in_python_forever() -> None:
    while True:
        sum(range(10))


def test_stacks_are_written_between_bytecodes_where_faulthandler_could_read_a_half_made_frame() -> None:
    """A rank spinning in Python calls a function ~10 million times a second: the stack comes from the
    Python-level handler (every frame whole), in faulthandler's layout, main thread first."""
    from ddpcheck.launch.rank import format_stacks
    from ddpcheck.pytest_plugin.failure import trim_stack

    result = run_ranks(GroupCall(_spin_in_python_forever, 1, timeout=1))
    (hung,) = result.outcomes
    assert hung.kind == "hang"
    first = hung.stack.split("\n\n")[0]
    assert first.startswith("Current thread 0x") and "(most recent call first):" in first
    assert "in _spin_in_python_forever" in first and "Fatal Python error" not in hung.stack
    here = format_stacks(sys._getframe())
    assert here.splitlines()[1].endswith(f"in {sys._getframe().f_code.co_name}")
    assert sys._getframe().f_code.co_name in trim_stack(here)


@pytest.mark.slow
def test_the_command_lines_timeout_bounds_a_simulated_rank_that_spins(tmp_path: Path) -> None:
    """``--timeout`` reaches simulated ranks too (it once stayed at the 120 s default there)."""
    proc, tag = _cli(
        "endless.py", "--simulate", "--world-sizes", "1", "--timeout", "2", tmp=tmp_path, timeout=90
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
    report = json.loads((tmp_path / "ddpcheck.json").read_text())
    (failure,) = report["runs"][0]["failures"]
    assert failure["kind"] == "hang" and "make_loader" in failure["stack"]
    assert not _tagged(tag)


def test_a_reference_that_never_finishes_stops_the_run_at_once(tmp_path: Path) -> None:
    """No world size can be judged without the reference: none is started after it hangs (each would
    have cost its deadline again; the report would list it), and the report says why, with the stack."""
    proc, tag = _cli(
        "endless.py", "--simulate", "--world-sizes", "1,2,4", "--timeout", "2", tmp=tmp_path, timeout=90
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
    report = json.loads((tmp_path / "ddpcheck.json").read_text())
    assert [run["world_size"] for run in report["runs"]] == [1]  # world sizes 2 and 4 never started
    assert report["runs"][0]["failures"][0]["kind"] == "hang"
    assert any("could not be recorded" in note for note in report["notes"])
    assert not _tagged(tag)


def test_a_simulated_factory_that_changes_directory_moves_no_other_rank(tmp_path: Path) -> None:
    """Simulated ranks share one process: each starts in the directory a process of its own would."""
    relative = os.path.relpath(HOSTILE / "chdir.py")
    proc = subprocess.run(
        [sys.executable, "-m", "ddpcheck", relative, "--simulate", "--world-sizes", "1,2,3",
         "--report-dir", os.path.relpath(tmp_path / "out"), "--quiet"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "out" / "ddpcheck.json").exists()


def test_a_non_daemon_thread_left_by_a_simulated_factory_does_not_hold_ddpcheck(tmp_path: Path) -> None:
    try:
        proc, _ = _cli("nondaemon_thread.py", "--simulate", "--world-sizes", "2", tmp=tmp_path, timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail("ddpcheck never exited: it waited for the user's non-daemon thread")
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_user_prints_in_simulated_ranks_stay_off_ddpchecks_stdout(tmp_path: Path) -> None:
    proc, _ = _cli("prints.py", "--simulate", "--world-sizes", "2", tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "USER-PRINT-MARKER" not in proc.stdout
    assert "USER-STDERR-MARKER" not in proc.stderr
    json.loads(proc.stdout)  # stdout is ddpcheck's report alone


def _print_then_fail(marker: str) -> None:
    import torch.distributed as dist

    print(f"{marker} from rank {dist.get_rank()}")
    if dist.get_rank() == 2:
        raise RuntimeError("rank 2 fails after printing")


def test_a_failed_simulated_rank_keeps_its_own_output(capfd: pytest.CaptureFixture[str]) -> None:
    result = simulate_ranks(_print_then_fail, 4, kwargs={"marker": "SIM-OUT"}, limits=Limits(30))
    failed = result.outcomes[2]
    assert failed.kind == "error" and failed.message == "rank 2 fails after printing"
    assert failed.output.strip() == "SIM-OUT from rank 2"
    assert "SIM-OUT" not in capfd.readouterr().out


def test_a_simulated_factorys_children_are_gone_after_the_run(tmp_path: Path) -> None:
    proc, tag = _cli("children.py", "--simulate", "--world-sizes", "2", tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    left = wait_until_gone(lambda: _tagged(tag), timeout=5)
    assert not left, f"helpers (one in its own session) outlived ddpcheck: {sorted(left)}"
    assert not list((tmp_path / "tmpdir").iterdir()), "temp files were left behind"


def test_a_user_sigterm_handler_in_a_simulated_factory_does_not_swallow_ddpchecks(tmp_path: Path) -> None:
    tag = uuid.uuid4().hex
    marker = tmp_path / "handler-installed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddpcheck", str(HOSTILE / "sigterm_handler.py"), "--simulate",
         "--world-sizes", "2", "--report-dir", str(tmp_path), "--format", "json"],
        env={**os.environ, TAG: tag, "DDPCHECK_TEST_MARKER": str(marker)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not marker.exists():  # the factory's handler is in place
            time.sleep(0.05)
        assert marker.exists(), "the simulated factory never installed its handler"
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("SIGTERM was swallowed by the user's handler: ddpcheck kept running")
    assert proc.returncode == 130, stderr[-2000:]
    assert not wait_until_gone(lambda: _tagged(tag), timeout=10)


# 3. every wait has a deadline -----------------------------------------------------------------------

_STOP_MID_WRITE = r"""
import os, signal, struct, sys, time
sys.path.insert(0, {root!r})
from ddpcheck.launch import GroupCall, run_ranks
from ddpcheck.launch import rank as rank_side

def half_a_result(conn, status, payload):
    # a length that promises 1 MiB (read as either framing), 1000 bytes of it, then the process stops
    os.write(conn.fileno(), struct.pack("!i", 1 << 20) + b"x" * 1000)
    os.kill(os.getpid(), signal.SIGSTOP)

def target():
    rank_side.send_result = half_a_result
    return 1

started = time.monotonic()
result = run_ranks(GroupCall(target, 1, timeout=3))
print(result.outcomes[0].kind, round(time.monotonic() - started, 1), result.outcomes[0].message)
"""


def test_a_rank_stopped_while_writing_its_result_does_not_block_the_parent() -> None:
    script = _STOP_MID_WRITE.format(root=str(Path(__file__).resolve().parents[1]))
    try:
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the parent blocked reading a stopped rank's half-written result")
    assert proc.returncode == 0, proc.stderr[-2000:]
    kind, seconds, message = proc.stdout.split(" ", 2)
    assert kind == "hang" and float(seconds) < 20
    assert "stopped" in message and "bytes into its result" in message


# 4. killed is killed, whatever the rank's helpers hold ----------------------------------------------


def _kill_rank_one_after(helper: str) -> int:
    import multiprocessing

    import torch.distributed as dist

    if dist.get_rank() == 1:
        if helper == "manager":
            manager = multiprocessing.Manager()
            manager.list([1])
        else:
            if os.fork() == 0:
                time.sleep(120)
                os._exit(0)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)  # rank 0 would wait for its peer much longer than the test allows
    return 0


@pytest.mark.parametrize("helper", ["manager", "fork"])
def test_a_killed_rank_with_a_helper_holding_its_pipes_is_killed_within_seconds(helper: str) -> None:
    before = children_of(os.getpid())  # e.g. multiprocessing's resource tracker, started by an earlier test
    started = time.monotonic()
    result = run_ranks(GroupCall(_kill_rank_one_after, 2, kwargs={"helper": helper}, timeout=60, grace=0.5))
    assert result.outcomes[1].kind == "killed" and "SIGKILL" in result.outcomes[1].message
    assert time.monotonic() - started < 15, "seen as a hang: the helper kept the rank's pipes open"
    assert not children_of(os.getpid()) - before


# 5. bounded memory for a rank's output ----------------------------------------------------------------


def _gigabyte_of_output() -> None:
    chunk = b"y" * (1 << 20)
    for _ in range(1024):
        os.write(1, chunk)
    os.write(1, b"\nLAST-LINE-OF-OUTPUT\n")
    raise RuntimeError("after a gigabyte of output")


def test_a_rank_writing_a_gigabyte_to_stdout_costs_the_parent_a_bounded_tail() -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    result = run_ranks(GroupCall(_gigabyte_of_output, 1, timeout=120))
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    (outcome,) = result.outcomes
    assert outcome.kind == "error"
    assert "LAST-LINE-OF-OUTPUT" in outcome.output
    assert "earlier bytes of output cut" in outcome.output
    assert len(outcome.output) < 100_000
    assert grown_mib < 200, f"the parent's peak RSS grew by {grown_mib:.0f} MiB"


# 6. loopback, whatever the user's environment says -----------------------------------------------------


def _group_listening_sockets() -> list[tuple[str, int]]:
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(1))  # gloo connects lazily: make it listen
    parent = os.getppid()
    pids = {parent, *children_of(parent)}
    inodes = set().union(*(socket_inodes(pid) for pid in pids))
    return listening_addresses(inodes)


def _other_interface() -> str:
    names = [n for n in os.listdir("/sys/class/net") if n != "lo"]
    return names[0] if names else "lo"


def test_groups_listen_on_loopback_even_when_the_environment_names_another_interface(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    other = _other_interface()
    if other == "lo":
        pytest.skip("this machine has no interface but loopback, so the environment cannot point elsewhere")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", other)
    result = run_ranks(GroupCall(_group_listening_sockets, 2, timeout=60))
    result.raise_for_failures()
    listening = result.values[0]
    assert listening and all(addr == "127.0.0.1" for addr, _ in listening), listening


# 7. nothing left behind --------------------------------------------------------------------------------


def _multiprocessing_and_an_escaped_child(tag: str) -> int:
    import multiprocessing

    manager = multiprocessing.Manager()  # creates a pymp-* dir in the temp dir, removed only at exit
    manager.list([1])
    env = {**os.environ, TAG: tag}
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env=env, start_new_session=True)
    return 0


def test_user_temp_dirs_and_escaped_children_of_ranks_are_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    import multiprocessing.process

    # short: multiprocessing's AF_UNIX socket paths live under it (pytest's tmp_path is too long for them)
    tmp_path = Path(tempfile.mkdtemp(prefix="h4-", dir="/tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delitem(multiprocessing.process.current_process()._config, "tempdir", raising=False)
    tag = uuid.uuid4().hex
    result = run_ranks(GroupCall(_multiprocessing_and_an_escaped_child, 2, kwargs={"tag": tag}, timeout=60))
    result.raise_for_failures()
    assert not list(tmp_path.iterdir()), f"left in the temp dir: {sorted(p.name for p in tmp_path.iterdir())}"
    left = wait_until_gone(lambda: _tagged(tag), timeout=5)
    assert not left, f"a child in its own session outlived the group: {sorted(left)}"
    tmp_path.rmdir()


def _shared_memory_freed_at_exit(prefix: str) -> str:
    import atexit
    from multiprocessing import shared_memory

    import torch.distributed as dist

    name = f"{prefix}{dist.get_rank()}"
    freed = shared_memory.SharedMemory(name=f"{name}a", create=True, size=64)
    atexit.register(lambda: (freed.close(), freed.unlink()))  # as mosaicml-streaming frees its state
    shared_memory.SharedMemory(name=f"{name}b", create=True, size=64)  # left to the resource tracker
    return name


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm on this system")
def test_shared_memory_of_ranks_is_not_left_behind() -> None:
    """A rank's atexit handlers and resource tracker run before it ends: no /dev/shm segment outlives it."""
    prefix = f"ddpchk_{uuid.uuid4().hex[:8]}_"
    result = run_ranks(GroupCall(_shared_memory_freed_at_exit, 2, kwargs={"prefix": prefix}, timeout=60))
    result.raise_for_failures()
    left = sorted(p.name for p in Path("/dev/shm").iterdir() if p.name.startswith(prefix))
    for name in left:  # do not leak into the next test run either
        Path("/dev/shm", name).unlink()
    assert not left, f"shared memory left behind: {left}"


# 8. a DataLoader worker's exception is the headline ------------------------------------------------


class _Truncated:
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        if index == 5:
            raise ValueError(f"record {index} is truncated")
        return index


def _iterate_with_a_worker() -> None:
    from torch.utils.data import DataLoader

    for _ in DataLoader(_Truncated(), batch_size=2, num_workers=1):
        pass


def test_a_worker_crash_is_headed_by_the_workers_exception_and_the_users_line() -> None:
    result = run_ranks(GroupCall(_iterate_with_a_worker, 1, timeout=60))
    (outcome,) = result.outcomes
    line = inspect.getsourcelines(_Truncated.__getitem__)[1] + 2
    assert outcome.kind == "error"
    assert outcome.message.startswith("ValueError: record 5 is truncated"), outcome.message
    assert f"{__file__}:{line} in __getitem__" in outcome.message
    assert "DataLoader worker process 0" in outcome.message
    assert "Caught ValueError in DataLoader worker process 0." in outcome.error  # torch's text is kept


def test_ids_of_a_class_defined_in_the_loader_file_travel_in_plain_form(tmp_path: Path) -> None:
    """The parent never imports the loader file, so ranks send user-class ids in a canonical plain form."""
    proc, tag = _cli("user_class_ids.py", "--world-sizes", "1,2", "--quiet", tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "ddpcheck.json").read_text())
    assert report["id_source"].startswith("hook (user-class ids travel as plain data")
    assert all(not run["failures"] for run in report["runs"])
    assert not _tagged(tag)


def test_canonical_ids_keep_equality_without_the_users_module() -> None:
    import enum
    from collections import namedtuple
    from dataclasses import dataclass

    from ddpcheck.checker.identity import plain_id

    @dataclass(frozen=True)
    class Key:
        shard: str
        row: int

    class Split(enum.Enum):
        TRAIN = 1

    pair = namedtuple("pair", "a b")
    name = Key.__qualname__
    assert plain_id(Key("a", 1)) == plain_id(Key("a", 1)) == (name, "a", 1)
    assert plain_id(Key("a", 1)) != plain_id(Key("a", 2))
    assert plain_id(Split.TRAIN) == f"{Split.__qualname__}.TRAIN"
    assert plain_id(pair(1, Key("b", 2))) == (1, (name, "b", 2))
    assert plain_id(7) == 7 and plain_id("x") == "x"


def test_ids_without_a_value_based_repr_compare_by_their_attributes_and_nan_is_refused() -> None:
    """``repr`` of a plain object holds its address, which differs in every process: its attributes
    identify it instead. NaN equals nothing, not even itself: bad input."""
    from ddpcheck.checker.identity import plain_id
    from ddpcheck.checker.loaderfile import BadLoaderFile

    class Key:
        def __init__(self, k: int) -> None:
            self.k = k

    assert plain_id(Key(3)) == plain_id(Key(3)) != plain_id(Key(4))
    assert "0x" not in repr(plain_id(Key(3)))
    with pytest.raises(BadLoaderFile, match="NaN"):
        plain_id(float("nan"))


def test_an_exception_whose_str_raises_keeps_its_traceback() -> None:
    from ddpcheck.launch.rank import error_message

    class Broken(Exception):
        def __str__(self) -> str:
            raise RuntimeError("str broken")

    try:
        raise Broken()
    except Broken as exc:
        message = error_message(exc)
    assert message["exc_type"] == "Broken" and "str() raised RuntimeError" in message["message"]
    assert "raise Broken()" in message["traceback"]


def test_the_janitor_kills_its_process_groups_and_removes_the_workdir_when_we_die(tmp_path: Path) -> None:
    """Closing the pipe without "done" is what the janitor sees when this process is SIGKILLed."""
    from ddpcheck.launch.procs import Janitor

    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "left.txt").write_text("x")
    # a group leader (as a rank is) with a child in its group (as a DataLoader worker is)
    leader = subprocess.Popen(
        ["sh", "-c", "sleep 300 & echo $!; wait"], start_new_session=True, stdout=subprocess.PIPE, text=True
    )
    assert leader.stdout is not None
    member = int(leader.stdout.readline())
    janitor = Janitor(str(workdir))
    try:
        janitor.watch(leader.pid)
        os.close(janitor.fd)  # no "done": as if this process had died
        janitor.fd = -1
        assert leader.wait(timeout=10) == -signal.SIGKILL
        deadline = time.monotonic() + 10
        while (workdir.exists() or _alive(member)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(member), "the janitor left a member of the group alive"
        assert not workdir.exists()
    finally:
        leader.kill()
        leader.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)
        os.waitpid(janitor.pid, 0)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
