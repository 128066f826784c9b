"""Training equivalence on real gloo ranks: DDP W x b must train like one process with batch b * W.

The passing fixture (strided split) must match to 1e-10 in float64 after every step, plain and with
gradient accumulation under ``no_sync``; a contiguous-block split and a summed loss must fail, each
with its own cause. ``judge_training`` (checks/training.py) is also tested alone on hand-made
weights, compared as the scenario compares them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddpcheck.checks.training import judge_training
from ddpcheck.evidence import TrainingDiffs
from ddpcheck.options import BadInput, CheckOptions
from ddpcheck.result import CheckResult, WorldResult
from ddpcheck.scenarios.training import RankTraining, ReferenceTraining, compared, relative_difference
from ddpcheck.session import check_loader
from ddpcheck.verdict import TRAINING_EQUIVALENCE, Verdict
from tests.conftest import FIXTURES, ROOT


def _check(path: Path | str, world_sizes: tuple[int, ...], **options: object) -> CheckResult:
    opts = CheckOptions(world_sizes=world_sizes, epochs=1, determinism=False, timeout=60.0, **options)  # type: ignore[arg-type]
    return check_loader(str(path), opts)


def _verdict(run: WorldResult) -> Verdict:
    assert not run.failures, run.failures
    found = [v for v in run.verdicts if v.check == TRAINING_EQUIVALENCE]
    assert len(found) == 1, run.verdicts
    return found[0]


# --------------------------------------------------------------------------- pure


def test_relative_difference() -> None:
    one = torch.tensor([2.0, -4.0], dtype=torch.float64)
    assert relative_difference(one.clone(), one) == 0.0
    nudged = one + torch.tensor([0.0, 1e-3], dtype=torch.float64)
    assert relative_difference(nudged, one) == pytest.approx(2.5e-4)
    assert relative_difference(torch.zeros(3), one) == float("inf")  # shapes differ


def _weights(*values: float) -> tuple[torch.Tensor, ...]:
    return tuple(torch.tensor([v, 1.0], dtype=torch.float64) for v in values)


def test_judge_training_reports_the_first_parting_step_and_the_composition() -> None:
    ranks = [
        RankTraining(
            0, batch_size=2, steps=3, batch_ids=((0, 2), (4, 6), (8, 10)), weights=_weights(1, 2, 3)
        ),
        RankTraining(1, batch_size=2, steps=3, batch_ids=((1, 3), (5, 7), (9, 11)), weights=()),
    ]
    same = ReferenceTraining(
        batch_ids=((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11)), weights=_weights(1, 2, 3)
    )
    verdict = judge_training(compared(ranks, same), 2)
    assert verdict.status == "pass", verdict.detail
    assert "2 ranks x batch 2 trains like one process with batch 4 for 3 SGD steps" in verdict.detail

    later = ReferenceTraining(batch_ids=same.batch_ids, weights=_weights(1, 2, 3.5))
    verdict = judge_training(compared(ranks, later), 2)
    assert verdict.failed and verdict.evidence.first_parting_step == 3
    assert verdict.detail.startswith("weights part at step 3 of 3")
    assert "loss is not a mean" in verdict.cause  # the batches were right

    blocks = ReferenceTraining(
        batch_ids=((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 12)), weights=_weights(1, 9, 9)
    )
    verdict = judge_training(compared(ranks, blocks), 2)
    assert verdict.evidence.first_parting_step == 2
    assert "step 3: 1 of its 4 samples are on no rank" in verdict.cause


# --------------------------------------------------------------------------- real ranks


def test_strided_ddp_trains_like_one_process() -> None:
    result = _check(FIXTURES / "train_strided.py", (1, 2, 3))
    assert result.exit_code == 0
    for run in result.runs:
        verdict = _verdict(run)
        assert verdict.status == "pass", verdict.detail
        data = verdict.evidence
        assert isinstance(data, TrainingDiffs)
        assert data.steps == 3 and data.per_rank_batch == 4
        assert data.global_batch == 4 * run.world_size and data.accumulation == 2
        diffs = [*data.max_relative_difference, *data.accumulation_max_relative_difference]
        assert len(diffs) == 6 and max(diffs) <= 1e-10, diffs
        assert data.first_parting_step is None and data.accumulation_first_parting_step is None
        assert "under no_sync match batch" in verdict.detail


def test_contiguous_blocks_fail_at_the_first_step() -> None:
    result = _check(FIXTURES / "train_contiguous_blocks.py", (1, 2))
    assert result.exit_code == 1
    assert _verdict(result.runs[0]).status == "pass"  # one rank holds the whole block
    verdict = _verdict(result.runs[1])
    assert verdict.failed
    assert verdict.evidence.first_parting_step == 1 and verdict.evidence.accumulation_first_parting_step == 1
    assert verdict.detail.startswith("weights part at step 1 of 3")
    assert "DDP 2 ranks x batch 4 vs one process with batch 8" in verdict.detail
    # Rank 0 holds samples 0-3, rank 1 samples 48-51: 4 of the single-process batch 0-7 are on no rank.
    assert (
        "not slices of the single-process batch (step 1: 4 of its 8 samples are on no rank)" in verdict.cause
    )
    assert max(verdict.evidence.max_relative_difference) > 1e-3  # type: ignore[call-overload]


SUMMED_LOSS = """
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

