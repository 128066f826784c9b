"""False alarms of the step checks (issue 35): ``ddpcheck run`` on every correct training-step fixture (the
``good_*`` and ``hf_trainer_default`` scripts of ``fixtures/steps``), repeated, at world sizes 1 and 2 (and
more with ``--world-sizes``): nondeterministic reductions must never cross the tolerance. Prints one line
per run and the count of failed checks (any check, step checks or not) and failed ranks, which must be 0.

    python benchmarks/soak_step.py [--repeats 10] [--world-sizes 1,2,3,4] [NAME ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEPS = Path(__file__).resolve().parent.parent / "fixtures" / "steps"
MESH_ONLY = ("good_mesh_noise",)  # builds a 2 x 2 mesh whatever the world size: no one-process run


def correct() -> list[str]:
    names = [*sorted(p.stem for p in STEPS.glob("good_*.py")), "hf_trainer_default"]
    return [n for n in names if n not in MESH_ONLY]


def run_once(name: str, world_sizes: str) -> tuple[list[str], float, float]:
    """The step checks that failed, the worst compared difference, and the seconds it took."""
    with tempfile.TemporaryDirectory() as reports:
        command = [sys.executable, "-m", "ddpcheck", "run", "--world-sizes", world_sizes, "--model-steps"]
        command += ["all", "--no-determinism", "-q", "--report-dir", reports, "--", str(STEPS / f"{name}.py")]
        started = time.monotonic()
        subprocess.run(command, capture_output=True, timeout=1800, check=False)
        seconds = time.monotonic() - started
        runs = json.loads((Path(reports) / "ddpcheck.json").read_text())["runs"]
    failed = [  # every check counts: a correct fixture must pass all of them, and no rank may fail
        f"ws{r['world_size']}:{c}" for r in runs for c, v in r["checks"].items() if v.get("status") == "fail"
    ]
    failed += [f"ws{r['world_size']}:rank failure" for r in runs if r.get("failures")]
    worst = max(
        (
            s["rel"] or 0.0
            for r in runs
            for s in r["checks"].get("step_equivalence", {}).get("data", {}).get("steps", [])
        ),
        default=0.0,
    )
    return failed, worst, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=None)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--world-sizes", default="1,2")
    args = parser.parse_args()
    alarms = 0
    for name in args.names or correct():
        for i in range(args.repeats):
            failed, worst, seconds = run_once(name, args.world_sizes)
            alarms += len(failed)
            said = ", ".join(failed) or "no step check failed"
            print(f"{name} #{i + 1}: {said}; worst rel. diff {worst:.2g} ({seconds:.0f} s)", flush=True)
    print(f"false alarms: {alarms}")
    raise SystemExit(1 if alarms else 0)


if __name__ == "__main__":
    main()
