"""The environment a training script runs in, inside one rank: how it is started (as ``python FILE`` or
``python -m MODULE``), what is changed around it (NCCL and CUDA meshes on gloo where there is no GPU;
``mp.spawn`` refused), where the rank stands, and how its end is told (one line, its own stack)."""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpcheck.checker.frames import user_line, user_site
from ddpcheck.checker.recipe import group_position

NEEDS_CUDA = "the script needs CUDA"
GPUS_ENV = "DDPCHECK_GPUS_FOUND"  # set when ddpcheck hid CUDA from the ranks: the GPUs there were


@dataclass(frozen=True)
class ScriptTarget:
    """What to run: a file (``python train.py ARGS``) or a module (``python -m pkg.train ARGS``)."""

    path: str = ""
    module: str = ""
    args: tuple[str, ...] = ()

    @property
    def shown(self) -> str:
        return self.path or f"-m {self.module}"


class RecorderError(BaseException):
    """The recorder cannot go on (an endless epoch, an unusable id): ends the script with this message.

    A ``BaseException``, so the script's own ``except Exception`` cannot swallow it and train on."""


def run_target(target: ScriptTarget) -> None:
    """Run the script as ``python FILE ARGS`` / ``python -m MODULE ARGS`` would, in this process."""
    if target.module:
        sys.argv = [target.module, *target.args]
        sys.path.insert(0, os.getcwd())
        runpy.run_module(target.module, run_name="__main__", alter_sys=True)
    else:
        path = os.path.abspath(target.path)
        sys.argv = [target.path, *target.args]
        sys.path.insert(0, os.path.dirname(path))
        runpy.run_path(path, run_name="__main__")


# --- where the rank stands ------------------------------------------------------------------------------

RANK_VARIABLES = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
WORLD_VARIABLES = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
_JOINED = [False]  # the script's init_process_group returned


def in_group() -> bool:
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_initialized())


def joined_group() -> bool:
    """The script is in a process group now, or its ``init_process_group`` returned earlier."""
    return in_group() or _JOINED[0]


def position() -> tuple[int, int]:
    """(rank, world size): the process group's when there is one, else the launcher's variables
    (torchrun's, SLURM's, Open MPI's, PMI's), else (0, 1)."""
    if in_group():
        return group_position()
    rank = next((os.environ[v] for v in RANK_VARIABLES if os.environ.get(v, "").isdigit()), "0")
    world = next((os.environ[v] for v in WORLD_VARIABLES if os.environ.get(v, "").isdigit()), "1")
    return int(rank), int(world)


# --- what is changed around the script --------------------------------------------------------------

CUDA_SIGNS = (
    "Torch not compiled with CUDA enabled",
    "_cuda_setDevice",
    "_cuda_getDeviceCount",
    "No CUDA GPUs are available",
    "Found no NVIDIA driver",
    "CUDA driver",
    "no CUDA-capable device",
    "ProcessGroupNCCL is only supported with GPUs",
    "NCCL",
)


HIDDEN_CUDA_SIGNS = ("invalid device ordinal", "no CUDA-capable device is detected")


def needs_cuda(exc: BaseException) -> bool:
    """The script failed for want of a GPU: CPU torch's errors, or (where ddpcheck hid the GPUs from
    a world size larger than their number) a CUDA build's, which name a device it cannot see."""
    text = f"{type(exc).__name__}: {exc}"
    signs = CUDA_SIGNS + (HIDDEN_CUDA_SIGNS if GPUS_ENV in os.environ else ())
    return any(sign in text for sign in signs)


def patch_cuda_choices() -> list[str]:
    """On a machine without CUDA, run what asks for NCCL (and CUDA meshes) on gloo (CPU), as the
    issue of a CPU check requires, and say so (the list returned fills as the script runs); remember
    that a group was joined."""
    import torch
    import torch.distributed as dist

    said: list[str] = []
    if not dist.is_available():
        return said
    cuda = torch.cuda.is_available()
    original = dist.init_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        backend = kwargs.get("backend", args[0] if args else None)
        if not cuda and backend is not None and "nccl" in str(backend).lower():
            said.append(f"the script asks for the nccl backend; {_no_gpu_text()}, so it ran on gloo")
            if "backend" in kwargs:
                kwargs["backend"] = "gloo"
            else:
                args = ("gloo", *args[1:])
        device = kwargs.get("device_id")
        if not cuda and device is not None and "cuda" in str(device):
            kwargs.pop("device_id")
        result = original(*args, **kwargs)
        _JOINED[0] = True
        return result

    dist.init_process_group = init_process_group  # type: ignore[assignment]
    try:
        from torch.distributed import distributed_c10d

        distributed_c10d.init_process_group = init_process_group  # type: ignore[assignment]
    except ImportError:  # pragma: no cover - every torch with distributed has it
        pass
    if not cuda:
        _mesh_on_cpu(said)
    return said


