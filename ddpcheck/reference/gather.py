"""Moving a sync's bytes and rows between ranks (:mod:`ddpcheck.reference.sync`): raw bytes of every dtype,
small keys in one all-gather padded to the longest rank, a large key gathered straight into its result
or broadcast by each rank into its place, and JSON for the schema; nothing here unpickles."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

_SMALL_BYTES = 4 << 20  # per-rank keys below this size share one all-gather


def comm_device() -> torch.device:
    """Where collective buffers must live for the default group's backend."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_gather_flat(out: torch.Tensor, inp: torch.Tensor, group: Any = None) -> None:
    """All-gather equal-sized ``inp`` from every rank (of ``group``) into ``out``, concatenated on dim 0."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, inp, group=group)


def _gather_bytes(payload: bytes, comm: torch.device, group: Any = None) -> list[bytes]:
    """Every rank's ``payload``, in rank order, sent as tensors (never pickled)."""
    world = dist.get_world_size(group)
    size = torch.tensor([len(payload)], dtype=torch.int64, device=comm)
    sizes_t = torch.empty(world, dtype=torch.int64, device=comm)
    _all_gather_flat(sizes_t, size, group)
    sizes = sizes_t.tolist()
    longest = max(sizes)
    if longest == 0:
        return [b""] * world
    buf = torch.zeros(longest, dtype=torch.uint8)
    if payload:
        buf[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    out = torch.empty(world * longest, dtype=torch.uint8, device=comm)
    _all_gather_flat(out, buf.to(comm), group)
    host = out.cpu().numpy()
    return [host[r * longest : r * longest + sizes[r]].tobytes() for r in range(world)]


def exchange_json(obj: Any, comm: torch.device, group: Any = None) -> list[Any]:
    """Every rank's JSON-able ``obj``; floats (NaN and infinities included) round-trip exactly."""
    payload = json.dumps(obj, separators=(",", ":")).encode()
    return [json.loads(b) for b in _gather_bytes(payload, comm, group)]


@dataclass
class Rows:
    """One key's bytes: ``counts[r]`` rows of ``rowbytes`` on rank r; ``local`` is this rank's."""

    counts: list[int]
    rowbytes: int
    local: torch.Tensor | None  # (counts[rank], rowbytes) uint8 on the comm device


def gather_rows(jobs: dict[str, Rows], comm: torch.device, group: Any = None) -> dict[str, torch.Tensor]:
    """Merge every key's rows in rank order: ``{key: (sum(counts), rowbytes) uint8}``."""
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    merged: dict[str, torch.Tensor] = {}
    small: list[tuple[str, Rows, int]] = []
    for key, job in jobs.items():
        longest = max(job.counts)
        if longest * job.rowbytes == 0:
            merged[key] = torch.empty((sum(job.counts), job.rowbytes), dtype=torch.uint8, device=comm)
        elif longest * job.rowbytes < _SMALL_BYTES:
            small.append((key, job, longest))
        else:
            merged[key] = _gather_large(job, longest, rank, world, comm, group)
    if small:
        total = sum(longest * job.rowbytes for _, job, longest in small)
        buf = torch.zeros(total, dtype=torch.uint8, device=comm)
        offset = 0
        offsets = []
        for _, job, longest in small:
            offsets.append(offset)
            if job.local is not None and job.local.numel():
                buf[offset : offset + job.local.numel()] = job.local.reshape(-1)
            offset += longest * job.rowbytes
        out = torch.empty((world, total), dtype=torch.uint8, device=comm)
        _all_gather_flat(out.view(-1), buf, group)
        for (key, job, _), start in zip(small, offsets, strict=True):
            parts = [out[r, start : start + job.counts[r] * job.rowbytes] for r in range(world)]
            merged[key] = torch.cat(parts).view(sum(job.counts), job.rowbytes)
    return merged


def _gather_large(
    job: Rows, longest: int, rank: int, world: int, comm: torch.device, group: Any = None
) -> torch.Tensor:
    local = job.local
    if local is None:
        local = torch.empty((0, job.rowbytes), dtype=torch.uint8, device=comm)
    if all(c == longest for c in job.counts):
        out = torch.empty((world * longest, job.rowbytes), dtype=torch.uint8, device=comm)
        _all_gather_flat(out, local.contiguous(), group)  # the gathered buffer is the result: no copy
        return out
    # Unequal lengths: each rank broadcasts its rows straight into their final place. Padding to
    # the longest rank would cost a copy in and a trimming copy out (measured 1.6x slower on gloo).
    out = torch.empty((sum(job.counts), job.rowbytes), dtype=torch.uint8, device=comm)
    starts = list(itertools.accumulate(job.counts, initial=0))
    out[starts[rank] : starts[rank + 1]] = local
    works = [
        dist.broadcast(out[starts[r] : starts[r + 1]], src=_global(group, r), group=group, async_op=True)
        for r in range(world)
        if job.counts[r]
    ]
    for work in works:
        if work is not None:
            work.wait()
    return out


def _global(group: Any, rank: int) -> int:
    """The default group's number of ``group``'s rank ``rank`` (what ``broadcast(src=...)`` takes)."""
    return rank if group is None else int(dist.get_global_rank(group, rank))
