"""Launch detection, SLURM node lists, and connect/disconnect with real gloo groups."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpcheck.launch import GroupCall, run_ranks
from ddpcheck.reference.dist import (
    LaunchEnv,
    connect,
    detect_launch,
    disconnect,
    first_slurm_host,
    get_rank_safe,
    get_world_size_safe,
    is_ddp,
    is_main_process,
    parse_slurm_nodelist,
)

TORCHRUN = {
    "RANK": "3",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "node-a",
    "MASTER_PORT": "29500",
    "TORCHELASTIC_RUN_ID": "job-7",
}
SLURM = {
    "SLURM_PROCID": "5",
    "SLURM_NTASKS": "8",
    "SLURM_LOCALID": "1",
    "SLURM_JOB_NODELIST": "gpu[01-04,07],cpu3",
    "SLURM_JOB_ID": "123456",
}

# --------------------------------------------------------------------------- detect_launch


def test_torchrun_environment_is_parsed() -> None:
    assert detect_launch(TORCHRUN) == LaunchEnv("torchrun", 3, 8, 1, "node-a", 29500, "job-7")
    plain = {k: v for k, v in TORCHRUN.items() if k != "TORCHELASTIC_RUN_ID"}
    assert detect_launch(plain) == LaunchEnv("torchrun", 3, 8, 1, "node-a", 29500, None)


def test_no_launcher_means_none() -> None:
    assert detect_launch({}) is None
    assert detect_launch({"SLURM_NTASKS": "4", "SLURM_JOB_ID": "9"}) is None  # a bare salloc shell
    assert detect_launch({"MASTER_ADDR": "x", "MASTER_PORT": "1"}) is None


def test_torchrun_wins_over_slurm() -> None:
    launch = detect_launch({**SLURM, **TORCHRUN})
    assert launch is not None and launch.source == "torchrun" and launch.rank == 3


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR, MASTER_PORT, LOCAL_RANK not set"),
        ({"WORLD_SIZE": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "RANK not set"),
        ({**TORCHRUN, "RANK": "8"}, "RANK=8 must be smaller than WORLD_SIZE=8"),
        ({**TORCHRUN, "WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not an integer"),
        ({**TORCHRUN, "RANK": "-1"}, "RANK=-1 must be >= 0"),
        ({**TORCHRUN, "WORLD_SIZE": "0"}, "WORLD_SIZE=0 must be >= 1"),
        ({**TORCHRUN, "MASTER_PORT": "70000"}, "MASTER_PORT=70000 is not a TCP port"),
        ({**TORCHRUN, "LOCAL_RANK": "2"}, "LOCAL_RANK=2 must be smaller than LOCAL_WORLD_SIZE=2"),
        ({**TORCHRUN, "RANK": "0"}, "LOCAL_RANK=1 cannot exceed RANK=0"),
        ({"SLURM_PROCID": "0"}, "SLURM_PROCID is set but SLURM_NTASKS is not"),
        ({**SLURM, "SLURM_PROCID": "8"}, "SLURM_PROCID=8 must be smaller than SLURM_NTASKS=8"),
        ({k: v for k, v in SLURM.items() if k != "SLURM_LOCALID"}, "SLURM_LOCALID not set"),
        (
            {k: v for k, v in SLURM.items() if k != "SLURM_JOB_NODELIST"},
            "set MASTER_ADDR or SLURM_JOB_NODELIST",
        ),
        ({k: v for k, v in SLURM.items() if k != "SLURM_JOB_ID"}, "set MASTER_PORT"),
        ({**SLURM, "SLURM_JOB_NODELIST": "gpu[01-"}, "unclosed '['"),
    ],
)
def test_incomplete_or_contradictory_environment_is_a_clear_error(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[")) as info:
        detect_launch(env)
    assert "\n" not in str(info.value)


def test_slurm_environment_is_parsed() -> None:
    assert detect_launch(SLURM) == LaunchEnv("slurm", 5, 8, 1, "gpu01", 15000 + 123456 % 20000, "123456")
    older = {"SLURM_PROCID": "0", "SLURM_NPROCS": "2", "SLURM_LOCALID": "0", "SLURM_NODELIST": "n[8-9]"}
    launch = detect_launch({**older, "SLURM_JOBID": "7"})
    assert launch is not None and (launch.world_size, launch.master_addr, launch.master_port) == (
        2,
        "n8",
        15007,
    )
    explicit = detect_launch({**SLURM, "MASTER_ADDR": "head", "MASTER_PORT": "4000"})
    assert explicit is not None and (explicit.master_addr, explicit.master_port) == ("head", 4000)
    single = detect_launch({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_ID": "3"})
    assert single == LaunchEnv("slurm", 0, 1, 0, "127.0.0.1", 15003, "3")


def test_rendezvous_variables_are_optional_when_asked() -> None:
    launch = detect_launch({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, require_rendezvous=False)
    assert launch == LaunchEnv("torchrun", 1, 2, 1, None, None, None)
    slurm = {k: v for k, v in SLURM.items() if k not in ("SLURM_JOB_NODELIST", "SLURM_JOB_ID")}
    assert detect_launch(slurm, require_rendezvous=False) == LaunchEnv("slurm", 5, 8, 1, None, None, None)


# --------------------------------------------------------------------------- SLURM node lists


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("node1", ["node1"]),
        ("gpu[01-04,07],cpu3", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu3"]),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),
        ("n[08-11]", ["n08", "n09", "n10", "n11"]),
        ("rack[1-2]-n[1,3]", ["rack1-n1", "rack1-n3", "rack2-n1", "rack2-n3"]),
        ("a[1],b[2-3]x", ["a1", "b2x", "b3x"]),
        (" host-a , host-b ", ["host-a", "host-b"]),
    ],
)
def test_slurm_node_lists_expand(text: str, hosts: list[str]) -> None:
    assert parse_slurm_nodelist(text) == hosts
    assert first_slurm_host(text) == hosts[0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty SLURM node list"),
        ("gpu[01-", "unclosed '['"),
        ("gpu]1", "']' without '['"),
        ("g[[1]]", "nested '['"),
        ("gpu[4-2]", "runs backwards"),
        ("gpu[a-b]", "bad range"),
        ("a,,b", "empty entry"),
    ],
)
def test_bad_slurm_node_lists_are_rejected(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        parse_slurm_nodelist(text)


def test_first_host_does_not_expand_the_whole_list() -> None:
    start = time.perf_counter()
    assert first_slurm_host("n[0000000-9999999]") == "n0000000"
    assert time.perf_counter() - start < 5.0  # expanding ten million names would take far longer


@st.composite
def _node_groups(draw: Any) -> tuple[str, list[str]]:
    """A compressed node list and the host names it stands for."""
    parts: list[str] = []
    hosts: list[str] = []
    for _ in range(draw(st.integers(1, 4))):
        prefix = draw(st.sampled_from(["gpu", "n", "node-", "x1y"]))
        width = draw(st.integers(1, 3))
        ranges = []
        for _ in range(draw(st.integers(1, 3))):
            lo = draw(st.integers(0, 10**width - 1))
            hi = draw(st.integers(lo, min(lo + 5, 10**width - 1)))
            ranges.append((lo, hi))
            hosts.extend(f"{prefix}{str(n).zfill(width)}" for n in range(lo, hi + 1))
        body = ",".join(
            str(lo).zfill(width) if lo == hi else f"{str(lo).zfill(width)}-{str(hi).zfill(width)}"
            for lo, hi in ranges
        )
        parts.append(f"{prefix}[{body}]")
    return ",".join(parts), hosts


@settings(max_examples=80)
@given(_node_groups())
def test_compressed_node_lists_round_trip(case: tuple[str, list[str]]) -> None:
    text, hosts = case
    assert parse_slurm_nodelist(text) == hosts


# --------------------------------------------------------------------------- connect / disconnect


def _connect_from_env_body(rdv: str) -> dict[str, Any]:
    import torch.distributed as dist

    before = (is_ddp(), get_rank_safe(), get_world_size_safe(), is_main_process())
    info = connect(init_method=f"file://{rdv}", backend="gloo", timeout=timedelta(seconds=30))
    total = torch.tensor([info.rank + 1])
    dist.all_reduce(total)
    during = (is_ddp(), get_rank_safe(), get_world_size_safe(), is_main_process())
    disconnect()
    disconnect()  # a second call is harmless
    return {
        "info": (info.rank, info.world_size, info.local_rank, info.backend, info.source),
        "before": before,
        "during": during,
        "after": (is_ddp(), get_world_size_safe()),
        "sum": int(total.item()),
    }


@pytest.mark.parametrize("world", [2, 3])
def test_connect_reads_a_torchrun_environment(world: int, tmp_path: Any) -> None:
    # run_ranks without its own group leaves RANK/WORLD_SIZE/LOCAL_RANK set, as torchrun does.
    result = run_ranks(
        GroupCall(
            _connect_from_env_body, world_size=world, init_group=False, kwargs={"rdv": str(tmp_path / "rdv")}
        )
    )
    result.raise_for_failures()
    for rank, got in enumerate(result.values):
        assert got["info"] == (rank, world, rank, "gloo", "torchrun")
        assert got["before"] == (False, 0, 1, True)
        assert got["during"] == (True, rank, world, rank == 0)
        assert got["after"] == (False, 1)
        assert got["sum"] == world * (world + 1) // 2


def _connect_store_body(path: str, world: int) -> tuple[Any, ...]:
    import os

    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    info = connect(store=dist.FileStore(path, world), rank=rank, world_size=world, backend="gloo")
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    disconnect()
    return info.source, info.master_addr, info.master_port, info.rank, t.item()


def test_connect_with_an_explicit_store(tmp_path: Any) -> None:
    result = run_ranks(
        GroupCall(
            _connect_store_body,
            world_size=2,
            init_group=False,
            kwargs={"path": str(tmp_path / "fs"), "world": 2},
        )
    )
    result.raise_for_failures()
    assert result.values == [("store", None, None, 0, 1.0), ("store", None, None, 1, 1.0)]


def _connect_alone_body() -> tuple[Any, ...]:
    info = connect(rank=0, world_size=1, backend="gloo")
    try:
        return info.source, info.world_size, is_ddp(), get_world_size_safe()
    finally:
        disconnect()


def test_a_world_of_one_needs_no_rendezvous() -> None:
    result = run_ranks(GroupCall(_connect_alone_body, world_size=1, init_group=False))
    result.raise_for_failures()
    assert result.values == [("explicit", 1, True, 1)]


def _connect_twice_body() -> str:
    try:
        connect(backend="gloo")
    except RuntimeError as e:
        return str(e)
    return "no error"


def test_connect_refuses_a_second_group() -> None:
    result = run_ranks(GroupCall(_connect_twice_body, world_size=2))
    result.raise_for_failures()
    assert result.values == ["a default process group already exists; call disconnect() first"] * 2


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"rank": 0}, ValueError, "pass rank= and world_size= together"),
        ({"rank": 2, "world_size": 2}, ValueError, "need 0 <= rank < world_size"),
        ({"rank": 0, "world_size": 2}, ValueError, "needs master_addr= and master_port="),
        ({"timeout": 5}, TypeError, "timeout must be a datetime.timedelta"),
        ({"store": object(), "init_method": "env://"}, ValueError, "either store= or init_method="),
        ({}, ValueError, "no launch found in the environment"),
    ],
)
def test_connect_argument_errors(
    kwargs: dict[str, Any], error: type[Exception], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(error, match=message):
        connect(**kwargs)
    assert not is_ddp()
