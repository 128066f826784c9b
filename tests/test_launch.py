"""The launch layer on real gloo groups: results, crashes, hangs, kills, loopback-only, no leftovers."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from ddpcheck.launch import GroupCall, TargetRef, report_progress, run_ranks
from tests.proc_utils import children_of, listening_addresses, socket_inodes


def _sum_of_ranks(offset: int) -> list[int]:
    import torch
    import torch.distributed as dist

    value = torch.tensor([dist.get_rank() + offset])
    dist.all_reduce(value)
    return [dist.get_rank(), dist.get_world_size(), int(value.item())]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_every_rank_runs_in_one_group_and_returns_plain_values(world_size: int) -> None:
    result = run_ranks(GroupCall(_sum_of_ranks, world_size, kwargs={"offset": 1}, timeout=60))
    result.raise_for_failures()
    total = sum(r + 1 for r in range(world_size))
    assert result.values == [[r, world_size, total] for r in range(world_size)]
    assert not children_of(os.getpid())


def _raise_on_rank_one() -> int:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("boom on rank 1")
    dist.barrier()
    return 0


def test_a_crashing_rank_is_primary_and_its_peers_secondary() -> None:
    result = run_ranks(GroupCall(_raise_on_rank_one, 3, timeout=60))
    kinds = {o.rank: o.kind for o in result.outcomes}
    assert kinds == {0: "secondary", 1: "error", 2: "secondary"}
    crashed = result.outcomes[1]
    assert crashed.message == "boom on rank 1"
    assert "ValueError: boom on rank 1" in crashed.error
    assert "_raise_on_rank_one" in crashed.error
    assert result.seconds < 30, "peers must be stopped long before the 60 s deadline"
    with pytest.raises(AssertionError, match="rank 1: error: boom on rank 1"):
        result.raise_for_failures()
    assert not children_of(os.getpid())


def _rank_zero_waits_alone() -> int:
    import torch
    import torch.distributed as dist

    report_progress(f"epoch 0, batch {dist.get_rank() + 4}")
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))
    return 1


def test_a_hang_ends_at_the_deadline_with_stacks_and_who_waits_for_whom() -> None:
    result = run_ranks(GroupCall(_rank_zero_waits_alone, 2, timeout=3))
    hung, waiting = result.outcomes
    assert hung.kind == "hang"
    assert hung.progress == "epoch 0, batch 4"
    assert "in all_reduce" in hung.stack and "_rank_zero_waits_alone" in hung.stack
    assert waiting.kind == "ok" and "final barrier" in waiting.progress
    assert "ranks 1 finished and wait for ranks 0" in result.diagnosis
    assert not children_of(os.getpid())


def _rank_one_is_killed() -> int:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()
    return 0


def test_a_killed_rank_is_reported_as_killed_not_as_a_hang() -> None:
    result = run_ranks(GroupCall(_rank_one_is_killed, 2, timeout=60))
    assert result.outcomes[1].kind == "killed"
    assert "SIGKILL" in result.outcomes[1].message
    assert result.outcomes[0].kind == "secondary"
    assert result.seconds < 30


def _exit_without_result() -> None:
    import torch.distributed as dist

    if dist.get_rank() == 0:
        os._exit(3)


def test_a_rank_that_exits_early_is_reported_with_its_exit_code() -> None:
    result = run_ranks(GroupCall(_exit_without_result, 2, timeout=60))
    assert result.outcomes[0].kind == "exited"
    assert "exited with code 3" in result.outcomes[0].message
    # its peer finished (ok) or was still joining (secondary); either way it is stopped after the
    # grace period, not at the deadline
    assert result.outcomes[1].kind in ("ok", "secondary")
    assert result.seconds < 30


def _print_and_fail() -> None:
    print("hello from the rank")
    raise RuntimeError("after printing")


def test_rank_output_is_captured_per_rank() -> None:
    result = run_ranks(GroupCall(_print_and_fail, 1, timeout=60))
    assert "hello from the rank" in result.outcomes[0].output
    assert "hello from the rank" in result.describe_failures()


def _group_listening_sockets() -> list[tuple[str, int]]:
    parent = os.getppid()
    pids = {parent, *children_of(parent)}
    inodes = set().union(*(socket_inodes(pid) for pid in pids))
    return listening_addresses(inodes)


def test_store_and_gloo_listen_on_loopback_only() -> None:
    result = run_ranks(GroupCall(_group_listening_sockets, 2, timeout=60))
    result.raise_for_failures()
    listening = result.values[0]
    assert listening, "expected the store and gloo to be listening during the run"
    assert all(addr == "127.0.0.1" for addr, _ in listening), listening


def test_targets_are_found_by_name_under_spawn() -> None:
    result = run_ranks(
        GroupCall(TargetRef.of(_sum_of_ranks), 2, kwargs={"offset": 0}, start_method="spawn", timeout=120)
    )
    result.raise_for_failures()
    assert [v[2] for v in result.values] == [1, 1]


def test_local_functions_are_refused_with_a_clear_error() -> None:
    def local() -> None:
        return None

    with pytest.raises(TypeError, match="module-level function"):
        TargetRef.of(local)


def test_world_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive integer"):
        run_ranks(GroupCall(_sum_of_ranks, 0))


def _large_op_and_tensor() -> tuple[float, object]:
    import torch

    return float((torch.arange(2_000_000, dtype=torch.float64) + 1).sum().item()), torch.ones(3)


def test_forked_ranks_survive_a_parent_that_used_the_openmp_pool() -> None:
    import torch

    (torch.arange(2_000_000, dtype=torch.float64) + 1).sum()  # starts the parent's intra-op pool
    result = run_ranks(GroupCall(_large_op_and_tensor, 2, timeout=30))
    result.raise_for_failures()
    assert [v[0] for v in result.values] == [2_000_001_000_000.0] * 2


def test_returned_tensors_travel_by_value_not_as_shared_memory_handles() -> None:
    result = run_ranks(GroupCall(_large_op_and_tensor, 2, timeout=30))
    result.raise_for_failures()
    tensor = result.values[1][1]
    assert tensor.tolist() == [1.0, 1.0, 1.0]
    assert not tensor.is_shared()


def _both_fail_one_mentions_a_timeout() -> None:
    import torch.distributed as dist

    if dist.get_rank() == 0:
        raise ValueError("boom")
    raise TimeoutError("my own timeout talking to a peer service")


def test_a_ranks_own_error_that_mentions_timeout_is_not_secondary() -> None:
    result = run_ranks(GroupCall(_both_fail_one_mentions_a_timeout, 2, timeout=60))
    assert [o.kind for o in result.outcomes] == ["error", "error"]


def test_max_time_counts_from_when_every_rank_has_joined() -> None:
    from ddpcheck.launch.watchdog import JOIN_ALLOWANCE_S, Deadline

    assert Deadline(started=100.0, timeout=3.0).cap == float("inf")  # no --max-time: no cap at all
    deadline = Deadline(started=100.0, timeout=3.0, max_time=5.0)
    assert deadline.cap == 100.0 + JOIN_ALLOWANCE_S + 5.0  # still joining: a slow rendezvous is not counted
    deadline.joined_at = 107.5
    assert deadline.cap == 112.5  # the group gets its whole max_time after the last rank joined


def _meet(marker_dir: str, mine: str, theirs: str) -> str:
    """Leave a marker, then wait (bounded) for the other group's: only groups running side by side meet."""
    import time

    import torch.distributed as dist

    open(os.path.join(marker_dir, f"{mine}-{dist.get_rank()}"), "w").close()
    deadline = time.monotonic() + 20
    while not any(name.startswith(theirs) for name in os.listdir(marker_dir)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"group {theirs} never ran while group {mine} did")
        time.sleep(0.01)
    dist.barrier()  # each group is a real group of its own
    return f"{mine}{dist.get_rank()}/{dist.get_world_size()}"


