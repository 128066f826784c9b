"""Hostile: rank 1's factory calls sys.exit(0). A false pass if it ended ddpcheck with exit 0."""

import sys

from torch.utils.data import DataLoader, DistributedSampler


def make_loader(rank: int, world_size: int) -> DataLoader:
    if rank == 1:
        sys.exit(0)
    data = list(range(32))
    return DataLoader(data, batch_size=4, sampler=DistributedSampler(data, world_size, rank, shuffle=False))
