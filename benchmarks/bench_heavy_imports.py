"""A loader file that imports Lightning, checked with and without preloading its imports in the parent.

Without preloading, every rank of every run imports Lightning again: the reference run, then each
world size twice (the determinism rerun), 1 + 2 x (2 + 3 + 4) = 19 rank processes at world sizes
1..4 (world size 1 reuses the reference), each paying ~3-4 s. ``check_loader`` calls
:func:`ddpcheck.launch.preload.preload_imports` once before any rank starts, so the forked ranks
inherit them.

Target: the preloaded Lightning run <= one import of Lightning + 1.5 x the torch-only twin's run.
Every variant runs in a fresh interpreter, timed from inside (interpreter start and the torch import
that ddpcheck itself needs are excluded, the same for all); variants alternate within each repeat so
a change in machine load hits them alike.

    python benchmarks/bench_heavy_imports.py [--world-sizes 1,2,3,4] [--epochs 2] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
LIGHTNING = HERE / "loader_lightning.py"
TORCH_ONLY = HERE / "loader_torch_only.py"
VARIANTS = ("torch-only", "lightning-import", "lightning-preloaded", "lightning-plain")


def run_variant(variant: str, world_sizes: tuple[int, ...], epochs: int) -> dict[str, Any]:
    """One measurement, in this (fresh) interpreter."""
    from ddpcheck.launch.preload import preload_imports
    from ddpcheck.options import CheckOptions
    from ddpcheck.session import check_loader

    options = CheckOptions(world_sizes=world_sizes, epochs=epochs, preload=variant != "lightning-plain")
    started = time.perf_counter()
    if variant == "lightning-import":
        import lightning  # noqa: F401

        return {"seconds": time.perf_counter() - started}
    path = str(TORCH_ONLY if variant == "torch-only" else LIGHTNING)
    preload: dict[str, Any] = {}
    if variant == "lightning-preloaded":
        report = preload_imports(path, deadline_s=120)
        preload = {
            "preload_s": report.seconds,
            "import_s": sum(report.imported.values()),
            "imported": sorted(report.imported),
            "notes": report.notes(),
        }
    result = check_loader(path, options)
    return {"seconds": time.perf_counter() - started, "ok": result.ok, **preload}


def measure(variant: str, world_sizes: tuple[int, ...], epochs: int) -> dict[str, Any]:
    command = [
        sys.executable,
        __file__,
        "--variant",
        variant,
        "--world-sizes",
        ",".join(map(str, world_sizes)),
        "--epochs",
        str(epochs),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{variant} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--world-sizes", default="1,2,3,4")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--no-plain", action="store_true", help="skip the slow run without preloading")
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    world_sizes = tuple(int(w) for w in args.world_sizes.split(","))
    if args.variant:
        print(json.dumps(run_variant(args.variant, world_sizes, args.epochs)))
        return
    variants = tuple(v for v in VARIANTS if not (args.no_plain and v == "lightning-plain"))
    seconds: dict[str, list[float]] = {v: [] for v in variants}
    preload_s: list[float] = []
    import_s: list[float] = []
    for repeat in range(args.repeats):
        order = variants[repeat % len(variants) :] + variants[: repeat % len(variants)]
        for variant in order:
            out = measure(variant, world_sizes, args.epochs)
            if out.get("ok") is False:
                raise SystemExit(f"{variant}: the check failed, so its time means nothing: {out}")
            seconds[variant].append(float(out["seconds"]))
            if "preload_s" in out:
                preload_s.append(float(out["preload_s"]))
                import_s.append(float(out["import_s"]))
            extra = (
                f" (preload {out['preload_s']:.2f}s: {', '.join(out['imported'])})"
                if "preload_s" in out
                else ""
            )
            print(f"repeat {repeat + 1} {variant:>20}: {out['seconds']:.2f}s{extra}", file=sys.stderr)
    med = {v: statistics.median(s) for v, s in seconds.items()}
    preloaded, torch_only = med["lightning-preloaded"], med["torch-only"]
    budget = med["lightning-import"] + 1.5 * torch_only
    print(f"world sizes {args.world_sizes}, {args.epochs} epochs, median of {args.repeats}:")
    for variant in variants:
        print(f"  {variant:>20}: {med[variant]:7.2f}s")
    print(f"  target: preloaded <= import + 1.5 x torch-only = {budget:.2f}s")
    print(f"  ratio preloaded / target: {preloaded / budget:.2f} (<= 1 meets it)")
    # The import timed in its own interpreter swings by seconds with machine load; the same import
    # timed inside the preloaded run does not, so this ratio isolates what preloading adds.
    ratios = [
        run / (imp + 1.5 * torch_only)
        for run, imp in zip(seconds["lightning-preloaded"], import_s, strict=True)
    ]
    print(f"  ratio with the import timed inside the same run: {statistics.median(ratios):.2f}")
    preload, inside = statistics.median(preload_s), statistics.median(import_s)
    check = preloaded - preload
    print(f"  of which preload {preload:.2f}s (its import {inside:.2f}s), checks {check:.2f}s")
    print(f"  checks after preload / torch-only run: {check / torch_only:.2f} (<= 1.5 meets it)")
    if "lightning-plain" in med:
        print(f"  speed-up over not preloading: {med['lightning-plain'] / preloaded:.1f}x")


if __name__ == "__main__":
    main()
