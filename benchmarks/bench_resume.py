"""The time the resume check adds, as a ratio to the same command without it, in the same run.

``ddpcheck benchmarks/loader_stateful.py`` (a StatefulDataLoader, so ``resume`` runs at every world
size) is timed with and without ``--no-resume``; both as whole commands, alternating per repeat.
Without resume, each world size costs two uninterrupted runs (the run and the determinism rerun), so
"at most one extra uninterrupted run per world size" means a ratio of about 1.5 or less.

    python benchmarks/bench_resume.py [--world-sizes 1,2,3,4] [--repeats 3] [--samples 20000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOADER = Path(__file__).resolve().parent / "loader_stateful.py"


def timed(world_sizes: str, resume: bool, samples: int) -> float:
    with tempfile.TemporaryDirectory() as reports:
        command = [sys.executable, "-m", "ddpcheck", str(LOADER), "--world-sizes", world_sizes, "--quiet"]
        command += ["--report-dir", reports, *([] if resume else ["--no-resume"])]
        env = {**os.environ, "DDPCHECK_BENCH_N": str(samples)}
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900, check=False)
        seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"ddpcheck failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--world-sizes", default="1,2,3,4")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--samples", type=int, default=20000)
    args = parser.parse_args()
    with_resume: list[float] = []
    without: list[float] = []
    for repeat in range(args.repeats):
        order = (True, False) if repeat % 2 == 0 else (False, True)
        for resume in order:
            (with_resume if resume else without).append(timed(args.world_sizes, resume, args.samples))
    a, b = statistics.median(with_resume), statistics.median(without)
    print(f"world sizes {args.world_sizes}, {args.samples:,} samples, median of {args.repeats}")
    print(f"  with resume:    {a:6.2f} s   ({', '.join(f'{s:.2f}' for s in with_resume)})")
    print(f"  --no-resume:    {b:6.2f} s   ({', '.join(f'{s:.2f}' for s in without)})")
    print(f"  ratio:          {a / b:6.2f}x  (resume adds {a - b:.2f} s)")


if __name__ == "__main__":
    main()
