"""Hostile: the factory never returns on rank 0 (a busy loop, not a wait)."""

from torch.utils.data import DataLoader, DistributedSampler


def make_loader(rank: int, world_size: int) -> DataLoader:
    while rank == 0:
        pass
    data = list(range(32))
    return DataLoader(data, batch_size=4, sampler=DistributedSampler(data, world_size, rank, shuffle=False))
