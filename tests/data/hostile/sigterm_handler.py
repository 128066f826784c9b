"""Hostile: the factory installs a SIGTERM handler that ignores the signal, then works for minutes.

Once the handler is in place it creates the file named by ``DDPCHECK_TEST_MARKER`` (when set), so a
test knows when to send its signal.
"""

import os
import signal
import time
from pathlib import Path

from torch.utils.data import DataLoader, DistributedSampler


def make_loader(rank: int, world_size: int) -> DataLoader:
    signal.signal(signal.SIGTERM, lambda *_: None)
    marker = os.environ.get("DDPCHECK_TEST_MARKER")
    if marker:
        Path(marker).touch()
    time.sleep(600)
    data = list(range(32))
    return DataLoader(data, batch_size=4, sampler=DistributedSampler(data, world_size, rank, shuffle=False))
