"""DDPSamplerWrapper cost: one rank's epoch against merely consuming the inner sampler once.

Every variant runs in its own fresh subprocess (so one variant's peak cannot mask another's) and
reports wall time and peak-RSS growth (VmHWM, reset through /proc/self/clear_refs right before the
epoch; without that, growth over the RSS at that point). Ratios are against the baseline
``inner``, measured in the same run: iterating ``RandomSampler(range(N))`` once. Target: the
wrapper within 1.2x time and 1.1x memory growth of that.

    python benchmarks/bench_sampler.py            # N = 10,000,000, 8 simulated ranks, rank 0
    python benchmarks/bench_sampler.py --n 100000 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

VARIANTS = {
    "inner": "consume RandomSampler(range(N)) once (baseline)",
    "wrapper-e0": "DDPSamplerWrapper, epoch 0 (stride)",
    "wrapper-e1": "DDPSamplerWrapper, epoch 1 (shuffled between GPUs)",
    "wrapper-noshuffle": "DDPSamplerWrapper, shuffle_samples_between_gpus=False",
    "distributed": "torch DistributedSampler(range(N)), rank 0's epoch",
}


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _child(variant: str, n: int, world: int) -> dict[str, Any]:
    import torch
    from torch.utils.data import DistributedSampler, RandomSampler

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from ddpcheck.reference.sampler import DDPSamplerWrapper

    torch.manual_seed(0)
    inner = RandomSampler(range(n), generator=torch.Generator().manual_seed(0))
    target: Any
    if variant == "inner":
        target = inner
    elif variant == "distributed":
        target = DistributedSampler(range(n), num_replicas=world, rank=0, shuffle=True)  # type: ignore[arg-type]
    else:
        shuffle = variant != "wrapper-noshuffle"
        target = DDPSamplerWrapper(inner, shuffle, num_replicas=world, rank=0)
        if variant == "wrapper-e1":
            target.set_epoch(1)
    before = _status_kb("VmRSS")
    if not _reset_peak():
        before = max(before, _status_kb("VmHWM"))
    start, cpu_start = time.perf_counter(), time.process_time()
    deque(iter(target), maxlen=0)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return {"seconds": seconds, "cpu": cpu, "growth_kb": _status_kb("VmHWM") - before}


def _measure(variant: str, n: int, world: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", variant, "--n", str(n), "--world", str(world)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=10_000_000, help="dataset length N")
    parser.add_argument("--world", type=int, default=8, help="simulated number of ranks")
    parser.add_argument("--repeats", type=int, default=3, help="subprocess runs per variant (median)")
    parser.add_argument("--child", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.n, args.world)))
        return

    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for _ in range(args.repeats):  # interleaved, so drift in machine load hits every variant alike
        for variant in VARIANTS:
            runs[variant].append(_measure(variant, args.n, args.world))
    med = {v: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for v, rs in runs.items()}
    base = med["inner"]
    print(
        f"N={args.n:,}  world={args.world}  rank 0  median of {args.repeats} fresh subprocesses per variant"
    )
    print("wall and CPU time (CPU time is steadier on a shared machine); peak-RSS growth")
    header = (
        f"{'variant':<18} {'wall s':>7} {'x inner':>7} {'cpu s':>7} {'x inner':>7} "
        f"{'peak MiB':>8} {'x inner':>7}  what"
    )
    print(header)
    print("-" * len(header))
    for v, m in med.items():
        mem_ratio = m["growth_kb"] / base["growth_kb"] if base["growth_kb"] > 0 else float("nan")
        print(
            f"{v:<18} {m['seconds']:7.3f} {m['seconds'] / base['seconds']:7.2f} {m['cpu']:7.3f} "
            f"{m['cpu'] / base['cpu']:7.2f} {m['growth_kb'] / 1024:8.1f} {mem_ratio:7.2f}  {VARIANTS[v]}"
        )


if __name__ == "__main__":
    main()
