"""The torch-only twin of ``loader_lightning.py``: the same loader, no Lightning import."""

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

N = 10_000


def make_loader(rank: int, world_size: int) -> DataLoader:
    dataset = TensorDataset(torch.arange(N, dtype=torch.float32))
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    return DataLoader(dataset, batch_size=64, sampler=sampler)
