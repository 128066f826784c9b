"""Benchmark loader: 100,000 token sequences of 4-128 tokens behind DistributedSampler, padded batches.

Every sequence is computed from its index (no table of 100,000 tensors): ``input_ids`` of a seeded
length, batches of 32 padded with an ``attention_mask`` and ``labels``, as a language-model loader
hands them to a model. ``DDPCHECK_BENCH_N`` changes the size.
"""

import os

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

N = int(os.environ.get("DDPCHECK_BENCH_N", "100000"))
LENGTHS = torch.randint(4, 129, (N,), generator=torch.Generator().manual_seed(0))


class Sequences(Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict:
        return {"id": i, "input_ids": torch.arange(int(LENGTHS[i])) % 997 + 1}


def pad(items: list[dict]) -> dict:
    width = max(len(it["input_ids"]) for it in items)
    ids = torch.zeros(len(items), width, dtype=torch.long)
    mask = torch.zeros(len(items), width, dtype=torch.long)
    for row, it in enumerate(items):
        ids[row, : len(it["input_ids"])] = it["input_ids"]
        mask[row, : len(it["input_ids"])] = 1
    return {
        "id": torch.tensor([it["id"] for it in items]),
        "input_ids": ids,
        "attention_mask": mask,
        "labels": ids.masked_fill(mask == 0, -100),
    }


def make_loader(rank: int, world_size: int) -> DataLoader:
    data = Sequences()
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    return DataLoader(data, batch_size=32, sampler=sampler, collate_fn=pad)
