"""Device meshes: ddpcheck on loaders run under FSDP2/HSDP-style meshes, asserting the truth.

Each case is a loader file in ``fixtures/mesh/`` (plain torch, torchtitan's own text loader, Accelerate's
``ParallelismConfig`` mesh, DeepSpeed's Ulysses adapter) whose truth was established without ddpcheck by
``fixtures/mesh/truth.py`` (real gloo ranks, a real ``init_device_mesh``, ids and content digests per
batch; see ``fixtures/mesh/NOTES.md``). Every ``must_fail`` check fails at its layout and nothing else
does; the cause names the mechanism. The mesh machinery (layouts, the data-parallel view, replica
consistency) has pure tests below, and the reference utilities run in real meshes through the plugin's
``@pytest.mark.ddp(mesh=...)``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from ddpcheck.checks.replicas import (
    GLOBAL_RANK,
    LAYOUT_MISMATCH,
    PER_RANK_RANDOM,
    REPLICA_STEPS,
    SHARDED_TWICE_MESH,
    check_replica_consistency,
    data_parallel_view,
)
from ddpcheck.cli import main
from ddpcheck.layout import Layout, LayoutError, parse_mesh, parse_meshes, shaped_like
from ddpcheck.trace import EpochTrace, RankTrace, RunTrace
from ddpcheck.verdict import (
    COVERAGE,
    EQUAL_STEPS,
    NO_OVERLAP,
    PADDING_BOUND,
    REPLICA_CONSISTENCY,
    SINGLE_PROCESS_EQUIVALENCE,
)
from tests.conftest import CACHE_ROOT_VAR, CACHE_VARS, FIXTURES, ROOT

MESH = FIXTURES / "mesh"
DP2_TP2 = "dp=2,tp=2"
FAST = ("--no-resume", "--no-metrics", "--train-steps", "0")


@dataclass(frozen=True)
class Case:
    """One ddpcheck run and its truth: ``must_fail`` maps a layout label (``"2"``, ``"dp=2,tp=2"``) to
    the checks that fail there; every other check passes or does not apply. ``cause`` is the cause the
    layout's failures name."""

    name: str
    file: str
    args: tuple[str, ...]
    exit_code: int = 0
    must_fail: dict[str, frozenset[str]] = field(default_factory=dict)
    cause: str = ""
    module: str = ""  # a library the file needs (skipped with the install line when missing)