def _mesh_on_cpu(said: list[str]) -> None:
    """``init_device_mesh("cuda", ...)`` builds a cpu mesh (and says so in ``said``)."""
    import torch.distributed as dist

    try:
        from torch.distributed import device_mesh

        original_mesh = device_mesh.init_device_mesh

        def init_device_mesh(device_type: str, *args: Any, **kwargs: Any) -> Any:
            if str(device_type).startswith("cuda"):
                said.append(f"the script builds a cuda DeviceMesh; {_no_gpu_text()}, so it is a cpu mesh")
                device_type = "cpu"
            return original_mesh(device_type, *args, **kwargs)

        device_mesh.init_device_mesh = init_device_mesh  # type: ignore[assignment]
        dist.init_device_mesh = init_device_mesh  # type: ignore[attr-defined]
    except ImportError:  # pragma: no cover
        pass


OWN_LAUNCH = (
    "the script starts its own ranks with torch.multiprocessing.{name}; ddpcheck run starts them as "
    "torchrun does: call the training function once per process, with the rank and world size from "
    "torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK), then run ddpcheck run -- SCRIPT"
)


def refuse_own_launch() -> None:
    """A script that spawns its ranks itself (the DDP tutorial's ``mp.spawn``) would start a second
    world beside the one ddpcheck launched and wait in it until the deadline: refuse it at once."""
    try:
        import torch.multiprocessing as tmp
        from torch.multiprocessing import spawn as spawn_module
    except ImportError:  # pragma: no cover - every torch has it
        return

    def refusing(name: str) -> Callable[..., Any]:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            where, _ = user_site(sys._getframe(1))
            raise RecorderError(f"{where}: {OWN_LAUNCH.format(name=name)}")

        return refuse

    for name in ("spawn", "start_processes"):
        if hasattr(tmp, name):
            setattr(tmp, name, refusing(name))
        if hasattr(spawn_module, name):
            setattr(spawn_module, name, refusing(name))


def _no_gpu_text() -> str:
    found = os.environ.get(GPUS_ENV)
    if found is None or found == "0":
        return "this machine has no GPU"
    world = os.environ.get("WORLD_SIZE", "?")
    return f"world size {world} needs {world} GPUs and this machine has {found}"


def accelerate_fallback() -> str:
    """Accelerate ran without distribution although the launch had several processes (its CPU
    fallback without ``cpu=True``): every rank was process 0 of 1. "" when not so."""
    module = sys.modules.get("accelerate.state")
    if module is None:
        return ""
    state = getattr(module, "PartialState", None)
    shared = getattr(state, "_shared_state", None) if state is not None else None
    if not shared:
        return ""
    processes = shared.get("num_processes", 1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and processes == 1:
        return (
            f"Accelerate ran non-distributed (process 0 of 1 on each of {world} ranks): without a GPU it "
            "falls back to one process unless cpu=True (ACCELERATE_USE_CPU=1)"
        )
    return ""


# --- how the script ended -----------------------------------------------------------------------------


@dataclass
class Outcome:
    """How the script ended: ``status`` "ok" | "error" | "exit", one line, its stack, an exit code."""

    status: str = "ok"
    message: str = ""
    stack: str = ""
    code: int = 0


_OWN_DIR = str(Path(__file__).resolve().parents[1])


def script_stack(exc: BaseException) -> str:
    """The traceback from the script's own first frame on (ddpcheck's and runpy's frames left out)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not (filename.startswith("<frozen") or filename.startswith(_OWN_DIR)):
            break
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def failure(exc: BaseException) -> Outcome:
    """The script's own error, in one line (a want of CUDA said as such), with its stack."""
    stack = script_stack(exc)
    where = user_line(exc)
    if needs_cuda(exc):
        call = where or "the script"
        here = _no_gpu_text().replace("no GPU", "none")
        message = (
            f"{call}: {NEEDS_CUDA} and {here} ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); choose the device from "
            "torch.cuda.is_available(), or record it on GPUs: torchrun ... -m ddpcheck.record"
        )
        return Outcome("error", message, stack, 3)
    first = str(exc).splitlines()[0] if str(exc) else ""
    prefix = f"{where}: " if where else ""
    return Outcome("error", f"{prefix}{type(exc).__name__}: {first}".rstrip(": "), stack, 3)
