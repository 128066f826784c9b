"""The bounded count of an epoch (``ddpcheck.checks.tally``) equals set arithmetic, and the checks give the
same verdicts from it as from sets, whatever holds the ids: ``array('q')``, numpy arrays of any width,
``.npy`` files on disk (:mod:`ddpcheck.tracefile`), or the stand-in union of a launch judged without a
reference. Ids that overflowed the dataset are named with their first position."""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddpcheck import trace as trace_module
from ddpcheck.checks import run_checks, tally
from ddpcheck.checks.ranges import find_overflow
from ddpcheck.checks.scripts import standin_reference
from ddpcheck.checks.tally import EpochTally, same_set
from ddpcheck.trace import (
    EpochTrace,
    IdArray,
    IdBuffer,
    LoaderFacts,
    RankTrace,
    RunTrace,
    ScriptLoader,
    ScriptRankTrace,
    UnionIds,
)
from ddpcheck.tracefile import narrowest, read_rank, spill_to, write_rank
from tests.test_scale import _as_tuples, scenarios

ids = st.lists(st.one_of(st.integers(-5, 40), st.integers(-(2**40), 2**40)), max_size=30)


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 3 ids and packed bits above 12: every path of the tally on tiny epochs."""
    monkeypatch.setattr(tally, "CHUNK", 3)
    monkeypatch.setattr(tally, "BYTE_SPAN", 12)


def _overlap_evidence(ranks: list[list[int]], over: set[int]) -> tuple[int, int, tuple[int, ...]] | None:
    if not over:
        return None
    owners: dict[int, list[int]] = {}
    for rank, s in enumerate(map(set, ranks)):
        for x in s & over:
            owners.setdefault(x, []).append(rank)
    first = min(rs[0] for rs in owners.values())
    mine = [x for x, rs in owners.items() if rs[0] == first]
    second = min(r for x in mine for r in owners[x] if r != first)
    return first, second, tuple(sorted(x for x in mine if second in owners[x])[:5])


@pytest.mark.usefixtures("small_chunks")
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ref=ids, ranks=st.lists(ids, max_size=5), limit=st.one_of(st.none(), st.integers(1, 50)))
def test_tally_counts_and_names_like_sets(ref: list[int], ranks: list[list[int]], limit: int | None) -> None:
    t = EpochTally(array("q", ref), [np.array(r, np.int64) for r in ranks], limit)
    assert t.ref_repeats == (len(set(ref)) != len(ref))
    if t.ref_repeats:
        assert EpochTally.of(array("q", ref), [np.array(r, np.int64) for r in ranks], limit) is None
        return
    union = set().union(*map(set, ranks))
    assert (t.ref_distinct, t.ddp_distinct, t.extras) == (len(set(ref)), len(union), len(union - set(ref)))
    assert [t.within(r) for r in range(len(ranks))] == [len(r) - len(set(r)) for r in ranks]
    holders = Counter(x for r in ranks for x in set(r))
    over = {x for x, c in holders.items() if c > 1}
    assert t.overlap_count == len(over)
    copies = Counter(x for r in ranks for x in r)
    assert t.duplicated_examples() == tuple(sorted(x for x, c in copies.items() if c > 1)[:5])
    assert t.missing_examples() == tuple(sorted(set(ref) - union)[:5])
    ev = t.overlap_evidence()
    assert (None if ev is None else (ev.first, ev.second, ev.shared)) == _overlap_evidence(ranks, over)
    strangers = union - set(ref)
    if limit is not None:
        strangers = {x for x in strangers if not 0 <= x < limit}
    found = t.strangers(indices=limit)
    holding = tuple(r for r in range(len(ranks)) if set(ranks[r]) & strangers)
    assert (found.count, found.ranks) == (len(strangers), holding)
    assert found.examples == (tuple(sorted(set(ranks[holding[0]]) & strangers)[:5]) if holding else ())
    assert [t.in_reference(r) for r in range(len(ranks))] == [len(set(r) & set(ref)) for r in ranks]
    assert t.same_reference(EpochTally(array("q", ref[::-1]), [], limit))
    assert t.same_reference(EpochTally(array("q", [*ref, 10**6]), [], limit)) == (10**6 in ref)


@pytest.mark.usefixtures("small_chunks")
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(a=ids, b=ids)
def test_same_set_is_set_equality(a: list[int], b: list[int]) -> None:
    assert same_set(np.array(a, np.int64), np.array(b, np.int64)) == (set(a) == set(b))
    assert same_set(np.array(a, np.int64), np.array(a[::-1] + a[:2], np.int64))


def test_large_spans_pack_a_bit_per_id(monkeypatch: pytest.MonkeyPatch) -> None:
    import ddpcheck.checks.tally as tally

    monkeypatch.setattr(tally, "BYTE_SPAN", 1 << 16)  # packed from 65,536 ids (the real one: 2^27)
    n = (1 << 16) + 100  # past BYTE_SPAN: packed bits
    ranks = [np.arange(r, n, 4, dtype=np.uint32) for r in range(4)]
    ranks[3][5] = ranks[0][7]  # one id on two ranks, one lost
    t = EpochTally(np.arange(n, dtype=np.uint32), ranks, n)
    assert t.seen.packed and t.seen.words.nbytes == (n + 7) // 8
    assert (t.ddp_distinct, t.overlap_count, t.missing_examples()) == (n - 1, 1, ((3 + 4 * 5),))
    ev = t.overlap_evidence()
    assert ev is not None and (ev.first, ev.second, ev.shared) == (0, 3, (28,))


# --- the checks: the same verdicts from arrays, files, unions and sets ----------------------------------


def _on_disk(run: RunTrace, folder: Path, tag: str) -> RunTrace:
    """The run with every rank's ids written by tracefile and read back as IdArrays on disk."""
    ranks = []
    for r in run.ranks:
        loader = ScriptLoader("x.py:1", r)
        path = write_rank(folder / f"{tag}{r.rank}", ScriptRankTrace(r.rank, run.world_size, (loader,)))
        back = read_rank(path, untrusted=True)
        assert back is not None
        ranks.append(replace(back.loaders[0].trace, rank=r.rank))
    return replace(run, ranks=tuple(ranks))