MISSING_IDS = frozenset({COVERAGE, REPLICA_CONSISTENCY, SINGLE_PROCESS_EQUIVALENCE})
CASES = [
    Case("plain-dp", "plain_dp.py", ("--mesh", DP2_TP2, "--world-sizes", "1,2")),
    Case("plain-dp-simulated", "plain_dp.py", ("--mesh", DP2_TP2, "--simulate", "--world-sizes", "2")),
    Case(
        "plain-hsdp",
        "plain_hsdp.py",
        (
            "--mesh",
            "dp_replicate=2,dp_shard=2,tp=2",
            "--factory",
            "make_loader_from_mesh",
            "--no-determinism",
        ),
    ),
    Case("plain-own-mesh", "plain_own_mesh.py", ("--mesh", DP2_TP2)),
    Case(
        "global-rank",
        "plain_global_rank.py",
        ("--mesh", DP2_TP2, "--world-sizes", "2"),
        exit_code=1,
        must_fail={DP2_TP2: MISSING_IDS},
        cause=GLOBAL_RANK,
    ),
    Case(
        "global-rank-simulated",
        "plain_global_rank.py",
        ("--mesh", DP2_TP2, "--simulate"),
        exit_code=1,
        must_fail={DP2_TP2: MISSING_IDS},
        cause=GLOBAL_RANK,
    ),
    Case(
        "sharded-twice",
        "plain_sharded_twice.py",
        ("--mesh", DP2_TP2, "--no-determinism"),
        exit_code=1,
        must_fail={DP2_TP2: MISSING_IDS},
        cause=SHARDED_TWICE_MESH,
    ),
    Case(
        "per-rank-augmentation",
        "plain_per_rank_augment.py",
        ("--mesh", DP2_TP2, "--world-sizes", "2"),
        exit_code=1,
        must_fail={DP2_TP2: frozenset({REPLICA_CONSISTENCY})},
        cause=PER_RANK_RANDOM,
    ),
    Case(
        "uneven-replica",
        "plain_uneven_replica.py",
        ("--mesh", DP2_TP2, "--no-determinism"),
        exit_code=1,
        must_fail={DP2_TP2: frozenset({EQUAL_STEPS, REPLICA_CONSISTENCY})},
        cause=REPLICA_STEPS,
    ),
    Case(
        "torchtitan",
        "torchtitan_dp.py",
        ("--mesh", DP2_TP2, "--world-sizes", "1,2"),
        module="torchtitan",
    ),
    Case(
        "torchtitan-global-rank",
        "torchtitan_global_rank.py",
        ("--mesh", DP2_TP2, "--no-determinism"),
        exit_code=1,
        must_fail={DP2_TP2: MISSING_IDS},
        cause=GLOBAL_RANK,
        module="torchtitan",
    ),
    Case(
        "accelerate-parallelism",
        "accelerate_parallelism.py",
        ("--mesh", DP2_TP2, "--world-sizes", "1,2", "--no-determinism"),
        module="accelerate",
    ),
    Case(
        "accelerate-dp-named-mesh",  # Accelerate reads dp_shard/dp_replicate by name: "dp" shards nothing
        "accelerate_dp_named_mesh.py",
        ("--mesh", DP2_TP2, "--no-determinism"),
        exit_code=1,
        must_fail={DP2_TP2: frozenset({NO_OVERLAP, PADDING_BOUND})},
        module="accelerate",
    ),
    Case(
        "accelerate-iterable-tp",  # its dispatcher refuses TP only for meshes named dp/fsdp: duplicates
        "accelerate_iterable_tp.py",
        ("--mesh", DP2_TP2, "--no-determinism"),
        exit_code=1,
        must_fail={DP2_TP2: frozenset({NO_OVERLAP, PADDING_BOUND})},
        module="accelerate",
    ),
    Case(
        "megatron",
        "megatron_parallel_state.py",
        ("--mesh", DP2_TP2, "--no-determinism"),
        module="megatron.core",
    ),
    Case(
        "megatron-transposed",  # Megatron orders tp-cp-ep-dp-pp: a mesh declared tp outermost is not its
        "megatron_parallel_state.py",
        ("--mesh", "tp=2,dp=2", "--no-determinism"),
        exit_code=1,
        must_fail={"tp=2,dp=2": MISSING_IDS | {NO_OVERLAP, PADDING_BOUND}},
        cause=LAYOUT_MISMATCH,
        module="megatron.core",
    ),
    Case(
        "deepspeed-ulysses",  # sp peers hold their own sequence slices: same samples, other tensors
        "deepspeed_ulysses.py",
        ("--mesh", "dp=2,sp=2", "--no-determinism"),
        module="deepspeed",
    ),
]
INSTALL = {
    "torchtitan": "pip install --no-deps -c constraints.txt torchtitan==0.3.0 spmd_types==0.2.3",
    "accelerate": "the 'integrations' extra",
    "deepspeed": "the 'integrations' extra",
    "megatron.core": "the 'integrations' extra",
}


