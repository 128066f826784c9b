"""What a run's own view of the working directory costs (issue 36): target < 0.2 s per run on a
directory of 10,000 files.

Per mode (``overlay``, ``view``) and per run: making the view (the overlay's namespace holder; the view's
folder of copies and links and, the first time, the scan of the directory), a stand-in rank that enters
it and writes a 1 MB checkpoint (measured against the same rank writing it without a view), and ending
it (what the run wrote listed, the holder ended, its folders removed). The baseline, in the same
invocation: starting a bare Python interpreter, which every rank costs anyway. Medians of ``--repeats``.
The load average is printed with the numbers: they hold on an otherwise idle machine.

    python benchmarks/bench_workdir.py [--files 10000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
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
    per = max(1, (files - 2) // 100)
    for d in range(100):
        sub = folder / "data" / f"shard{d:03d}"
        sub.mkdir()
        for f in range(per):
            (sub / f"{f:04d}.txt").write_text("sample\n")
    return folder


def python(code: str, cwd: str, env: dict[str, str] | None = None) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(HERE.parent), **(env or {})},
        check=True,
    )
    return time.perf_counter() - started


def one_run(guard: WorkdirGuard, janitor: Janitor, scratch: str) -> dict[str, float]:
    started = time.perf_counter()
    run = guard.start("world size 1", janitor)
    made = time.perf_counter()
    entered = python(ENTER + WRITE, run.cwd, run.env)
    plain = python(ENTER.split(";")[0] + "; " + WRITE, scratch)  # the same import, no view, same write
    ended_at = time.perf_counter()
    guard.finish(run)
    ended = time.perf_counter() - ended_at
    assert not os.path.exists(run.temp)
    return {"start": made - started, "enter": max(entered - plain, 0.0), "finish": ended}


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
        baseline = statistics.median(python("pass", str(scratch)) for _ in range(args.repeats))
        print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; directory of {count} files")
        print(f"baseline: a bare Python interpreter starts in {baseline * 1000:.0f} ms (every rank pays it)")
        print(f"{'mode':8} {'start':>8} {'enter':>8} {'finish':>8} {'per run':>9} {'x baseline':>11}  target")
        for mode in ("overlay", "view"):
            guard = WorkdirGuard(str(folder), mode=mode)
            janitor = Janitor(str(root / f"janitor-{mode}"))
            try:
                runs = [one_run(guard, janitor, str(scratch)) for _ in range(args.repeats)]
            finally:
                janitor.close()
            parts = {key: statistics.median(r[key] for r in runs) for key in ("start", "enter", "finish")}
            total = sum(parts.values())
            verdict = "ok" if total < 0.2 else "OVER 0.2 s"
            print(
                f"{mode:8} {parts['start'] * 1000:6.0f}ms {parts['enter'] * 1000:6.0f}ms "
                f"{parts['finish'] * 1000:6.0f}ms {total * 1000:7.0f}ms {total / baseline:10.2f}x  {verdict}"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
