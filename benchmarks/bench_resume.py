"""The time the resume check adds, as a ratio to the same command without it, in the same run.

Three loaders, each timed as a whole ``ddpcheck`` command with and without ``--no-resume``,
alternating per repeat: ``stateful`` (benchmarks/loader_stateful.py, a 20,000-sample
StatefulDataLoader), ``litdata`` (fixtures/streaming/litdata_streaming.py: a 96-sample litdata
``StreamingDataLoader`` with 2 workers) and ``trainer`` (fixtures/frameworks/transformers_trainer_resume.py:
``transformers.Trainer``'s loader resumed through Accelerate's ``skip_first_batches``). Target: at
most 2x.

    python benchmarks/bench_resume.py [--loaders stateful,litdata,trainer] [--world-sizes 1,2,3,4]
        [--repeats 3] [--samples 20000]
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

ROOT = Path(__file__).resolve().parent.parent
LOADERS = {
    "stateful": ROOT / "benchmarks" / "loader_stateful.py",
    "litdata": ROOT / "fixtures" / "streaming" / "litdata_streaming.py",
    "trainer": ROOT / "fixtures" / "frameworks" / "transformers_trainer_resume.py",
}


def timed(loader: Path, world_sizes: str, resume: bool, samples: int) -> float:
    with tempfile.TemporaryDirectory() as reports:
        command = [sys.executable, "-m", "ddpcheck", str(loader), "--world-sizes", world_sizes, "--quiet"]
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
    parser.add_argument("--loaders", default=",".join(LOADERS))
    parser.add_argument("--world-sizes", default="1,2,3,4")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--samples", type=int, default=20000)
    args = parser.parse_args()
    for name in args.loaders.split(","):
        loader = LOADERS[name]
        with_resume: list[float] = []
        without: list[float] = []
        for repeat in range(args.repeats):
            order = (True, False) if repeat % 2 == 0 else (False, True)
            for resume in order:
                seconds = timed(loader, args.world_sizes, resume, args.samples)
                (with_resume if resume else without).append(seconds)
        a, b = statistics.median(with_resume), statistics.median(without)
        print(f"{name}: world sizes {args.world_sizes}, median of {args.repeats}")
        print(f"  with resume:    {a:6.2f} s   ({', '.join(f'{s:.2f}' for s in with_resume)})")
        print(f"  --no-resume:    {b:6.2f} s   ({', '.join(f'{s:.2f}' for s in without)})")
        print(f"  ratio:          {a / b:6.2f}x  (resume adds {a - b:.2f} s)")


if __name__ == "__main__":
    main()
