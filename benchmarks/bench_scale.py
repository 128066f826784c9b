"""ddpcheck against a loader-only baseline from 100,000 to 10,000,000 samples: time and peak memory.

Target (issue 37; issue 13 asked 1.5x): at 10,000,000 samples, world sizes 1,2,4,8, 2 epochs,
``DistributedSampler``, ddpcheck at most 1.3x the loader-only baseline, and every ddpcheck process at
most 1 GiB peak RSS.

The baseline is the work ddpcheck cannot avoid, done with nothing else: the same samplers in the
same number of processes forked from a parent that has imported torch, the one-process reference
first, then every world size twice (the run and the determinism rerun), each process calling
``set_epoch`` and iterating its batch sampler for every epoch, discarding the ids. Both sides are
timed as whole commands (interpreter start and torch import included).

Peak memory: each command runs under a small wrapper that waits for it and reads
``getrusage(RUSAGE_CHILDREN).ru_maxrss``, the largest peak RSS of any process of the command
(parent and every forked rank alike, as each is reaped); the parent's own peak comes from polling
its ``VmHWM``. CPU seconds (user + system, every process) are printed too: on a machine other jobs
share, they compare the two sides where wall time cannot.

    python benchmarks/bench_scale.py [--sizes 100000,1000000,10000000] [--world-sizes 1,2,4,8]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOADER = HERE / "loader_100k.py"
GIB = 1024**3

BASELINE_SCRIPT = r"""
import importlib.util, os, sys
import torch  # imported before forking, as ddpcheck does

def load(path):
    spec = importlib.util.spec_from_file_location("bench_loader", path)
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod); return mod

def rank(mod, rank, world_size, epochs):
    loader = mod.make_loader(rank=rank, world_size=world_size)
    source = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        for _ in source:
            pass

def group(mod, world_size, epochs):
    pids = []
    for r in range(world_size):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                torch.set_num_threads(1)
                rank(mod, r, world_size, epochs)
            except BaseException:
                code = 1
            os._exit(code)
        pids.append(pid)
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        if status != 0:
            raise SystemExit(f"a baseline rank failed ({status})")

if __name__ == "__main__":
    path, epochs = sys.argv[1], int(sys.argv[2])
    mod = load(path)
    group(mod, 1, epochs)  # the one-process reference
    for ws in [int(w) for w in sys.argv[3].split(",")]:
        group(mod, ws, epochs)  # the run
        group(mod, ws, epochs)  # the determinism rerun
"""

WRAPPER = r"""
import json, os, resource, subprocess, sys, threading, time
started = time.perf_counter()
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
hwm = [0]

def poll():
    path = f"/proc/{proc.pid}/status"
    while proc.poll() is None:
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        hwm[0] = max(hwm[0], int(line.split()[1]) * 1024)
        except OSError:
            pass
        time.sleep(0.02)

thread = threading.Thread(target=poll, daemon=True)
thread.start()
_, err = proc.communicate()
elapsed = time.perf_counter() - started
thread.join()
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
peak, cpu = usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime
print(json.dumps({"rc": proc.returncode, "seconds": elapsed, "cpu": cpu, "max_rss": peak,
                  "parent_rss": hwm[0], "stderr": err.decode(errors="replace")[-2000:]}))
"""


def measure(cmd: list[str], env: dict[str, str], ok_codes: tuple[int, ...] = (0,)) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", WRAPPER, *cmd], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"wrapper failed: {out.stderr[-2000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if result["rc"] not in ok_codes:
        raise SystemExit(f"command failed ({result['rc']}): {' '.join(cmd)}\n{result['stderr']}")
    return result


CHECKS_SCRIPT = r"""
import resource, sys, time
import numpy as np
from array import array
from dataclasses import replace
from ddpcheck.checks import run_checks
from ddpcheck.trace import EpochTrace, LoaderFacts, RankTrace, RunTrace

mode, n, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
facts = LoaderFacts(dataset_len=n, batch_size=64, drop_last=False, sampler="DistributedSampler",
                    batch_sampler="BatchSampler", padding=True, has_set_epoch=True)

