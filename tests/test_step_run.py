"""The step checks through ``ddpcheck run`` (issue 35): the training-step fixtures run as the user runs
them, on real gloo ranks and a real one-process replay, their verdicts held to the truth each fixture's
own loop logged under torchrun without ddpcheck (``fixtures/steps/truth_results.jsonl``; see
``fixtures/steps/NOTES.md``). The checks themselves are held to every fixture's truth in
``tests/test_step_truth.py``; here, what the session wires: the replay launch, the loader the step is
attached to, ``--no-step``, ``--allow`` and ``ddpcheck judge --replay``. The mesh fixtures build a 2 x 2
mesh whatever the world size, so they cannot run at one process as ``ddpcheck run`` needs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ddpcheck.checks.step import PER_RANK_NORM
from ddpcheck.result import CheckResult, WorldResult
from ddpcheck.session.script import check_script
from ddpcheck.verdict import EQUAL_MICROSTEPS, RNG_INDEPENDENCE, STEP_EQUIVALENCE, SUPERVISION
from tests.conftest import FIXTURES

STEPS = FIXTURES / "steps"
TOL = 1e-5  # float32's tolerance (ddpcheck.checks.step.TOLERANCE)
STEP_IDS = (SUPERVISION, RNG_INDEPENDENCE, STEP_EQUIVALENCE, EQUAL_MICROSTEPS)


def _truth() -> dict[tuple[str, int], dict[str, Any]]:
    rows = [json.loads(line) for line in (STEPS / "truth_results.jsonl").read_text().splitlines()]
    return {(row["script"], row["nproc"]): row["facts"] for row in rows}


TRUTH = _truth()


def _truly_failing(name: str, nproc: int) -> set[str]:
    """The step checks the truth says fail: gradients apart from the replay (beyond float noise, and not
    the exact 1/world of a loss summed over a fixed normaliser), ranks' backward or forward counts apart,
    a micro-batch without a supervised label, first draws equal on two ranks' workers or loops."""
    facts = TRUTH[(name, nproc)]
    failing = set()
    steps = facts.get("per_step", [])
    apart = any(p["rel_diff"] is None or p["rel_diff"] > TOL for p in steps)
    exact_share = facts.get("loss_scale") == "sum" and all(abs(p["c"] - 1 / nproc) < 1e-5 for p in steps)
    if (apart and not exact_share) or any(facts["nan_steps"].values()):
        failing.add(STEP_EQUIVALENCE)
    if facts["backward_differ"] or facts["forwards_differ"]:
        failing.add(EQUAL_MICROSTEPS)
    if facts["unsupervised"] or facts["empty"]:
        failing.add(SUPERVISION)
    if any(
        a[1] != b[1] for a, b in facts.get("fetch_equal_pairs", [])
    ):  # "r0w0" and "r1w0": two ranks, not two workers of one
        failing.add(RNG_INDEPENDENCE)
    return failing


def _run(name: str, **options: Any) -> CheckResult:
    settings: dict[str, Any] = {"world_sizes": (1, 2), "model_steps": None, "determinism": False}
    return check_script(str(STEPS / f"{name}.py"), timeout=240.0, **{**settings, **options})


def _step_result(result: CheckResult, world_size: int) -> WorldResult:
    """The result row that carries the step checks at ``world_size`` (exactly one does)."""
    rows = [
        r
        for r in result.runs
        if r.world_size == world_size and any(v.check == STEP_EQUIVALENCE for v in r.verdicts)
    ]
    assert len(rows) == 1, [(r.loader, [v.check for v in r.verdicts]) for r in result.runs]
    return rows[0]


CAUSES = {  # fixture -> what the failing step check must name
    "bug_rank_mean_ce": "supervised-token counts differ",
    "bug_accum_tail_constant": "only the epoch's last accumulation window differs",
    "bug_token_budget": "",
    "bug_sft_all_masked": "",
    "bug_same_seed_workers": "the same torch.manual_seed on every rank",
    "good_global_token_mean": "",
    "good_seed_by_rank_workers": "",
    "bug_augment_main_same_seed": "the ranks load with the same torch state",
    "good_shard_shuffle_same_seed": "",  # the samplers' seed draws alike are the order, not loading
    "bug_global_count_no_world": "1 / the world size",  # the loss probe finds a mean: the factor stays
    "bug_sft_masked_accelerate": "every label is the ignore index",  # fetched one ahead by Accelerate
    "good_sum_fixed_norm": "",  # the loss probe finds a sum: compared with the replay / world size
    "good_batchnorm_per_rank": "",  # BatchNorm per rank, on purpose: the replay normalises each rank's part
    "bug_batchnorm_rank_mean": "supervised-token counts differ",  # the same model, a loss mean per rank
}


@pytest.mark.parametrize("name", sorted(CAUSES))
def test_step_verdicts_through_ddpcheck_run_are_the_truth(name: str) -> None:
    result = _run(name)
    assert not [f for r in result.runs for f in r.failures], [
        f.message for r in result.runs for f in r.failures
    ]
    expected = _truly_failing(name, 2)
    row = _step_result(result, 2)
    statuses = {v.check: v for v in row.verdicts if v.check in STEP_IDS}
    assert set(statuses) == set(STEP_IDS)
    if "per_step" not in TRUTH[(name, 2)]:  # the truth did not replay it: the gradient is not measured
        del statuses[STEP_EQUIVALENCE]
    else:
        assert statuses[STEP_EQUIVALENCE].status in ("pass", "fail"), statuses[STEP_EQUIVALENCE]  # compared
    failed = {c for c, v in statuses.items() if v.status == "fail"}
    assert failed == expected, {c: (v.status, v.detail, v.cause) for c, v in statuses.items()}
    if CAUSES[name]:
        assert any(CAUSES[name] in statuses[c].cause for c in failed), [statuses[c].cause for c in failed]
    if "batchnorm_per_rank" in name or "batchnorm_rank_mean" in name:
        assert PER_RANK_NORM in statuses[STEP_EQUIVALENCE].detail, statuses[STEP_EQUIVALENCE].detail
    assert result.ok == (not [v for r in result.runs for v in r.verdicts if v.failed])
    single = _step_result(result, 1)
    one = {v.check: v.status for v in single.verdicts if v.check in STEP_IDS}
    assert one[STEP_EQUIVALENCE] == "n/a" and one[EQUAL_MICROSTEPS] == "n/a"
    assert {c for c, s in one.items() if s == "fail"} == _truly_failing(name, 1) - {STEP_EQUIVALENCE}


