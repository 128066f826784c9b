"""Killing or interrupting the ddpcheck process itself leaves no rank, worker or helper process behind."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import DATA
from tests.proc_utils import processes_with_env, wait_until_gone

SLOW = DATA / "slow_loader.py"
TAG = "DDPCHECK_TEST_TAG"


def _start(tmp_path: Path) -> tuple[subprocess.Popen[str], str]:
    tag = uuid.uuid4().hex
    (tmp_path / "tmpdir").mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddpcheck", str(SLOW), "--world-sizes", "1,2", "--load-data",
         "--report-dir", str(tmp_path), "--timeout", "120", "--format", "json"],
        env={**os.environ, TAG: tag, "TMPDIR": str(tmp_path / "tmpdir")},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    # wait until ranks and their DataLoader workers are running (more than the ddpcheck process)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(processes_with_env(TAG, tag)) < 4:
        time.sleep(0.1)
    assert len(processes_with_env(TAG, tag)) >= 4, "ranks with workers never started"
    return proc, tag


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupting_ddpcheck_stops_every_process_and_keeps_the_report(tmp_path: Path, signum: int) -> None:
    proc, tag = _start(tmp_path)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr
    assert not wait_until_gone(lambda: processes_with_env(TAG, tag), timeout=10)
    assert not list((tmp_path / "tmpdir").iterdir()), "ddpcheck's temp dirs outlived the interrupt"
    report = json.loads((tmp_path / "ddpcheck.json").read_text())
    assert report["runs"] == [], "the reference run was still going: no world size finished"
    assert any("interrupted" in note for note in report["notes"])
    # the report must not read as green: nothing was checked
    assert report["interrupted"] is True and report["ok"] is False and report["exit_code"] == 130
    assert "ddpcheck interrupted" in (tmp_path / "ddpcheck.md").read_text()


Moment = Callable[[subprocess.Popen[bytes], bytes], bool]  # (the process, what it said on stderr) -> reached


def _torch_loading(proc: subprocess.Popen[bytes], said: bytes) -> bool:
    """torch's native library is mapped into the ddpcheck process: its import is under way, long after
    ddpcheck's signal handlers were installed (the first thing it does) and before any rank starts."""
    try:
        return b"libtorch" in Path(f"/proc/{proc.pid}/maps").read_bytes()
    except OSError:
        return False


def _reference_running(proc: subprocess.Popen[bytes], said: bytes) -> bool:
    """ddpcheck said on stderr that the single-process reference run started: no layout has finished."""
    return b"ddpcheck: reference run" in said


def _wait_for(proc: subprocess.Popen[bytes], moment: Moment, timeout: float = 90) -> None:
    """Read the process's stderr until ``moment`` has come; fails at the deadline, or if it exits first."""
    said = b""
    deadline = time.monotonic() + timeout
    assert proc.stderr is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stderr, selectors.EVENT_READ)
        while not moment(proc, said):
            left = deadline - time.monotonic()
            assert left > 0 and proc.poll() is None, f"{moment.__name__} never came: {said[-2000:]!r}"
            if selector.select(min(left, 0.05)):
                said += os.read(proc.stderr.fileno(), 1 << 16)


@pytest.mark.parametrize("moment", [_torch_loading, _reference_running])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_during_start_up_still_writes_reports_that_say_nothing_was_checked(
    tmp_path: Path, signum: int, moment: Moment
) -> None:
    """While torch is being imported, or while the reference runs: the reports exist and say
    interrupted, never passed (the signal is sent when the process shows it reached that moment)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddpcheck", str(SLOW), "--world-sizes", "1,2", "--load-data",
         "--report-dir", str(tmp_path), "--format", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        _wait_for(proc, moment)
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 130, stderr
    report = json.loads((tmp_path / "ddpcheck.json").read_text())
    assert report["interrupted"] is True and report["runs"] == [] and report["exit_code"] == 130
    assert any("nothing was checked" in note or "interrupted" in note for note in report["notes"])
    assert "ddpcheck interrupted" in (tmp_path / "ddpcheck.md").read_text()


def test_sigkill_of_ddpcheck_takes_its_ranks_and_workers_down(tmp_path: Path) -> None:
    proc, tag = _start(tmp_path)
    proc.kill()
    proc.wait(timeout=10)
    left = wait_until_gone(lambda: processes_with_env(TAG, tag), timeout=15)
    assert not left, f"processes outlived a SIGKILLed ddpcheck: {sorted(left)}"
    leftovers = wait_until_gone(lambda: set((tmp_path / "tmpdir").iterdir()), timeout=5)  # type: ignore[arg-type]
    assert not leftovers, f"temp dirs outlived a SIGKILLed ddpcheck: {sorted(map(str, leftovers))}"
