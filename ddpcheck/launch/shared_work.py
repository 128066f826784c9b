"""Work that simulated ranks would each repeat identically, done once and shared.

Under ``--simulate`` every rank runs in one process, one after another, and a sampler such as
``DistributedSampler`` makes each rank draw the *same* seeded permutation of the whole dataset and
turn it into a list: O(world size x dataset) work that real ranks do in parallel. Here a
``torch.randperm`` drawn from a generator in a state already seen returns the permutation computed
then (and leaves the generator in the state the real call would have), and ``tolist()`` of such a
permutation returns a fresh copy of the list made then. Nothing is shared that the code could tell
apart: a permutation modified in place is recomputed, and every caller gets its own list. What is kept
has a budget (:data:`SHARED_BYTES`): a simulated process must stay near one rank's own memory, so a
permutation of tens of millions is drawn again by each rank rather than held as Python ints.

At scale (:data:`ARRAYS_FROM` samples and more) a recognised sampler's epoch is read as one numpy array
instead (:func:`epoch_array`): a billion Python ints would need tens of GB, its indices as ``uint32`` need
4 bytes each. Its permutation is drawn once per epoch and kept, narrowed, for the child's other ranks.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from typing import Any, cast

import torch

_RANDPERM = torch.randperm  # the real one, whatever shared_permutations has put in its place
SHARED_BYTES = 64 << 20  # kept permutations (8 bytes an index) and their lists (~40), each kind at most
_LIST_ITEM_BYTES = 40  # a list slot and a small int object


class _Shared:
    def __init__(self) -> None:
        self.perms: dict[tuple[Any, ...], tuple[torch.Tensor, int, torch.Tensor]] = {}
        self.lists: dict[int, tuple[torch.Tensor, int, list[Any]]] = {}
        self.perm_ids: dict[int, torch.Tensor] = {}
        self.hits = 0

    def room(self, kept: dict[Any, Any], item_bytes: int, n: int) -> bool:
        """Whether ``n`` more items fit the budget of ``kept`` (the oldest are let go to make room)."""
        need = n * item_bytes
        if need > SHARED_BYTES:
            return False
        while kept and (sum(len(_items(v)) for v in kept.values()) * item_bytes + need > SHARED_BYTES):
            key = next(iter(kept))
            old = kept.pop(key)
            if kept is self.perms:
                self.perm_ids.pop(id(old[0]), None)
        return True


def _items(entry: tuple[Any, ...]) -> Any:
    return entry[2] if isinstance(entry[2], list) else entry[0]


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
        if shared.room(shared.perms, perm.element_size(), n):
            shared.perms[key] = (perm, perm._version, generator.get_state())  # type: ignore[union-attr]
            shared.perm_ids[id(perm)] = perm
        return perm

    def tolist(self: torch.Tensor) -> Any:
        cached = shared.lists.get(id(self))
        if cached is not None and cached[0] is self and cached[1] == self._version:
            return list(cached[2])
        out = real_tolist(self)
        if shared.perm_ids.get(id(self)) is self and shared.room(shared.lists, _LIST_ITEM_BYTES, len(out)):
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


ARRAYS_FROM = 1 << 20  # from this many samples on, a recognised sampler's epoch is read as one array
PERMUTATION_BYTES = 3 << 30  # narrowed permutations a child keeps for its next ranks, at most
MAPPED_FROM_BYTES = 64 << 20  # a permutation this large is kept as its shared file's pages, one at a time


class Shortcuts:
    """What :func:`known_samplers` did in one child: draws computed directly, how many were checked, and
    epochs read as arrays (each kind of sampler they came from checked once against its real code)."""

    def __init__(self) -> None:
        self.direct = 0
        self.verified = 0
        self.arrays = 0
        self.probes = 0  # small datasets on which the arrays' arithmetic was checked against the real code
        self.mismatch = ""  # non-empty: a direct draw differed from the real one (the run must be redone)
        self.probed: set[tuple[Any, ...]] = set()
        self.permutations: dict[tuple[int, int], Any] = {}  # (n, seed): the permutation, narrowed
        self.real_iter: Any = None  # DistributedSampler.__iter__ as torch defines it

    def summary(self) -> dict[str, Any]:
        return {
            "direct": self.direct,
            "verified": self.verified,
            "arrays": self.arrays,
            "probes": self.probes,
            "mismatch": self.mismatch,
        }


_ACTIVE: list[Shortcuts] = []  # the known_samplers block in effect in this process, if any


@contextlib.contextmanager
def known_samplers(lists: bool = True) -> Iterator[Shortcuts]:
    """Within the block, torch's own ``DistributedSampler`` (the exact class) computes its rank's share
    with numpy from the (shared) permutation instead of building and slicing a list of the whole
    dataset: O(share) instead of O(dataset) per simulated rank (``lists`` False: not as lists; the
    recorder may still read epochs at scale as arrays, :func:`epoch_array`). Recognising the sampler is
    only trusted because it is verified: the first draws and every ``VERIFY_EVERY``-th run the sampler's
    real ``__iter__`` too and must match, else the child stops shortcutting and says so.
    """
    from torch.utils.data.distributed import DistributedSampler

    done = Shortcuts()
    real_iter = done.real_iter = DistributedSampler.__iter__

    def direct_iter(self: DistributedSampler[Any]) -> Iterator[Any]:
        if type(self) is not DistributedSampler or done.mismatch or not lists:
            return real_iter(self)
        share = _direct_share(self, done.permutations)
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
    _ACTIVE.append(done)
    try:
        yield done
    finally:
        _ACTIVE.remove(done)
        DistributedSampler.__iter__ = real_iter  # type: ignore[method-assign]


def _direct_share(sampler: Any, permutations: dict[tuple[int, int], Any]) -> list[int] | None:
    """``DistributedSampler.__iter__``'s list for this rank, by index arithmetic; None if unsure. The
    epoch's permutation is drawn once in the child and kept (``permutations``): drawn again for every
    simulated rank it cost 2048 draws of a 1M permutation at world size 1024, 2 epochs."""
    share = _share_array(sampler, permutations)
    return None if share is None else share.tolist()


def _share_array(sampler: Any, permutations: dict[tuple[int, int], Any] | None = None) -> Any:
    """``DistributedSampler.__iter__``'s indices for this rank as a numpy array, by index arithmetic
    (None if unsure). ``permutations``: where a drawn permutation is kept, narrowed, for the next ranks."""
    import numpy as np

    try:
        n = len(sampler.dataset)
        total, replicas, rank = sampler.total_size, sampler.num_replicas, sampler.rank
        if not all(isinstance(v, int) for v in (n, total, replicas, rank, sampler.num_samples)) or n <= 0:
            return None
        if (total > n and sampler.drop_last) or (total < n and not sampler.drop_last):
            return None
        base = _permutation(n, sampler.seed + sampler.epoch, permutations) if sampler.shuffle else None
    except Exception:  # anything unusual: the real code decides, and raises its own errors
        return None
    if base is None:
        head = np.arange(rank, min(total, n), replicas, dtype=np.int64)
    else:
        head = base[rank : min(total, n) : replicas]
    if total > n:  # padding repeats the order from its start
        first = rank + replicas * len(head)
        tail = np.arange(first, total, replicas) % n
        head = np.concatenate([head, tail if base is None else base[tail]])
    if len(head) != sampler.num_samples:
        return None
    return head


def _permutation(n: int, seed: int, kept: dict[tuple[int, int], Any] | None) -> Any:
    """``torch.randperm(n)`` from a generator seeded ``seed``, as numpy (kept narrowed when ``kept`` is
    given: a billion indices as ``uint32``, 4 GB instead of 8, while no more than PERMUTATION_BYTES).

    Kept ones are also shared through the run's temp directory (:func:`~ddpcheck.launch.rank.shared_tmp`):
    the reference's process draws a 1e8-sample epoch's permutation once (15 s of CPU), every later
    simulated process of the run maps the file instead of drawing it again."""
    import numpy as np

    if kept is not None and (n, seed) in kept:
        return kept[(n, seed)]
    if kept is not None:  # a mapped file is mapped again in milliseconds: only the epoch in use stays mapped
        for key in [k for k, v in kept.items() if isinstance(v, np.memmap)]:
            del kept[key]
    mapped = 4 * n >= MAPPED_FROM_BYTES  # smaller ones stay in memory: mapping costs ~1 ms a rank
    shared = _shared_file(n, seed) if kept is not None else ""
    if shared and os.path.exists(shared):
        with contextlib.suppress(OSError, ValueError):
            narrow = np.load(shared, mmap_mode="r" if mapped else None)
            if len(narrow) == n:
                return _keep(kept, (n, seed), narrow)
    generator = torch.Generator()
    generator.manual_seed(seed)
    drawn = _RANDPERM(n, generator=generator).numpy()
    if kept is None:
        return drawn
    narrow = drawn.astype(np.uint32) if n <= 1 << 32 else drawn
    del drawn
    if shared:
        with contextlib.suppress(OSError, ValueError):
            partial = f"{shared}.{os.getpid()}.part"
            with open(partial, "wb") as handle:
                np.save(handle, narrow)
            os.replace(partial, shared)
            if mapped:
                narrow = np.load(shared, mmap_mode="r")  # the file's pages: dropped when done
    return _keep(kept, (n, seed), narrow)


def _keep(kept: dict[tuple[int, int], Any] | None, key: tuple[int, int], narrow: Any) -> Any:
    if kept is not None:
        while kept and sum(p.nbytes for p in kept.values()) + narrow.nbytes > PERMUTATION_BYTES:
            del kept[next(iter(kept))]  # the oldest epoch's
        kept[key] = narrow
    return narrow


def _shared_file(n: int, seed: int) -> str:
    """Where the run keeps the permutation of ``n`` from ``seed`` ("" outside a run, or past its budget)."""
    from ddpcheck.launch.rank import RUN_TMPDIR_ENV

    run_dir = os.environ.get(RUN_TMPDIR_ENV, "")
    if not run_dir or not os.path.isdir(run_dir):
        return ""
    folder = os.path.join(run_dir, ".ddpcheck-permutations")
    with contextlib.suppress(OSError):
        os.makedirs(folder, exist_ok=True)
        name = os.path.join(folder, f"{n}-{seed}-torch{torch.__version__}.npy")
        if os.path.exists(name):
            return name
        held = sum(e.stat().st_size for e in os.scandir(folder) if e.name.endswith(".npy"))
        return name if held + 4 * n <= PERMUTATION_BYTES else ""
    return ""


def epoch_array(sampler: Any) -> Any:
    """Under :func:`known_samplers` (a simulated rank): the epoch of torch's own ``DistributedSampler`` (the
    exact class) over at least :data:`ARRAYS_FROM` samples, as one numpy array of indices; None for any
    other sampler, or outside the block. Trusted because checked: the first epoch of each kind (shuffle,
    drop_last, replicas, the dataset's remainder modulo them) in this child is compared with the real
    ``__iter__`` on a small dataset of that kind; a difference stops the arrays and is reported as a
    mismatch (the run is then redone without shortcuts)."""
    from torch.utils.data.distributed import DistributedSampler

    done = _ACTIVE[-1] if _ACTIVE else None
    if done is None or done.mismatch or type(sampler) is not DistributedSampler:
        return None
    dataset: Any = sampler.dataset
    try:
        n = len(dataset)
    except Exception:
        return None
    if not isinstance(n, int) or n < ARRAYS_FROM:
        return None
    if not _probe(sampler, n, done):
        return None
    share = _share_array(sampler, done.permutations)
    if share is not None:
        done.arrays += 1
    return share


def _probe(sampler: Any, n: int, done: Shortcuts) -> bool:
    """The real ``DistributedSampler.__iter__`` and :func:`_share_array` agree on a small dataset with this
    sampler's settings and the same remainder modulo its replicas (once per kind; False: they differ)."""
    from torch.utils.data.distributed import DistributedSampler

    replicas, rank = sampler.num_replicas, sampler.rank
    kind = (sampler.shuffle, sampler.drop_last, replicas, n % replicas)
    if kind in done.probed:
        return True
    size = 3 * replicas + n % replicas
    small: Any = DistributedSampler(
        cast(Any, range(size)), replicas, rank, shuffle=sampler.shuffle, seed=sampler.seed,
        drop_last=sampler.drop_last,
    )  # fmt: skip
    small.set_epoch(sampler.epoch)
    real = list(done.real_iter(small))
    share = _share_array(small)
    done.probes += 1
    if share is None or share.tolist() != real:
        done.mismatch = (
            f"rank {rank} of {replicas}, epoch {sampler.epoch}: the epoch read as an array differs from "
            f"DistributedSampler.__iter__ (torch {torch.__version__})"
        )
        return False
    done.probed.add(kind)
    return True
