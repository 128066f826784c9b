"""``ddpcheck run`` against ``torchrun`` running the same training script, in the same invocation.

Targets (issue 28), on train_20ms.py (20,000 samples, batch 32, a 20 ms step):
- ``ddpcheck run --world-sizes 1,2,4 --epochs 2`` (reference, layouts and the determinism rerun) at most
  0.3x ``torchrun --standalone`` running the script to the end of its 2 epochs at 1, 2 and 4 processes,
  one launch after another;
- the overhead of recording: ``ddpcheck run --model-steps 2 --no-determinism`` at most 1.3x torchrun
  running the same script limited by itself to 2 steps an epoch at 1, 2 and 4 processes (what the
  script's own loop receives either way; ddpcheck also records the rest of every epoch).
- the step checks (issue 35; on by default: the step watched on every launch, one replay launch per layout
  with several ranks) at most 1.5x ``ddpcheck run --no-step``, and the full run still <= 0.3x torchrun;
- the metric comparison (issue 41; on by default) on train_eval_20ms.py (the same training, an evaluation
  of 1,001 samples after each epoch): ``ddpcheck run --no-step`` at most 1.2x ``ddpcheck run --no-step
  --no-metrics``.
Every number depends on an otherwise idle machine: the load average is printed with them.

    python benchmarks/bench_run.py [--repeats 1]
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

HERE = Path(__file__).resolve().parent
SCRIPT = "train_20ms.py"
EVAL_SCRIPT = "train_eval_20ms.py"
SIZES = (1, 2, 4)


def timed(command: list[str]) -> float:
    started = time.monotonic()
    subprocess.run(command, cwd=HERE, check=True, capture_output=True, timeout=900)
    return time.monotonic() - started


def torchrun(*script_args: str) -> float:
    """Launch after launch at 1, 2 and 4 processes: the wall time of all three."""
    total = 0.0
    for n in SIZES:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}"]
        total += timed([*command, SCRIPT, *script_args])
    return total


def ddpcheck(*options: str, script: str = SCRIPT) -> float:
    with tempfile.TemporaryDirectory() as reports:
        command = [sys.executable, "-m", "ddpcheck", "run", "--world-sizes", "1,2,4", "--epochs", "2", "-q"]
        return timed([*command, "--report-dir", reports, *options, "--", script])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--metric-only", action="store_true", help="only the metric comparison's rows")
    args = parser.parse_args()
    rows: dict[str, list[float]] = {
        "full": [], "check": [], "steps": [], "record": [], "no_step": [], "metric": [], "no_metric": []
    }  # fmt: skip
    for _ in range(args.repeats):
        if not args.metric_only:
            rows["full"].append(torchrun())
            rows["check"].append(ddpcheck())
            rows["no_step"].append(ddpcheck("--no-step"))
            rows["steps"].append(torchrun("--steps-per-epoch", "2"))
            rows["record"].append(ddpcheck("--model-steps", "2", "--no-determinism"))
        rows["metric"].append(ddpcheck("--no-step", script=EVAL_SCRIPT))
        rows["no_metric"].append(ddpcheck("--no-step", "--no-metrics", script=EVAL_SCRIPT))
    print(f"load average {os.getloadavg()[0]:.1f}; medians of {args.repeats}")
    if not args.metric_only:
        full, check = statistics.median(rows["full"]), statistics.median(rows["check"])
        steps, record = statistics.median(rows["steps"]), statistics.median(rows["record"])
        print(f"torchrun, 2 full epochs at 1,2,4:        {full:7.2f} s")
        share = check / full
        print(f"ddpcheck run --world-sizes 1,2,4:        {check:7.2f} s   {share:.2f}x  (target <= 0.30x)")
        no_step = statistics.median(rows["no_step"])
        cost = check / no_step
        print(
            f"ddpcheck run --no-step:                  {no_step:7.2f} s   step {cost:.2f}x (target <= 1.50x)"
        )
        print(f"torchrun, 2 steps an epoch at 1,2,4:     {steps:7.2f} s")
        ratio = record / steps
        print(f"ddpcheck run --model-steps 2, no rerun:  {record:7.2f} s   {ratio:.2f}x  (target <= 1.30x)")
    metric, no_metric = statistics.median(rows["metric"]), statistics.median(rows["no_metric"])
    cost = metric / no_metric
    print(f"{EVAL_SCRIPT}, --no-step --no-metrics: {no_metric:7.2f} s")
    print(f"{EVAL_SCRIPT}, --no-step:              {metric:7.2f} s   {cost:.2f}x  (target <= 1.20x)")


if __name__ == "__main__":
    main()
