"""What work_balance and packing cost, as ratios in the same run.

The loader (``loader_tokens_100k.py``: 100,000 padded token sequences, 2 epochs) is checked three ways,
alternating per repeat: with work measured (the default for token batches: the real loader is iterated
and every batch's work counted as it passes), with ``--no-work --load-data`` (the same data pass,
nothing measured: the check's own cost is the difference) and with ``--no-work`` (ids from the sampler
alone, no data loaded: what a non-token loader costs). Target: with work at most 1.1x the same data
pass without it.

    python benchmarks/bench_work.py [--repeats 3] [--world-sizes 1,2]
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

LOADER = Path(__file__).resolve().parent / "loader_tokens_100k.py"
MODES = {
    "work measured": [],
    "--no-work --load-data": ["--no-work", "--load-data"],
    "--no-work": ["--no-work"],
}


def timed(world_sizes: str, extra: list[str]) -> float:
    with tempfile.TemporaryDirectory() as reports:
        command = [sys.executable, "-m", "ddpcheck", str(LOADER), "--world-sizes", world_sizes, "--quiet"]
        command += ["--report-dir", reports, "--no-resume", *extra]
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
        seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"ddpcheck failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--world-sizes", default="1,2")
    args = parser.parse_args()
    runs: dict[str, list[float]] = {name: [] for name in MODES}
    for repeat in range(args.repeats):
        names = list(MODES) if repeat % 2 == 0 else list(reversed(MODES))
        for name in names:
            runs[name].append(timed(args.world_sizes, MODES[name]))
    median = {name: statistics.median(times) for name, times in runs.items()}
    print(f"100,000 token sequences, world sizes {args.world_sizes}, 2 epochs, {os.cpu_count()} cores")
    for name, times in runs.items():
        print(f"  {name:24s} {median[name]:6.2f} s  ({', '.join(f'{t:.2f}' for t in times)})")
    same_pass = median["work measured"] / median["--no-work --load-data"]
    print(f"  work measured / the same data pass without it: {same_pass:.2f}x  (target <= 1.1)")
    alone = median["work measured"] / median["--no-work"]
    print(f"  work measured / ids from the sampler alone:    {alone:.2f}x")


if __name__ == "__main__":
    main()
