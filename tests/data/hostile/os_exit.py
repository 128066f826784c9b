"""Hostile: rank 1's factory calls os._exit(0): the process is gone without a word."""

import os

from torch.utils.data import DataLoader, DistributedSampler


def make_loader(rank: int, world_size: int) -> DataLoader:
    if rank == 1:
        os._exit(0)
    data = list(range(32))
    return DataLoader(data, batch_size=4, sampler=DistributedSampler(data, world_size, rank, shuffle=False))