def test_no_step_leaves_the_loader_checks_alone() -> None:
    result = _run("bug_rank_mean_ce", step=False)
    checks = {v.check for r in result.runs for v in r.verdicts}
    assert STEP_EQUIVALENCE not in checks and EQUAL_MICROSTEPS not in checks
    assert result.ok  # the loader is correct; the bug lives in the step, which was not watched


def test_allow_turns_a_step_failure_into_allowed() -> None:
    result = _run("bug_two_tower", allow=(EQUAL_MICROSTEPS,))  # its averaged gradient is exact (truth)
    verdict = next(v for v in _step_result(result, 2).verdicts if v.check == EQUAL_MICROSTEPS)
    assert verdict.status == "allowed" and result.ok


def _torchrun(nproc: int, out: Path, *ours: str, name: str = "bug_rank_mean_ce") -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    command += ["-m", "ddpcheck.record", "--out", str(out), "--model-steps", "all", "--step", *ours]
    done = subprocess.run(
        [*command, "--", f"{name}.py"], cwd=STEPS, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_launch_recorded_under_torchrun_and_its_replay_are_judged_later(tmp_path: Path) -> None:
    """The user's own launch (a real torchrun) recorded with --step, its replay at one process, then
    ``ddpcheck judge --replay``: the verdict ``ddpcheck run`` gives, and the truth's."""
    run, replay = tmp_path / "run", tmp_path / "replay"
    _torchrun(2, run)
    _torchrun(1, replay, "--replay", str(run))
    report = tmp_path / "reports"
    judge = [sys.executable, "-m", "ddpcheck", "judge", str(run), "--report-dir", str(report), "-q"]
    proc = subprocess.run([*judge, "--replay", str(replay)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = json.loads((report / "ddpcheck.json").read_text())["runs"]
    judged = next(r["checks"] for r in rows if STEP_EQUIVALENCE in r["checks"])
    assert judged[STEP_EQUIVALENCE]["status"] == "fail"
    first = TRUTH[("bug_rank_mean_ce", 2)]["per_step"][0]["rel_diff"]
    assert f"by {first:.2g} at step 0" in judged[STEP_EQUIVALENCE]["detail"]
    assert "supervised-token counts differ" in judged[STEP_EQUIVALENCE]["cause"]
    without = subprocess.run(judge, capture_output=True, text=True, timeout=120)  # no replay: n/a, why
    rows = json.loads((report / "ddpcheck.json").read_text())["runs"]
    judged = next(r["checks"] for r in rows if STEP_EQUIVALENCE in r["checks"])
    assert (
        judged[STEP_EQUIVALENCE]["status"] == "n/a"
        and "no --replay given" in judged[STEP_EQUIVALENCE]["detail"]
    )
    assert without.returncode == 0, without.stdout + without.stderr
    wrong = subprocess.run([*judge, "--replay", str(run)], capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 2 and "holds no one-process replay" in wrong.stderr


def test_a_users_own_launch_judged_with_the_loss_probe(tmp_path: Path) -> None:
    """``good_sum_fixed_norm`` (a loss summed over a fixed per-rank normaliser, correct) under a real
    torchrun: judged with its replay alone, the exact factor 1/2 is a failure that says the loss was not
    probed; with the replay fed every batch twice as well (``--replay-twice``) it passes, as its truth."""
    name = "good_sum_fixed_norm"
    run, replay, twice = tmp_path / "run", tmp_path / "replay", tmp_path / "twice"
    _torchrun(2, run, name=name)
    _torchrun(1, replay, "--replay", str(run), name=name)
    _torchrun(1, twice, "--replay", str(run), "--replay-twice", name=name)
    report = tmp_path / "reports"
    judge = [sys.executable, "-m", "ddpcheck", "judge", str(run), "--report-dir", str(report), "-q"]
    judge += ["--replay", str(replay)]

    def step_verdict() -> dict[str, Any]:
        rows = json.loads((report / "ddpcheck.json").read_text())["runs"]
        return next(r["checks"][STEP_EQUIVALENCE] for r in rows if STEP_EQUIVALENCE in r["checks"])

    alone = subprocess.run(judge, capture_output=True, text=True, timeout=120)
    assert alone.returncode == 1 and "did not probe the loss" in step_verdict()["cause"], alone.stdout
    probe = [*judge, "--replay-twice", str(twice)]
    probed = subprocess.run(probe, capture_output=True, text=True, timeout=120)
    assert probed.returncode == 0, probed.stdout + probed.stderr
    assert step_verdict()["status"] == "pass" and "fixed normaliser" in step_verdict()["detail"]
    swapped = [*judge[:-2], "--replay", str(twice), "--replay-twice", str(replay)]
    wrong = subprocess.run(swapped, capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 2 and "holds no one-process replay" in wrong.stderr
