"""``--simulate`` with a sampler ddpcheck cannot shortcut: the peak memory of every ddpcheck process against
the loader alone iterating one rank, measured in the same run.

Target (issue 43 item 2): a ``DistributedSampler`` subclass (torch's ``__iter__`` builds the epoch's whole
permutation as a Python list on every rank; ddpcheck computes shares directly only for the exact class)
simulated at world sizes 8 and 1024: the largest peak RSS of any ddpcheck process at most 1.5x the
baseline's, whatever the world size. Simulated ranks run one after another in a few processes, each
rank's memory handed back before the next; the number of processes side by side follows the first
rank's measured peak.

The baseline: a fresh interpreter that imports torch, builds ``make_loader(0, W)`` and iterates its two
epochs (``set_epoch``, every batch, ids discarded), as one rank of a real launch does; measured at world
size 1 too, since every ddpcheck run simulates that one as its reference (the ratio is against the
larger of the two, and against world size W's alone, both printed). Both sides run
under a wrapper that reports wall time, CPU seconds and the largest peak RSS of the command and all its
processes (``getrusage(RUSAGE_CHILDREN).ru_maxrss``, which propagates up as each process is reaped).
A run whose estimate passes a few minutes prints it first (that line is shown when it appears).

    python benchmarks/bench_simulate_memory.py [--samples 10000000] [--world-sizes 8,1024] [--epochs 2]

The load average is printed: wall times from a shared machine are noisy, peaks are not.
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


class OpaqueSampler(DistributedSampler):
    \"\"\"torch's own order; a subclass, so ddpcheck runs its real __iter__ (a list of N ints per rank).\"\"\"


def make_loader(rank: int = 0, world_size: int = 1) -> DataLoader:
    data = Indices()
    sampler = OpaqueSampler(data, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    return DataLoader(data, batch_size=256, sampler=sampler)
"""

BASELINE = """
import importlib.util, sys, torch
torch.set_num_threads(1)
spec = importlib.util.spec_from_file_location("bench_loader", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
loader = module.make_loader(0, int(sys.argv[2]))
for epoch in range(int(sys.argv[3])):
    loader.sampler.set_epoch(epoch)
    for _ in loader.batch_sampler:  # the indices, as ddpcheck reads a map-style loader: no data loaded
        pass
"""

WRAPPER = r"""
import json, resource, subprocess, sys, time
started = time.perf_counter()
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"rc": proc.returncode, "seconds": time.perf_counter() - started,
                  "cpu": usage.ru_utime + usage.ru_stime, "max_rss": usage.ru_maxrss * 1024,
                  "out": proc.stdout[-4000:], "err": proc.stderr[-4000:]}))
"""


def measure(command: list[str], env: dict[str, str]) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", WRAPPER, *command], capture_output=True, text=True, env=env)
    if out.returncode:
        raise SystemExit(f"wrapper failed: {out.stderr[-2000:]}")
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=float, default=1e7)
    parser.add_argument("--world-sizes", default="8,1024")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    n = int(args.samples)
    print(f"{n:,} samples, {args.epochs} epochs, a DistributedSampler subclass, load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="ddpcheck-bench-mem-") as tmp:
        loader = Path(tmp) / "loader.py"
        loader.write_text(LOADER)
        env = {**os.environ, "BENCH_SAMPLES": str(n)}
        alone = {}  # world size -> the loader alone at rank 0 of it; 1: the reference every run simulates
        for world in sorted({1, *(int(w) for w in args.world_sizes.split(","))}):
            got = measure([sys.executable, "-c", BASELINE, str(loader), str(world), str(args.epochs)], env)
            alone[world] = float(got["max_rss"])  # type: ignore[arg-type]
            print(f"the loader alone, rank 0 of {world}: {float(got['seconds']):.1f} s, "  # type: ignore[arg-type]
                  f"peak {alone[world] / GIB:.2f} GiB")  # fmt: skip
        for world in (int(w) for w in args.world_sizes.split(",")):
            command = [sys.executable, "-m", "ddpcheck", str(loader), "--simulate", "--world-sizes",
                       str(world), "--epochs", str(args.epochs), "--report-dir", tmp]  # fmt: skip
            got = measure(command, env)
            seconds, cpu, peak = (float(got[k]) for k in ("seconds", "cpu", "max_rss"))  # type: ignore[arg-type]
            # ddpcheck's run simulates world size 1 (the reference) and this one: a process of either is
            # held to the larger of the two loaders' own peaks, and the ratio to this size's alone is shown
            base = max(alone[1], alone[world])
            print(
                f"world size {world}: ddpcheck --simulate {seconds:.1f} s, CPU {cpu:.1f} s, largest process "
                f"peak {peak / GIB:.2f} GiB = {peak / base:.2f}x the loader's own (target <= 1.5x; "
                f"{peak / alone[world]:.2f}x rank 0 of {world} alone), exit {got['rc']}"
            )
            lines = str(got["err"]).splitlines()
            said = [line for line in lines if "to shorten it" in line or "error" in line]
            for line in said:
                print(f"  said: {line.strip()}")
            if got["rc"] not in (0, 1):
                print(str(got["out"])[-2000:], str(got["err"])[-2000:])
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
