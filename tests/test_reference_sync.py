"""sync_dicts_ddp / mp_sync under real gloo groups of 2 and 3 ranks, plus their single-process paths."""

from __future__ import annotations

import math
import pickle
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from ddpcheck.launch import GroupCall, run_ranks
from ddpcheck.reference.sync import (
    WarningDDP,
    merge_list_of_dicts,
    mp_sync,
    mp_sync_dict,
    sync_dicts_ddp,
)

WORLDS = [2, 3]


def _by_value(body: Any, kwargs: dict[str, Any]) -> bytes:
    # Plain pickle copies tensors by value; multiprocessing's pickler would pass them as shared
    # memory handles, which the parent cannot open once the rank has exited.
    return pickle.dumps(body(**kwargs))


def _values(body: Any, world: int, **kwargs: Any) -> list[Any]:
    result = run_ranks(
        GroupCall(_by_value, world_size=world, kwargs={"body": body, "kwargs": kwargs}, timeout=60)
    )
    result.raise_for_failures()
    return [pickle.loads(v) for v in result.values]


def _rank_world() -> tuple[int, int]:
    import torch.distributed as dist

    # A forked rank whose parent already ran an OpenMP parallel region hangs in its own first
    # parallel op; one intra-op thread per rank sidesteps that (and 2 cores are shared anyway).
    torch.set_num_threads(1)
    return dist.get_rank(), dist.get_world_size()


def _count_object_gathers() -> list[int]:
    """Count calls of all_gather_object (the pickling path) in this rank; the real one still runs."""
    import torch.distributed as dist

    calls = [0]
    real = dist.all_gather_object

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    dist.all_gather_object = counting  # type: ignore[assignment]  # this forked rank only
    return calls


def _catch(fn: Any) -> tuple[str, str]:
    try:
        fn()
    except Exception as e:
        return type(e).__name__, str(e)
    return "no error", ""


def _assert_same(a: Any, b: Any, where: str) -> None:
    assert type(a) is type(b), f"{where}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{a.shape} != {b.dtype}{b.shape}"
        assert torch.equal(a, b), where
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert np.array_equal(a, b), where
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), where
    else:
        assert a == b, where


# --------------------------------------------------------------------------- merging every kind


def _rows(rank: int) -> int:
    return 0 if rank == 1 else rank + 2  # unequal lengths, rank 1 holds nothing


def _mixed(rank: int) -> dict[str, Any]:
    n = _rows(rank)
    return {
        "f32": torch.arange(n * 3, dtype=torch.float32).reshape(n, 3) + 100 * rank,
        "f64": torch.full((n,), 0.1, dtype=torch.float64) + rank * 1e-13,  # not representable in float32
        "i64": torch.arange(n, dtype=torch.int64) + 2**62 + 1000 * rank,  # not representable in float64
        "flags": torch.arange(n) % 2 == rank % 2,
        "np_f64": np.linspace(0.0, 1.0, n) + rank,
        "np_i16": np.arange(n, dtype=np.int16) - 7,
        "np_u64": np.full((n, 2), 2**64 - 1 - rank, dtype=np.uint64),
        "np_str": np.array([f"r{rank}"] * n, dtype="<U3"),
        "ints": [2**40 + rank * 10 + i for i in range(n)],
        "floats": [0.1 * rank + i for i in range(n)],
        "paths": tuple(f"p{rank}_{i}" for i in range(n)),
        "mixed": [1, "a", None, True, 2.5][:n],
    }


def _expected_mixed(world: int) -> dict[str, Any]:
    parts = [_mixed(r) for r in range(world)]
    out: dict[str, Any] = {}
    for key, first in parts[0].items():
        values = [p[key] for p in parts]
        if isinstance(first, torch.Tensor):
            out[key] = torch.cat(values)
        elif isinstance(first, np.ndarray):
            out[key] = np.concatenate(values)
        else:
            out[key] = type(first)(x for v in values for x in v)
    return out


def _mixed_body() -> dict[str, Any]:
    rank, world = _rank_world()
    return sync_dicts_ddp(_mixed(rank), world)


