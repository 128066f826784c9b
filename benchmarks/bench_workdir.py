"""What a run's own view of the working directory costs (issue 36): target < 0.2 s per run on a
directory of 10,000 files.

Per mode (``overlay``, ``view``) and per run: making the view (the overlay's namespace holder; the view's
folder of copies and links and, the first time, the scan of the directory), a stand-in rank that enters
it and writes a 1 MB checkpoint (measured against the same rank writing it without a view), and ending
it (what the run wrote listed, the holder ended, its folders removed). The baseline, in the same
invocation: starting a bare Python interpreter, which every rank costs anyway. Medians of ``--repeats``,
as wall time and as CPU time (this process's and its children's: what the run costs whatever else the
machine runs). The load average is printed with them: wall times hold on an otherwise idle machine.

    python benchmarks/bench_workdir.py [--files 10000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from ddpcheck.launch.procs import Janitor  # noqa: E402
from ddpcheck.launch.workdir import WorkdirGuard  # noqa: E402

WRITE = "open('checkpoint.pt', 'wb').write(b'x' * (1 << 20))"
ENTER = "from ddpcheck.launch.workdir import enter_workdir; assert not enter_workdir(); "


def directory(root: Path, files: int) -> Path:
    """``files`` files: a few at the top (the script, a config), the rest in 100 folders (a dataset)."""
    folder = root / "project"
    (folder / "data").mkdir(parents=True)
    (folder / "train.py").write_text("print('train')\n")
    (folder / "config.yaml").write_text("lr: 0.1\n")
    for i in range(max(files - 2, 0)):
        sub = folder / "data" / f"shard{i % 100:03d}"
        sub.mkdir(exist_ok=True)
        (sub / f"{i:05d}.txt").write_text("sample\n")
    return folder


def cpu() -> float:
    """CPU seconds of this process and of its reaped children: what a run costs, whatever the load."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def python(code: str, cwd: str, env: dict[str, str] | None = None) -> tuple[float, float]:
    """(wall, CPU) seconds of a fresh interpreter running ``code``."""
    wall, used = time.perf_counter(), cpu()
    subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(HERE.parent), **(env or {})},
        check=True,
    )
    return time.perf_counter() - wall, cpu() - used


def one_run(guard: WorkdirGuard, janitor: Janitor, scratch: str) -> dict[str, float]:
    """Wall and CPU seconds of one run's view: start, the rank's extra to enter it, finish."""
    wall, used = time.perf_counter(), cpu()
    run = guard.start("world size 1", janitor)
    start = (time.perf_counter() - wall, cpu() - used)
    entered = python(ENTER + WRITE, run.cwd, run.env)
    plain = python(ENTER.split(";")[0] + "; " + WRITE, scratch)  # the same import, no view, same write
    wall, used = time.perf_counter(), cpu()
    guard.finish(run)
    finish = (time.perf_counter() - wall, cpu() - used)
    assert not os.path.exists(run.temp)
    enter = (max(entered[0] - plain[0], 0.0), max(entered[1] - plain[1], 0.0))
    return {
        **{
            f"{name} wall": value[0]
            for name, value in (("start", start), ("enter", enter), ("finish", finish))
        },
        **{
            f"{name} cpu": value[1]
            for name, value in (("start", start), ("enter", enter), ("finish", finish))
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-workdir-"))
    try:
        folder = directory(root, args.files)
        scratch = root / "scratch"
        scratch.mkdir()
        count = sum(len(files) for _, _, files in os.walk(folder))
        bare = [python("pass", str(scratch)) for _ in range(args.repeats)]
        base_wall = statistics.median(b[0] for b in bare)
        base_cpu = statistics.median(b[1] for b in bare)
        print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; directory of {count} files")
        print(
            f"baseline (every rank pays it): a bare Python interpreter, {base_wall * 1000:.0f} ms wall, "
            f"{base_cpu * 1000:.0f} ms CPU"
        )
        heads = f"{'start':>8} {'enter':>8} {'finish':>8} {'per run':>9} {'x baseline':>11}"
        print(f"{'mode':8} {'':5} {heads}  target")
        for mode in ("overlay", "view"):
            guard = WorkdirGuard(str(folder), mode=mode)
            janitor = Janitor(str(root / f"janitor-{mode}"))
            try:
                runs = [one_run(guard, janitor, str(scratch)) for _ in range(args.repeats)]
            finally:
                janitor.close()
            for kind, base in (("wall", base_wall), ("cpu", base_cpu)):
                parts = [
                    statistics.median(r[f"{name} {kind}"] for r in runs)
                    for name in ("start", "enter", "finish")
                ]
                total = sum(parts)
                verdict = "ok (< 0.2 s)" if total < 0.2 else "OVER 0.2 s"
                cells = " ".join(f"{p * 1000:6.0f}ms" for p in parts)
                print(f"{mode:8} {kind:5} {cells} {total * 1000:7.0f}ms {total / base:10.2f}x  {verdict}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
