"""Fault figures (issue 6): for each fault fixture, time to detection, exit code, processes left.

Each fault runs as a whole ``python -m ddpcheck`` command with a test tag in its environment; every
process that inherits the tag (ranks, DataLoader workers) is counted two seconds after ddpcheck
exits, and must be zero. "Detection" is ddpcheck's wall time minus the time the same command takes on
a good loader, so interpreter start and torch import cancel out; for hangs it includes the deadline.

    python benchmarks/bench_faults.py [--timeout 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.proc_utils import processes_with_env, wait_until_gone  # noqa: E402

HOSTILE = ROOT / "tests" / "data" / "hostile"
FAULTS = [
    ("crash_in_iter.py", []),
    ("crash_in_worker.py", ["--load-data"]),
    ("factory_raises_on_rank1.py", []),
    ("killed_rank.py", []),
    ("killed_rank_with_helper.py", []),
    ("stopped_rank.py", []),
    ("gigabyte_stdout.py", []),
    ("hang_uneven_collective.py", []),
    ("infinite_iterable.py", ["--max-time", "5"]),  # it keeps yielding: --timeout (no progress) never ends it
    (str(HOSTILE / "sys_exit.py"), []),
    (str(HOSTILE / "sys_exit.py"), ["--simulate"]),
    (str(HOSTILE / "os_exit.py"), ["--simulate"]),
    (str(HOSTILE / "endless.py"), ["--simulate"]),
    (str(HOSTILE / "nondaemon_thread.py"), ["--simulate"]),
    (str(HOSTILE / "children.py"), ["--simulate"]),
    (str(HOSTILE / "children.py"), []),
]


def run(loader: Path, extra: list[str], timeout: float) -> tuple[float, int, int, dict[str, object], int]:
    """Elapsed s, exit code, processes left, the JSON report ({} if none), temp entries left."""
    tag = uuid.uuid4().hex
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp) / "tmpdir"
        tmpdir.mkdir()
        cmd = [sys.executable, "-m", "ddpcheck", str(loader), "--world-sizes", "1,2",
               "--timeout", str(timeout),
               "--report-dir", tmp, "--quiet", "--format", "json", *extra]  # fmt: skip
        started = time.perf_counter()
        try:
            proc = subprocess.run(
                cmd,
                env={**os.environ, "DDPCHECK_BENCH_TAG": tag, "TMPDIR": str(tmpdir)},
                capture_output=True,
                text=True,
                timeout=timeout * 4 + 120,
            )
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = -999  # ddpcheck itself hung
        elapsed = time.perf_counter() - started
        left = wait_until_gone(lambda: processes_with_env("DDPCHECK_BENCH_TAG", tag), timeout=2.0)
        report_path = Path(tmp) / "ddpcheck.json"
        report = json.loads(report_path.read_text()) if report_path.exists() else {}
        temp_left = len(list(tmpdir.iterdir()))
    return elapsed, code, len(left), report, temp_left


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=5.0, help="ddpcheck --timeout for each fault")
    args = parser.parse_args()
    base, code, _, _, _ = run(
        ROOT / "fixtures" / "good_distributed_sampler.py", ["--no-determinism"], args.timeout
    )
    assert code == 0, "the good loader must pass"
    print(f"baseline (good loader, world sizes 1,2): {base:.2f} s; --timeout {args.timeout:g} s")
    print(f"{'fault':44} {'detect s':>9} {'exit':>5} {'left':>5} {'tmp':>4} {'report':>6}  kinds reported")
    for name, extra in FAULTS:
        elapsed, code, left, report, temp_left = run(ROOT / "fixtures" / "faults" / name, extra, args.timeout)
        runs: Any = report.get("runs", [])
        kinds = sorted({f["kind"] for r in runs for f in r.get("failures", [])})
        label = f"{Path(name).name} {' '.join(extra)}".strip()
        written = "yes" if report else "no"
        print(
            f"{label:44} {elapsed - base:9.2f} {code:5d} {left:5d} {temp_left:4d} {written:>6}"
            f"  {', '.join(kinds) or '-'}"
        )


if __name__ == "__main__":
    main()
