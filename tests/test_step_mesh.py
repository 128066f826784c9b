"""The step checks on device meshes (issue 42), through ``ddpcheck run --mesh``, held to the truth.

The fixtures are training scripts in ``fixtures/steps/`` whose truth ``fixtures/steps/truth.py`` measured
without ddpcheck under a real torchrun (4 processes as a dp=2 x tp=2 or dp=2 x cp=2 mesh, 2 as dp=1 x cp=2,
and 1): each rank's batches and what a cp rank fed its model, the
whole gradient before every optimizer step (DTensors gathered by the truth's own collective), and the
gradient of one process fed the union of one rank per data-parallel coordinate from the run's weights
(``truth_results.jsonl``, ``NOTES.md``). A tensor-parallel model's parameters are DTensors: ddpcheck reads
each rank's shard and puts them together, without a collective of its own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ddpcheck.cli import main
from ddpcheck.verdict import (
    COVERAGE,
    REPLICA_CONSISTENCY,
    SEQUENCE_SPLIT,
    SINGLE_PROCESS_EQUIVALENCE,
    STEP_EQUIVALENCE,
)
from tests.conftest import FIXTURES

STEPS = FIXTURES / "steps"
TOL = 1e-5  # float32's tolerance (ddpcheck.checks.step.TOLERANCE)
TRUTH: dict[tuple[str, int], dict[str, Any]] = {
    (row["script"], row["nproc"]): row["facts"]
    for row in map(json.loads, (STEPS / "truth_results.jsonl").read_text().splitlines())
}


def _run(name: str, mesh: str, tmp_path: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "reports"
    argv = ["--mesh", mesh, "--world-sizes", "1", "--no-determinism", "--epochs", "1", "--timeout", "240"]
    code = main(["run", *argv, *extra, "--report-dir", str(out), "--quiet", "--", str(STEPS / f"{name}.py")])
    return code, json.loads((out / "ddpcheck.json").read_text())


def _mesh_checks(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    (run,) = [r for r in report["runs"] if r["mesh"] is not None]
    assert not run["failures"], run["failures"]
    return run["checks"]


@pytest.mark.slow
def test_a_tensor_parallel_model_is_compared_and_passes(tmp_path: Path) -> None:
    """``parallelize_module`` over tp and FSDP2 over dp: every parameter a DTensor. The run ends 0 (no rank
    failure), and its step equals one process's, as the truth measured (rel. diff <= 1.3e-7)."""
    facts = TRUTH[("good_tp_fsdp", 4)]
    assert all(p["rel_diff"] < TOL for p in facts["per_step"]) and not facts["peers_ids_differ"]
    code, report = _run("good_tp_fsdp", "dp=2,tp=2", tmp_path)
    assert code == 0, json.dumps(report["causes"], indent=1)[:3000]
    checks = _mesh_checks(report)
    step = checks[STEP_EQUIVALENCE]
    assert step["status"] == "pass" and "2 compared steps" in step["detail"], step


@pytest.mark.slow
def test_a_tensor_parallel_script_sharded_by_the_global_rank_still_fails(tmp_path: Path) -> None:
    """The same model, its sampler given the global rank: tensor peers are handed different samples (the
    truth: ranks 1 and 3 differ from their peers, 16 of 32 samples reach the data-parallel view), and their
    shards of the replicated bias's gradient differ (0.61)."""
    facts = TRUTH[("bug_tp_global_rank", 4)]
    assert facts["peers_ids_differ"] == [1, 3] and facts["dp_view_samples"] == 16
    code, report = _run("bug_tp_global_rank", "dp=2,tp=2", tmp_path)
    assert code == 1, json.dumps(report["causes"], indent=1)[:3000]
    checks = _mesh_checks(report)
    failed = {c for c, v in checks.items() if v["status"] == "fail"}
    assert {COVERAGE, REPLICA_CONSISTENCY, STEP_EQUIVALENCE} <= failed <= {
        COVERAGE, REPLICA_CONSISTENCY, STEP_EQUIVALENCE, SINGLE_PROCESS_EQUIVALENCE
    }, failed  # fmt: skip
    assert "global rank" in checks[COVERAGE]["cause"]
    assert f"by {facts['ranks_grad_diff']:.2g} (rel. L2)" in checks[STEP_EQUIVALENCE]["detail"]


CONTEXT_RUNS = [
    ("good_cp_contiguous", "dp=2,cp=2"),
    ("good_cp_zigzag", "dp=2,cp=2"),
    ("bug_cp_zigzag_off_by_one", "dp=2,cp=2"),
    ("bug_cp_positions_per_slice", "dp=1,cp=2"),
    ("bug_cp_labels_per_slice", "dp=2,cp=2"),
    ("bug_cp_labels_per_slice", "dp=1,cp=2"),
    ("good_cp_zigzag", "dp=1,cp=2"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "mesh"), CONTEXT_RUNS, ids=[f"{n}-{m}" for n, m in CONTEXT_RUNS])
def test_context_parallel_scripts_through_ddpcheck_run_are_the_truth(
    name: str, mesh: str, tmp_path: Path
) -> None:
    """Each cp fixture as a user runs it (``ddpcheck run --mesh dp=2,cp=2`` or ``dp=1,cp=2``): the step is
    compared with one process on the whole sequences at every mesh, dp=1 included, and
    ``sequence_split`` reads what the cp ranks fed their models; both verdicts are the truth's."""
    nproc = 2 if mesh.startswith("dp=1") else 4
    facts = TRUTH[(name, nproc)]
    code, report = _run(name, mesh, tmp_path)
    checks = _mesh_checks(report)
    split, step = checks[SEQUENCE_SPLIT], checks[STEP_EQUIVALENCE]
    wrong = (
        facts["positions_held_twice"] or facts["positions_held_by_none"] or facts["tokens_misplaced_ranks"]
    )
    apart = any(p["rel_diff"] > TOL for p in facts["per_step"])
    assert split["status"] == ("fail" if wrong else "pass"), split
    assert step["status"] == ("fail" if apart else "pass"), step
    assert code == (1 if wrong or apart else 0), json.dumps(report["causes"], indent=1)[:3000]
    if facts["positions_restarted_ranks"]:
        assert split["cause"].startswith("positions restarted per slice"), split["cause"]
    if facts["positions_held_twice"] and not facts["positions_restarted_ranks"]:
        assert "is held by two ranks" in split["cause"], split["cause"]
