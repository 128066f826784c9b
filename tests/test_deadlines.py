"""``--timeout`` is time without progress on a rank; ``--max-time`` is a cap on a group's whole time.

Real processes, small numbers: a loader whose sampler yields every 25 ms (a batch every 50 ms) for longer
than the timeout in all passes; a rank that stops yielding (rank 1 of 2) is reported as hung within the
timeout plus a generous slack, named with its stack, and the single-process reference (which finished) is
not blamed; ``--max-time`` ends a steady run in words of its own. The same in every mode: loader files
with real and simulated ranks, training scripts (``ddpcheck run``, whose ranks run ``ddpcheck.record``),
and the pytest plugin. The fixtures' truth (``fixtures/progress/truth_results.jsonl``) was measured
without ddpcheck under torchrun: it says the steady runs last longer than the timeout with no gap near
it, and that rank 1 of the stalled loader yields 3 batches, then nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROGRESS = ROOT / "fixtures" / "progress"
STEADY = PROGRESS / "good_steady_sampler.py"
STALLED = PROGRESS / "stalled_rank.py"
# What a stall may take beyond --timeout before it is reported: the watchdog's wake-up, the stack dump
# (at most ~2.5 s), killing the group. Stated generously: these tests share two cores with other jobs.
SLACK_S = 30.0


def _truth(name: str) -> list[dict[str, Any]]:
    lines = (PROGRESS / "truth_results.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if row["file"] == name]


def _ddpcheck(*args: str, tmp: Path, timeout: float = 300) -> tuple[subprocess.CompletedProcess[str], dict]:
    command = [sys.executable, "-m", "ddpcheck", *args, "--quiet", "--report-dir", str(tmp)]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    report = tmp / "ddpcheck.json"
    return proc, json.loads(report.read_text()) if report.exists() else {}


def test_the_fixtures_truth_is_what_the_tests_rely_on() -> None:
    for name, timeout in (("good_steady_sampler.py", 1.5), ("script_steady.py", 3.0)):
        rows = _truth(name)
        assert {r["world_size"] for r in rows} == {1, 2}
        assert all(r["total_s"] > timeout and r["max_gap_s"] < timeout / 3 for r in rows), rows
    stalled = {(r["world_size"], r["rank"]): r for r in _truth("stalled_rank.py")}
    assert stalled[(2, 1)]["stalled_after"] == 3
    assert all(stalled[k]["stalled_after"] is None for k in ((1, 0), (2, 0)))


@pytest.mark.parametrize("mode", [(), ("--simulate",)], ids=["real", "simulated"])
def test_a_rank_that_keeps_yielding_longer_than_the_timeout_passes(
    mode: tuple[str, ...], tmp_path: Path
) -> None:
    proc, report = _ddpcheck(
        str(STEADY), "--world-sizes", "1,2", "--timeout", "1.5", "--no-resume", *mode, tmp=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert all(run["ok"] and not run["failures"] for run in report["runs"])


@pytest.mark.parametrize("mode", [(), ("--simulate",)], ids=["real", "simulated"])
def test_a_rank_that_stops_yielding_is_named_within_the_timeout(
    mode: tuple[str, ...], tmp_path: Path
) -> None:
    proc, report = _ddpcheck(str(STALLED), "--world-sizes", "1,2", "--timeout", "3", *mode, tmp=tmp_path)
    assert proc.returncode == 3, proc.stderr[-3000:]
    runs = {run["world_size"]: run for run in report["runs"]}
    assert runs[1]["ok"] and not runs[1]["failures"]  # the reference finished: it is not blamed
    hung = [f for f in runs[2]["failures"] if f["kind"] == "hang"]
    assert [f["rank"] for f in hung] == [1], runs[2]["failures"]
    assert hung[0]["message"].startswith("no progress for ") and "(--timeout 3), since " in hung[0]["message"]
    assert hung[0]["progress"].startswith("epoch 0, batch 4")  # the truth: 3 batches, then nothing
    assert "stalled_rank.py" in hung[0]["stack"] and "in __iter__" in hung[0]["stack"]
    assert runs[2]["seconds"] < 3 + SLACK_S


def test_max_time_ends_a_steady_run_in_its_own_words(tmp_path: Path) -> None:
    proc, report = _ddpcheck(
        str(STEADY), "--world-sizes", "1", "--max-time", "1", "--format", "json", tmp=tmp_path
    )
    assert proc.returncode == 3, proc.stderr[-3000:]
    (failure,) = report["runs"][0]["failures"]
    assert failure["kind"] == "overtime" and "--max-time (1 s) ran out" in failure["message"]
    assert "epoch" in failure["progress"]
    proc, _ = _ddpcheck(str(STEADY), "--world-sizes", "1", "--max-time", "1", tmp=tmp_path / "text")
    assert "ran past --max-time" in (tmp_path / "text" / "ddpcheck.md").read_text()
    assert "hung" not in (tmp_path / "text" / "ddpcheck.md").read_text()


def _run_script(*args: str, tmp: Path) -> tuple[subprocess.CompletedProcess[str], dict]:
    command = [
        sys.executable,
        "-m",
        "ddpcheck",
        "run",
        "--world-sizes",
        "1,2",
        "--no-determinism",
        "--no-step",
    ]
    command += [*args[:-1], "--quiet", "--report-dir", str(tmp), "--", args[-1]]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    report = tmp / "ddpcheck.json"
    return proc, json.loads(report.read_text()) if report.exists() else {}


def test_a_training_script_that_keeps_yielding_longer_than_the_timeout_passes(tmp_path: Path) -> None:
    proc, report = _run_script(
        "--epochs", "4", "--timeout", "3", str(PROGRESS / "script_steady.py"), tmp=tmp_path
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert all(not run["failures"] for run in report["runs"])


def test_a_training_script_rank_that_stops_is_named_within_the_timeout(tmp_path: Path) -> None:
    started = time.monotonic()
    script = ROOT / "fixtures" / "scripts" / "faults" / "hangs.py"
    proc, report = _run_script("--timeout", "3", str(script), tmp=tmp_path)
    assert proc.returncode == 3, proc.stdout[-3000:]
    failures = [f for run in report["runs"] for f in run["failures"]]
    hung = [f for f in failures if f["kind"] == "hang"]
    assert [f["rank"] for f in hung] == [1], failures  # rank 0, waiting in its barrier, is not the cause
    assert "rank 1 made no progress for " in hung[0]["message"] and "hangs.py line 16" in hung[0]["message"]
    assert {f["rank"]: f["kind"] for f in failures}.get(0) == "secondary"
    assert time.monotonic() - started < 3 + SLACK_S + 120  # the reference launch and the imports, too


PLUGIN_TESTS = """
import time

