"""Hostile: the factory prints to stdout and stderr (ddpcheck's own stdout must stay its report)."""

import sys

from torch.utils.data import DataLoader, DistributedSampler


def make_loader(rank: int, world_size: int) -> DataLoader:
    print(f"USER-PRINT-MARKER rank {rank}")
    print(f"USER-STDERR-MARKER rank {rank}", file=sys.stderr)
    data = list(range(32))
    return DataLoader(data, batch_size=4, sampler=DistributedSampler(data, world_size, rank, shuffle=False))