def trace(ids):
    ids = array("q", ids.astype(np.int64).tobytes())
    sizes = [64] * (len(ids) // 64) + ([len(ids) % 64] if len(ids) % 64 else [])
    return EpochTrace(0, ids if mode == "arrays" else tuple(ids), sizes, len(sizes))

orders = [np.random.default_rng(e).permutation(n) for e in range(2)]
def run(w):
    ranks = []
    for r in range(w):
        epochs = []
        for e, order in enumerate(orders):
            total = -(-n // w) * w
            padded = np.concatenate([order, order[: total - n]])
            epochs.append(replace(trace(padded[r::w]), epoch=e))
        ranks.append(RankTrace(r, tuple(epochs), facts))
    return RunTrace(w, "gloo", tuple(ranks))
reference, ddp = run(1), run(world)
started = time.perf_counter()
verdicts = run_checks(reference, ddp, ddp)
took = time.perf_counter() - started
assert not [v for v in verdicts if v.failed], verdicts
print(took, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def checks_only(n: int, world: int) -> None:
    """The checks alone on synthetic DistributedSampler traces: numpy counting against Python sets."""
    out = {}
    for mode in ("arrays", "sets"):
        proc = subprocess.run(
            [sys.executable, "-c", CHECKS_SCRIPT, mode, str(n), str(world)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise SystemExit(proc.stderr[-2000:])
        seconds, rss = proc.stdout.split()
        out[mode] = (float(seconds), int(rss))
    (a, ra), (b, rb) = out["arrays"], out["sets"]
    print(
        f"checks alone, {n:,} samples, world size {world}, 2 epochs, run + rerun: ids as arrays (numpy) "
        f"{a:.2f} s, peak {gib(ra)} GiB; the same ids in tuples (Python sets) {b:.2f} s, peak {gib(rb)} GiB"
    )


def gib(n: float) -> str:
    return f"{n / GIB:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000,10000000")
    parser.add_argument("--world-sizes", default="1,2,4,8")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--checks-only", type=int, metavar="N", help="time the checks alone on N samples")
    args = parser.parse_args()
    if args.checks_only:
        checks_only(args.checks_only, max(int(w) for w in args.world_sizes.split(",")))
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "loader_only_baseline.py"
        script.write_text(BASELINE_SCRIPT)
        for n in sizes:
            env = {**os.environ, "DDPCHECK_BENCH_N": str(n)}
            ours_cmd = [
                sys.executable, "-m", "ddpcheck", str(LOADER), "--world-sizes", args.world_sizes,
                "--epochs", str(args.epochs), "--quiet", "--report-dir", tmp, "--format", "json",
            ]  # fmt: skip
            base_cmd = [sys.executable, str(script), str(LOADER), str(args.epochs), args.world_sizes]
            base = measure(base_cmd, env)
            ours = measure(ours_cmd, env)
            rows.append((n, ours, base))
            print(
                f"{n:>12,} samples: ddpcheck {ours['seconds']:6.2f} s, peak {gib(ours['max_rss'])} GiB "
                f"(parent {gib(ours['parent_rss'])}); loader-only {base['seconds']:6.2f} s, "
                f"peak {gib(base['max_rss'])} GiB; ratio {ours['seconds'] / base['seconds']:.2f}x "
                f"(CPU {ours['cpu']:.1f} s / {base['cpu']:.1f} s = {ours['cpu'] / base['cpu']:.2f}x)",
                flush=True,
            )
    print()
    print(
        f"world sizes {args.world_sizes}, {args.epochs} epochs, DistributedSampler, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f} (ratios are only comparable on an otherwise idle machine)"
    )
    print(
        "| samples | ddpcheck | loader-only | ratio | CPU ratio | peak RSS, any ddpcheck process "
        "| of which parent |"
    )
    print("|---|---|---|---|---|---|---|")
    for n, ours, base in rows:
        print(
            f"| {n:,} | {ours['seconds']:.1f} s | {base['seconds']:.1f} s | "
            f"{ours['seconds'] / base['seconds']:.2f}x | {ours['cpu'] / base['cpu']:.2f}x | "
            f"{gib(ours['max_rss'])} GiB | "
            f"{gib(ours['parent_rss'])} GiB |"
        )
    n, ours, base = rows[-1]
    ratio = ours["seconds"] / base["seconds"]
    print(
        f"\nat {n:,}: ratio {ratio:.2f} (target <= 1.3), largest process {gib(ours['max_rss'])} GiB "
        f"(target <= 1.00)"
    )


if __name__ == "__main__":
    main()
