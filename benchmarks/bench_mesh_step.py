"""A mesh run with the step checks against the same run without them (``--no-step``), in the same run.

Target (issue 42): ``ddpcheck run --mesh ...`` of a training script with the step checks (the step watcher
on every rank, the compared steps' batches and weights saved, the one-process replay launched, the loss
probe where it is needed) takes at most 1.5x the same command with ``--no-step``. Whole commands are
timed (interpreter start, torch import and every launch included), the two alternating so that a busy
moment costs both; the medians are compared. The scripts are the step fixtures on meshes: a dp x cp
causal LM whose cp ranks feed slices (``good_cp_zigzag.py``, ``--mesh dp=2,cp=2``) and a dp x tp model
under ``parallelize_module`` and FSDP2 (``good_tp_fsdp.py``, ``--mesh dp=2,tp=2``).

    python benchmarks/bench_mesh_step.py [--repeats 3] [--only cp|tp]
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
SCRIPTS = {
    "cp": (ROOT / "fixtures" / "steps" / "good_cp_zigzag.py", "dp=2,cp=2"),
    "tp": (ROOT / "fixtures" / "steps" / "good_tp_fsdp.py", "dp=2,tp=2"),
}
TARGET = 1.5


def timed(cmd: list[str]) -> float:
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return elapsed


def measure(name: str, repeats: int) -> tuple[float, float]:
    """Median seconds of the run with the step checks and without them."""
    script, mesh = SCRIPTS[name]
    with tempfile.TemporaryDirectory() as tmp:
        base = [sys.executable, "-m", "ddpcheck", "run", "--mesh", mesh, "--world-sizes", "1"]
        fixed = ["--quiet", "--report-dir", tmp, "--format", "json", "--", str(script)]
        with_step, without = [*base, *fixed], [*base, "--no-step", *fixed]
        timed(without)  # warm the file cache: the first command of a run pays for it
        stepped, plain = [], []
        for _ in range(repeats):
            plain.append(timed(without))
            stepped.append(timed(with_step))
    return statistics.median(stepped), statistics.median(plain)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=sorted(SCRIPTS), default="")
    args = parser.parse_args()
    names = [args.only] if args.only else list(SCRIPTS)
    worst = 0.0
    for name in names:
        stepped, plain = measure(name, args.repeats)
        ratio = stepped / plain
        worst = max(worst, ratio)
        script, mesh = SCRIPTS[name]
        print(
            f"{script.name} --mesh {mesh} (median of {args.repeats}): with the step checks {stepped:6.2f} s, "
            f"--no-step {plain:6.2f} s, ratio {ratio:.2f}x (target <= {TARGET}x)"
        )
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    sys.exit(0 if worst <= TARGET else 1)


if __name__ == "__main__":
    main()