@pytest.mark.parametrize("world", WORLDS)
def test_every_sequence_kind_merges_in_rank_order_with_exact_dtypes(world: int) -> None:
    expected = _expected_mixed(world)
    for rank, got in enumerate(_values(_mixed_body, world)):
        assert list(got) == list(expected)
        for key in expected:
            _assert_same(got[key], expected[key], f"rank {rank} key {key}")
    assert expected["f64"].dtype == torch.float64 and expected["i64"][0].item() == 2**62  # fixture sanity


def _scalars_body() -> dict[str, Any]:
    rank, world = _rank_world()
    d = {
        "i": rank,
        "f": 0.1 + rank,
        "s": f"r{rank}",
        "b": rank == 0,
        "none": None,
        "nan": float("nan"),
        "t0": torch.tensor(0.1 + rank, dtype=torch.float64),
        "np0": np.float32(rank + 0.5),
        "arr0": np.array(rank, dtype=np.int8),
    }
    return sync_dicts_ddp(d, world)


@pytest.mark.parametrize("world", WORLDS)
def test_scalars_and_zero_d_values_become_one_entry_per_rank(world: int) -> None:
    for got in _values(_scalars_body, world):
        assert got["i"] == list(range(world)) and all(type(x) is int for x in got["i"])
        assert got["f"] == [0.1 + r for r in range(world)]
        assert got["s"] == [f"r{r}" for r in range(world)]
        assert got["b"] == [r == 0 for r in range(world)] and all(type(x) is bool for x in got["b"])
        assert got["none"] == [None] * world
        assert all(math.isnan(x) for x in got["nan"])
        _assert_same(got["t0"], [torch.tensor(0.1 + r, dtype=torch.float64) for r in range(world)], "t0")
        assert [type(x) for x in got["np0"]] == [np.float32] * world
        assert [float(x) for x in got["np0"]] == [r + 0.5 for r in range(world)]
        assert [(x.shape, x.dtype, int(x)) for x in got["arr0"]] == [((), np.int8, r) for r in range(world)]


def _empty_body() -> dict[str, Any]:
    _, world = _rank_world()
    d = {"t": torch.empty(0, 3, dtype=torch.float64), "l": [], "tup": (), "a": np.empty((0, 2), np.int32)}
    out = sync_dicts_ddp(d, world)
    out["placed_on"] = sync_dicts_ddp({"t": torch.ones(1)}, world, device="meta")["t"].device.type
    return out


def test_all_ranks_empty_keeps_dtype_and_shape_and_results_go_to_device() -> None:
    for got in _values(_empty_body, 2):
        _assert_same(got["t"], torch.empty(0, 3, dtype=torch.float64), "t")
        assert got["l"] == [] and got["tup"] == ()
        _assert_same(got["a"], np.empty((0, 2), np.int32), "a")
        assert got["placed_on"] == "meta"  # merged tensors go to `device`


