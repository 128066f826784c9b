"""Hostile: the factory changes the working directory (a library that chdirs into its cache)."""

import os
import tempfile

from torch.utils.data import DataLoader, DistributedSampler


def make_loader(rank: int, world_size: int) -> DataLoader:
    os.chdir(tempfile.gettempdir())
    data = list(range(32))
    return DataLoader(data, batch_size=4, sampler=DistributedSampler(data, world_size, rank, shuffle=False))
