"""The float noise behind ``metric_equivalence``'s tolerance (issue 41): a mean over n float32 values summed
batch by batch (32) at one process, against the same values summed by W ranks over strided shares and the
ranks' sums added (an all-reduce), for n up to a million and W up to 8. Prints the relative difference of
each and the largest; the tolerance (relative 1e-5) must stay well above it.

    python benchmarks/bench_metric_noise.py
"""

from __future__ import annotations

import torch


def summed(values: torch.Tensor) -> torch.Tensor:
    total = torch.zeros((), dtype=torch.float32)
    for batch in values.split(32):
        total += batch.sum()
    return total


def main() -> None:
    generator = torch.Generator().manual_seed(0)
    worst = 0.0
    for n in (1_001, 10_000, 100_000, 1_000_000):
        values = (torch.rand(n, generator=generator) * 3).float()
        one = float(summed(values))
        for world in (2, 4, 8):
            ranks = float(torch.stack([summed(values[r::world]) for r in range(world)]).sum())
            rel = abs(ranks - one) / abs(one)
            worst = max(worst, rel)
            print(f"n={n:>9,} ws={world}: relative difference {rel:.1e}")
    print(f"largest {worst:.1e}; tolerance 1e-05 is {1e-5 / worst:.0f}x that")


if __name__ == "__main__":
    main()
