"""What makes large runs cheap, guarded by behaviour (never by timing).

Ids stay ``array('q')`` from the rank's sampler to the checks; the checks count with numpy instead
of Python sets, and give exactly the verdicts the set arithmetic gives; the endless-loader guard
counts distinct ids incrementally; ranks inherit a heap that garbage collection leaves alone.
"""

from __future__ import annotations

import gc
import itertools
import os
import pickle
import subprocess
import sys
import time
from array import array
from collections.abc import Hashable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, RandomSampler, TensorDataset

from ddpcheck.checker.batches import SamplerBatches
from ddpcheck.checker.running import record_indices
from ddpcheck.checks import run_checks
from ddpcheck.checks.arrays import epoch_counts, same_id_set
from ddpcheck.checks.context import Context
from ddpcheck.hygiene import gc_paused
from ddpcheck.options import CheckOptions
from ddpcheck.session import check_loader
from ddpcheck.trace import EpochTrace, IdBuffer, RankTrace, RunTrace, compact_ids
from tests.trace_builders import reference, run

ids_lists = st.lists(st.integers(-5, 40), max_size=30)
sparse_ids = st.lists(st.one_of(st.integers(-5, 40), st.integers(-(2**62), 2**62)), max_size=30)


@settings(max_examples=300, deadline=None)
@given(ref=st.one_of(ids_lists, sparse_ids), ranks=st.lists(st.one_of(ids_lists, sparse_ids), max_size=5))
def test_array_counts_equal_set_arithmetic(ref: list[int], ranks: list[list[int]]) -> None:
    counts = epoch_counts(np.array(ref, np.int64), [np.array(r, np.int64) for r in ranks])
    union = set().union(*map(set, ranks))
    assert counts.ref_distinct == len(set(ref))
    assert counts.ddp_distinct == len(union)
    assert counts.extras == len(union - set(ref))
    assert counts.within == tuple(len(r) - len(set(r)) for r in ranks)
    assert counts.ref_ids().tolist() == sorted(set(ref))


@settings(max_examples=200, deadline=None)
@given(a=st.one_of(ids_lists, sparse_ids), b=st.one_of(ids_lists, sparse_ids))
def test_same_id_set_is_set_equality(a: list[int], b: list[int]) -> None:
    assert same_id_set(np.array(a, np.int64), np.array(b, np.int64)) == (set(a) == set(b))
    assert same_id_set(np.array(a, np.int64), np.array(list(reversed(a)) + a[:2], np.int64))


def _as_tuples(trace: RunTrace) -> RunTrace:
    """The same run with ids in tuples: the checks then take their set-based path."""

    def epoch(e: EpochTrace) -> EpochTrace:
        return replace(e, ids=tuple(e.ids))

    ranks = tuple(replace(r, epochs=tuple(epoch(e) for e in r.epochs)) for r in trace.ranks)
    return replace(trace, ranks=ranks)


