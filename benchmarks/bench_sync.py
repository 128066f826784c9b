"""sync_dicts_ddp against a bare all_gather of the same tensor, in one run on 2 gloo ranks.

Each rank holds ``--mb`` MB of float32 embeddings plus a Python list of int ids (one per row).
Timed per repeat, between barriers, as the slowest rank's time; the median over repeats is printed
with its ratio to the bare ``torch.distributed.all_gather`` of the embeddings alone (target: <= 1.3x).
For scale, the same dict through ``all_gather_object`` (OML's way: pickle everything) is timed too.

    python benchmarks/bench_sync.py [--mb 50] [--repeats 9] [--world 2]
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from tabulate import tabulate

from ddpcheck.launch import GroupCall, run_ranks
from ddpcheck.reference.sync import sync_dicts_ddp

DIM = 256


def _timed(fn: Callable[[], Any], repeats: int) -> list[float]:
    """Per-repeat time of the slowest rank."""
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        fn()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times.append(elapsed.item())
    return times


def _body(mb: float, repeats: int, ragged: bool) -> bytes:
    torch.set_num_threads(1)  # 2 ranks share the cores; also safe after fork (OpenMP)
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = int(mb * 1e6 / 4 / DIM) - (rank * 7 if ragged else 0)
    emb = torch.randn(rows, DIM, generator=torch.Generator().manual_seed(rank))
    ids = list(range(rank * rows, (rank + 1) * rows))
    outputs = {"embeddings": emb, "ids": ids}

    # all_gather needs equal sizes: with unequal rows the baseline gathers the longest rank's size.
    full = torch.randn(int(mb * 1e6 / 4 / DIM), DIM) if ragged else emb

    def bare() -> None:
        gathered = [torch.empty_like(full) for _ in range(world)]
        dist.all_gather(gathered, full)

    def ours() -> None:
        sync_dicts_ddp(outputs, world)

    def ours_no_pickle() -> None:
        sync_dicts_ddp(outputs, world, allow_pickle=False)

    def pickled() -> None:
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, outputs)
        torch.cat([g["embeddings"] for g in gathered])

    merged = sync_dicts_ddp(outputs, world)  # warm-up, and a correctness check
    assert merged["embeddings"].shape[0] == sum(
        int(mb * 1e6 / 4 / DIM) - (r * 7 if ragged else 0) for r in range(world)
    )
    assert len(merged["ids"]) == merged["embeddings"].shape[0]
    bare()
    results: dict[str, list[float]] = {}
    # Interleave the contenders so drift in machine load hits them alike.
    for _ in range(repeats):
        for name, fn in (("bare", bare), ("ours", ours), ("ours_no_pickle", ours_no_pickle)):
            results.setdefault(name, []).extend(_timed(fn, 1))
    results["pickled"] = _timed(pickled, max(3, repeats // 3))
    return pickle.dumps(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=50.0, help="MB of float32 embeddings per rank")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--world", type=int, default=2)
    args = parser.parse_args()
    table = []
    for ragged in (False, True):
        result = run_ranks(
            GroupCall(
                _body,
                world_size=args.world,
                kwargs={"mb": args.mb, "repeats": args.repeats, "ragged": ragged},
                timeout=600,
            )
        )
        result.raise_for_failures()
        times = pickle.loads(result.values[0])
        base = statistics.median(times["bare"])
        label = "unequal rows" if ragged else "equal rows"
        for name, desc in (
            ("bare", "dist.all_gather(embeddings) [baseline]"),
            ("ours", "sync_dicts_ddp(embeddings + ids)"),
            ("ours_no_pickle", "sync_dicts_ddp(..., allow_pickle=False)"),
            ("pickled", "all_gather_object(dict) (OML's way)"),
        ):
            med = statistics.median(times[name])
            table.append([label, desc, f"{med * 1e3:.1f}", f"{med / base:.2f}x", len(times[name])])
    print(f"{args.world} gloo ranks, {args.mb:g} MB float32 embeddings (dim {DIM}) + int ids per rank")
    print(tabulate(table, headers=["ranks hold", "operation", "median ms", "vs baseline", "repeats"]))


if __name__ == "__main__":
    main()
