"""``ddpcheck.record --fingerprint`` (issue 37 item 2): the tables add up as the sets they summarise, and
under a real ``python -m torch.distributed.run --standalone`` the verdict is held to what the script's own
loop received without ddpcheck (``fixtures/scale/train_fingerprint.py --truth``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ddpcheck.checker.fingerprint import BUCKETS, fold, index_table
from tests.conftest import ROOT

SCRIPT = ROOT / "fixtures" / "scale" / "train_fingerprint.py"
WORLD = 3
TIMEOUT = 300


def test_tables_add_up_as_the_multisets_they_summarise() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.integers(-(2**40), 2**40, 5000), rng.integers(0, 3000, 7000)
    joined = fold(iter([np.concatenate([a, b])]))
    with np.errstate(over="ignore"):
        assert np.array_equal(joined, fold(iter([b])) + fold(iter([a])))  # wrapping sums, any order
    assert np.array_equal(joined, fold(iter([rng.permutation(np.concatenate([a, b]))])))
    assert joined.shape == (2, BUCKETS) and joined[0].sum() == 12000
    twice = fold(iter([np.concatenate([a, b, b[:1]])]))
    assert (twice != joined).any(axis=0).sum() == 1  # one id more: one bucket differs
    with np.errstate(over="ignore"):
        slices = sum(index_table(10_007, r, 4) for r in range(4))
    assert np.array_equal(slices, fold(iter([np.arange(10_007)])))


def _torchrun(out: Path, *args: str, ddpcheck: bool) -> subprocess.CompletedProcess[str]:
    ours = ["-m", "ddpcheck.record", "--fingerprint", "--out", str(out), "--"] if ddpcheck else []
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}",
               *ours, str(SCRIPT), *args]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, env=env, cwd=ROOT)


def _truth(tmp: Path, *args: str) -> list[dict[str, Any]]:
    """Per epoch, measured from what every rank's loop received (no ddpcheck in the launch)."""
    tmp.mkdir()
    proc = _torchrun(tmp, *args, "--truth", str(tmp), ddpcheck=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [np.load(tmp / f"truth-rank{r}.npz") for r in range(WORLD)]
    out = []
    for epoch in range(2):
        got = [r[f"epoch{epoch}"] for r in ranks]
        values, counts = np.unique(np.concatenate(got), return_counts=True)
        n = int(args[args.index("--size") + 1])
        twice = {int(x): [r for r in range(WORLD) if x in got[r]] for x in values[counts > 1]}
        out.append(
            {"extra": int((counts - 1).sum()), "never": set(range(n)) - set(values.tolist()), "twice": twice}
        )
    return out


def _fingerprint(tmp: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    proc = _torchrun(tmp, *args, ddpcheck=True)
    return proc, json.loads((tmp / "fingerprint-rank0.json").read_text())


Launched = tuple[list[dict[str, Any]], subprocess.CompletedProcess[str], dict[str, Any], Path]


def _launched(tmp: Path, *args: str) -> Launched:
    truth = _truth(tmp / "truth", *args)
    proc, found = _fingerprint(tmp / "fp", *args)
    return truth, proc, found, tmp / "fp"


@pytest.fixture(scope="module")
def overlapping(tmp_path_factory: pytest.TempPathFactory) -> Launched:
    """Rank 1 starts with rank 0's first 7 indices (one launch shared by the tests that read it)."""
    return _launched(tmp_path_factory.mktemp("overlap"), "--size", "20000", "--overlap", "7")


@pytest.fixture(scope="module")
def correct(tmp_path_factory: pytest.TempPathFactory) -> Launched:
    """The neighbour: the same loop without the overlap; 20,000 indices over 3 ranks pad one copy."""
    return _launched(tmp_path_factory.mktemp("correct"), "--size", "20000")


def test_a_planted_overlap_is_found_counted_and_named(overlapping: Launched) -> None:
    truth, proc, found, out = overlapping
    assert proc.returncode != 0 and not found["ok"], proc.stderr[-3000:]
    assert "FAIL: 8 extra copies" in proc.stderr  # 7 planted, 1 padding copy (20,000 over 3 ranks)
    for epoch, measured in zip(found["epochs"], truth, strict=True):
        assert epoch["status"] == "fail" and epoch["exact"]
        assert epoch["extra"] == measured["extra"] == 8 and epoch["missing"] == len(measured["never"]) == 7
        assert epoch["twice"] and all(measured["twice"][x] == ranks for x, ranks in epoch["twice"])
        assert epoch["never"] and set(epoch["never"]) <= measured["never"]
    assert not list(out.glob(".fingerprint-*")) and not list(out.glob("*.trace"))


def test_a_correct_loop_passes_with_only_its_padding(correct: Launched) -> None:
    truth, proc, found, _ = correct
    assert proc.returncode == 0 and found["ok"], proc.stderr[-3000:]
    for epoch, measured in zip(found["epochs"], truth, strict=True):
        assert measured["extra"] == 1 and not measured["never"]
        assert epoch["status"] == "allowed" and epoch["extra"] == 1 and epoch["missing"] == 0
        assert "within what the sampler says it pads" in epoch["detail"]


def _judge(out: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """``python -m ddpcheck judge`` on a --fingerprint directory, its JSON report read back."""
    reports = out.parent / f"reports-{out.name}"
    command = [sys.executable, "-m", "ddpcheck", "judge", str(out), "--report-dir", str(reports), *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, env=env, cwd=ROOT)
    found = (reports / "ddpcheck.json").read_text() if (reports / "ddpcheck.json").exists() else "{}"
    return proc, json.loads(found)


def _verdicts(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    (run,) = report["runs"]
    checks: dict[str, dict[str, Any]] = run["checks"]
    return checks


def test_judge_reports_a_planted_overlap_with_its_named_samples(overlapping: Launched) -> None:
    truth, _, _, out = overlapping
    proc, report = _judge(out, "--format", "markdown")
    assert proc.returncode == 1, proc.stderr[-3000:]
    verdicts = _verdicts(report)
    assert {c: verdicts[c]["status"] for c in ("coverage", "no_overlap")} == {
        "coverage": "fail",
        "no_overlap": "fail",
    }
    overlap = verdicts["no_overlap"]
    assert overlap["examples"] and all(x in truth[0]["twice"] for x in overlap["examples"])
    for x in overlap["examples"]:  # each named sample on exactly the ranks the loop measured
        assert f"sample {x} on ranks {', '.join(map(str, truth[0]['twice'][x]))}" in overlap["detail"]
    assert set(verdicts["coverage"]["examples"]) <= truth[0]["never"] and verdicts["coverage"]["examples"]
    assert verdicts["reshuffle"]["status"] == "n/a" and "--fingerprint" in verdicts["reshuffle"]["detail"]
    assert "no_overlap" in proc.stdout and "sample" in proc.stdout  # the Markdown printout names them


def test_judge_passes_the_correct_loop_and_says_what_it_cannot_judge(correct: Launched) -> None:
    _, _, _, out = correct
    proc, report = _judge(out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    verdicts = _verdicts(report)
    assert [verdicts[c]["status"] for c in ("coverage", "no_overlap", "padding_bound")] == ["pass"] * 3
    unjudged = {c for c, v in verdicts.items() if v["status"] == "n/a"}
    assert {"equal_steps", "reshuffle", "determinism", "replica_consistency"} <= unjudged
    said = " ".join(proc.stdout.split())  # the table wraps its notes to the terminal's width
    assert "PASS" in said and "replica_consistency are n/a" in said  # reasons folded on the first screen
    assert "not kept by a --fingerprint recording" in verdicts["reshuffle"]["detail"]  # kept in the report


def test_judge_refuses_what_a_fingerprint_directory_cannot_answer(correct: Launched, tmp_path: Path) -> None:
    _, _, _, out = correct
    proc, _ = _judge(out, "--reference", str(out))
    assert proc.returncode == 2 and "holds no ids to compare" in proc.stderr
    assert "Traceback" not in proc.stderr
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "fingerprint-rank0.json").write_text('{"ok": true}')
    proc, _ = _judge(tmp_path / "bad")
    assert proc.returncode == 2 and "is not a verdict of ddpcheck.record --fingerprint" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("n", ["20001"])
def test_every_index_once_passes(tmp_path: Path, n: str) -> None:
    proc, found = _fingerprint(tmp_path, "--size", n)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [e["status"] for e in found["epochs"]] == ["pass", "pass"]
    assert "every index of 0..20,000 yielded exactly once over 3 ranks" in proc.stderr