def _split(order: list[int], world: int, pad: bool) -> list[list[int]]:
    if pad:
        total = -(-len(order) // world) * world
        order = order + (order * world)[: total - len(order)]
    else:
        order = order[: len(order) // world * world]
    return [order[r::world] for r in range(world)]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[RunTrace, RunTrace, RunTrace]:
    n = draw(st.integers(1, 40))
    world = draw(st.integers(1, 5))
    epochs = draw(st.integers(1, 3))
    pad = draw(st.booleans())
    offset = draw(st.sampled_from([0, 7, -3, 2**40]))
    seeds = [draw(st.integers(0, 3)) for _ in range(epochs)]
    resample = draw(st.booleans())
    orders = []
    for s in seeds:
        rng = np.random.default_rng(s)
        order = rng.integers(0, n, n).tolist() if resample else rng.permutation(n).tolist()
        orders.append([x + offset for x in order])
    ref = reference(orders, dataset_len=n, padding=pad)
    per_rank: list[list[list[int]]] = [[] for _ in range(world)]
    for order in orders:
        for r, ids in enumerate(_split(order, world, pad)):
            per_rank[r].append(ids)
    bug = draw(st.sampled_from(["none", "overlap", "drop", "foreign", "repeat", "frozen"]))
    for r in range(world):
        for e in range(epochs):
            ids = per_rank[r][e]
            if bug == "overlap" and r and per_rank[0][e]:
                ids[: len(ids) // 2] = per_rank[0][e][: len(ids) // 2]
            elif bug == "drop" and ids and r == world - 1:
                del ids[-draw(st.integers(1, len(ids))) :]
            elif bug == "foreign" and r == 0:
                ids.append(10**6 + draw(st.integers(0, 3)))
            elif bug == "repeat" and ids and r == 0:
                ids.append(ids[0])
            elif bug == "frozen" and e:
                per_rank[r][e] = list(reversed(per_rank[r][0]))
    trace = run(per_rank, padding=pad)
    rerun = run([[list(reversed(ids)) for ids in epochs_] for epochs_ in per_rank], padding=pad)
    return ref, trace, draw(st.sampled_from([trace, rerun]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=scenarios())
def test_array_verdicts_equal_set_verdicts(case: tuple[RunTrace, RunTrace, RunTrace]) -> None:
    ref, trace, rerun = case
    assert isinstance(trace.ranks[0].epochs[0].ids, array)
    fast = run_checks(ref, trace, rerun)
    slow = run_checks(_as_tuples(ref), _as_tuples(trace), _as_tuples(rerun))
    assert fast == slow


def test_passing_path_builds_no_python_sets() -> None:
    order = list(range(1000))
    ref = reference([order, order[::-1]], dataset_len=1000, padding=True)
    trace = run([[order[0::2], order[::-1][0::2]], [order[1::2], order[::-1][1::2]]], padding=True)
    ctx = Context(ref, trace, trace)
    verdicts = run_checks(ref, trace, trace)
    assert not [v for v in verdicts if v.failed]
    run_checks(ref, trace, trace)
    for view in ctx.views():
        view.missing_count, view.excess, view.cross_excess  # noqa: B018
        assert "ref_set" not in view.__dict__ and "_union" not in view.__dict__
        assert "extras" not in view.__dict__


@settings(max_examples=200, deadline=None)
@given(batches=st.lists(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=6), max_size=12))
def test_id_buffer_counts_and_stores_like_a_list(batches: list[list[int]]) -> None:
    buffer, plain = IdBuffer(), IdBuffer()
    seen: list[Hashable] = []
    for batch in batches:
        buffer.extend(array("q", batch))
        plain.extend(batch)
        seen.extend(batch)
        assert len(buffer) == len(seen) and buffer.distinct() == len(set(seen))
        assert plain.distinct() == len(set(seen))
    assert buffer.ids() == compact_ids(seen) and plain.ids() == compact_ids(seen)
    assert type(buffer.ids()) is array


def test_id_buffer_falls_back_to_the_list_path() -> None:
    buffer = IdBuffer()
    buffer.extend(array("q", [1, 2]))
    buffer.extend(["a", 2])
    assert buffer.ids() == (1, 2, "a", 2) and buffer.distinct() == 3


def _loader(n: int, world: int, rank: int, **kwargs: object) -> DataLoader:
    data = TensorDataset(torch.arange(n))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=3)
    return DataLoader(data, batch_size=7, sampler=sampler, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("make", ["distributed", "random", "custom"])
def test_sampler_batches_are_compact_and_equal_the_itemwise_path(make: str) -> None:
    data = TensorDataset(torch.arange(50))

    class Mine(BatchSampler):
        pass

    if make == "distributed":
        loader = _loader(50, 3, 1)
    elif make == "random":
        loader = DataLoader(
            data, batch_size=4, sampler=RandomSampler(data, generator=torch.Generator().manual_seed(1))
        )
    else:
        loader = DataLoader(data, batch_sampler=Mine(RandomSampler(data), 5, False))
    loader.sampler.set_epoch(1) if hasattr(loader.sampler, "set_epoch") else None
    got = [b for b, _ in SamplerBatches(loader)]
    if make != "custom":
        assert all(type(b) is array for b in got)
    trace = record_indices(loader, 0)
    assert type(trace.ids) is array and trace.ids.typecode == "q"
    assert list(trace.batch_sizes) == [len(b) for b in got]


def test_traces_stay_arrays_through_the_pipe() -> None:
    trace = record_indices(_loader(1000, 2, 0), 0)
    rank = RankTrace(0, (trace,))
    back = pickle.loads(pickle.dumps(rank, protocol=pickle.HIGHEST_PROTOCOL))
    assert type(back.epochs[0].ids) is array and back.epochs[0].ids == trace.ids


def _whoami(hang_at: int = -1) -> tuple[int, int]:
    import os
    import time

    import torch.distributed as dist

    rank = dist.get_rank()
    if rank == hang_at:
        time.sleep(600)
    return rank, os.getpid()


def test_simulated_ranks_share_out_over_cores_in_rank_order() -> None:
    """The first rank runs alone (it is measured); from SPLIT_MIN_RANKS on the rest go to one child per
    core (at most MAX_PARTS; these ranks need no memory worth counting); below it one child runs all."""
    from ddpcheck.launch.simulate import MAX_PARTS, SPLIT_MIN_RANKS, simulate_ranks

    cores = len(os.sched_getaffinity(0))
    world = SPLIT_MIN_RANKS + 6
    result = simulate_ranks(_whoami, world, capture=False)
    assert [o.value[0] for o in result.outcomes] == list(range(world))
    assert len({o.value[1] for o in result.outcomes}) == min(cores, MAX_PARTS)
    small = simulate_ranks(_whoami, SPLIT_MIN_RANKS - 1, capture=False)
    assert [o.value[0] for o in small.outcomes] == list(range(SPLIT_MIN_RANKS - 1))
    assert len({o.value[1] for o in small.outcomes}) == 1


def test_simulating_a_sample_of_ranks_runs_exactly_those_ranks() -> None:
    from ddpcheck.launch.simulate import simulate_ranks

    sample = [0, 1, 500, 1022, 1023]
    result = simulate_ranks(_whoami, 1024, ranks=sample, capture=False)
    assert [o.rank for o in result.outcomes] == sample
    assert [o.value[0] for o in result.outcomes] == sample  # each ran as that rank of a 1024 world
    assert result.world_size == 1024


def test_a_hung_simulated_rank_is_named_and_no_rank_is_handed_out_after_it() -> None:
    """Rank 3 sleeps: it alone is hung (the watchdog: no progress for the timeout), the ranks before it
    ran, and what was not handed out yet is reported as not run; ranks other children already held
    finish."""
    from ddpcheck.launch.simulate import simulate_ranks
    from ddpcheck.launch.watchdog import Limits

    world = 64
    started = time.monotonic()
    result = simulate_ranks(_whoami, world, kwargs={"hang_at": 3}, limits=Limits(1.0), capture=False)
    assert time.monotonic() - started < 1.0 + 30.0  # the timeout, plus a generous slack for a loaded machine
    kinds = [o.kind for o in result.outcomes]
    assert kinds[:3] == ["ok"] * 3 and kinds[3] == "hang"
    assert set(kinds[4:]) <= {"ok", "secondary"} and "secondary" in kinds
    hung = result.outcomes[3]
    assert hung.message.startswith("no progress for ") and "(--timeout 1)" in hung.message
    assert "_whoami" in hung.stack
    assert all(
        "simulated rank 3 did not finish" in o.message for o in result.outcomes if o.kind == "secondary"
    )


def test_a_huge_simulated_world_reruns_a_sample_first_last_and_spread() -> None:
    from ddpcheck.session.record import RERUN_SAMPLE_FROM, rerun_sample

    assert rerun_sample(RERUN_SAMPLE_FROM - 1) == ()
    sample = rerun_sample(1024)
    assert set(range(8)) <= set(sample) and set(range(1016, 1024)) <= set(sample)
    assert len(sample) == 32 and list(sample) == sorted(set(sample))
    middle = [r for r in sample if 8 <= r < 1016]
    assert max(b - a for a, b in itertools.pairwise([7, *middle, 1016])) < 1024 // 8  # no big unchecked gap


_RANDOM_SEED_LOADER = """
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def make_loader(rank, world_size):
    dataset = TensorDataset(torch.arange(1024))
    seed = {seed}
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=seed)
    return DataLoader(dataset, batch_size=2, sampler=sampler)
"""


@pytest.mark.parametrize("seeded", [True, False])
def test_a_sampled_simulated_rerun_judges_determinism_and_says_it_sampled(
    tmp_path: Path, seeded: bool
) -> None:
    from ddpcheck.options import CheckOptions
    from ddpcheck.session import check_loader
    from ddpcheck.session.record import rerun_sample

    loader = tmp_path / "loader.py"
    # unseeded: every rank of every run draws its own seed (a fresh process's random state)
    seed = "7" if seeded else "int(torch.randint(0, 2**31, (1,)))"
    loader.write_text(_RANDOM_SEED_LOADER.format(seed=seed))
    sampled = len(rerun_sample(128))
    options = CheckOptions(world_sizes=(128,), simulate=True, resume=False, train_steps=0, metrics=False)
    result = check_loader(str(loader), options)
    verdict = {v.check: v for v in result.runs[0].verdicts}["determinism"]
    if seeded:
        assert verdict.status == "pass"
        assert verdict.detail.startswith(f"a sample of {sampled} of 128 simulated ranks")
    else:
        assert verdict.status == "fail"
        assert f"of {sampled} sampled ranks differ" in verdict.detail


_FREEZE_PROBE = """
import gc
import os

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def make_loader(rank, world_size):
    with open(os.path.join(os.environ["FREEZE_PROBE_DIR"], f"rank{rank}-of-{world_size}"), "w") as f:
        f.write(str(gc.get_freeze_count()))
    dataset = TensorDataset(torch.arange(16))
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=False)
    return DataLoader(dataset, batch_size=4, sampler=sampler)
"""


def test_ranks_inherit_a_frozen_heap_and_an_in_process_caller_gets_its_own_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A collection in a rank must not walk (and so copy) the heap it inherited; the caller's own
    garbage collection is left as it was."""
    loader = tmp_path / "probe.py"
    loader.write_text(_FREEZE_PROBE)
    monkeypatch.setenv("FREEZE_PROBE_DIR", str(tmp_path))
    assert gc.get_freeze_count() == 0
    result = check_loader(str(loader), CheckOptions(world_sizes=(1, 2), epochs=1))
    assert result.ok, result
    seen = {p.name: int(p.read_text()) for p in tmp_path.glob("rank*")}
    assert set(seen) == {"rank0-of-1", "rank0-of-2", "rank1-of-2"}
    assert all(count > 1000 for count in seen.values()), seen  # torch's objects, at least
    assert gc.get_freeze_count() == 0 and gc.isenabled()


def test_the_command_pauses_collection_while_importing_and_freezes_what_it_imported() -> None:
    assert gc.isenabled()
    with gc_paused(freeze=False):
        assert not gc.isenabled()
    assert gc.isenabled() and gc.get_freeze_count() == 0
    code = (
        "import gc; from ddpcheck.hygiene import gc_paused\n"
        "with gc_paused(freeze=True):\n"
        "    import json, xml.etree.ElementTree\n"
        "print(gc.isenabled(), gc.get_freeze_count() > 1000)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "True"]


_COUNTED_FAILURE = """
import os

from torch.utils.data import DataLoader


class Broken:
    def __iter__(self):
        raise RuntimeError("broken sampler")

    def __len__(self):
        return 4


def make_loader(rank, world_size):
    with open(os.environ["CALLS_FILE"], "a") as f:
        f.write(f"{rank}/{world_size}\\n")
    return DataLoader(list(range(4)), batch_size=2, sampler=Broken())
"""


def test_a_failed_simulated_reference_is_not_rerun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulated groups take every core, so world size 1's determinism rerun follows its run instead
    of running beside it; a run that failed is judged alone, not repeated (a hang would cost its
    deadline twice)."""
    loader = tmp_path / "counted.py"
    loader.write_text(_COUNTED_FAILURE)
    calls = tmp_path / "calls"
    monkeypatch.setenv("CALLS_FILE", str(calls))
    result = check_loader(str(loader), CheckOptions(world_sizes=(1,), epochs=1, simulate=True))
    assert [f.kind for run in result.runs for f in run.failures] == ["error"]
    assert calls.read_text().splitlines() == ["0/1"]


def _spill_threshold() -> int:
    from ddpcheck.trace import spill_threshold

    return spill_threshold()


def test_a_large_simulated_world_spills_smaller_epochs_so_the_parent_holds_a_bounded_share() -> None:
    """The parent holds every simulated rank's in-memory epochs at once: at 1e8 samples and W=1024 that
    was 0.8 GB of ids below the per-epoch spill size (the run peaked at 2.10 GiB; 1.30 GiB with this
    rule, ``benchmarks/bench_simulate_scale.py``). A rank's epoch spills past the world's share of
    WORLD_HELD_IDS (never below SPILL_FLOOR); a small world keeps the usual SPILL_IDS."""
    from ddpcheck.launch.rank import shared_tmp
    from ddpcheck.launch.simulate import SPILL_FLOOR, WORLD_HELD_IDS, simulate_ranks
    from ddpcheck.trace import SPILL_IDS

    with shared_tmp():  # a run's temp directory, where simulated ranks spill
        big = simulate_ranks(_spill_threshold, 256, capture=False)
        small = simulate_ranks(_spill_threshold, 2, capture=False)
    assert {o.value for o in big.outcomes} == {max(SPILL_FLOOR, WORLD_HELD_IDS // 256)}
    assert {o.value for o in small.outcomes} == {SPILL_IDS}


@pytest.mark.parametrize("dtype", ["<u4", "<i8"])
def test_a_file_of_ids_is_counted_from_plain_reads_equal_to_the_array(tmp_path: Path, dtype: str) -> None:
    """The tally reads a file-backed epoch part by part with plain reads (a memory map's pages stayed
    counted in the judging process until the map was dropped); the parts are the array's."""
    import numpy as np

    from ddpcheck.checks.tally import chunks
    from ddpcheck.trace import IdArray

    values = np.random.default_rng(0).permutation(1_000_003).astype(dtype)
    path = tmp_path / "ids.npy"
    np.save(path, values)
    stored = IdArray(path=str(path), dtype=values.dtype.str, size=len(values), lo=0, hi=len(values) - 1)
    got = list(chunks(stored, 1 << 18))
    assert [start for start, _ in got] == list(range(0, len(values), 1 << 18))
    assert all(part.dtype == np.int64 for _, part in got)
    assert np.array_equal(np.concatenate([part for _, part in got]), values.astype(np.int64))
    short = IdArray(path=str(path), dtype=values.dtype.str, size=len(values) + 5, lo=0, hi=len(values))
    with pytest.raises(ValueError, match="ids, not"):
        list(chunks(short))
