"""Hostile: ``sample_ids`` returns instances of a class defined in this file (the parent never imports it)."""

from dataclasses import dataclass

from torch.utils.data import DataLoader, DistributedSampler


@dataclass(frozen=True)
class SampleId:
    shard: str
    row: int


def make_loader(rank: int, world_size: int) -> DataLoader:
    data = [{"sid": SampleId("a", i)} for i in range(20)]
    sampler = DistributedSampler(data, world_size, rank, seed=0)
    return DataLoader(data, batch_size=4, sampler=sampler, collate_fn=list)


def sample_ids(batch: list[dict]) -> list[SampleId]:
    return [item["sid"] for item in batch]
