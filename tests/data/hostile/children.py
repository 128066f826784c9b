"""Hostile: the factory starts two long-lived helper processes, one escaped into its own session."""

import subprocess
import sys

from torch.utils.data import DataLoader, DistributedSampler

SLEEP = [sys.executable, "-c", "import time; time.sleep(300)"]


def make_loader(rank: int, world_size: int) -> DataLoader:
    subprocess.Popen(SLEEP)
    subprocess.Popen(SLEEP, start_new_session=True)
    data = list(range(32))
    return DataLoader(data, batch_size=4, sampler=DistributedSampler(data, world_size, rank, shuffle=False))
