"""ddpcheck joins launches it did not start: torchrun (one node, two nodes on loopback), explicit flags."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DATA, FIXTURES, GOOD

BUGGY = DATA / "seed_per_rank.py"
RANDOM_VARLEN = FIXTURES / "tokens" / "plain_random_varlen.py"  # token batches: work_balance applies


def _free_port() -> int:
    # torchrun needs a port number up front; the tiny race is torchrun's contract, not ddpcheck's.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")
    }
    env["OMP_NUM_THREADS"] = "1"
    return env


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


def test_torchrun_standalone_two_processes(tmp_path: Path) -> None:
    cmd = _torchrun(
        "--standalone", "--nproc-per-node=2", "-m", "ddpcheck", str(GOOD), "--report-dir", str(tmp_path)
    )
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "ddpcheck.json").read_text())
    (run,) = report["runs"]
    assert run["world_size"] == 2
    assert run["checks"]["no_overlap"]["status"] == "pass"
    assert run["checks"]["determinism"]["status"] == "skip"
    assert report["options"]["joined"] is True


@pytest.mark.parametrize("allow", [False, True])
def test_torchrun_honours_max_idle_and_allow(tmp_path: Path, allow: bool) -> None:
    """A joined launch judges as a local run does: ``--max-idle`` fails a work_balance that random batching
    passes (variable-length sequences: no step is ever perfectly balanced, so idle > 0.001), and ``--allow``
    reports that failure as allowed (exit 0). Both were silently ignored in joined launches."""
    args = ["--max-idle", "0.001", *(["--allow", "work_balance"] if allow else [])]
    cmd = _torchrun("--standalone", "--nproc-per-node=2", "-m", "ddpcheck", str(RANDOM_VARLEN), "--epochs",
                    "1", "--no-resume", "--quiet", "--report-dir", str(tmp_path), *args)  # fmt: skip
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == (0 if allow else 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "ddpcheck.json").read_text())
    assert report["options"]["joined"] is True and report["options"]["max_idle"] == 0.001
    (run,) = report["runs"]
    work = run["checks"]["work_balance"]
    assert work["status"] == ("allowed" if allow else "fail"), work
    assert "--max-idle" in work["detail"]
    failed = sorted(check for check, v in run["checks"].items() if v["status"] == "fail")
    assert failed == ([] if allow else ["work_balance"])
    assert run["checks"]["determinism"]["status"] == "skip"
    assert any("does not run metric_equivalence" in note for note in report["notes"]), report["notes"]


@pytest.mark.parametrize("loader,expected", [(GOOD, 0), (BUGGY, 1)])
def test_two_torchrun_nodes_on_loopback_exit_with_the_same_code(
    tmp_path: Path, loader: Path, expected: int
) -> None:
    port = _free_port()
    procs = [
        subprocess.Popen(
            _torchrun(
                "--nnodes=2",
                f"--node-rank={node}",
                "--nproc-per-node=1",
                "--master-addr=127.0.0.1",
                f"--master-port={port}",
                "-m",
                "ddpcheck",
                str(loader),
                "--report-dir",
                str(tmp_path),
            ),
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for node in (0, 1)
    ]
    outputs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [expected, expected], outputs[0][1][-3000:]
    report = json.loads((tmp_path / "ddpcheck.json").read_text())
    assert report["runs"][0]["world_size"] == 2
    if expected:
        assert report["runs"][0]["checks"]["no_overlap"]["status"] == "fail"


def test_explicit_rank_world_size_and_master_flags(tmp_path: Path) -> None:
    port = _free_port()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ddpcheck",
                str(GOOD),
                "--rank",
                str(rank),
                "--world-size",
                "2",
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
                "--report-dir",
                str(tmp_path),
                "--quiet",
            ],
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert "ws=2" in outputs[0][0] and outputs[1][0] == ""


def test_rank_without_world_size_is_bad_usage(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ddpcheck", str(GOOD), "--rank", "0", "--report-dir", str(tmp_path)],
        env=_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "pass --rank and --world-size together" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_rendezvous_timeout_is_a_one_line_environment_error(tmp_path: Path) -> None:
    """Rank 1 of a launch whose rank 0 never listens: the launch's fault (exit 2), named, never "internal"."""
    port = _free_port()  # closed again: nobody listens there
    proc = subprocess.run(
        [sys.executable, "-m", "ddpcheck", str(GOOD), "--rank", "1", "--world-size", "2",
         "--master-addr", "127.0.0.1", "--master-port", str(port), "--timeout", "2",
         "--report-dir", str(tmp_path), "--quiet"],
        env=_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-2000:]
    assert "internal error" not in lines[0] and "Traceback" not in proc.stderr
    assert f"rendezvous at 127.0.0.1:{port} within 2 s" in lines[0]
    assert "MASTER_ADDR/MASTER_PORT" in lines[0]
