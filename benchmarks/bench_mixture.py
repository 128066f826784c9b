"""What the mixture check costs: the same run with sources read and judged, and with them off.

The loader (``fixtures/mixture/plain_mix_seeded_per_stream.py`` with ``length=100000``: a correct 3-source
weighted mixture, 100,000 samples per epoch over the ranks, 2 epochs, an iterable dataset, so the real
loader is iterated either way) is checked at world sizes 1,2,4 with ``CheckOptions(mixture=True)`` (the
default: every batch's sources read on the ranks, the shares judged) and ``mixture=False`` (nothing read;
mixture n/a), alternating per repeat; resume off, determinism on (as by default). Target: on / off <= 1.1.

    python benchmarks/bench_mixture.py [--repeats 3] [--world-sizes 1,2,4] [--length 100000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from ddpcheck.options import CheckOptions
from ddpcheck.session import check_loader
from ddpcheck.verdict import MIXTURE

LOADER = Path(__file__).resolve().parent.parent / "fixtures" / "mixture" / "plain_mix_seeded_per_stream.py"


def timed(world_sizes: tuple[int, ...], length: int, mixture: bool) -> tuple[float, str]:
    options = CheckOptions(
        world_sizes=world_sizes,
        resume=False,
        mixture=mixture,
        factory_args=(("length", length),),
        timeout=600,
    )
    started = time.perf_counter()
    result = check_loader(str(LOADER), options)
    seconds = time.perf_counter() - started
    statuses = {v.status for run in result.runs for v in run.verdicts if v.check == MIXTURE}
    expected = {"pass"} if mixture else {"n/a"}
    if statuses != expected or any(run.failures for run in result.runs):
        raise SystemExit(f"mixture={mixture}: mixture verdicts {statuses}, expected {expected}")
    return seconds, ",".join(sorted(statuses))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--world-sizes", default="1,2,4")
    parser.add_argument("--length", type=int, default=100_000)
    args = parser.parse_args()
    sizes = tuple(int(x) for x in args.world_sizes.split(","))
    runs: dict[bool, list[float]] = {True: [], False: []}
    for repeat in range(args.repeats):
        for mixture in (True, False) if repeat % 2 == 0 else (False, True):
            runs[mixture].append(timed(sizes, args.length, mixture)[0])
    on, off = statistics.median(runs[True]), statistics.median(runs[False])
    print(
        f"{args.length:,} samples per epoch, 3 sources, world sizes {args.world_sizes}, 2 epochs, "
        f"{os.cpu_count()} cores"
    )
    print(f"  mixture on   {on:6.2f} s  ({', '.join(f'{t:.2f}' for t in runs[True])})")
    print(f"  mixture off  {off:6.2f} s  ({', '.join(f'{t:.2f}' for t in runs[False])})")
    print(f"  on / off: {on / off:.3f}x  (target <= 1.1)")


if __name__ == "__main__":
    main()
