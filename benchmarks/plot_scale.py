"""Scaling of ``ddpcheck judge``: time and peak memory against the ids N and the ranks W, as a plot.

Runs ``benchmarks/bench_judge.py`` (traces of N uint32 ids over W ranks, a planted overflow and 1,000
duplicates that must be found and named) for every N of ``--ids`` at ``--ranks-at`` ranks and every W of
``--ranks`` at ``--ids-at`` ids, collects its printed figures into ``--json`` and draws
``--svg`` (two panels: seconds and GiB against N, and against W; wall time and CPU seconds both, since
wall time on a shared machine also measures the other jobs). ``--add N,W,SECONDS,CPU,GIB`` adds a point
measured by an earlier run (a billion ids take minutes).

    python benchmarks/plot_scale.py [--ids 1e6,1e7,1e8] [--ranks-at 4096] [--ranks 8,64,512,4096]
        [--ids-at 1e7] [--json docs/scale.json] [--svg docs/scale.svg]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIGURES = re.compile(
    r"^([\d,]+) ids over ([\d,]+) ranks .*ddpcheck judge ([\d.]+) s \(CPU ([\d.]+) s\), peak ([\d.]+) GiB"
)


def judged(ids: float, ranks: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, str(HERE / "bench_judge.py"), "--ids", str(ids), "--ranks", str(ranks)],
        capture_output=True,
        text=True,
    )
    for line in out.stdout.splitlines():
        found = FIGURES.match(line)
        if found:
            n, w, seconds, cpu, gib = found.groups()
            if "planted overflow and duplicates found and named" not in out.stdout:
                raise SystemExit(f"N={n} W={w}: the planted bugs were not found: {out.stdout[-2000:]}")
            number = {"ids": n, "ranks": w}
            return {**{k: int(v.replace(",", "")) for k, v in number.items()}, "seconds": float(seconds),
                    "cpu": float(cpu), "gib": float(gib)}  # fmt: skip
    raise SystemExit(f"bench_judge gave no figures: {out.stdout[-2000:]} {out.stderr[-2000:]}")


def draw(points: list[dict[str, float]], svg: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("svg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, fixed in ((axes[0], "ids", "ranks"), (axes[1], "ranks", "ids")):
        near = {p[fixed]: float(f"{p[fixed]:.1e}") for p in points}  # 9,998,336 ids at 4096 ranks is 1e7
        common = max(set(near.values()), key=lambda v: sum(near[p[fixed]] == v for p in points))
        first: dict[float, dict[str, float]] = {}
        for p in points:  # one point per x: the first measured
            if near[p[fixed]] == common:
                first.setdefault(float(f"{p[key]:.1e}"), p)
        line = sorted(first.values(), key=lambda p: p[key])
        common = line[0][fixed]
        xs = [p[key] for p in line]
        ax.plot(xs, [p["seconds"] for p in line], "o-", label="wall s")
        ax.plot(xs, [p["cpu"] for p in line], "s--", label="CPU s")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("ids N" if key == "ids" else "ranks W")
        ax.set_ylabel("seconds")
        twin = ax.twinx()
        twin.plot(xs, [p["gib"] for p in line], "^:", color="tab:red", label="peak GiB")
        twin.set_ylabel("peak GiB")
        twin.set_ylim(0, max(2.0, max(p["gib"] for p in line) * 1.2))
        ax.set_title(
            f"{'W' if key == 'ids' else 'N'} = {int(common):,}" + (" (about)" if key == "ranks" else "")
        )
        handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
        ax.legend(handles, [h.get_label() for h in handles], loc="upper left", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(svg)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", default="1e6,1e7,1e8")
    parser.add_argument("--ranks-at", type=int, default=4096)
    parser.add_argument("--ranks", default="8,64,512,4096")
    parser.add_argument("--ids-at", type=float, default=1e7)
    parser.add_argument("--add", action="append", default=[], metavar="N,W,SECONDS,CPU,GIB")
    parser.add_argument("--json", default="docs/scale.json")
    parser.add_argument("--svg", default="docs/scale.svg")
    parser.add_argument("--redraw", action="store_true", help="draw --json's points again, measure nothing")
    parser.add_argument(
        "--title", default="ddpcheck judge: uint32 traces, a planted overflow and 1,000 copies"
    )
    args = parser.parse_args()
    if args.redraw:
        points = json.loads(Path(args.json).read_text())
        draw(points, Path(args.svg), args.title)
        return
    points = [judged(float(n), args.ranks_at) for n in args.ids.split(",") if n]
    done = {(float(f"{p['ids']:.1e}"), p["ranks"]) for p in points}
    points += [
        judged(args.ids_at, int(w)) for w in args.ranks.split(",") if w and (args.ids_at, int(w)) not in done
    ]
    for extra in args.add:
        n, w, seconds, cpu, gib = extra.split(",")
        points.append({"ids": int(float(n)), "ranks": int(w), "seconds": float(seconds), "cpu": float(cpu),
                       "gib": float(gib)})  # fmt: skip
    Path(args.json).write_text(json.dumps(points, indent=1) + "\n")
    draw(points, Path(args.svg), args.title)
    for p in points:
        print(
            f"N={p['ids']:,} W={p['ranks']:,}: {p['seconds']:.1f} s, CPU {p['cpu']:.1f} s, {p['gib']:.2f} GiB"
        )


if __name__ == "__main__":
    main()
