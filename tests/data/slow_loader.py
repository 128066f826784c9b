"""A loader whose epoch takes minutes (one batch per second), with DataLoader workers alive meanwhile."""

import time

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class SlowDataset(Dataset):
    def __len__(self) -> int:
        return 400

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.5)
        return torch.tensor(index)


def make_loader(rank: int, world_size: int) -> DataLoader:
    dataset = SlowDataset()
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=False)
    return DataLoader(dataset, batch_size=2, sampler=sampler, num_workers=2)
