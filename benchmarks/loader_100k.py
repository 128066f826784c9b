"""Benchmark loader: a 100,000-sample map-style dataset behind torch's DistributedSampler.

``DDPCHECK_BENCH_N`` changes the size (the simulate benchmark uses 1,000,000).
"""

import os

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

N = int(os.environ.get("DDPCHECK_BENCH_N", "100000"))


def make_loader(rank: int, world_size: int) -> DataLoader:
    dataset = TensorDataset(torch.arange(N, dtype=torch.float32))
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    return DataLoader(dataset, batch_size=64, sampler=sampler)