def _large_body(equal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    rank, world = _rank_world()
    n = 1100 if equal else 1100 + 37 * rank  # 4.5 MB per rank: over the coalescing threshold
    emb = torch.arange(n * 1024, dtype=torch.float32).reshape(n, 1024) + rank
    small = torch.tensor([rank], dtype=torch.int64)
    out = sync_dicts_ddp({"emb": emb, "small": small}, world)
    return out["emb"], out["small"]


@pytest.mark.parametrize("equal", [True, False], ids=["equal-lengths", "unequal-lengths"])
def test_large_tensors_travel_alone_and_are_trimmed(equal: bool) -> None:
    world = 2
    got = _values(_large_body, world, equal=equal)
    # Computed after the ranks ran: a parallel op in the parent before a fork can hang OpenMP in the child.
    rows = [1100 if equal else 1100 + 37 * r for r in range(world)]
    expected = torch.cat(
        [torch.arange(n * 1024, dtype=torch.float32).reshape(n, 1024) + r for r, n in enumerate(rows)]
    )
    for emb, small in got:
        _assert_same(emb, expected, "emb")
        _assert_same(small, torch.tensor([0, 1]), "small")


# --------------------------------------------------------------------------- pickling


def _objects_body() -> tuple[Any, int]:
    rank, world = _rank_world()
    calls = _count_object_gathers()
    d = {
        "objs": [{"rank": rank, "i": i} for i in range(rank + 1)],
        "arr": np.array([{"r": rank}], dtype=object),
        "t": torch.ones(rank),
    }
    return sync_dicts_ddp(d, world), calls[0]


def test_objects_are_pickled_in_one_gather() -> None:
    for got, calls in _values(_objects_body, 3):
        assert got["objs"] == [{"rank": r, "i": i} for r in range(3) for i in range(r + 1)]
        assert got["arr"].dtype == object and list(got["arr"]) == [{"r": r} for r in range(3)]
        _assert_same(got["t"], torch.ones(3), "t")
        assert calls == 1  # both object keys share one all_gather_object


def _no_pickle_body() -> tuple[dict[str, Any], int]:
    rank, world = _rank_world()
    calls = _count_object_gathers()
    d = {
        "emb": torch.randn(rank + 1, 4, generator=torch.Generator().manual_seed(rank)),
        "arr": np.arange(rank, dtype=np.float64),
        "paths": [f"img{rank}_{i}.png" for i in range(rank + 1)],
        "mixed": [rank, "x", None, 0.5],
        "ids": list(range(rank)),
        "score": 0.5 * rank,
    }
    return sync_dicts_ddp(d, world, allow_pickle=False), calls[0]


@pytest.mark.parametrize("world", WORLDS)
def test_data_without_objects_never_unpickles(world: int) -> None:
    for got, calls in _values(_no_pickle_body, world):
        assert calls == 0
        assert got["paths"] == [f"img{r}_{i}.png" for r in range(world) for i in range(r + 1)]
        assert got["mixed"] == [x for r in range(world) for x in (r, "x", None, 0.5)]
        assert got["ids"] == [i for r in range(world) for i in range(r)]
        assert got["emb"].shape == (sum(r + 1 for r in range(world)), 4)
        assert got["score"] == [0.5 * r for r in range(world)]


def _pickle_refused_body() -> tuple[str, str, int]:
    rank, world = _rank_world()
    calls = _count_object_gathers()
    d = {"paths": [{"path": "a"}] if rank == 1 else ["a"], "t": torch.zeros(1)}
    kind, msg = _catch(lambda: sync_dicts_ddp(d, world, allow_pickle=False))
    return kind, msg, calls[0]


@pytest.mark.parametrize("world", WORLDS)
def test_allow_pickle_false_refuses_objects_on_every_rank(world: int) -> None:
    got = _values(_pickle_refused_body, world)
    assert len(set(got)) == 1, got  # the same error on every rank, even those holding plain strings
    kind, msg, calls = got[0]
    assert kind == "TypeError" and calls == 0
    assert "key 'paths'" in msg and "rank(s) [1]" in msg and "allow_pickle=False" in msg


# --------------------------------------------------------------------------- mismatches


def _mismatch(case: str, rank: int) -> dict[str, Any]:
    odd = rank == 1
    if case == "keys":
        return {"a": [1]} if odd else {"a": [1], "b": [2]}
    if case == "dtype":
        return {"x": torch.zeros(2, dtype=torch.float64 if odd else torch.float32)}
    if case == "shape":
        return {"x": torch.zeros(2, 4 if odd else 3)}
    if case == "type":
        return {"x": [0.0, 1.0] if odd else torch.zeros(2)}
    if case == "np-dtype":
        return {"x": np.zeros(2, dtype=np.int32 if odd else np.int64)}
    if case == "scalar":
        return {"x": 1.0 if odd else 1}
    if case == "unsupported":
        return {"x": {1, 2} if odd else [1, 2]}
    raise AssertionError(case)


def _mismatch_body(case: str) -> tuple[str, str]:
    rank, world = _rank_world()
    return _catch(lambda: sync_dicts_ddp(_mismatch(case, rank), world))


MISMATCHES = {
    "keys": ("ValueError", "sync_dicts_ddp: every rank must pass the same keys, but rank 1 lacks ['b']"),
    "dtype": ("ValueError", "key 'x' has different dtypes: torch.float32 on rank"),
    "shape": ("ValueError", "key 'x' has different shapes after dim 0: (3,) on rank"),
    "type": ("ValueError", "key 'x' has different types: tensor on rank"),
    "np-dtype": ("ValueError", "key 'x' has different dtypes: int64 on rank"),
    "scalar": ("ValueError", "key 'x' has different scalar types: int on rank"),
    "unsupported": ("TypeError", "rank 1: key 'x' holds a set"),
}


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("case", sorted(MISMATCHES))
def test_mismatch_raises_the_same_error_on_every_rank(case: str, world: int) -> None:
    got = _values(_mismatch_body, world, case=case)
    kind, fragment = MISMATCHES[case]
    for rank, (k, msg) in enumerate(got):
        assert k == kind, f"rank {rank}: {k}: {msg}"
        assert fragment in msg, f"rank {rank}: {msg}"
        assert "\n" not in msg
    assert len(set(got)) == 1, got  # identical text on every rank


def _wrong_world_body() -> tuple[str, str]:
    rank, world = _rank_world()
    return _catch(lambda: sync_dicts_ddp({"a": [rank]}, world + 1))


def test_wrong_world_size_argument_is_reported_everywhere() -> None:
    got = _values(_wrong_world_body, 2)
    assert got[0] == got[1]
    assert got[0][0] == "ValueError" and "world_size=3 but the process group has 2 ranks" in got[0][1]


# --------------------------------------------------------------------------- ids_key: exact metrics


N_SAMPLES = 11  # not divisible by 2 or 3: DistributedSampler pads with repeats


class _Table(Dataset[dict[str, Any]]):
    def __len__(self) -> int:
        return N_SAMPLES

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {
            "ids": i,
            "value": torch.tensor(math.sin(i) * 1e3 + i / 7, dtype=torch.float64),
            "emb": torch.tensor([i, i * 0.5, -i], dtype=torch.float32),
            "label": i % 3,
            "path": f"img_{i}.jpg",
        }


def _dedup_body(ids_as_list: bool, num_workers: int) -> tuple[int, dict[str, Any]]:
    rank, world = _rank_world()
    sampler: DistributedSampler[Any] = DistributedSampler(
        _Table(), num_replicas=world, rank=rank, shuffle=True, seed=3
    )
    loader = DataLoader(_Table(), batch_size=2, sampler=sampler, num_workers=num_workers)
    parts: dict[str, list[Any]] = {"ids": [], "value": [], "emb": [], "labels": [], "paths": []}
    for batch in loader:
        parts["ids"].append(batch["ids"])
        parts["value"].append(batch["value"])
        parts["emb"].append(batch["emb"])
        parts["labels"].extend(batch["label"].tolist())
        parts["paths"].extend(batch["path"])
    local: dict[str, Any] = {
        "ids": torch.cat(parts["ids"]),
        "value": torch.cat(parts["value"]),
        "emb": torch.cat(parts["emb"]),
        "labels": parts["labels"],
        "paths": tuple(parts["paths"]),
    }
    if ids_as_list:
        local["ids"] = local["ids"].tolist()
    seen = len(local["labels"])
    return seen, sync_dicts_ddp(local, world, ids_key="ids")


def _metrics(values: torch.Tensor) -> tuple[float, float]:
    positions = torch.arange(len(values), dtype=torch.float64)
    return values.mean().item(), (values * positions).sum().item()  # the second is order-sensitive


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize(
    ("ids_as_list", "num_workers"), [(False, 0), (True, 1)], ids=["tensor-ids", "list-ids-1-worker"]
)
def test_ids_key_makes_metrics_equal_the_single_process_ones_exactly(
    world: int, ids_as_list: bool, num_workers: int
) -> None:
    got = _values(_dedup_body, world, ids_as_list=ids_as_list, num_workers=num_workers)
    table = _Table()
    single = torch.stack([table[i]["value"] for i in range(N_SAMPLES)])
    assert sum(seen for seen, _ in got) > N_SAMPLES  # the sampler really padded with repeats
    for _, out in got:
        ids = out["ids"].tolist() if isinstance(out["ids"], torch.Tensor) else out["ids"]
        assert ids == list(range(N_SAMPLES))
        assert _metrics(out["value"]) == _metrics(single)  # exact, not approximate
        assert out["paths"] == tuple(f"img_{i}.jpg" for i in range(N_SAMPLES))
        assert out["labels"] == [i % 3 for i in range(N_SAMPLES)]
        _assert_same(out["emb"], torch.stack([table[i]["emb"] for i in range(N_SAMPLES)]), "emb")
    # Without dedup the padded repeats would shift the mean: the test can fail.
    assert _metrics(torch.cat([single, single[:1]]))[0] != _metrics(single)[0]


def _bad_ids_body(case: str) -> tuple[str, str]:
    rank, world = _rank_world()
    d: dict[str, Any] = {"ids": [rank], "v": [1.0]}
    if case == "missing":
        return _catch(lambda: sync_dicts_ddp(d, world, ids_key="idx"))
    d["v"] = [1.0, 2.0]
    return _catch(lambda: sync_dicts_ddp(d, world, ids_key="ids"))


@pytest.mark.parametrize(
    ("case", "fragment"),
    [("missing", "ids_key 'idx' is not a key of the dict"), ("length", "key 'v' has 4 rows but ids_key")],
)
def test_bad_ids_key_is_the_same_error_everywhere(case: str, fragment: str) -> None:
    got = _values(_bad_ids_body, 2, case=case)
    assert got[0] == got[1] and got[0][0] == "ValueError" and fragment in got[0][1], got


# --------------------------------------------------------------------------- mp_sync


def _mp_body() -> dict[str, Any]:
    rank, _ = _rank_world()
    return {
        "f64": mp_sync(0.1 + rank, double_precision=True),
        "f32": mp_sync(0.1 + rank),
        "int": mp_sync(2**40 + rank, double_precision=True),
        "zero_d": mp_sync(torch.tensor(rank + 0.25, dtype=torch.float64)),
        "ragged": mp_sync(list(range(rank))),  # rank 0 sends [] and adopts int64
        "np": mp_sync(np.arange(rank + 1, dtype=np.float64) / 3),
        "split": mp_sync(torch.ones(rank + 1, 2, dtype=torch.int32) * rank, concat=False),
        "list64": mp_sync([0.1, 0.2 + rank], double_precision=True),
        "dict": mp_sync_dict({"x": rank, "y": [1.5] * rank}, double_precision=True),
    }


@pytest.mark.parametrize("world", WORLDS)
def test_mp_sync_keeps_precision_and_handles_scalars_and_ragged_ranks(world: int) -> None:
    ranks = range(world)
    for got in _values(_mp_body, world):
        _assert_same(got["f64"], torch.tensor([0.1 + r for r in ranks], dtype=torch.float64), "f64")
        _assert_same(got["f32"], torch.tensor([0.1 + r for r in ranks], dtype=torch.float32), "f32")
        _assert_same(got["int"], torch.tensor([2**40 + r for r in ranks], dtype=torch.int64), "int")
        _assert_same(got["zero_d"], torch.tensor([r + 0.25 for r in ranks], dtype=torch.float64), "zero_d")
        _assert_same(
            got["ragged"], torch.tensor([i for r in ranks for i in range(r)], dtype=torch.int64), "ragged"
        )
        expected_np = torch.cat([torch.from_numpy(np.arange(r + 1, dtype=np.float64) / 3) for r in ranks])
        _assert_same(got["np"], expected_np, "np")
        _assert_same(got["split"], [torch.ones(r + 1, 2, dtype=torch.int32) * r for r in ranks], "split")
        _assert_same(
            got["list64"],
            torch.tensor([x for r in ranks for x in (0.1, 0.2 + r)], dtype=torch.float64),
            "list64",
        )
        _assert_same(got["dict"]["x"], torch.tensor(list(ranks)), "dict.x")
        _assert_same(got["dict"]["y"], torch.tensor([1.5] * sum(ranks), dtype=torch.float64), "dict.y")
    assert torch.tensor(0.1 + 1, dtype=torch.float32).double().item() != 0.1 + 1  # float32 would lose it


def _mp_mismatch_body(case: str) -> tuple[str, str]:
    rank, _ = _rank_world()
    if case == "dtype":
        return _catch(lambda: mp_sync(torch.zeros(1, dtype=torch.float64 if rank == 1 else torch.float32)))
    return _catch(lambda: mp_sync("text" if rank == 1 else 1.0))


@pytest.mark.parametrize(
    ("case", "kind", "fragment"),
    [
        (
            "dtype",
            "ValueError",
            "mp_sync: the value has different dtypes: torch.float32 on ranks 0, 2; torch.float64 on rank 1",
        ),
        ("type", "TypeError", "mp_sync: rank 1: cannot sync a str"),
    ],
)
def test_mp_sync_mismatch_is_the_same_error_everywhere(case: str, kind: str, fragment: str) -> None:
    got = _values(_mp_mismatch_body, 3, case=case)
    assert len(set(got)) == 1, got
    assert got[0][0] == kind and fragment in got[0][1], got[0]


# --------------------------------------------------------------------------- without a process group


def test_without_a_group_the_dict_comes_back_as_a_copy() -> None:
    d = {"a": [1, 2], "t": torch.ones(2)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = sync_dicts_ddp(d, 1)
    assert out == d and out is not d
    with pytest.warns(WarningDDP, match="without a process group"):
        assert sync_dicts_ddp(d, 2) == d


def test_without_a_group_ids_key_still_dedups_and_sorts() -> None:
    d = {"ids": [3, 1, 2, 1], "v": torch.tensor([30.0, 10.0, 20.0, 11.0]), "s": ("c", "a", "b", "a2")}
    out = sync_dicts_ddp(d, 1, ids_key="ids")
    assert out["ids"] == [1, 2, 3] and out["s"] == ("a", "b", "c")
    assert out["v"].tolist() == [10.0, 20.0, 30.0]  # the first of the two id-1 rows wins
    with pytest.raises(ValueError, match="key 'v' has 2 rows but ids_key 'ids' has 3"):
        sync_dicts_ddp({"ids": [1, 2, 3], "v": [1.0, 2.0]}, 1, ids_key="ids")
    with pytest.raises(ValueError, match="cannot be sorted"):
        sync_dicts_ddp({"ids": [1, "a"]}, 1, ids_key="ids")


def test_bad_arguments_are_rejected_before_any_communication() -> None:
    with pytest.raises(ValueError, match="world_size must be a positive int"):
        sync_dicts_ddp({}, 0)
    with pytest.raises(TypeError, match="must be a dict"):
        sync_dicts_ddp([("a", 1)], 1)  # type: ignore[arg-type]


def test_mp_sync_without_a_group_converts_like_with_one() -> None:
    _assert_same(mp_sync(0.1, double_precision=True), torch.tensor([0.1], dtype=torch.float64), "f64")
    _assert_same(mp_sync(torch.tensor(3)), torch.tensor([3]), "0-d")
    _assert_same(mp_sync([1, 2], concat=False), [torch.tensor([1, 2])], "split")
    _assert_same(mp_sync_dict({"a": 2.5})["a"], torch.tensor([2.5]), "dict")
    with pytest.raises(TypeError, match="cannot sync a str"):
        mp_sync("x")


def test_merge_list_of_dicts_follows_the_same_rules() -> None:
    merged = merge_list_of_dicts(
        [{"t": torch.ones(1, 2), "l": (1,), "s": 0.5}, {"t": torch.zeros(2, 2), "l": (2, 3), "s": 1.5}]
    )
    _assert_same(merged["t"], torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]), "t")
    assert merged["l"] == (1, 2, 3) and merged["s"] == [0.5, 1.5]
    with pytest.raises(ValueError, match="different types"):
        merge_list_of_dicts([{"a": [1]}, {"a": (1,)}])
    with pytest.raises(ValueError, match="has keys"):
        merge_list_of_dicts([{"a": [1]}, {"b": [1]}])


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), world=st.integers(1, 5), seed=st.integers(0, 1000), shuffle=st.booleans())
def test_padded_splits_merge_back_to_the_dataset(n: int, world: int, seed: int, shuffle: bool) -> None:
    """What the ranks would send, merged in rank order, reorders to exactly the dataset."""
    parts = []
    for rank in range(world):
        data: Any = range(n)  # any sized sequence works as the sampler's dataset
        idx: list[int] = list(
            DistributedSampler(data, num_replicas=world, rank=rank, shuffle=shuffle, seed=seed)
        )
        parts.append(
            {
                "ids": torch.tensor(idx),
                "x": torch.tensor(idx, dtype=torch.float64) ** 0.5,
                "p": [str(i) for i in idx],
            }
        )
    out = sync_dicts_ddp(merge_list_of_dicts(parts), 1, ids_key="ids")
    assert out["ids"].tolist() == list(range(n))
    assert torch.equal(out["x"], torch.arange(n, dtype=torch.float64) ** 0.5)
    assert out["p"] == [str(i) for i in range(n)]