X = torch.arange(32, dtype=torch.float32).reshape(16, 2) / 10
Y = X.sum(dim=1, keepdim=True)

def make_loader(rank, world_size):                 # no batch_size parameter: the loader is re-batched
    data = TensorDataset(X, Y)
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=False)
    return DataLoader(data, batch_size=2, sampler=sampler)

def make_model():
    return torch.nn.Linear(2, 1)

def loss(model, batch):
    x, y = batch
    return LOSS
"""


def _loader_file(tmp_path: Path, loss: str) -> Path:
    path = tmp_path / "loader.py"
    path.write_text(SUMMED_LOSS.replace("LOSS", loss), encoding="utf-8")
    return path


def test_a_summed_loss_breaks_equivalence_with_the_right_batches(tmp_path: Path) -> None:
    mean = _check(_loader_file(tmp_path, "((model(x) - y) ** 2).mean()"), (2,))
    assert _verdict(mean.runs[0]).status == "pass"  # re-batching a factory without batch_size works
    summed = _check(_loader_file(tmp_path, "((model(x) - y) ** 2).sum()"), (2,))
    verdict = _verdict(summed.runs[0])
    assert verdict.failed and verdict.evidence.first_parting_step == 1
    assert "the loss is not a mean over the batch" in verdict.cause


def test_train_steps_zero_turns_the_check_off_and_negative_is_bad_input() -> None:
    result = _check(FIXTURES / "train_strided.py", (2,), train_steps=0)
    assert all(v.check != TRAINING_EQUIVALENCE for v in result.runs[0].verdicts)
    with pytest.raises(BadInput, match="train steps must be a non-negative integer"):
        _check(FIXTURES / "train_strided.py", (2,), train_steps=-1)
    with pytest.raises(BadInput, match="metric tolerance must be a non-negative number"):
        _check(FIXTURES / "train_strided.py", (2,), metric_tolerance=-0.5)


def test_a_loss_that_is_not_a_scalar_is_a_clear_rank_failure(tmp_path: Path) -> None:
    result = _check(_loader_file(tmp_path, "(model(x) - y) ** 2"), (1,))
    assert result.exit_code == 3
    (failure,) = result.runs[0].failures
    expected = "loss(model, batch) must return a scalar tensor computed from the model's output"
    assert failure.message.startswith(f"training_equivalence: {expected}")


@pytest.mark.parametrize("split", ["strided", "contiguous"])
def test_factory_args_reach_the_training_check(tmp_path: Path, split: str) -> None:
    """``make_loader(rank, world_size, split, batch_size=4)``: only ``--factory-arg`` can call it, in the DDP
    ranks and the single-process rank the training check starts too; the verdict follows the split."""
    command = [sys.executable, "-m", "ddpcheck", str(FIXTURES / "train_factory_arg.py"),
               "--world-sizes", "1,2", "--epochs", "1", "--no-determinism", "--no-resume", "--quiet",
               "--report-dir", str(tmp_path), "--factory-arg", f"split={split}"]  # fmt: skip
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == (0 if split == "strided" else 1), proc.stderr + proc.stdout
    report = json.loads((tmp_path / "ddpcheck.json").read_text(encoding="utf-8"))
    runs = {run["world_size"]: run for run in report["runs"]}
    assert all(not run["failures"] for run in runs.values()), [run["failures"] for run in runs.values()]
    assert runs[1]["checks"][TRAINING_EQUIVALENCE]["status"] == "pass"
    two = runs[2]["checks"][TRAINING_EQUIVALENCE]
    assert two["status"] == ("pass" if split == "strided" else "fail"), two
    failing = {check for run in runs.values() for check, v in run["checks"].items() if v["status"] == "fail"}
    assert failing == (set() if split == "strided" else {TRAINING_EQUIVALENCE})


def test_the_training_and_metric_checks_build_the_data_runs_loader() -> None:
    """Their ranks open the data run's own loader recipe (``LoaderRecipe.from_options``), not copies made
    field by field: no loader option (``--factory-arg``, ``--patch``, batch size, ``--no-set-epoch``, ...)
    can be left out."""
    from dataclasses import fields

    from ddpcheck.checker.loaderfile import LoaderSpec
    from ddpcheck.checker.recipe import LoaderRecipe
    from ddpcheck.scenarios.metric import MetricEquivalence
    from ddpcheck.scenarios.training import TrainingEquivalence, TrainOptions

    options = CheckOptions(factory_args=(("split", "contiguous"),), patch=True, batch_size=3, set_epoch=False,
                           load_data=True, simulate=True)  # fmt: skip
    spec = LoaderSpec(path=str(FIXTURES / "train_factory_arg.py"), factory="make_loader")
    expected = LoaderRecipe.from_options(spec, options)
    assert TrainingEquivalence(spec, options).options.recipe == expected
    assert MetricEquivalence(spec, options).recipe == expected
    assert expected.factory_args == (("split", "contiguous"),) and expected.patch and not expected.set_epoch
    loader_fields = {f.name for f in fields(LoaderRecipe)}
    assert {f.name for f in fields(TrainOptions)} & loader_fields == set()  # the recipe travels whole
