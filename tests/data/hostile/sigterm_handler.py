"""Hostile: the factory installs a SIGTERM handler that ignores the signal, then works for minutes."""

import signal
import time

from torch.utils.data import DataLoader, DistributedSampler


def make_loader(rank: int, world_size: int) -> DataLoader:
    signal.signal(signal.SIGTERM, lambda *_: None)
    print("HANDLER-INSTALLED", flush=True)
    time.sleep(600)
    data = list(range(32))
    return DataLoader(data, batch_size=4, sampler=DistributedSampler(data, world_size, rank, shuffle=False))
