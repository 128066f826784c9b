"""``ddpcheck judge`` on the traces of a large launch: time and peak memory, and the planted bugs named.

Target (issue 37): a billion ids over 4096 ranks, written as ``uint32`` trace files, with an index that
overflowed (a wrapped ``-7`` stored as ``2**32 - 7``) and 1,000 ids copied onto a second rank; ``ddpcheck
judge`` finds and names both in at most 2 GiB and 5 minutes.

The traces are what ``python -m ddpcheck.record`` writes (:mod:`ddpcheck.tracefile`): rank ``r`` holds
the indices ``r, r + W, r + 2W, ...`` of the dataset in its own shuffled order (``DistributedSampler``'s
split without the global shuffle, which the checks cannot tell apart), one epoch; the dataset is the
largest multiple of W not above ``--ids`` and the sampler says it does not pad (``drop_last=True``), so
no copy is allowed. Then:

- rank ``W * 3 // 4`` yields ``2**32 - 7`` at position 12,345 (or the middle of its epoch when shorter);
- for ``i`` in ``range(1000)``: rank ``i % W`` gives its id at position ``10 + i // W`` to rank
  ``(i + W // 2) % W``, which yields it at position ``10 + ceil(1000 / W) + i // W`` instead of its own.

The judge runs as a whole command (``python -m ddpcheck judge DIR --format json``) under a wrapper that
reads ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` (its peak RSS) and the wall time; CPU seconds are printed
too (on a shared machine they compare better than wall time). Files are written under ``--dir`` (default:
a temporary directory, removed after) and need about 4 bytes per id (4 GB at 1e9).

    python benchmarks/bench_judge.py [--ids 1000000000] [--ranks 4096] [--dir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ddpcheck.trace import EpochTrace, IdArray, LoaderFacts, RankTrace, ScriptLoader, ScriptRankTrace
from ddpcheck.tracefile import write_rank

GIB = 1024**3
BATCH = 512
WRAPPED = 2**32 - 7
DUPLICATES = 1000
LOADER = "train.py:12"

WRAPPER = r"""
import json, resource, subprocess, sys, time
started = time.perf_counter()
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"rc": proc.returncode, "seconds": time.perf_counter() - started,
                  "cpu": usage.ru_utime + usage.ru_stime, "max_rss": usage.ru_maxrss * 1024,
                  "stderr": proc.stderr[-3000:]}))
"""


def plan(n: int, world: int) -> tuple[tuple[int, int, int], list[tuple[int, int, int, int]]]:
    """The planted overflow (rank, position, value) and the copies (from rank, position, to rank,
    position)."""
    shard = n // world
    over = (world * 3 // 4, min(12_345, shard // 2), WRAPPED)
    rounds = -(-DUPLICATES // world)
    copies = [
        (i % world, 10 + i // world, (i + world // 2) % world, 10 + rounds + i // world)
        for i in range(DUPLICATES)
    ]
    return over, copies


def shard(n: int, world: int, rank: int) -> np.ndarray:
    """Rank ``rank``'s indices in its own shuffled order, as uint32."""
    ids = np.arange(rank, n, world, dtype=np.uint32)
    np.random.default_rng(rank).shuffle(ids)
    return ids


