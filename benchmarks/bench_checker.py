"""ddpcheck's wall time against a plain ``torch.multiprocessing.spawn`` script, in the same run.

Target (issue 13, tightening issue 3): world sizes 1,2,3,4,8 x 2 epochs on a 100,000-sample loader
at most 0.10x the spawn script's wall time and under 2.5 s on 2 cores; ``--simulate`` at world size
1024 on 1,000,000 samples under 10 s. Every number depends on the machine being otherwise idle: the
script prints the load average so a busy run can be told apart. Both sides are timed as whole
commands (interpreter start and torch import included), the way a user meets them: with ddpcheck's
bytecode compiled, as ``pip install`` leaves a wheel (an editable checkout under
PYTHONDONTWRITEBYTECODE, as on this machine, would recompile its ~60 modules on every run, about
0.1 s; ``--no-compile`` measures that).

    python benchmarks/bench_checker.py [--world-sizes 1,2,3,4,8] [--repeats 3] [--no-compile]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOADER = HERE / "loader_100k.py"

SPAWN_SCRIPT = r"""
import sys, importlib.util, socket
from datetime import timedelta
import torch.distributed as dist
import torch.multiprocessing as mp

def load(path):
    spec = importlib.util.spec_from_file_location("bench_loader", path)
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod); return mod

def worker(rank, world_size, port, path, epochs):
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=rank == 0, timeout=timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    loader = load(path).make_loader(rank=rank, world_size=world_size)
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        for _ in loader:
            pass
    dist.barrier(); dist.destroy_process_group()

if __name__ == "__main__":
    path, epochs = sys.argv[1], int(sys.argv[2])
    for ws in [int(w) for w in sys.argv[3].split(",")]:
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        mp.spawn(worker, args=(ws, port, path, epochs), nprocs=ws, join=True)
"""


def timed(cmd: list[str], env: dict[str, str] | None = None) -> float:
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return elapsed


def compile_ddpcheck() -> Path:
    """Byte-compile the ddpcheck package this interpreter imports (its own __pycache__ directories)."""
    import compileall

    import ddpcheck

    root = Path(ddpcheck.__file__).resolve().parent
    if not compileall.compile_dir(str(root), quiet=1):
        raise SystemExit(f"could not byte-compile {root}")
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", default="1,2,3,4,8")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-simulate", action="store_true")
    parser.add_argument("--no-compile", action="store_true", help="leave ddpcheck's bytecode as it is")
    args = parser.parse_args()
    compiled = None if args.no_compile else compile_ddpcheck()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "spawn_baseline.py"
        script.write_text(SPAWN_SCRIPT)

        def ddpcheck_cmd(world_sizes: str, *extra: str) -> list[str]:
            fixed = ["--epochs", str(args.epochs), "--quiet", "--report-dir", tmp, "--format", "json"]
            head = [sys.executable, "-m", "ddpcheck", str(LOADER)]
            return [*head, "--world-sizes", world_sizes, *fixed, *extra]

        spawn_cmd = [sys.executable, str(script), str(LOADER), str(args.epochs), args.world_sizes]
        ours = [timed(ddpcheck_cmd(args.world_sizes)) for _ in range(args.repeats)]
        base = [timed(spawn_cmd) for _ in range(max(1, args.repeats // 2))]
        sim_time = sim_once = None
        if not args.skip_simulate:
            env = {**os.environ, "DDPCHECK_BENCH_N": "1000000"}
            sim_cmd = ddpcheck_cmd("1024", "--simulate")
            sim_time = [timed(sim_cmd, env) for _ in range(args.repeats)]
            once_cmd = [*sim_cmd, "--no-determinism"]
            sim_once = [timed(once_cmd, env) for _ in range(args.repeats)]
    ours_s, base_s = statistics.median(ours), statistics.median(base)
    load = os.getloadavg()[0]
    print(
        f"world sizes {args.world_sizes}, {args.epochs} epochs, 100,000 samples, {os.cpu_count()} cores, "
        f"load average {load:.1f}"
    )
    print(f"  ddpcheck's bytecode: {f'compiled ({compiled})' if compiled else 'as found (--no-compile)'}")
    print(f"  ddpcheck (whole command, median of {len(ours)}):       {ours_s:7.2f} s  {spread(ours)}")
    print(f"  torch.multiprocessing.spawn script (median of {len(base)}): {base_s:7.2f} s  {spread(base)}")
    print(
        f"  ratio ddpcheck / spawn script: {ours_s / base_s:.3f}  (target <= 0.10; absolute target < 2.5 s)"
    )
    if sim_time is not None and sim_once is not None:
        sim_s, once_s = statistics.median(sim_time), statistics.median(sim_once)
        print(f"  --simulate world size 1024, 1,000,000 samples: {sim_s:.2f} s {spread(sim_time)} (< 5 s)")
        print(f"    the same without the determinism rerun: {once_s:.2f} s {spread(sim_once)}")


def spread(values: list[float]) -> str:
    """The range a median was taken over, so that a 10% change reads against the noise."""
    return f"(min {min(values):.2f}, max {max(values):.2f}, n={len(values)})"


if __name__ == "__main__":
    main()