def _run(case: Case, tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / "reports"
    argv = [str(MESH / case.file), *case.args, *FAST, "--report-dir", str(out), "--quiet", "--timeout", "120"]
    code = main(argv)
    report = json.loads((out / "ddpcheck.json").read_text())
    assert code == case.exit_code, json.dumps(report["causes"], indent=1)[:3000]
    return report


@pytest.mark.slow  # a whole ddpcheck run in process (cli.main)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_mesh_fixture(case: Case, tmp_path: Path) -> None:
    if case.module:
        pytest.importorskip(case.module, reason=f"needs {case.module}: {INSTALL[case.module]}")
    report = _run(case, tmp_path)
    mesh_runs = [run for run in report["runs"] if run["mesh"] is not None]
    assert mesh_runs, "no mesh layout was checked"
    for run in report["runs"]:
        label = run["label"].removeprefix("ws=")
        failed = {check for check, v in run["checks"].items() if v["status"] == "fail"}
        assert failed == case.must_fail.get(label, frozenset()), (label, failed)
        assert not run["failures"], run["failures"]
        replica = run["checks"][REPLICA_CONSISTENCY]
        assert replica["status"] == ("n/a" if run["mesh"] is None else "fail" if label in case.must_fail and
                                     REPLICA_CONSISTENCY in case.must_fail[label] else "pass")  # fmt: skip
        for check in case.must_fail.get(label, ()):
            if case.cause:
                assert run["checks"][check]["cause"] == case.cause, (check, run["checks"][check]["cause"])
                assert run["checks"][check]["fix"], f"{check} names no fix"
    if case.cause:
        assert [c["cause"] for c in report["causes"]] == [case.cause]  # one cause for every check it explains


COLD_TESTS = (  # DeepSpeed (torch_extensions), HF datasets (huggingface), mmengine (matplotlib, YAPF)
    "tests/test_meshes.py::test_mesh_fixture[deepspeed-ulysses]",
    "tests/test_frameworks.py::test_framework_loader[datasets-map-split]",
    "tests/test_frameworks.py::test_framework_loader[mmengine-default-sampler]",
)


@pytest.mark.slow
def test_a_cold_run_writes_nothing_into_the_home_caches(tmp_path: Path) -> None:
    """README command 2 on a fresh machine: an empty home, none of the cache variables set. The tests that
    import DeepSpeed, HF datasets and mmengine pass well inside their deadlines (DeepSpeed builds no
    shared-memory op: it used to compile for ~60 s and leave a lock in ~/.cache/torch_extensions), and
    the home gets nothing: tests/conftest.py gives the session caches of its own and removes them."""
    for module in ("deepspeed", "datasets", "mmengine"):
        pytest.importorskip(module, reason=f"needs {module}: the 'integrations' extra")
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in CACHE_VARS and k != CACHE_ROOT_VAR}
    env.update(HOME=str(home), TMPDIR=str(tmp))
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *COLD_TESTS]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "3 passed" in proc.stdout, proc.stdout[-2000:]
    assert "built successfully" not in proc.stdout + proc.stderr  # DeepSpeed compiled nothing
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == []
    assert not list(tmp.glob("ddpcheck-test-caches-*")), "the session's caches were not removed"