def _narrow(run: RunTrace) -> RunTrace:
    """The run with ids as numpy arrays of the narrowest type, in memory."""

    def epoch(e: EpochTrace) -> EpochTrace:
        values = np.frombuffer(e.ids, np.int64) if len(e.ids) else np.zeros(0, np.int64)
        dtype = narrowest(int(values.min()), int(values.max())) if len(values) else "<i8"
        return replace(e, ids=values.astype(dtype))

    return replace(run, ranks=tuple(replace(r, epochs=tuple(map(epoch, r.epochs))) for r in run.ranks))


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(case=scenarios())
def test_verdicts_are_the_same_whatever_holds_the_ids(
    case: tuple[RunTrace, RunTrace, RunTrace], tmp_path_factory: pytest.TempPathFactory
) -> None:
    ref, run, rerun = case
    expected = run_checks(_as_tuples(ref), _as_tuples(run), _as_tuples(rerun))
    assert run_checks(_narrow(ref), _narrow(run), _narrow(rerun)) == expected
    folder = tmp_path_factory.mktemp("traces")
    on_disk = _on_disk(run, folder, "run")
    again = on_disk if rerun is run else _on_disk(rerun, folder, "rerun")
    assert run_checks(_on_disk(ref, folder, "ref"), on_disk, again) == expected
    standin, standin_tuples = standin_reference(on_disk), standin_reference(_as_tuples(run))
    assert isinstance(standin.ranks[0].epochs[0].ids, UnionIds)
    assert run_checks(standin, on_disk, again) == run_checks(
        standin_tuples, _as_tuples(run), _as_tuples(rerun)
    )


# --- trace files -------------------------------------------------------------------------------------------


def test_trace_files_hold_ids_in_the_narrowest_type(tmp_path: Path) -> None:
    facts = LoaderFacts(dataset_len=70_000)
    epochs = (
        EpochTrace(0, array("q", [3, 1, 2]), [2, 1], 2),
        EpochTrace(1, array("q", [69_999, -1]), [2], 1),
        EpochTrace(2, ("a", "b"), [2], 1),
    )
    trace = ScriptRankTrace(5, 8, (ScriptLoader("t.py:3", RankTrace(5, epochs, facts)),))
    path = write_rank(tmp_path, trace)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "rank5.0.0.ids.npy",
        "rank5.0.1.ids.npy",
        "rank5.trace",
    ]
    assert np.load(tmp_path / "rank5.0.0.ids.npy").dtype == np.uint8
    assert np.load(tmp_path / "rank5.0.1.ids.npy").dtype == np.int32
    back = read_rank(path, untrusted=True)
    assert back is not None
    got = back.loaders[0].trace.epochs
    assert [list(e.ids) for e in got] == [[3, 1, 2], [69_999, -1], ["a", "b"]]
    assert isinstance(got[0].ids, IdArray) and (got[1].ids.lo, got[1].ids.hi) == (-1, 69_999)  # type: ignore[union-attr]
    assert list(got[0].batch_sizes) == [2, 1]


def test_a_trace_naming_a_foreign_or_mismatched_ids_file_is_refused(tmp_path: Path) -> None:
    trace = ScriptRankTrace(
        0, 1, (ScriptLoader("t.py:3", RankTrace(0, (EpochTrace(0, array("q", [1, 2]), [2], 1),))),)
    )
    path = write_rank(tmp_path, trace)
    np.save(tmp_path / "rank0.0.0.ids.npy", np.array([1, 2, 3], np.uint8))  # three ids where two were written
    from ddpcheck.tracefile import BadTraceFile

    with pytest.raises(BadTraceFile, match="holds"):
        read_rank(path, untrusted=True)