def test_groups_run_side_by_side_each_with_its_own_store(tmp_path: Path) -> None:
    from ddpcheck.launch import GroupCall, run_groups

    before = children_of(os.getpid())  # e.g. multiprocessing's resource tracker, from a spawn test

    calls = [
        GroupCall(_meet, 2, timeout=60, kwargs={"marker_dir": str(tmp_path), "mine": "a", "theirs": "b"}),
        GroupCall(_meet, 3, timeout=60, kwargs={"marker_dir": str(tmp_path), "mine": "b", "theirs": "a"}),
    ]
    first, second = run_groups(calls)
    first.raise_for_failures()
    second.raise_for_failures()
    assert first.values == ["a0/2", "a1/2"]
    assert second.values == ["b0/3", "b1/3", "b2/3"]
    assert children_of(os.getpid()) <= before


def test_a_failing_group_leaves_the_group_beside_it_alone() -> None:
    from ddpcheck.launch import GroupCall, run_groups

    before = children_of(os.getpid())

    failing, fine = run_groups(
        [
            GroupCall(_raise_on_rank_one, 3, timeout=60),
            GroupCall(_sum_of_ranks, 2, timeout=60, kwargs={"offset": 0}),
        ]
    )
    assert {o.rank: o.kind for o in failing.outcomes} == {0: "secondary", 1: "error", 2: "secondary"}
    fine.raise_for_failures()
    assert fine.values == [[0, 2, 1], [1, 2, 1]]
    assert children_of(os.getpid()) <= before


def _touch(marker: str) -> int:
    import torch.distributed as dist

    open(f"{marker}-{dist.get_rank()}", "w").close()
    return dist.get_rank()


def test_a_held_group_runs_nothing_until_opened(tmp_path: Path) -> None:
    import time

    from ddpcheck.launch import GroupCall, started_groups

    before = children_of(os.getpid())
    marker = str(tmp_path / "ran")
    with started_groups([GroupCall(_touch, 2, timeout=60, kwargs={"marker": marker})], hold=True) as started:
        time.sleep(1.0)  # time enough to run, were it let go
        assert not list(tmp_path.iterdir()), "a held group's ranks ran before it was opened"
        assert len(children_of(os.getpid()) - before) >= 2, "its ranks are forked already"
        (result,) = started.collect(0)
    result.raise_for_failures()
    assert result.values == [0, 1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ran-0", "ran-1"]
    assert children_of(os.getpid()) <= before


def test_leaving_the_block_stops_a_group_never_opened(tmp_path: Path) -> None:
    from ddpcheck.launch import GroupCall, started_groups

    before = children_of(os.getpid())
    marker = str(tmp_path / "ran")
    with started_groups([GroupCall(_touch, 3, timeout=60, kwargs={"marker": marker})], hold=True):
        pass
    assert children_of(os.getpid()) <= before
    assert not list(tmp_path.iterdir())
