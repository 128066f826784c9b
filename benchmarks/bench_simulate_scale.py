"""``ddpcheck --simulate`` on a 1e8-sample epoch at world sizes 1 and 1024: time and peak memory.

Target (issue 43 item 3, tightening issue 37's): ``DistributedSampler`` over 100,000,000 samples, world
sizes 1 and 1024 (one invocation each), 2 epochs, at most 45 s and at most 2 GiB peak per process (the
peak beyond the permutation, 8 bytes a sample as the int64 tensor ``torch.randperm`` returns, is printed
too, as issue 37 stated it).

The baseline, measured in the same run, is what every epoch of that sampler costs however it is
checked: a fresh interpreter that imports torch and draws the epoch's seeded ``torch.randperm``
(``DistributedSampler.__iter__`` then makes a list of it, 3.6 GB of Python ints at 1e8; ddpcheck reads
the epoch as an array instead). Each command runs under a wrapper that reports its wall time, the CPU
seconds of it and all its children, and the largest peak RSS of any of its processes
(``getrusage(RUSAGE_CHILDREN).ru_maxrss``); CPU seconds compare better than wall time on a shared
machine.

    python benchmarks/bench_simulate_scale.py [--samples 100000000] [--world-sizes 1,1024] [--epochs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

GIB = 1024**3

LOADER = """
import os
from torch.utils.data import DataLoader, Dataset, DistributedSampler

N = int(os.environ["BENCH_SAMPLES"])


class Indices(Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return i


def make_loader(rank: int = 0, world_size: int = 1) -> DataLoader:
    data = Indices()
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    return DataLoader(data, batch_size=64, sampler=sampler)
"""

BASELINE = """
import os, torch
torch.set_num_threads(1)
g = torch.Generator(); g.manual_seed(0)
torch.randperm(int(os.environ["BENCH_SAMPLES"]), generator=g)
"""

WRAPPER = r"""
import json, resource, subprocess, sys, time
started = time.perf_counter()
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"rc": proc.returncode, "seconds": time.perf_counter() - started,
                  "cpu": usage.ru_utime + usage.ru_stime, "max_rss": usage.ru_maxrss * 1024,
                  "out": proc.stdout[-4000:], "err": proc.stderr[-2000:]}))
"""


def measure(command: list[str], env: dict[str, str]) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", WRAPPER, *command], capture_output=True, text=True, env=env)
    if out.returncode:
        raise SystemExit(f"wrapper failed: {out.stderr[-2000:]}")
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=float, default=1e8)
    parser.add_argument("--world-sizes", default="1,1024")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    n = int(args.samples)
    permutation = 8 * n
    with tempfile.TemporaryDirectory(prefix="ddpcheck-bench-sim-") as tmp:
        loader = Path(tmp) / "loader.py"
        loader.write_text(LOADER)
        env = {**os.environ, "BENCH_SAMPLES": str(n)}
        base = measure([sys.executable, "-c", BASELINE], env)
        print(
            f"baseline (import torch, one seeded randperm of {n:,}): {base['seconds']:.1f} s, "
            f"CPU {base['cpu']:.1f} s, peak {float(base['max_rss']) / GIB:.2f} GiB"  # type: ignore[arg-type]
        )
        base_s, base_cpu = float(base["seconds"]), float(base["cpu"])  # type: ignore[arg-type]
        for world in (int(w) for w in args.world_sizes.split(",")):
            command = [sys.executable, "-m", "ddpcheck", str(loader), "--simulate", "--world-sizes",
                       str(world), "--epochs", str(args.epochs), "--no-determinism", "--no-resume",
                       "--report-dir", tmp, "-q"]  # fmt: skip
            got = measure(command, env)
            seconds, cpu, peak = (float(got[k]) for k in ("seconds", "cpu", "max_rss"))  # type: ignore[arg-type]
            beyond = max(peak - permutation, 0.0)
            print(
                f"world size {world}: ddpcheck {seconds:.1f} s ({seconds / base_s:.2f}x the baseline), "
                f"CPU {cpu:.1f} s ({cpu / base_cpu:.2f}x), peak {peak / GIB:.2f} GiB ({beyond / GIB:.2f} GiB "
                f"beyond the {permutation / GIB:.2f} GiB permutation), exit {got['rc']} (targets: <= 45 s, "
                "<= 2 GiB a process)"
            )
            if got["rc"] != 0:
                print(str(got["out"])[-2000:], str(got["err"])[-2000:])
            said = " ".join(str(got["out"]).split())
            print(f"  epochs read as arrays: {'yes' if 'as arrays of indices' in said else 'NO'}")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
