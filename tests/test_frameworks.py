"""ddpcheck on loaders built the way framework users build them, asserting the truth, not today's output.

Each case names a loader file in ``fixtures/frameworks/`` built with the real library (Accelerate,
Lightning, transformers, torchdata, webdataset, mmengine, HF datasets) and what ddpcheck must report for
it. The truth comes from the libraries' documented behaviour and source, and was confirmed without
ddpcheck by ``fixtures/frameworks/truth.py``, which runs each loader in real gloo ranks under a torchrun
environment and compares the ids the data itself carries (see ``docs/frameworks.md``).

The test process imports the library first (``pytest.importorskip``) and runs ``ddpcheck.cli.main``
in-process: ranks are forked from it, so they inherit the import instead of paying it per rank.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ddpcheck.cli import main
from ddpcheck.verdict import (
    COVERAGE,
    DETERMINISM,
    EQUAL_STEPS,
    NO_OVERLAP,
    PADDING_BOUND,
    RESHUFFLE,
    RESUME,
    SINGLE_PROCESS_EQUIVALENCE,
    WORKER_SHARDING,
)
from tests.conftest import FRAMEWORKS

EXTRA = "the 'integrations' extra (pip install -c constraints.txt -e '.[integrations]')"
OML = (
    "pip install --no-deps -c constraints.txt open-metric-learning==4.0.0 "
    "(not in the extra: it requires torchvision, which must not be installed; oml.ddp does not need it)"
)

# Sampling with replacement (webdataset resampled shards) is not a partition: these checks do not apply.
NOT_A_PARTITION = frozenset(
    {COVERAGE, NO_OVERLAP, PADDING_BOUND, WORKER_SHARDING, SINGLE_PROCESS_EQUIVALENCE, RESHUFFLE}
)


@dataclass(frozen=True)
class Case:
    """One ddpcheck run and its truth.

    ``must_fail``/``may_fail`` map a world size to check ids: every ``must_fail`` check fails, and
    nothing outside ``must_fail | may_fail`` fails (``may_fail`` holds direct consequences of the same
    bug, e.g. coverage and single_process_equivalence both count the same missing samples). ``allowed``:
    check ids that fail by design and are passed with ``--allow``; they must show status "allowed".
    """

    name: str
    file: str
    module: str  # imported first; skipped with EXTRA when missing
    world_sizes: tuple[int, ...] = (1, 2)
    args: tuple[str, ...] = ()
    exit_code: int = 0
    must_fail: dict[int, frozenset[str]] = field(default_factory=dict)
    may_fail: dict[int, frozenset[str]] = field(default_factory=dict)
    allowed: dict[int, frozenset[str]] = field(default_factory=dict)
    may_allow: frozenset[str] = frozenset()  # passed with --allow; each may pass or show "allowed"
    must_pass: frozenset[str] = frozenset()
    truth: str = ""
    install: str = EXTRA  # how to get ``module``, for the skip reason


def _at(world_sizes: tuple[int, ...], *checks: str) -> dict[int, frozenset[str]]:
    return {ws: frozenset(checks) for ws in world_sizes}


CASES = [
    # --- Accelerate -----------------------------------------------------------------------------
    Case(
        "accelerate-shuffle",
        "accelerate_shuffle.py",
        "accelerate",
        truth="partition every epoch (rank 0's generator state is copied to all ranks in __iter__); "
        "64 = 8 batches of 8 split evenly, so even_batches pads nothing; set_seed(0) makes it repeatable",
    ),
    Case(
        "accelerate-even-batches",
        "accelerate_even_batches.py",
        "accelerate",
        must_pass=frozenset({PADDING_BOUND, NO_OVERLAP, COVERAGE, EQUAL_STEPS}),
        truth="60 = 7 full batches + 4: rank 1's last batch is topped up with the epoch's first 4 samples; "
        "4 duplicates, within Accelerate's documented even_batches bound (fewer than W x batch)",
    ),
    Case(
        "accelerate-dispatch",
        "accelerate_dispatch.py",
        "accelerate",
        world_sizes=(1, 2, 3),
        must_pass=frozenset({PADDING_BOUND, NO_OVERLAP, COVERAGE, EQUAL_STEPS, SINGLE_PROCESS_EQUIVALENCE}),
        truth="dispatch_batches: only rank 0 iterates the DataLoader; a partition at W=2 (32+32) and W=3 "
        "(22x3, 2 padding copies); samples identified by the id field since ranks 1+ see no indices",
    ),
    Case(
        "accelerate-iterable-shard",
        "accelerate_dispatch.py",
        "accelerate",
        world_sizes=(1, 2, 3),
        args=("--factory", "make_loader_iterable"),
        must_pass=frozenset({PADDING_BOUND, NO_OVERLAP, COVERAGE, EQUAL_STEPS}),
        truth="IterableDatasetShard completes the last round of W x 8 from the start: 4 copies at W=2, "
        "12 at W=3 (24x3 items), within its bound; equal steps, nothing missing",
    ),
    Case(
        "accelerate-no-seed",
        "accelerate_no_seed.py",
        "accelerate",
        exit_code=1,
        must_fail=_at((1, 2), DETERMINISM),
        truth="partition every epoch, but the sampler generator is seeded from unseeded global RNG",
    ),
    Case(
        "accelerate-batch-sampler-epoch",
        "accelerate_batch_sampler_epoch.py",
        "accelerate",
        exit_code=1,
        must_fail={2: frozenset({RESHUFFLE})},
        truth="BatchSamplerShard wraps the user's batch sampler at W >= 2; DataLoaderShard.set_epoch never "
        "calls its set_epoch: truth.py's order_changes is true at W=1, false at W=2",
    ),
    Case(
        "accelerate-batch-sampler-epoch-hook",
        "accelerate_batch_sampler_epoch_hook.py",
        "accelerate",
        must_pass=frozenset({RESHUFFLE}),
        truth="the same loader in a loop that also calls the wrapped batch sampler's set_epoch (the "
        "set_epoch(loader, epoch) hook): it reshuffles at every world size",
    ),
    Case(
        "lhotse-cutsets",
        "../tokens/lhotse_buckets_synced.py",
        "lhotse",
        must_pass=frozenset({COVERAGE, NO_OVERLAP, EQUAL_STEPS, RESHUFFLE, RESUME}),
        truth="DynamicBucketingSampler yields CutSets, not indices: each rank draws W batches of one seeded "
        "stream and keeps its own; every cut once per epoch at W=1, 2 (identified by cut.id)",
    ),
    Case(
        "accelerate-double-shard",
        "accelerate_double_shard.py",
        "accelerate",
        exit_code=1,
        must_fail={2: frozenset({COVERAGE})},
        may_fail={2: frozenset({SINGLE_PROCESS_EQUIVALENCE})},
        truth="DistributedSampler then BatchSamplerShard: each rank 16 of 64, 32 samples reach no rank",
    ),
    Case(
        "accelerate-stateful",
        "accelerate_stateful.py",
        "accelerate",
        exit_code=1,
        must_fail=_at((1, 2), RESUME),
        must_pass=frozenset({COVERAGE, NO_OVERLAP, EQUAL_STEPS, DETERMINISM}),
        truth="a partition with a real state_dict that does not resume exactly (reproduced without "
        "ddpcheck, see the fixture): epoch 1 restarts in another order, and a state saved after the last "
        "step marks the epoch finished",
    ),
    # --- Lightning ------------------------------------------------------------------------------
    Case(
        "fabric-setup-dataloaders",
        "lightning_fabric.py",
        "lightning",
        truth="DistributedSampler(seed 0) injected; _FabricDataLoader (no DataLoader) sets the epoch itself",
    ),
    Case(
        "trainer-sampler-injection",
        "lightning_trainer.py",
        "lightning",
        truth="the loader Trainer.fit would use: DistributedSampler(seed 0) injected; a partition",
    ),
    Case(
        "trainer-no-injection",
        "lightning_trainer.py",
        "lightning",
        args=("--factory", "make_loader_no_injection"),
        exit_code=1,
        must_fail={1: frozenset({DETERMINISM}), 2: frozenset({NO_OVERLAP, DETERMINISM})},
        may_fail={2: frozenset({PADDING_BOUND, RESHUFFLE, SINGLE_PROCESS_EQUIVALENCE})},
        truth="use_distributed_sampler=False: every rank draws its own unseeded permutation of all 60",
    ),
    # --- transformers ---------------------------------------------------------------------------
    Case(
        "hf-trainer",
        "transformers_trainer.py",
        "transformers",
        truth="get_train_dataloader = Accelerate prepare of a RandomSampler loader; seeded by args.seed",
    ),
    # --- torchdata ------------------------------------------------------------------------------
    Case(
        "stateful-dataloader",
        "torchdata_stateful.py",
        "torchdata",
        world_sizes=(1, 2, 3),
        truth="StatefulDataLoader's BatchSampler subclass forms torch's batches; a partition",
    ),
    Case(
        "stateful-dataloader-workers",
        "torchdata_stateful.py",
        "torchdata",
        args=("--factory", "make_loader_workers"),
        truth="the same with 2 workers per rank",
    ),
    Case(
        "torchdata-nodes",
        "torchdata_nodes.py",
        "torchdata.nodes",
        world_sizes=(1, 2, 3),
        must_pass=frozenset(
            {COVERAGE, NO_OVERLAP, PADDING_BOUND, EQUAL_STEPS, RESHUFFLE, DETERMINISM, RESUME}
        ),
        truth="nodes.Loader (no DataLoader underneath) over a DistributedSampler: a partition, reshuffled "
        "by SamplerWrapper; a state saved after an epoch's last batch restores into the next epoch, which "
        "is right for a job that starts the next epoch at once (a loop that finishes the stopped one "
        "first would train an extra epoch: Loader restarts when it runs out)",
    ),
    # --- webdataset -----------------------------------------------------------------------------
    Case(
        "wds-split",
        "wds_split.py",
        "webdataset",
        truth="8 shards: 4 per rank at W=2; no shard shuffle, so no reshuffle anywhere",
    ),
    Case(
        "wds-split-workers",
        "wds_split.py",
        "webdataset",
        args=("--factory", "make_loader_workers"),
        truth="the same with split_by_worker over 2 workers per rank",
    ),
    Case(
        "wds-webloader",
        "wds_split.py",
        "webdataset",
        args=("--factory", "make_loader_webloader"),
        truth="webdataset's WebLoader (a pipeline around a DataLoader): the same split, batched in it",
    ),
    Case(
        "wds-split-uneven",
        "wds_split.py",
        "webdataset",
        world_sizes=(1, 3),
        exit_code=1,
        must_fail={3: frozenset({EQUAL_STEPS})},
        truth="8 shards over 3 ranks: 3, 3, 2 shards = 6, 6, 4 batches; a DDP job hangs at rank 2's end",
    ),
    Case(
        "wds-fixed-assignment",
        "wds_fixed_assignment.py",
        "webdataset",
        exit_code=1,
        must_fail={2: frozenset({RESHUFFLE})},
        truth="split_by_node before the shard shuffle: rank r always owns shards r, r+W; order changes",
    ),
    Case(
        "wds-fixed-assignment-allowed",
        "wds_fixed_assignment.py",
        "webdataset",
        args=("--allow", RESHUFFLE),
        allowed={2: frozenset({RESHUFFLE})},
        truth="the same, with the fixed assignment declared a design choice",
    ),
    Case(
        "wds-resampled",
        "wds_resampled.py",
        "webdataset",
        args=("--steps", "4", *(a for c in sorted(NOT_A_PARTITION) for a in ("--allow", c))),
        may_allow=NOT_A_PARTITION,
        must_pass=frozenset({EQUAL_STEPS, DETERMINISM}),
        truth="infinite, with replacement: 4 steps per rank, equal and repeatable; not a partition",
    ),
    # --- mmengine -------------------------------------------------------------------------------
    Case(
        "mmengine-default-sampler",
        "mmengine_default.py",
        "mmengine",
        world_sizes=(1, 2, 3),
        truth="seeded randperm(seed + epoch), padded by < W (1 sample at W=3), strided by rank",
    ),
    Case(
        "mmengine-infinite-sampler",
        "mmengine_infinite.py",
        "mmengine",
        args=("--steps", "4"),
        truth="one continuing stream of seeded permutations, strided by rank: each 4-step window at W=2 "
        "is one permutation of 64",
    ),
    # --- open-metric-learning -----------------------------------------------------------------
    Case(
        "oml-patch-seeded",
        "oml_patch.py",
        "oml",
        install=OML,
        truth="DDPSamplerWrapper strides one inner order, the same on every rank (seeded generator)",
    ),
    Case(
        "oml-patch-unseeded",
        "oml_patch.py",
        "oml",
        args=("--factory", "make_loader_unseeded"),
        install=OML,
        exit_code=1,
        must_fail={1: frozenset({DETERMINISM}), 2: frozenset({NO_OVERLAP, DETERMINISM})},
        may_fail={2: frozenset({COVERAGE, SINGLE_PROCESS_EQUIVALENCE, PADDING_BOUND, RESHUFFLE})},
        truth="each rank strides its own unseeded permutation: ranks overlap and miss samples",
    ),
    # --- HF datasets ----------------------------------------------------------------------------
    Case(
        "datasets-map-split",
        "hf_datasets_map.py",
        "datasets",
        exit_code=1,
        must_fail={2: frozenset({RESHUFFLE})},
        truth="contiguous blocks per rank (ids from the hook); blocks never move between epochs",
    ),
    Case(
        "datasets-map-split-allowed",
        "hf_datasets_map.py",
        "datasets",
        world_sizes=(1, 2, 3),
        args=("--allow", RESHUFFLE),
        allowed={2: frozenset({RESHUFFLE}), 3: frozenset({RESHUFFLE})},
        truth="the same, fixed blocks declared a design choice: a partition at W = 2 and 3",
    ),
    Case(
        "datasets-map-split-no-hook",
        "hf_datasets_map_nohook.py",
        "datasets",
        args=("--allow", RESHUFFLE),
        allowed={2: frozenset({RESHUFFLE})},
        truth="a partition; every shard is indexed from 0, so only the batches' id column identifies rows",
    ),
    Case(
        "datasets-iterable-split",
        "hf_datasets_iterable.py",
        "datasets",
        world_sizes=(1, 2, 3),
        args=("--allow", RESHUFFLE),
        allowed={2: frozenset({RESHUFFLE})},
        truth="W=2: 2 of 4 shards per rank, fixed; W=3: 1 example in 3 (assignment changes): partitions",
    ),
]


def _run(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    pytest.importorskip(case.module, reason=f"{case.module} is not installed: it comes with {case.install}")
    report_dir = tmp_path / "reports"
    argv = [
        str(FRAMEWORKS / case.file),
        "--world-sizes",
        ",".join(map(str, case.world_sizes)),
        "--report-dir",
        str(report_dir),
        "--format",
        "json",
        "--quiet",
        "--timeout",
        "120",
        *case.args,
    ]
    code = main(argv)
    report_path = report_dir / "ddpcheck.json"
    assert report_path.exists(), f"no JSON report (exit {code}): {capsys.readouterr().err.strip()}"
    return code, json.loads(report_path.read_text())


def _statuses(report: dict[str, Any]) -> dict[int, dict[str, str]]:
    return {
        run["world_size"]: {name.split("#")[0]: check["status"] for name, check in run["checks"].items()}
        for run in report["runs"]
    }


def _explain(report: dict[str, Any]) -> str:
    lines = []
    for run in report["runs"]:
        for name, check in run["checks"].items():
            if check["status"] not in ("pass", "n/a"):
                lines.append(f"ws={run['world_size']} {name} {check['status']}: {check['detail']}")
        lines.extend(
            f"ws={run['world_size']} rank {f['rank']} {f['kind']}: {f['message']}" for f in run["failures"]
        )
    return "\n".join(lines) or "(nothing failed)"


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_framework_loader(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, report = _run(case, tmp_path, capsys)
    why = f"{case.truth}\nddpcheck said:\n{_explain(report)}"
    statuses = _statuses(report)
    assert sorted(statuses) == list(case.world_sizes), why
    for ws, checks in statuses.items():
        failed = {c for c, s in checks.items() if s == "fail"}
        must = case.must_fail.get(ws, frozenset())
        may = case.may_fail.get(ws, frozenset())
        assert must <= failed, f"ws={ws}: expected {sorted(must)} to fail\n{why}"
        assert failed <= must | may, f"ws={ws}: unexpected failures {sorted(failed - must - may)}\n{why}"
        allowed = {c for c, s in checks.items() if s == "allowed"}
        must_allow = set(case.allowed.get(ws, frozenset()))
        assert must_allow <= allowed <= must_allow | case.may_allow, (
            f"ws={ws}: allowed {sorted(allowed)}\n{why}"
        )
        for check in case.must_pass:
            assert checks.get(check) == "pass", f"ws={ws}: {check} is {checks.get(check)}\n{why}"
    assert [run["failures"] for run in report["runs"]] == [[] for _ in report["runs"]], why
    assert code == case.exit_code, why


@pytest.mark.slow
def test_infinite_sampler_without_steps_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An endless loader without ``--steps`` is a usage error that says what to do, not a 50M-item crawl."""
    pytest.importorskip("mmengine", reason=f"mmengine is not installed: it comes with {EXTRA}")
    argv = [str(FRAMEWORKS / "mmengine_infinite.py"), "--world-sizes", "1,2", "--report-dir", str(tmp_path)]
    code = main([*argv, "--quiet", "--timeout", "60"])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert "--steps" in err and len(err.splitlines()) == 1, err
