"""Work that simulated ranks would each repeat identically, done once and shared.

Under ``--simulate`` every rank runs in one process, one after another, and a sampler such as
``DistributedSampler`` makes each rank draw the *same* seeded permutation of the whole dataset and
turn it into a list: O(world size x dataset) work that real ranks do in parallel. Here a
``torch.randperm`` drawn from a generator in a state already seen returns the permutation computed
then (and leaves the generator in the state the real call would have), and ``tolist()`` of such a
permutation returns a fresh copy of the list made then. Nothing is shared that the code could tell
apart: a permutation modified in place is recomputed, and every caller gets its own list.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from typing import Any

import torch


class _Shared:
    def __init__(self) -> None:
        self.perms: dict[tuple[Any, ...], tuple[torch.Tensor, int, torch.Tensor]] = {}
        self.lists: dict[int, tuple[torch.Tensor, int, list[Any]]] = {}
        self.perm_ids: dict[int, torch.Tensor] = {}
        self.hits = 0


def _key(n: int, generator: torch.Generator, kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    if generator.device.type != "cpu" or set(kwargs) - {"dtype"}:
        return None
    state = hashlib.blake2b(generator.get_state().numpy().tobytes(), digest_size=16).digest()
    return (n, kwargs.get("dtype"), state)


@contextlib.contextmanager
def shared_permutations() -> Iterator[_Shared]:
    """Within the block, share seeded ``torch.randperm`` results and their ``tolist()`` across callers."""
    shared = _Shared()
    real_randperm = torch.randperm
    real_tolist = torch.Tensor.tolist

    def randperm(n: int, *args: Any, generator: torch.Generator | None = None, **kwargs: Any) -> Any:
        key = _key(n, generator, kwargs) if generator is not None and not args else None
        if key is None:
            return real_randperm(n, *args, generator=generator, **kwargs)
        cached = shared.perms.get(key)
        if cached is not None and cached[0]._version == cached[1]:
            shared.hits += 1
            generator.set_state(cached[2])  # type: ignore[union-attr]
            return cached[0]
        perm = real_randperm(n, generator=generator, **kwargs)
        shared.perms[key] = (perm, perm._version, generator.get_state())  # type: ignore[union-attr]
        shared.perm_ids[id(perm)] = perm
        return perm

    def tolist(self: torch.Tensor) -> Any:
        cached = shared.lists.get(id(self))
        if cached is not None and cached[0] is self and cached[1] == self._version:
            return list(cached[2])
        out = real_tolist(self)
        if shared.perm_ids.get(id(self)) is self:
            shared.lists[id(self)] = (self, self._version, list(out))
        return out

    torch.randperm = randperm  # type: ignore[assignment]
    torch.Tensor.tolist = tolist  # type: ignore[method-assign,assignment]
    try:
        yield shared
    finally:
        torch.randperm = real_randperm  # type: ignore[assignment]
        torch.Tensor.tolist = real_tolist  # type: ignore[method-assign]


VERIFY_FIRST = 2  # the first draws of every simulated child are checked against the sampler's own code
VERIFY_EVERY = 128  # and then every 128th


class Shortcuts:
    """What :func:`known_samplers` did in one child: draws computed directly, and how many were checked."""

    def __init__(self) -> None:
        self.direct = 0
        self.verified = 0
        self.mismatch = ""  # non-empty: a direct draw differed from the real one (the run must be redone)

    def summary(self) -> dict[str, Any]:
        return {"direct": self.direct, "verified": self.verified, "mismatch": self.mismatch}


@contextlib.contextmanager
def known_samplers() -> Iterator[Shortcuts]:
    """Within the block, torch's own ``DistributedSampler`` (the exact class) computes its rank's share
    with numpy from the (shared) permutation instead of building and slicing a list of the whole
    dataset: O(share) instead of O(dataset) per simulated rank. Recognising the sampler is only
    trusted because it is verified: the first draws and every ``VERIFY_EVERY``-th run the sampler's
    real ``__iter__`` too and must match, else the child stops shortcutting and says so.
    """
    from torch.utils.data.distributed import DistributedSampler

    done = Shortcuts()
    real_iter = DistributedSampler.__iter__

    def direct_iter(self: DistributedSampler[Any]) -> Iterator[Any]:
        if type(self) is not DistributedSampler or done.mismatch:
            return real_iter(self)
        share = _direct_share(self)
        if share is None:
            return real_iter(self)
        done.direct += 1
        if done.direct <= VERIFY_FIRST or done.direct % VERIFY_EVERY == 0:
            real = list(real_iter(self))
            done.verified += 1
            if real != share:
                done.mismatch = (
                    f"rank {self.rank} of {self.num_replicas}, epoch {self.epoch}: the direct computation "
                    f"differs from DistributedSampler.__iter__ (torch {torch.__version__})"
                )
                return iter(real)
        return iter(share)

    DistributedSampler.__iter__ = direct_iter  # type: ignore[method-assign]
    try:
        yield done
    finally:
        DistributedSampler.__iter__ = real_iter  # type: ignore[method-assign]


def _direct_share(sampler: Any) -> list[int] | None:
    """``DistributedSampler.__iter__``'s list for this rank, by index arithmetic; None if unsure."""
    import numpy as np

    try:
        n = len(sampler.dataset)
        total, replicas, rank = sampler.total_size, sampler.num_replicas, sampler.rank
        if not all(isinstance(v, int) for v in (n, total, replicas, rank, sampler.num_samples)) or n <= 0:
            return None
        if sampler.shuffle:
            generator = torch.Generator()
            generator.manual_seed(sampler.seed + sampler.epoch)
            base = torch.randperm(n, generator=generator).numpy()
        else:
            base = np.arange(n, dtype=np.int64)
    except Exception:  # anything unusual: the real code decides, and raises its own errors
        return None
    if sampler.drop_last:
        if total > n:
            return None
        positions = np.arange(rank, total, replicas)
    else:
        if total < n:
            return None
        positions = np.arange(rank, total, replicas) % n  # padding repeats the order from its start
    share = base[positions]
    if len(share) != sampler.num_samples:
        return None
    return list(share.tolist())
