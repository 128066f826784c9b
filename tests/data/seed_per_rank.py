"""Buggy: the sampler seed depends on the rank, so ranks overlap and miss samples."""

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def make_loader(rank, world_size):
    dataset = TensorDataset(torch.arange(100, dtype=torch.float32))
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=rank)
    return DataLoader(dataset, batch_size=8, sampler=sampler)
