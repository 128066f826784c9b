"""The command line: bad usage is one line and exit 2; reports land where asked, in every format."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.conftest import GOOD


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ddpcheck", *args], capture_output=True, text=True, timeout=180, cwd=cwd
    )


@pytest.mark.parametrize(
    "args,message",
    [
        (["--world-sizes", "0"], "world sizes must be positive integers"),
        (["--world-sizes", "1,two"], "world sizes must be comma-separated integers"),
        (["--epochs", "0"], "must be from 1 to"),
        (["--timeout", "-1"], "must be positive"),
        (["--backend", "mpi"], "invalid choice: 'mpi'"),
        (["--backend", "nccl"], "backend nccl needs CUDA"),
        (["--format", "html"], "invalid choice: 'html'"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    proc = _cli(str(GOOD), "--report-dir", str(tmp_path), *args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_loader_file_is_exit_2(tmp_path: Path) -> None:
    proc = _cli(str(tmp_path / "nope.py"), "--report-dir", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"ddpcheck: error: loader file not found: {tmp_path / 'nope.py'}"
    ]


def test_unwritable_report_dir_is_exit_2_before_any_rank_runs(tmp_path: Path) -> None:
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a directory")
    proc = _cli(str(GOOD), "--report-dir", str(blocker / "reports"))
    assert proc.returncode == 2
    assert "cannot write reports to" in proc.stderr
    assert "reference run" not in proc.stderr  # failed fast, nothing was launched


def test_json_on_stdout_matches_the_report_file_and_junit_is_written(tmp_path: Path) -> None:
    junit = tmp_path / "junit" / "ddpcheck.xml"
    proc = _cli(str(GOOD), "--world-sizes", "1,2", "--report-dir", str(tmp_path), "--format", "json",
                "--junit", str(junit), "--quiet")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    assert printed == json.loads((tmp_path / "ddpcheck.json").read_text())
    assert printed["ok"] is True and [r["world_size"] for r in printed["runs"]] == [1, 2]
    assert (tmp_path / "ddpcheck.md").read_text().startswith("#")
    suite = ET.parse(junit).getroot()
    cases = suite.findall(".//testcase")
    assert len(cases) == 2 * 13  # the eleven data checks, replica consistency and resume, per world size
    assert not suite.findall(".//failure")
    skipped = [c.get("name") or "" for c in cases if c.find("skipped") is not None]
    assert any("resume" in name for name in skipped), skipped  # n/a (no state to resume) is <skipped>


def test_default_report_dir_is_reports_in_the_working_directory(tmp_path: Path) -> None:
    proc = _cli(str(GOOD), "--world-sizes", "1", "--quiet", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "reports" / "ddpcheck.json").exists()
    assert "ws" in proc.stdout and "PASS" in proc.stdout
