"""Per-test cost of @pytest.mark.ddp(world_size=2): 20 trivial 2-rank tests against 20 plain ones.

Both files import torch.distributed at module level, so the import is paid equally by both runs and
the difference is what the plugin adds per test (fork two ranks, loopback rendezvous, gloo group,
final barrier, collect). Each variant runs in its own pytest subprocess, ``--repeats`` times; the
median wall time is reported with the per-test overhead and the mean "call" phase of each kind.

    python bench_plugin.py              # 20 tests per file, 3 repeats
    python bench_plugin.py --tests 50 --world-size 4
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEADER = "import pytest\nimport torch.distributed as dist\n\n"


def write_files(root: Path, n: int, world_size: int) -> None:
    plain = HEADER + "".join(f"def test_plain_{i}():\n    assert True\n\n" for i in range(n))
    marked = HEADER + "".join(
        f"@pytest.mark.ddp(world_size={world_size})\ndef test_marked_{i}(ddp_rank):\n    assert True\n\n"
        for i in range(n)
    )
    (root / "test_plain.py").write_text(plain)
    (root / "test_marked.py").write_text(marked)


def run(root: Path, name: str) -> tuple[float, float]:
    """(wall seconds of the whole pytest run, mean seconds of one test's call phase)."""
    started = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            name,
            "-q",
            "-p",
            "no:cacheprovider",
            "--durations=0",
            "--durations-min=0",
            "-vv",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stdout[-3000:]}")
    calls = [float(m) for m in re.findall(r"^([0-9.]+)s call ", proc.stdout, re.MULTILINE)]
    return wall, (statistics.mean(calls) if calls else 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=20)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_files(root, args.tests, args.world_size)
        plain = [run(root, "test_plain.py") for _ in range(args.repeats)]
        marked = [run(root, "test_marked.py") for _ in range(args.repeats)]
    wall_plain = statistics.median(w for w, _ in plain)
    wall_marked = statistics.median(w for w, _ in marked)
    call_plain = statistics.median(c for _, c in plain)
    call_marked = statistics.median(c for _, c in marked)
    per_test = (wall_marked - wall_plain) / args.tests
    print(f"{args.tests} plain tests:              {wall_plain:7.2f} s wall (baseline)")
    print(
        f"{args.tests} ddp({args.world_size}) tests:              {wall_marked:7.2f} s wall "
        f"({wall_marked / wall_plain:.2f}x the baseline)"
    )
    print(f"overhead per marked test:      {per_test * 1000:7.1f} ms (wall difference / {args.tests})")
    print(f"mean call phase, plain/marked: {call_plain * 1000:7.1f} ms / {call_marked * 1000:.1f} ms")


if __name__ == "__main__":
    main()
