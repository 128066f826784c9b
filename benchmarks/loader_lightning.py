"""Benchmark loader that imports Lightning at module level, as a LightningDataModule user's file does.

The data path is the torch-only twin's (``loader_torch_only.py``): the only difference between the
two is the ~3-4 s import of Lightning, which every rank of every run pays unless it is preloaded.
"""

import lightning as L
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

N = 10_000


class Numbers(L.LightningDataModule):
    def __init__(self, rank: int, world_size: int) -> None:
        super().__init__()
        self.rank, self.world_size = rank, world_size

    def train_dataloader(self) -> DataLoader:
        dataset = TensorDataset(torch.arange(N, dtype=torch.float32))
        sampler = DistributedSampler(
            dataset, num_replicas=self.world_size, rank=self.rank, shuffle=True, seed=0
        )
        return DataLoader(dataset, batch_size=64, sampler=sampler)


def make_loader(rank: int, world_size: int) -> DataLoader:
    return Numbers(rank, world_size).train_dataloader()
