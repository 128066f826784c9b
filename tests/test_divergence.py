"""Metric divergence: pure math and cause counting, then real gloo ranks via ``check_loader`` and the CLI.

Expected values are computed here from the fixtures' data and from how ``DistributedSampler`` pads
(repeat the first ``total - n`` indices) and splits (rank ``r`` takes ``r, r + W, ...``), never from
ddpcheck's own code.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddpcheck.checker.loaderfile import defined_names
from ddpcheck.checks.metric import (
    Evaluation,
    close,
    count_causes,
    judge_metrics,
    metric_rows,
)
from ddpcheck.options import CheckOptions
from ddpcheck.result import CheckResult, WorldResult
from ddpcheck.scenarios.metric import default_metric, default_outputs, metric_values
from ddpcheck.session import check_loader
from ddpcheck.verdict import METRIC_EQUIVALENCE, Verdict
from tests.conftest import FIXTURES, ROOT


def _check(path: Path | str, world_sizes: tuple[int, ...], **options: object) -> CheckResult:
    opts = CheckOptions(world_sizes=world_sizes, epochs=1, determinism=False, timeout=60.0, **options)  # type: ignore[arg-type]
    return check_loader(str(path), opts)


def _run(result: CheckResult, ws: int) -> WorldResult:
    return next(run for run in result.runs if run.world_size == ws)


def _metric_verdict(run: WorldResult) -> Verdict:
    found = [v for v in run.verdicts if v.check == METRIC_EQUIVALENCE]
    assert len(found) == 1, run.verdicts
    return found[0]


def _padded_order(n: int, world_size: int) -> list[int]:
    """The naive gather's ids: DistributedSampler(shuffle=False) padding, rank-major concatenation."""
    total = -(-n // world_size) * world_size
    indices = list(range(n)) + list(range(total - n))
    return [i for rank in range(world_size) for i in indices[rank::world_size]]


# --------------------------------------------------------------------------- pure: causes and math


def test_count_causes_counts_copies_drops_extras_and_order() -> None:
    causes = count_causes([0, 1, 2, 3, 4], [0, 2, 4, 1, 3, 0, 2])
    assert (causes.duplicated, causes.dropped, causes.extra) == (2, 0, 0)
    assert causes.duplicated_ids == (0, 2)
    assert causes.order_differs and not causes.order_only  # copies are more than an order change

    dropped = count_causes([0, 1, 2, 3, 4], [0, 2, 1, 3, 9])
    assert (dropped.duplicated, dropped.dropped, dropped.extra) == (0, 1, 1)
    assert dropped.dropped_ids == (4,)

    reordered = count_causes(["a", "b", "c"], ["a", "c", "b"])
    assert reordered.order_only and reordered.same_samples

    same = count_causes([3, 1, 2], [3, 1, 2])
    assert same.same_samples and not same.order_differs


def test_close_is_exact_for_integers_and_relative_for_floats() -> None:
    assert close(10, 10) and not close(10, 11)
    assert not close(1_000_000_000, 1_000_000_001)  # integers: exact, however large
    assert close(0.7, 0.7 * (1 + 5e-7)) and not close(0.7, 0.7 * (1 + 5e-6))
    assert close(0.0, 1e-13) and not close(0.0, 1e-9)  # absolute floor at zero
    assert close(10, 11, tolerance=0.1) and not close(10, 12, tolerance=0.1)  # explicit: for ints too
    assert not close(0.7, 0.7 + 1e-15, tolerance=0.0)
    assert close(math.nan, math.nan) and not close(math.nan, 1.0) and not close(1.0, math.nan)


def _evaluation(
    ws: int, naive: dict[str, float], corrected: dict[str, float], ids: list[int], **kw: object
) -> Evaluation:
    return Evaluation(world_size=ws, naive=naive, corrected=corrected, ids=ids, **kw)  # type: ignore[arg-type]


def test_rows_and_verdict_for_padding() -> None:
    correct = [0, 0, 1, 1, 1, 1, 1, 1, 1, 0]  # per sample
    naive_ids = _padded_order(10, 3)
    assert len(naive_ids) == 12 and sorted(naive_ids) == [0, 0, 1, 1, *range(2, 10)]
    naive_acc = sum(correct[i] for i in naive_ids) / len(naive_ids)
    reference = _evaluation(
        1, {"accuracy": 0.7, "samples": 10}, {"accuracy": 0.7, "samples": 10}, list(range(10))
    )
    run = _evaluation(3, {"accuracy": naive_acc, "samples": 12}, {"accuracy": 0.7, "samples": 10}, naive_ids)
    rows = metric_rows(reference, run)
    by_name = {row.metric: row for row in rows}
    assert by_name["accuracy"].naive_diff == pytest.approx(7 / 12 - 0.7)
    assert by_name["samples"].naive_diff == 2 and by_name["samples"].corrected_diff == 0
    assert all(row.duplicated == 2 and row.dropped == 0 and not row.order_only for row in rows)
    assert "ids_key dedup" in by_name["accuracy"].cause
    verdict = judge_metrics(reference, run, rows)
    assert verdict.status == "pass"
    assert "2 padding duplicates" in verdict.detail and "accuracy 0.583333 vs 0.7" in verdict.detail
    assert verdict.evidence.duplicated == 2 and verdict.examples == (0, 1)


def test_verdict_fails_when_drop_last_drops_samples() -> None:
    reference = _evaluation(1, {"samples": 10}, {"samples": 10}, list(range(10)))
    run = _evaluation(3, {"samples": 9}, {"samples": 9}, [0, 3, 6, 1, 4, 7, 2, 5, 8], drops=True)
    rows = metric_rows(reference, run)
    assert rows[0].dropped == 1 and rows[0].corrected_diff == -1
    verdict = judge_metrics(reference, run, rows)
    assert verdict.failed
    assert verdict.detail.startswith(
        "1 sample dropped by drop_last never reaches any rank; use padding + ids_key dedup for evaluation"
    )
    assert verdict.cause == "drop_last drops samples from evaluation"
    assert verdict.examples == (9,)
    evened = Evaluation(3, {"samples": 8}, {"samples": 8}, [0, 3, 6, 1, 4, 7, 2, 5])  # e.g. an iterable
    verdict = judge_metrics(reference, evened, metric_rows(reference, evened))
    assert verdict.detail.startswith("2 samples dropped never reach any rank; no gather can recover them")
    assert verdict.cause == "samples never reach any rank"


def test_order_only_and_a_wrong_forward_are_told_apart() -> None:
    reference = _evaluation(1, {"p@2": 1.0}, {"p@2": 1.0}, [0, 1, 2, 3])
    reordered = _evaluation(2, {"p@2": 0.5}, {"p@2": 1.0}, [0, 2, 1, 3])
    row = metric_rows(reference, reordered)[0]
    assert row.order_only and row.duplicated == 0 and "depends on order" in row.cause
    assert judge_metrics(reference, reordered, [row]).status == "pass"

    drifted = _evaluation(2, {"p@2": 0.5}, {"p@2": 0.5}, [0, 1, 2, 3])  # same samples, same order
    rows = metric_rows(reference, drifted)
    verdict = judge_metrics(reference, drifted, rows)
    assert verdict.failed and "forward depends on the batch or rank" in verdict.cause
    assert verdict.detail.startswith("the ids_key gather does not reproduce")


def test_a_tolerance_lets_a_small_difference_pass() -> None:
    reference = _evaluation(1, {"loss": 1.0}, {"loss": 1.0}, [0, 1])
    run = _evaluation(2, {"loss": 1.001}, {"loss": 1.001}, [0, 1])
    assert judge_metrics(reference, run, metric_rows(reference, run)).failed
    assert judge_metrics(reference, run, metric_rows(reference, run, 0.01), 0.01).status == "pass"


def test_cli_flags_reach_the_options() -> None:
    from ddpcheck.cli import build_parser

    flags = ["--metrics", "--metric-tolerance", "1e-3", "--train-steps", "0"]
    args = build_parser().parse_args(["x.py", *flags])
    assert (args.metrics, args.metric_tolerance, args.train_steps) == (True, 1e-3, 0)
    args = build_parser().parse_args(["x.py", "--no-metrics"])
    assert (args.metrics, args.metric_tolerance, args.train_steps) == (False, None, 3)
    assert build_parser().parse_args(["x.py"]).metrics is None


def test_bad_metric_and_training_flags_are_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    """Range rules live in one place (``validate``): the command says them in one line, exit 2."""
    from ddpcheck.cli import main

    for bad, said in (
        (["--metric-tolerance", "-1"], "metric tolerance"),
        (["--train-steps", "-2"], "train steps"),
    ):
        assert main(["x.py", *bad]) == 2
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err, err


def test_defined_names_reads_the_source_without_running_it(tmp_path: Path) -> None:
    path = tmp_path / "loader.py"
    path.write_text(
        "raise SystemExit('never run')\n"
        "from mymetrics import accuracy as metric\n"
        "def make_loader(): ...\n"
        "if True:\n    forward = lambda b: b\n"
        "try:\n    import numpy.linalg as loss\nexcept ImportError:\n    pass\n"
        "class make_model: ...\n"
        "def helper():\n    sample_ids = 1\n",
        encoding="utf-8",
    )
    names = defined_names(path)
    assert {"metric", "make_loader", "forward", "loss", "make_model"} <= names
    assert "sample_ids" not in names and "accuracy" not in names
    assert defined_names(tmp_path / "missing.py") == frozenset()


def test_defined_names_reads_a_pep263_file_as_python_does(tmp_path: Path) -> None:
    path = tmp_path / "latin.py"
    path.write_bytes(
        b"# -*- coding: latin-1 -*-\nlabel = '\xe9t\xe9'\n\ndef metric(outputs):\n    return 0\n"
    )
    assert {"label", "metric"} <= defined_names(path)


def test_default_outputs_and_metric() -> None:
    x = torch.tensor([[1.0, 3.0], [2.0, 6.0], [0.0, 0.0]])
    y = torch.tensor([1, 0, 1])
    out = default_outputs((x, y), [7, 8, 9], collated=True)
    assert out["id"] == [7, 8, 9]
    assert out["field0"].tolist() == [2.0, 4.0, 0.0]  # per-sample means of a multi-valued field
    assert out["field1"].tolist() == [1, 0, 1]
    metrics = default_metric(out)
    assert metrics == {
        "samples": 3,
        "mean(id)": 8.0,
        "mean(field0)": 2.0,
        "mean(field1)": pytest.approx(2 / 3),
    }
    as_dict = default_outputs({"id": torch.tensor([4, 5]), "name": ["a", "b"], "meta": "x"}, [4, 5], True)
    assert set(as_dict) == {"id", "name"}  # per-sample fields only
    assert default_metric(as_dict) == {"samples": 2, "mean(id)": 4.5}


def test_metric_values_normalises_and_rejects() -> None:
    assert metric_values(torch.tensor(0.25)) == {"metric": 0.25}
    values = metric_values({"acc": torch.tensor(0.5, dtype=torch.float64), "n": 3, "ok": True})
    assert values == {"acc": 0.5, "n": 3, "ok": 1}
    assert isinstance(values["n"], int)
    with pytest.raises(TypeError, match="must return a number or a dict of numbers"):
        metric_values([1, 2])
    with pytest.raises(TypeError, match="metric 'acc' is a list"):
        metric_values({"acc": [1]})


# --------------------------------------------------------------------------- real ranks


def _fixture_accuracy() -> tuple[list[int], int]:
    """Per-sample correctness of divergence_padding_accuracy.py, recomputed: x_i = (i, 10 - i), identity."""
    labels = [0, 0, 1, 1, 1, 0, 0, 0, 0, 1]
    predicted = [1 if (10 - i) > i else 0 for i in range(10)]
    return [int(p == y) for p, y in zip(predicted, labels, strict=True)], 10


def test_padding_changes_accuracy_by_the_computed_amount() -> None:
    correct, n = _fixture_accuracy()
    result = _check(FIXTURES / "divergence_padding_accuracy.py", (1, 2, 3))
    assert result.exit_code == 0
    reference = sum(correct) / n
    for ws in (1, 2, 3):
        run = _run(result, ws)
        order = _padded_order(n, ws)
        rows = {row.metric: row for row in run.divergence}
        assert set(rows) == {"accuracy", "correct", "samples"}
        assert rows["accuracy"].reference == reference == 0.7
        assert rows["accuracy"].naive == sum(correct[i] for i in order) / len(order)
        assert rows["accuracy"].corrected == reference
        assert rows["samples"].naive == len(order) and rows["samples"].corrected == n
        assert rows["accuracy"].duplicated == len(order) - n
        assert _metric_verdict(run).status == "pass"
    three = {row.metric: row for row in _run(result, 3).divergence}
    assert three["accuracy"].naive == 7 / 12 and three["accuracy"].naive_diff == pytest.approx(7 / 12 - 0.7)


def test_drop_last_fails_and_says_why() -> None:
    result = _check(FIXTURES / "divergence_drop_last.py", (1, 2, 3))
    assert result.exit_code == 1
    assert _metric_verdict(_run(result, 1)).status == "pass"
    assert _metric_verdict(_run(result, 2)).status == "pass"  # 10 splits evenly: nothing dropped
    verdict = _metric_verdict(_run(result, 3))
    assert verdict.failed
    assert "1 sample dropped by drop_last never reaches any rank" in verdict.detail
    assert "use padding + ids_key dedup for evaluation" in verdict.detail
    labels = [1, 0, 1, 0, 1, 0, 1, 0, 1, 1]
    rows = {row.metric: row for row in _run(result, 3).divergence}
    assert rows["samples"].reference == 10 and rows["samples"].corrected == 9 and rows["samples"].dropped == 1
    assert rows["positive_rate"].reference == pytest.approx(sum(labels) / 10)
    assert rows["positive_rate"].corrected == pytest.approx(sum(labels[:9]) / 9)


def test_order_sensitive_metric_only_the_id_ordered_gather_gets_right() -> None:
    relevant = [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0]

    def dcg(order: list[int]) -> float:
        return sum(relevant[i] / math.log2(pos + 2) for pos, i in enumerate(order))

    result = _check(FIXTURES / "divergence_ranking.py", (2, 3))
    assert result.exit_code == 0
    for ws in (2, 3):
        order = _padded_order(12, ws)  # 12 splits evenly: only the order changes
        rows = {row.metric: row for row in _run(result, ws).divergence}
        assert rows["precision@4"].reference == 1.0
        assert rows["precision@4"].naive == sum(relevant[i] for i in order[:4]) / 4 == 0.5
        assert rows["dcg"].naive == pytest.approx(dcg(order), rel=1e-12)
        assert rows["dcg"].corrected == pytest.approx(dcg(list(range(12))), rel=1e-12)
        assert all(row.order_only and row.duplicated == 0 and row.dropped == 0 for row in rows.values())
        assert _metric_verdict(_run(result, ws)).status == "pass"


def test_metrics_flag_uses_the_defaults_on_a_file_without_hooks() -> None:
    path = FIXTURES / "good_eval_no_shuffle.py"  # TensorDataset(arange(101)), no hooks
    plain = _check(path, (2,))
    assert all(v.check != METRIC_EQUIVALENCE for run in plain.runs for v in run.verdicts)
    assert not any(run.divergence for run in plain.runs)
    result = _check(path, (2,), metrics=True)
    rows = {row.metric: row for row in _run(result, 2).divergence}
    assert rows["samples"].naive == 102 and rows["samples"].corrected == 101  # sample 0 padded once
    assert rows["mean(field0)"].reference == 50.0
    assert rows["mean(field0)"].naive == pytest.approx(5050 / 102, rel=1e-12)
    assert _metric_verdict(_run(result, 2)).status == "pass"


def test_simulate_skips_the_metric_check() -> None:
    result = _check(FIXTURES / "divergence_ranking.py", (2,), simulate=True)
    verdict = _metric_verdict(_run(result, 2))
    assert verdict.status == "skip" and "real gloo ranks" in verdict.detail


EMPTY_RANK = """
import torch
from torch.utils.data import DataLoader, Sampler, TensorDataset

class Strided(Sampler):
    def __init__(self, n, rank, world_size):
        self.indices = list(range(n))[rank::world_size]
    def __iter__(self):
        return iter(self.indices)
    def __len__(self):
        return len(self.indices)

def make_loader(rank, world_size):
    data = TensorDataset(torch.tensor([[1.0], [3.0]]), torch.tensor([1, 0]))
    return DataLoader(data, batch_size=2, sampler=Strided(2, rank, world_size))

def forward(batch):
    return {"score": batch[0][:, 0].double(), "label": batch[1]}
"""


def test_a_rank_without_batches_still_gathers(tmp_path: Path) -> None:
    path = tmp_path / "empty_rank.py"
    path.write_text(EMPTY_RANK, encoding="utf-8")
    result = _check(path, (3,))  # rank 2 gets no sample
    run = _run(result, 3)
    assert not run.failures, run.failures
    rows = {row.metric: row for row in run.divergence}
    assert rows["samples"].naive == 2 and rows["mean(score)"].corrected == 2.0
    assert _metric_verdict(run).status == "pass"


def test_a_bad_forward_is_a_rank_failure_with_a_clear_message(tmp_path: Path) -> None:
    path = tmp_path / "bad_forward.py"
    path.write_text(
        EMPTY_RANK.replace(
            '{"score": batch[0][:, 0].double(), "label": batch[1]}', '{"score": batch[0][:1]}'
        ),
        encoding="utf-8",
    )
    result = _check(path, (1,))
    assert result.exit_code == 3
    (failure,) = _run(result, 1).failures
    assert failure.message.startswith("metric_equivalence: forward(batch) key 'score' has 1 rows")


def test_cli_writes_the_divergence_rows(tmp_path: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "ddpcheck",
        str(FIXTURES / "divergence_padding_accuracy.py"),
        "--world-sizes",
        "1,3",
        "--epochs",
        "1",
        "--no-determinism",
        "--quiet",
        "--report-dir",
        str(tmp_path),
    ]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "Divergence" in proc.stdout and "duplicated 2" in proc.stdout
    report = json.loads((tmp_path / "ddpcheck.json").read_text(encoding="utf-8"))
    three = next(run for run in report["runs"] if run["world_size"] == 3)
    assert three["checks"][METRIC_EQUIVALENCE]["status"] == "pass"
    rows = {row["metric"]: row for row in three["divergence"]}
    assert rows["accuracy"]["reference"] == 0.7 and rows["accuracy"]["corrected"] == 0.7
    assert rows["accuracy"]["naive"] == 7 / 12
    assert rows["samples"] == {
        "metric": "samples",
        "reference": 10,
        "naive": 12,
        "corrected": 10,
        "naive_diff": 2,
        "corrected_diff": 0,
        "duplicated": 2,
        "dropped": 0,
        "order_only": False,
        "cause": "padding copies; ids_key dedup removes them",
    }
    assert report["options"]["metric_tolerance"] is None and report["options"]["train_steps"] == 3


# --------------------------------------------------------------------------- --factory-arg reaches the check


def _cli_json(tmp_path: Path, fixture: str, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    command = [sys.executable, "-m", "ddpcheck", str(FIXTURES / fixture), "--epochs", "1", "--no-determinism",
               "--no-resume", "--quiet", "--report-dir", str(tmp_path), *args]  # fmt: skip
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    report = json.loads((tmp_path / "ddpcheck.json").read_text(encoding="utf-8"))
    return proc, report


@pytest.mark.parametrize("drop_last", [False, True])
def test_factory_args_reach_the_metric_check(tmp_path: Path, drop_last: bool) -> None:
    """``make_loader(rank, world_size, drop_last)``: only ``--factory-arg`` can call it, in every rank the
    metric check starts too; the verdict follows the argument (drop_last drops sample 9 at world size 3)."""
    arg = f"drop_last={drop_last}"
    proc, report = _cli_json(
        tmp_path, "divergence_factory_arg.py", "--world-sizes", "1,3", "--factory-arg", arg
    )
    assert proc.returncode == (1 if drop_last else 0), proc.stderr + proc.stdout
    runs = {run["world_size"]: run for run in report["runs"]}
    assert all(not run["failures"] for run in runs.values()), [run["failures"] for run in runs.values()]
    assert runs[1]["checks"][METRIC_EQUIVALENCE]["status"] == "pass"
    assert runs[3]["checks"][METRIC_EQUIVALENCE]["status"] == ("fail" if drop_last else "pass")
    samples = {row["metric"]: row for row in runs[3]["divergence"]}["samples"]
    assert samples["reference"] == 10
    assert samples["corrected"] == (9 if drop_last else 10) and samples["dropped"] == (1 if drop_last else 0)
    assert samples["naive"] == (9 if drop_last else 12)  # padding: samples 0 and 1 twice
