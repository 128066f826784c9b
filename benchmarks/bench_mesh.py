"""A device mesh against the plain world size of the same ranks, in the same run.

Targets (the device-mesh issue): the same loader (``loader_mesh.py``, 100,000 samples, 2 epochs) as
``--mesh dp=2,tp=2`` takes at most 1.2x the time of ``--world-sizes 4`` (the mesh also compares every
replica's batches, content included); and ``--simulate --mesh dp=128,tp=8`` over 1,000,000 samples
finishes under 10 s. Whole commands are timed (interpreter start and torch import included), the mesh
and the world size alternating so that a busy moment costs both; the medians are compared.

    python benchmarks/bench_mesh.py [--repeats 5] [--skip-simulate]
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
LOADER = HERE / "loader_mesh.py"


def timed(cmd: list[str], env: dict[str, str] | None = None) -> float:
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-simulate", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:

        def ddpcheck(*layout: str) -> list[str]:
            fixed = ["--quiet", "--report-dir", tmp, "--format", "json"]
            return [sys.executable, "-m", "ddpcheck", str(LOADER), *layout, *fixed]

        mesh_cmd, plain_cmd = ddpcheck("--mesh", "dp=2,tp=2"), ddpcheck("--world-sizes", "4")
        timed(plain_cmd)  # warm the file cache: the first command of a run pays for it
        mesh, plain = [], []
        for _ in range(args.repeats):
            plain.append(timed(plain_cmd))
            mesh.append(timed(mesh_cmd))
        simulated = None
        if not args.skip_simulate:
            env = {**os.environ, "DDPCHECK_BENCH_N": "1000000"}
            sim_cmd = ddpcheck("--simulate", "--mesh", "dp=128,tp=8")
            simulated = statistics.median(timed(sim_cmd, env) for _ in range(max(1, args.repeats // 2)))
    mesh_s, plain_s = statistics.median(mesh), statistics.median(plain)
    print(f"100,000 samples, 2 epochs, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    print(f"  --world-sizes 4   (median of {len(plain)}): {plain_s:6.2f} s   runs: {_runs(plain)}")
    print(f"  --mesh dp=2,tp=2  (median of {len(mesh)}): {mesh_s:6.2f} s   runs: {_runs(mesh)}")
    print(f"  ratio mesh / world size: {mesh_s / plain_s:.2f}  (target <= 1.2)")
    if simulated is not None:
        print(f"  --simulate --mesh dp=128,tp=8, 1,000,000 samples: {simulated:.2f} s  (target < 10 s)")


def _runs(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


if __name__ == "__main__":
    main()
