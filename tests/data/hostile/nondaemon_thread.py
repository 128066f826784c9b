"""Hostile: the factory leaves a non-daemon thread waiting forever (a process exit would wait for it)."""

import threading

from torch.utils.data import DataLoader, DistributedSampler

_forever = threading.Event()


def make_loader(rank: int, world_size: int) -> DataLoader:
    threading.Thread(target=_forever.wait, name="user-non-daemon", daemon=False).start()
    data = list(range(32))
    return DataLoader(data, batch_size=4, sampler=DistributedSampler(data, world_size, rank, shuffle=False))
