"""Benchmark loader for meshes: ``DistributedSampler`` over the data-parallel coordinate.

The same data as ``loader_100k.py`` (``DDPCHECK_BENCH_N`` samples), sharded by ``dp_rank`` and
``dp_world_size``, which ddpcheck passes at a plain world size too (there: the rank and the world size).
"""

import os

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

N = int(os.environ.get("DDPCHECK_BENCH_N", "100000"))


def make_loader(dp_rank: int, dp_world_size: int) -> DataLoader:
    dataset = TensorDataset(torch.arange(N, dtype=torch.float32))
    sampler = DistributedSampler(dataset, num_replicas=dp_world_size, rank=dp_rank, shuffle=True, seed=0)
    return DataLoader(dataset, batch_size=64, sampler=sampler)
