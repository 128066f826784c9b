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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.proc_utils import processes_with_env, wait_until_gone  # noqa: E402

FAULTS = [
    ("crash_in_iter.py", []),
    ("crash_in_worker.py", ["--load-data"]),
    ("factory_raises_on_rank1.py", []),
    ("killed_rank.py", []),
    ("hang_uneven_collective.py", []),
    ("infinite_iterable.py", []),
]


def run(loader: Path, extra: list[str], timeout: float) -> tuple[float, int, int, dict[str, object]]:
    tag = uuid.uuid4().hex
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "ddpcheck", str(loader), "--world-sizes", "1,2",
               "--timeout", str(timeout),
               "--report-dir", tmp, "--quiet", "--format", "json", *extra]  # fmt: skip
        started = time.perf_counter()
        proc = subprocess.run(
            cmd, env={**os.environ, "DDPCHECK_BENCH_TAG": tag}, capture_output=True, text=True
        )
        elapsed = time.perf_counter() - started
        left = wait_until_gone(lambda: processes_with_env("DDPCHECK_BENCH_TAG", tag), timeout=2.0)
        report_path = Path(tmp) / "ddpcheck.json"
        report = json.loads(report_path.read_text()) if report_path.exists() else {}
    return elapsed, proc.returncode, len(left), report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=5.0, help="ddpcheck --timeout for each fault")
    args = parser.parse_args()
    base, code, _, _ = run(
        ROOT / "fixtures" / "good_distributed_sampler.py", ["--no-determinism"], args.timeout
    )
    assert code == 0, "the good loader must pass"
    print(f"baseline (good loader, world sizes 1,2): {base:.2f} s; --timeout {args.timeout:g} s")
    print(f"{'fault':32} {'detect s':>9} {'exit':>5} {'left':>5}  kinds reported")
    for name, extra in FAULTS:
        elapsed, code, left, report = run(ROOT / "fixtures" / "faults" / name, extra, args.timeout)
        kinds = sorted({f["kind"] for r in report.get("runs", []) for f in r.get("failures", [])})
        print(f"{name:32} {elapsed - base:9.2f} {code:5d} {left:5d}  {', '.join(kinds) or '-'}")


if __name__ == "__main__":
    main()