def test_a_judged_directory_with_two_traces_of_one_rank_is_refused(tmp_path: Path) -> None:
    """A stale copy beside a launch's traces (``rank5.trace`` holding rank 1 of 2 again) is no launch:
    ``ddpcheck judge`` must not keep one of the two silently."""
    import shutil

    from ddpcheck.launch.recorded import read_trace_dir
    from ddpcheck.options import BadInput

    for rank in (0, 1):
        epoch = EpochTrace(0, (f"r{rank}a", f"r{rank}b"), [2], 1)
        write_rank(tmp_path, ScriptRankTrace(rank, 2, (ScriptLoader("t.py:3", RankTrace(rank, (epoch,))),)))
    assert sorted(read_trace_dir(tmp_path).traces) == [0, 1]
    shutil.copy(tmp_path / "rank1.trace", tmp_path / "rank5.trace")
    with pytest.raises(BadInput, match=r"rank1\.trace and .*rank5\.trace both hold rank 1"):
        read_trace_dir(tmp_path)


@pytest.fixture
def spilling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Epochs past 4 ids spill into ``tmp_path`` (as under ``ddpcheck.record``), for this test only."""
    monkeypatch.setattr(trace_module, "SPILL_IDS", 4)
    saved = list(trace_module.ID_SINKS)
    spill_to(str(tmp_path))
    yield tmp_path
    trace_module.ID_SINKS[:] = saved


def test_an_epoch_spills_to_disk_while_it_is_recorded(spilling: Path) -> None:
    buffer = IdBuffer()
    written: list[int] = []
    for start in range(0, 30, 3):
        batch = array("q", range(start, start + 3))
        buffer.extend(batch)
        written += batch
        assert len(buffer) == len(written)
        assert buffer.distinct() == len(set(written))
    assert buffer._ints is not None and len(buffer._ints) < 4
    stored = buffer.ids()
    assert isinstance(stored, IdArray) and list(stored) == written and stored.dtype == "|u1"
    assert [p.name for p in spilling.iterdir() if not p.name.endswith(".npy")] == []  # the raw spill is gone


# --- overflow: ids held against the dataset's length ---------------------------------------------------


def _wrapped_run(world: int, dtype: type, n: int = 40_000, limit: int | None = 40_000) -> RunTrace:
    facts = LoaderFacts(dataset_len=n, index_space=limit, batch_size=64, padding=True)
    order = np.random.default_rng(0).permutation(n)
    ranks = []
    for r in range(world):
        values = order[r::world].astype(dtype).astype(np.int64)
        ranks.append(RankTrace(r, (EpochTrace(0, array("q", values.tobytes()), [len(values)], 1),), facts))
    return RunTrace(world, "gloo", tuple(ranks))


def test_an_int16_index_map_is_named_at_its_first_wrapped_position() -> None:
    run = _wrapped_run(2, np.int16)
    found = find_overflow(run)
    assert found is not None and (found.epoch, found.rank, found.negative) == (0, 0, 40_000 - 32_768)
    first = int(np.flatnonzero(np.random.default_rng(0).permutation(40_000)[0::2] >= 32_768)[0])
    assert found.position == first and found.value < 0 and "int16" in found.what()
    verdicts = {v.check: v for v in run_checks(_wrapped_run(1, np.int16), run)}
    assert verdicts["coverage"].failed and "overflowed" in verdicts["coverage"].cause
    assert verdicts["coverage"].evidence.position == first


def test_ids_that_fit_or_are_keys_are_no_overflow() -> None:
    assert find_overflow(_wrapped_run(2, np.int64)) is None  # int64 holds them
    assert find_overflow(_wrapped_run(2, np.int16, limit=None)) is None  # not the sampler's own indices
    keyed = _wrapped_run(2, np.int64, n=40_000, limit=100)  # most ids beyond the length: keys, not indices
    assert find_overflow(keyed) is None


def test_popcount_without_numpy_2_counts_what_bitwise_count_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """NumPy 1.24 (pyproject's floor) has no ``bitwise_count``: the unpacked-bytes path must count the
    same bits, for the word sizes a bitmap uses."""
    import numpy as np

    from ddpcheck.checks import tally

    rng = np.random.default_rng(7)
    for dtype in (np.uint8, np.uint64):
        words = rng.integers(0, np.iinfo(dtype).max, size=1001, dtype=dtype, endpoint=True)
        expected = sum(bin(int(w)).count("1") for w in words)
        assert tally.popcount(words) == expected
        monkeypatch.setattr(tally, "_BITWISE_COUNT", None)
        assert tally.popcount(words) == expected
        monkeypatch.undo()
