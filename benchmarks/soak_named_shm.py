"""Soak (issue 36, item 7): a series of ddpcheck invocations over loaders that name POSIX shared memory
machine-wide, N times in a row: every answer must be right, and nothing may be left after each call.

The series, each one ``python -m ddpcheck`` call, one after another as a user's script would run them:
``fixtures/streaming/named_shm_registry.py`` (mosaicml-streaming's registration of
``/000000_locals``, reproduced in plain torch: streaming itself imports torchvision) at world sizes 1,2;
the same on the mesh ``dp=2,tp=2`` (world size 1 beside it, as in the issue); its
``make_loader_cleaning`` factory (Streaming's ``clean_stale_shared_memory()`` first) at world sizes 1,2.
Determinism reruns on (they ran beside their runs), resume off. Right: exit 0 every time. After each
call: no process tagged with the run's environment alive, and no ``/dev/shm/*_locals`` it created.

    python benchmarks/soak_named_shm.py [--runs 20]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.proc_utils import processes_with_env, wait_until_gone  # noqa: E402

TAG = "DDPCHECK_SOAK_TAG"
FIXTURE = "fixtures/streaming/named_shm_registry.py"
SERIES = (
    ("registry ws 1,2", ["--world-sizes", "1,2"]),
    ("registry mesh dp=2,tp=2", ["--world-sizes", "1", "--mesh", "dp=2,tp=2"]),
    ("cleaning ws 1,2", ["--world-sizes", "1,2", "--factory", "make_loader_cleaning"]),
)


def _registered() -> set[str]:
    shm = Path("/dev/shm")
    return {p.name for p in shm.glob("0*_locals")} if shm.is_dir() else set()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    wrong = left = 0
    started_all = time.perf_counter()
    for i in range(1, args.runs + 1):
        for name, options in SERIES:
            tag = uuid.uuid4().hex
            before = _registered()
            started = time.perf_counter()
            with tempfile.TemporaryDirectory() as reports:
                command = [
                    sys.executable,
                    "-m",
                    "ddpcheck",
                    FIXTURE,
                    "--no-resume",
                    "-q",
                    "--report-dir",
                    reports,
                ]
                proc = subprocess.run(
                    [*command, *options],
                    cwd=ROOT,
                    env={**os.environ, TAG: tag},
                    capture_output=True,
                    text=True,
                )
            seconds = time.perf_counter() - started
            alive = wait_until_gone(lambda tag=tag: processes_with_env(TAG, tag), timeout=5.0)
            names = _registered() - before
            wrong += proc.returncode != 0
            left += len(alive) + len(names)
            print(
                f"run {i:2d} {name:24s} exit {proc.returncode}, {len(alive)} processes and "
                f"{len(names)} names left, {seconds:.1f}s",
                flush=True,
            )
            if proc.returncode != 0:
                print(proc.stdout[-2000:], proc.stderr[-2000:])
    calls = args.runs * len(SERIES)
    took = time.perf_counter() - started_all
    print(
        f"{args.runs} series ({calls} calls, {took:.0f}s): {calls - wrong} right, {wrong} wrong, "
        f"{left} processes or names left"
    )
    return 1 if wrong or left else 0


if __name__ == "__main__":
    sys.exit(main())
