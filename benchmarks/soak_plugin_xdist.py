"""Soak (issue 6): the pytest-plugin suite under ``-n 2``, N times in a row; failures and leftovers.

Each run gets a unique environment tag; every process that inherits it (xdist workers, ranks,
DataLoader workers) is counted after the run ends, and must be zero. Failures must be zero too.

    python benchmarks/soak_plugin_xdist.py [--runs 20] [--tests tests/test_plugin.py]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.proc_utils import processes_with_env, wait_until_gone  # noqa: E402

TAG = "DDPCHECK_SOAK_TAG"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--tests", default="tests/test_plugin.py")
    args = parser.parse_args()
    totals = {"failed_runs": 0, "leftover": 0}
    for i in range(1, args.runs + 1):
        tag = uuid.uuid4().hex
        started = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", args.tests, "-n", "2", "-q", "-p", "no:cacheprovider"],
            cwd=ROOT,
            env={**os.environ, TAG: tag},
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - started
        left = wait_until_gone(lambda tag=tag: processes_with_env(TAG, tag), timeout=5.0)
        summary = next((ln for ln in reversed(proc.stdout.splitlines()) if re.search(r"\d+ passed", ln)), "?")
        totals["failed_runs"] += proc.returncode != 0
        totals["leftover"] += len(left)
        result = summary.strip("= ")
        print(f"run {i:2d}: exit {proc.returncode}, {result}, {len(left)} processes left, {seconds:.1f}s")
        if proc.returncode != 0:
            print(proc.stdout[-3000:])
    print(f"{args.runs} runs: {totals['failed_runs']} failed, {totals['leftover']} processes left in total")
    return 1 if totals["failed_runs"] or totals["leftover"] else 0


if __name__ == "__main__":
    sys.exit(main())
