"""``ddpcheck.record --fingerprint`` inside ``torchrun --nproc-per-node 4`` on 1e7 indices.

Target (issue 37 item 2): the check at the end (tables, one all_reduce, naming) at most 1 s, at most 2 MB
of state a rank, and a planted overlap detected and named.

Three launches of ``fixtures/scale/train_fingerprint.py --size N --epochs 1`` under
``python -m torch.distributed.run --standalone``: the script alone (the baseline, in the same run), the
script under ``python -m ddpcheck.record --fingerprint``, and the same with ``--overlap 1000`` (rank 1
starts with rank 0's first 1,000 indices). Printed: each launch's wall time, the check's own wall and
CPU seconds (rank 0's, from ``fingerprint-rank0.json``), the state a rank keeps, and the verdicts.

    python benchmarks/bench_fingerprint.py [--size 10000000] [--ranks 4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "fixtures" / "scale" / "train_fingerprint.py"


def launch(ranks: int, ours: list[str], args: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
               *ours, str(SCRIPT), *args]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=3600)
    return time.perf_counter() - started, proc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=float, default=1e7)
    parser.add_argument("--ranks", type=int, default=4)
    args = parser.parse_args()
    script = ["--size", str(int(args.size)), "--epochs", "1"]
    base, proc = launch(args.ranks, [], script)
    if proc.returncode:
        raise SystemExit(f"the script alone failed: {proc.stderr[-2000:]}")
    print(f"{int(args.size):,} indices on {args.ranks} ranks, 1 epoch: the script alone {base:.1f} s")
    for label, extra, expect in (("correct", [], 0), ("overlap 1000", ["--overlap", "1000"], 1)):
        with tempfile.TemporaryDirectory(prefix="ddpcheck-bench-fp-") as out:
            ours = ["-m", "ddpcheck.record", "--fingerprint", "--epochs", "1", "--out", out, "--"]
            seconds, proc = launch(args.ranks, ours, script + extra)
            found = json.loads((Path(out) / "fingerprint-rank0.json").read_text())
        epoch = found["epochs"][0]
        print(
            f"{label}: launch {seconds:.1f} s ({seconds / base:.2f}x the script alone); the check "
            f"{found['seconds']:.2f} s, CPU {found['cpu_seconds']:.2f} s on rank 0; state "
            f"{found['state_bytes'] / 1e6:.2f} MB a rank; {epoch['status'].upper()}: {epoch['detail'][:240]}"
        )
        failed = proc.returncode != 0
        if failed != bool(expect) or (expect and not epoch["twice"]):
            raise SystemExit(f"{label}: unexpected verdict (exit {proc.returncode}): {proc.stderr[-2000:]}")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