@pytest.mark.slow  # a whole ddpcheck run in process (cli.main)
def test_a_mesh_report_names_layouts_everywhere(tmp_path: Path) -> None:
    report = _run(CASES[4], tmp_path)  # global rank: fails at the mesh only
    mesh = next(run for run in report["runs"] if run["mesh"])
    assert mesh["label"] == DP2_TP2 and mesh["world_size"] == 4
    assert mesh["mesh"] == {"names": ["dp", "tp"], "shape": [2, 2], "data_dims": ["dp"]}
    assert report["summary"]["meshes"] == [DP2_TP2] and report["summary"]["world_sizes"] == [2]
    detail = mesh["checks"][REPLICA_CONSISTENCY]["detail"]
    assert detail.startswith("dp=0: tp=0 and tp=1 differ from step 0 of epoch 0")
    markdown = (tmp_path / "reports" / "ddpcheck.md").read_text()
    assert "| dp=2,tp=2 " in markdown and "dp\\=2,tp\\=2" not in markdown.split("###")[0]
    html = (tmp_path / "reports" / "ddpcheck.html").read_text()
    assert 'class="replicas"' in html and "Replica groups step by step (mesh dp=2,tp=2)" in html
    assert (tmp_path / "reports" / "ddpcheck-dp2-tp2-replicas.svg").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mesh", "dp=0,tp=2"], "size of dp must be at least 1"),
        (["--mesh", "dp=2,dp=2"], "dimension dp is named twice"),
        (["--mesh", "tp=2,pp=2"], "has no data-parallel dimension"),
        (["--mesh", "dp=2,tp=2", "--data-dims", "xx"], "--data-dims names xx, a dimension of no mesh given"),
        (["--mesh", "dp=200,tp=2"], "a mesh of 400 ranks exceeds 256 real ranks"),
        (["--mesh", "dp2tp2"], "expected NAME=SIZE"),
        (["--data-dims", "dp"], "give --mesh too"),
        (["--mesh", "dp=2,sp=2", "--sequence-dims", "dp"], "cannot both split the data and slice sequences"),
    ],
)
def test_bad_mesh_specs_are_one_line_exit_2(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([str(MESH / "plain_dp.py"), *args, "--report-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err


def test_data_dims_override_which_dimensions_split_the_data(tmp_path: Path) -> None:
    """tp=2,pp=2 with --data-dims pp: pp splits the data, tp replicates (the loader reads dp_rank)."""
    args = ["--mesh", "tp=2,pp=2", "--data-dims", "pp", *FAST, "--report-dir", str(tmp_path), "--quiet"]
    code = main([str(MESH / "plain_dp.py"), *args])
    report = json.loads((tmp_path / "ddpcheck.json").read_text())
    assert code == 0 and report["runs"][0]["mesh"]["data_dims"] == ["pp"]


# ------------------------------------------------------------------ layouts and the pure checks


def test_layout_numbers_ranks_row_major_and_flattens_the_data_dims() -> None:
    layout = parse_mesh("dp_replicate=2,dp_shard=2,tp=2")
    assert layout.data_dims == ("dp_replicate", "dp_shard") and layout.world_size == 8
    assert layout.dp_world_size == 4 and layout.replicas == 2
    assert [layout.coords(r) for r in (0, 1, 2, 5, 7)] == [
        (0, 0, 0),
        (0, 0, 1),
        (0, 1, 0),
        (1, 0, 1),
        (1, 1, 1),
    ]
    assert [layout.dp_rank(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]  # torchtitan's "batch" rank
    assert layout.replica_groups() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout.representatives() == [0, 2, 4, 6]
    assert layout.replica_coords(5) == "tp=1" and layout.data_coords(5) == "dp_replicate=1,dp_shard=0"
    assert layout.without_replicas().shape == (2, 2, 1)
    inner = parse_mesh("tp=2,dp=2")  # the data dimension need not be outermost
    assert [inner.dp_rank(r) for r in range(4)] == [0, 1, 0, 1]


def test_plain_world_sizes_take_the_meshes_names() -> None:
    meshes = parse_meshes(["dp=2,tp=2", "dp_shard=2,cp=2"])
    assert shaped_like(meshes, 3).dims == (("dp", 3), ("tp", 1), ("dp_shard", 1), ("cp", 1))
    assert shaped_like(meshes, 1).world_size == 1 and not shaped_like(meshes, 3).mesh
    assert shaped_like([], 4) == Layout.plain(4)
    assert parse_mesh("dp=2,sp=2").sequence_dims == ("sp",)
    with pytest.raises(LayoutError, match="--sequence-dims names xx"):
        parse_meshes(["dp=2,tp=2"], sequence_dims=("xx",))


def _trace(streams: dict[int, list[list[int]]], digests: dict[int, list[int]] | None = None) -> RunTrace:
    ranks = []
    for rank, batches in sorted(streams.items()):
        flat = [i for b in batches for i in b]
        digest = (digests or {}).get(rank)
        epoch = EpochTrace(0, flat, [len(b) for b in batches], len(batches), digests=digest)
        ranks.append(RankTrace(rank, (epoch,)))
    return RunTrace(len(streams), "gloo", tuple(ranks))


REFERENCE = RunTrace(1, "gloo", (RankTrace(0, (EpochTrace(0, list(range(8)), [2, 2, 2, 2], 4),)),))


def test_replica_consistency_names_each_pattern() -> None:
    layout = parse_mesh(DP2_TP2)
    same = {0: [[0, 2], [4, 6]], 1: [[0, 2], [4, 6]], 2: [[1, 3], [5, 7]], 3: [[1, 3], [5, 7]]}
    assert check_replica_consistency(REFERENCE, _trace(same), layout).status == "pass"
    global_rank = {0: [[0, 4]], 1: [[1, 5]], 2: [[2, 6]], 3: [[3, 7]]}
    verdict = check_replica_consistency(REFERENCE, _trace(global_rank), layout)
    assert verdict.cause == GLOBAL_RANK and verdict.fix.startswith("shard by the data-parallel coordinate")
    assert verdict.detail.startswith("dp=0: tp=0 and tp=1 differ from step 0 of epoch 0")
    twice = {0: [[0]], 1: [[1]], 2: [[2]], 3: [[3]]}  # together half the epoch: split again by global rank
    assert check_replica_consistency(REFERENCE, _trace(twice), layout).cause == SHARDED_TWICE_MESH
    noise = check_replica_consistency(
        REFERENCE, _trace(same, {0: [1, 2], 1: [9, 2], 2: [3, 4], 3: [3, 4]}), layout
    )
    assert noise.cause == PER_RANK_RANDOM and "dp=0" in noise.detail and noise.evidence.diverging_groups == 1
    short = {**same, 3: [[1, 3]]}
    assert check_replica_consistency(REFERENCE, _trace(short), layout).cause == REPLICA_STEPS


def test_sequence_dims_compare_samples_not_slices() -> None:
    layout = parse_mesh("dp=2,sp=2")  # sp: each peer holds its own slice of every sequence
    same = {0: [[0, 2]], 1: [[0, 2]], 2: [[1, 3]], 3: [[1, 3]]}
    sliced = _trace(same, {0: [1], 1: [2], 2: [3], 3: [4]})
    assert check_replica_consistency(REFERENCE, sliced, layout).status == "pass"
    assert check_replica_consistency(REFERENCE, sliced, parse_mesh("dp=2,tp=2")).status == "fail"


def test_the_data_parallel_view_keeps_one_replica_per_dp_rank() -> None:
    layout = parse_mesh("tp=2,dp=2")  # ranks 0, 1 are dp 0, 1 with tp 0
    run = _trace({0: [[0]], 1: [[1]], 2: [[0]], 3: [[1]]})
    view = data_parallel_view(layout, run)
    assert view.world_size == 2 and [r.rank for r in view.ranks] == [0, 1]
    assert [list(r.epochs[0].ids) for r in view.ranks] == [[0], [1]]
    assert check_replica_consistency(REFERENCE, run, Layout.plain(4)).status == "n/a"


# ------------------------------------------------------------------ reference utilities in real meshes


@pytest.mark.ddp(mesh={"dp": 2, "tp": 2})
def test_reference_utilities_shard_by_the_data_parallel_coordinate(ddp_mesh: Any, ddp_rank: int) -> None:
    from torch.utils.data import DataLoader, SequentialSampler

    from ddpcheck import (
        DDPSamplerWrapper,
        data_parallel_rank,
        data_parallel_world_size,
        patch_dataloader_to_ddp,
    )
    from ddpcheck.reference import sync_dicts_ddp

    dp = data_parallel_rank(ddp_mesh)
    assert (dp, data_parallel_world_size(ddp_mesh)) == (ddp_rank // 2, 2)
    wrapper = DDPSamplerWrapper(SequentialSampler(range(10)), mesh=ddp_mesh)
    assert list(wrapper) == list(range(10))[dp::2]  # tp peers get the same items
    patched = patch_dataloader_to_ddp(DataLoader(list(range(10)), batch_size=2), mesh=ddp_mesh)
    mine = [int(x) for batch in patched for x in batch]
    peers: list[Any] = [None] * 4
    dist.all_gather_object(peers, mine)
    assert peers[0] == peers[1] and peers[2] == peers[3] and not set(peers[0]) & set(peers[2])
    group = ddp_mesh["dp"].get_group()
    merged = sync_dicts_ddp({"id": torch.tensor(mine)}, 2, group=group, ids_key="id")
    assert merged["id"].tolist() == list(range(10))  # each sample once: replicas are not counted twice
    with pytest.raises(ValueError, match="not both"):
        DDPSamplerWrapper(SequentialSampler(range(10)), mesh=ddp_mesh, num_replicas=2, rank=0)