import pytest
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler


class Steady(DistributedSampler):
    def __iter__(self):
        for index in super().__iter__():
            time.sleep(0.025)
            yield index


@pytest.mark.ddp(world_size=2, timeout=1)
def test_steady(ddp_rank):
    data = list(range(120))  # 60 samples a rank, a batch of 2 every 50 ms: 1.5 s in all
    for _batch in DataLoader(data, batch_size=2, sampler=Steady(data, 2, ddp_rank)):
        pass
    dist.barrier()


@pytest.mark.ddp(world_size=2, timeout=2)
def test_stalls(ddp_rank):
    if ddp_rank == 1:
        while True:
            time.sleep(0.1)
"""


def test_the_pytest_plugin_counts_batches_and_names_a_stalled_rank(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_progress=textwrap.dedent(PLUGIN_TESTS))
    started = time.monotonic()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=300)
    result.assert_outcomes(passed=1, failed=1)
    text = result.stdout.str()
    assert "hang: rank 1 of 2 made no progress for the 2 s timeout" in text
    assert " in test_stalls" in text  # its stack
    assert time.monotonic() - started < 2 + SLACK_S + 60  # pytest's own start, too


def test_an_old_timeout_setting_keeps_working_and_max_time_is_configurable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``timeout = 600`` in ``[tool.ddpcheck]`` is read as before (its meaning is now time without
    progress); ``max-time`` comes from the file or ``DDPCHECK_MAX_TIME`` like any option, off by default."""
    from ddpcheck.cli import _options, parse
    from ddpcheck.options import BadInput, CheckOptions

    for name in [k for k in __import__("os").environ if k.startswith("DDPCHECK_")]:
        monkeypatch.delenv(name)
    (tmp_path / "pyproject.toml").write_text("[tool.ddpcheck]\ntimeout = 600\n")
    args = parse(["x.py"], cwd=tmp_path)
    assert (args.timeout, args.max_time) == (600.0, None)
    assert (_options(args).timeout, _options(args).max_time) == (600.0, None)
    (tmp_path / "pyproject.toml").write_text("[tool.ddpcheck]\ntimeout = 600\nmax-time = 3600\n")
    assert parse(["x.py"], cwd=tmp_path).max_time == 3600.0
    monkeypatch.setenv("DDPCHECK_MAX_TIME", "90")
    args = parse(["x.py"], cwd=tmp_path)
    assert args.max_time == 90.0 and args.option_sources["max_time"] == "env DDPCHECK_MAX_TIME"
    with pytest.raises(BadInput, match="max time must be positive"):
        CheckOptions(max_time=0)