def write_traces(directory: Path, n: int, world: int) -> dict[str, object]:
    """Every rank's trace file; returns what was planted."""
    (o_rank, o_pos, o_value), copies = plan(n, world)
    given = {(src, pos) for src, pos, _, _ in copies}
    copied: dict[tuple[int, int], int] = {}
    facts = LoaderFacts(
        dataset_len=n, index_space=n, batch_size=BATCH, drop_last=False, sampler="DistributedSampler",
        batch_sampler="BatchSampler", padding=False, has_set_epoch=True, shuffles=True,
    )  # fmt: skip
    for src in sorted({s for s, _ in given}):  # the ids that will be copied, read before any rank is altered
        ids = shard(n, world, src)
        for s, pos in given:
            if s == src:
                copied[(s, pos)] = int(ids[pos])
    duplicated = sorted(set(copied.values()))
    by_dst: dict[int, list[tuple[int, int]]] = {}
    for src, spos, dst, dpos in copies:
        by_dst.setdefault(dst, []).append((dpos, copied[(src, spos)]))
    for rank in range(world):
        ids = shard(n, world, rank)
        for dpos, value in by_dst.get(rank, []):
            ids[dpos] = value
        if rank == o_rank:
            ids[o_pos] = o_value
        sizes = [BATCH] * (len(ids) // BATCH) + ([len(ids) % BATCH] if len(ids) % BATCH else [])
        epoch = EpochTrace(epoch=0, ids=IdArray(ids), batch_sizes=sizes, len_loader=len(sizes))
        loader = ScriptLoader(LOADER, RankTrace(rank, (epoch,), facts))
        write_rank(directory, ScriptRankTrace(rank, world, (loader,), joined_group=True))
    return {"overflow": (o_rank, 0, o_pos, o_value), "duplicated": duplicated}


def judge(directory: Path, reports: Path) -> dict[str, object]:
    command = [sys.executable, "-m", "ddpcheck", "judge", str(directory), "--format", "json",
               "--report-dir", str(reports), "--quiet"]  # fmt: skip
    out = subprocess.run([sys.executable, "-c", WRAPPER, *command], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"wrapper failed: {out.stderr[-2000:]}")
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def verdicts(reports: Path) -> dict[str, dict[str, object]]:
    report = json.loads((reports / "ddpcheck.json").read_text())
    checks: dict[str, dict[str, object]] = report["runs"][0]["checks"]
    return checks


def check_findings(found: dict[str, dict[str, object]], planted: dict[str, object]) -> list[str]:
    """What the judge failed to find or name (empty: everything planted was found and named)."""
    problems = []
    coverage = found.get("coverage", {})
    data = coverage.get("data", {})
    assert isinstance(data, dict)
    rank, epoch, position, value = planted["overflow"]  # type: ignore[misc]
    named = (data.get("rank"), data.get("epoch"), data.get("position"), data.get("value"))
    if coverage.get("status") != "fail" or named != (rank, epoch, position, value):
        problems.append(f"overflow not named at rank {rank}, epoch {epoch}, position {position}: {coverage}")
    overlap = found.get("no_overlap", {})
    odata = overlap.get("data", {})
    assert isinstance(odata, dict)
    duplicated = planted["duplicated"]
    assert isinstance(duplicated, list)
    examples = overlap.get("examples", [])
    assert isinstance(examples, list)
    if overlap.get("status") != "fail" or odata.get("shared_items") != len(duplicated):
        problems.append(f"duplicates not counted ({len(duplicated)} planted): {overlap}")
    elif not examples or not set(examples) <= set(duplicated):
        problems.append(f"duplicates not named: examples {examples}")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=float, default=1e9)
    parser.add_argument("--ranks", type=int, default=4096)
    parser.add_argument(
        "--dir", default="", help="where to write the traces (default: a temporary directory)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the traces (and reuse them if present)")
    args = parser.parse_args()
    world = args.ranks
    n = int(args.ids) // world * world  # every rank the same share: DistributedSampler(drop_last=True)
    root = Path(args.dir or tempfile.mkdtemp(prefix="ddpcheck-bench-judge-"))
    traces, reports = root / f"traces-{n}-{world}", root / "reports"
    try:
        started = time.perf_counter()
        marker = traces / "planted.json"
        if marker.exists():
            planted = json.loads(marker.read_text())
        else:
            traces.mkdir(parents=True, exist_ok=True)
            planted = write_traces(traces, n, world)
            marker.write_text(json.dumps(planted))
        written = time.perf_counter() - started
        size = sum(p.stat().st_size for p in traces.iterdir())
        measured = judge(traces, reports)
        found = verdicts(reports)
        problems = check_findings(found, planted)
        report_size = (reports / "ddpcheck.json").stat().st_size
        print(
            f"{n:,} ids over {world:,} ranks ({size / 1e9:.2f} GB on disk, written in {written:.0f} s): "
            f"ddpcheck judge {measured['seconds']:.1f} s (CPU {measured['cpu']:.1f} s), "
            f"peak {measured['max_rss'] / GIB:.2f} GiB, exit {measured['rc']}; "
            f"JSON report {report_size:,} bytes"
        )
        print(f"  coverage: {found['coverage']['detail']}")
        print(f"  no_overlap: {found['no_overlap']['detail']}")
        print(f"  padding_bound: {found['padding_bound']['detail']}")
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        if problems or measured["rc"] != 1:
            raise SystemExit(
                "NOT FOUND: " + "; ".join(problems) + f" (exit {measured['rc']}): {measured['stderr']}"
            )
        print("planted overflow and duplicates found and named")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
