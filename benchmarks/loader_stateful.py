"""Benchmark loader for the resume check: torchdata's StatefulDataLoader over a DistributedSampler.

``DDPCHECK_BENCH_N`` samples (default 20,000), batch 64, no workers: the loader's own state_dict is
the resume mechanism, so ``resume`` runs at every world size.
"""

import os

import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler, TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

N = int(os.environ.get("DDPCHECK_BENCH_N", "20000"))


def make_loader() -> StatefulDataLoader:
    dataset = TensorDataset(torch.arange(N))
    sampler = DistributedSampler(dataset, dist.get_world_size(), dist.get_rank(), shuffle=True, seed=0)
    return StatefulDataLoader(dataset, batch_size=64, sampler=sampler)
