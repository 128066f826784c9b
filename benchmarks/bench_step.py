"""What the step watcher costs a training loop, as ratios against the same loop without it, in one run.

A small training script (an MLP of 12 linear layers with dropout, batch 32 from a DataLoader, noise drawn
in the loop, accumulation over 2 batches, clipping, Adam; 400 batches) runs in a fresh process per
mode, alternating modes per repeat:

- ``plain``: no watcher;
- ``counting``: the watcher installed and every batch handed through it, no window compared
  (``compare_batches=0``): what the hooks cost outside compared steps;
- ``compared``: every window compared: forward hooks, kept gradients, recorded draws, dropout off and
  each window's batches, draws and weights saved for a replay.

Only the loop is timed (imports and start-up excluded). Per-call costs of what the hooks wrap are
measured in this process too (the fastest of 7 repeats, which a loaded machine disturbs least).
Targets: ``counting`` at most 1.05x ``plain``; ``compared`` is what a compared step costs, reported
(the recorder compares a few steps per epoch).

    python benchmarks/bench_step.py [--repeats 5] [--batches 400]
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

MODES = ("plain", "counting", "compared")
ROOT = Path(__file__).resolve().parent.parent


def child(mode: str, batches: int, out: str) -> float:
    """One run of the loop in this process; returns its seconds."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    watcher = None
    if mode != "plain":
        from ddpcheck.checker.step import StepOptions, install_watcher

        watcher = install_watcher(
            StepOptions(
                out=out if mode == "compared" else "", compare_batches=None if mode == "compared" else 0
            )
        )
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(12):
        layers += [nn.Linear(128, 128), nn.ReLU(), nn.Dropout(0.1)]
    model = nn.Sequential(*layers, nn.Linear(128, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = TensorDataset(torch.randn(batches * 32, 128), torch.randint(0, 10, (batches * 32,)))
    loader = DataLoader(data, batch_size=32)
    started = time.perf_counter()
    for position, batch in enumerate(loader):
        if watcher is not None:
            batch = watcher.handed("bench", 0, position, batch)
        x, y = batch
        loss = F.cross_entropy(model(x + 0.01 * torch.randn_like(x)), y) / 2
        loss.backward()
        if position % 2 == 1:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
    seconds = time.perf_counter() - started
    if watcher is not None:
        trace = watcher.finish()
        assert len(trace.steps) == batches // 2, len(trace.steps)
    return seconds


def per_call() -> dict[str, tuple[float, float]]:
    """Microseconds per call (min of repeats, so load matters less) of what the hooks wrap, without and
    with the watcher installed, outside compared windows."""
    import timeit

    import torch
    import torch.nn.functional as F

    x = torch.ones(4, 4, requires_grad=True)
    batch = (torch.ones(32, 8), torch.zeros(32, dtype=torch.long))
    calls = {
        "torch.randn(4)": lambda: torch.randn(4),
        "F.dropout": lambda: F.dropout(x, 0.1),
        "backward": lambda: (x * 2).sum().backward(),
    }

    def best(call: object) -> float:
        return min(timeit.repeat(call, number=2000, repeat=7)) / 2000 * 1e6  # type: ignore[arg-type]

    before = {name: best(call) for name, call in calls.items()}
    from ddpcheck.checker.step import StepOptions, install_watcher

    watcher = install_watcher(StepOptions(compare_batches=0))
    positions = iter(range(10**9))
    after = {name: best(call) for name, call in calls.items()}
    before["handed(batch)"] = 0.0
    after["handed(batch)"] = best(lambda: watcher.handed("bench", 0, next(positions), batch))
    watcher.finish()
    return {name: (before[name], after[name]) for name in calls.keys() | {"handed(batch)"}}


def timed(mode: str, batches: int) -> float:
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        command = [sys.executable, __file__, "--child", mode, "--batches", str(batches), "--out", out]
        done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{mode} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(child(args.child, args.batches, args.out))
        return
    for name, (plain, watched) in sorted(per_call().items()):
        print(f"  per call, {name:16s} {plain:7.2f} us plain, {watched:7.2f} us watched")
    runs: dict[str, list[float]] = {mode: [] for mode in MODES}
    for repeat in range(args.repeats):
        for mode in MODES if repeat % 2 == 0 else tuple(reversed(MODES)):
            runs[mode].append(timed(mode, args.batches))
    median = {mode: statistics.median(times) for mode, times in runs.items()}
    print(
        f"{args.batches} batches of 32, a 12-layer MLP, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
    )
    for mode, times in runs.items():
        print(f"  {mode:9s} {median[mode]:6.3f} s  ({', '.join(f'{t:.3f}' for t in times)})")
    print(f"  counting / plain: {median['counting'] / median['plain']:.3f}x  (target <= 1.05)")
    print(f"  compared / plain: {median['compared'] / median['plain']:.3f}x  (every window compared)")


if __name__ == "__main__":
    main()
