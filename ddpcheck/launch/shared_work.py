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
