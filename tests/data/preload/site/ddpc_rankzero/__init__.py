"""Lightning's convention: ``rank_zero_only.rank`` is read from the environment when imported."""

import os


def rank_zero_only(fn):
    def wrapped(*args, **kwargs):
        return fn(*args, **kwargs) if rank_zero_only.rank == 0 else None

    return wrapped


rank_zero_only.rank = int(os.environ.get("RANK", 0))
