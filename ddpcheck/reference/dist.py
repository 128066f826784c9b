"""Connecting to a process group: rank queries, launch detection and ``connect``/``disconnect``.

Names follow ``oml.ddp.utils`` (``is_ddp``, ``get_rank_safe``, ``get_world_size_safe``,
``is_main_process``) so OML code works by changing the import. The ``*_safe`` queries never raise:
without a process group a program is one rank of a world of one.

``detect_launch`` reads the environment a launcher left behind (torchrun or SLURM's ``srun``)
without touching ``torch.distributed``, so it can be unit-tested and used to decide whether to join
an existing launch. ``connect`` turns explicit arguments, an explicit store or a detected launch
into an initialised default group, always with an explicit timeout.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

import torch
import torch.distributed as dist

Source = Literal["explicit", "torchrun", "slurm", "store"]

_TORCHRUN_TRIGGERS = ("RANK", "WORLD_SIZE")
_SLURM_PORT_BASE = 15000
_SLURM_PORT_SPAN = 20000


def is_ddp() -> bool:
    """True when ``torch.distributed`` is available and the default group is initialised."""
    return dist.is_available() and dist.is_initialized()


def get_world_size_safe() -> int:
    """The world size, or 1 without a process group."""
    return dist.get_world_size() if is_ddp() else 1


def get_rank_safe() -> int:
    """This process's global rank, or 0 without a process group."""
    return dist.get_rank() if is_ddp() else 0


def is_main_process() -> bool:
    """True on global rank 0, and in a program without a process group."""
    return get_rank_safe() == 0


@dataclass(frozen=True)
class LaunchEnv:
    """What a launcher told this process through the environment."""

    source: Literal["torchrun", "slurm"]
    rank: int
    world_size: int
    local_rank: int
    master_addr: str | None  # None only with detect_launch(..., require_rendezvous=False)
    master_port: int | None
    run_id: str | None = None  # TORCHELASTIC_RUN_ID under torchrun, SLURM_JOB_ID under SLURM


@dataclass(frozen=True)
class ConnectionInfo:
    """The group ``connect`` initialised; ``master_*`` are ``None`` when a store was passed in."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    source: Source
    master_addr: str | None
    master_port: int | None


# --------------------------------------------------------------------------- SLURM node lists


DATA_PREFIX = (
    "dp"  # mesh dimensions that split the data: dp, dp_replicate, dp_shard (as torchtitan names them)
)


def _data_dims(mesh: Any, data_dims: Sequence[str] | None) -> list[tuple[int, str | None]]:
    names = list(getattr(mesh, "mesh_dim_names", None) or ())
    if not names:
        if mesh.ndim != 1:
            raise ValueError("a mesh of several dimensions needs mesh_dim_names to tell its data dimensions")
        return [(0, None)]
    chosen = [
        (i, n) for i, n in enumerate(names) if (n in data_dims if data_dims else n.startswith(DATA_PREFIX))
    ]
    if not chosen:
        raise ValueError(
            f"mesh dimensions {names} include no data-parallel one (a name starting with dp, or data_dims=)"
        )
    return chosen


def data_parallel_rank(mesh: Any, data_dims: Sequence[str] | None = None) -> int:
    """This rank's data-parallel rank on a ``DeviceMesh``: its row-major coordinate over the data
    dimensions (names starting with ``dp``, or ``data_dims``), as torchtitan flattens ``dp_replicate``
    and ``dp_shard``. Ranks that differ only in tensor, context or pipeline coordinates share it: they
    must load the same data."""
    rank = 0
    for i, name in _data_dims(mesh, data_dims):
        rank = rank * int(mesh.size(i)) + int(mesh.get_local_rank(name if name is not None else 0))
    return rank


def data_parallel_world_size(mesh: Any, data_dims: Sequence[str] | None = None) -> int:
    """How many data replicas a ``DeviceMesh`` has: the product of its data dimensions' sizes."""
    size = 1
    for i, _ in _data_dims(mesh, data_dims):
        size *= int(mesh.size(i))
    return size


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside ``[...]``."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"invalid SLURM node list {text!r}: nested '['")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"invalid SLURM node list {text!r}: ']' without '['")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"invalid SLURM node list {text!r}: unclosed '['")
    parts.append(text[start:])
    return parts


def _range_set(body: str, text: str) -> list[tuple[str, str]]:
    """``01-04,07`` -> ``[('01', '04'), ('07', '07')]``, validated but not expanded."""
    out: list[tuple[str, str]] = []
    for item in body.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", item.strip())
        if m is None:
            raise ValueError(f"invalid SLURM node list {text!r}: bad range {item!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise ValueError(f"invalid SLURM node list {text!r}: range {item!r} runs backwards")
        out.append((lo, hi))
    return out


def _expand_one(pattern: str, text: str) -> Iterator[str]:
    """Expand one host pattern lazily, e.g. ``rack[1-2]-n[01-02]`` (brackets combine as a product)."""
    m = re.search(r"\[([^\]]*)\]", pattern)
    if m is None:
        yield pattern
        return
    head, tail = pattern[: m.start()], pattern[m.end() :]
    for lo, hi in _range_set(m.group(1), text):
        for n in range(int(lo), int(hi) + 1):
            value = str(n).zfill(len(lo))  # zero padding follows the range's first number
            for rest in _expand_one(tail, text):
                yield head + value + rest


def iter_slurm_nodelist(text: str) -> Iterator[str]:
    """Host names of a compressed SLURM node list, lazily, in order (``gpu[01-04,07],cpu3``)."""
    stripped = text.strip()
    if not stripped:
        raise ValueError("empty SLURM node list")
    for part in _split_top_level(stripped):
        part = part.strip()
        if not part:
            raise ValueError(f"invalid SLURM node list {text!r}: empty entry")
        yield from _expand_one(part, text)


def parse_slurm_nodelist(text: str) -> list[str]:
    """All host names of a compressed SLURM node list, without calling ``scontrol``."""
    return list(iter_slurm_nodelist(text))


def first_slurm_host(text: str) -> str:
    """The first host of a SLURM node list (the conventional rendezvous host), without expanding the rest."""
    return next(iter_slurm_nodelist(text))


# --------------------------------------------------------------------------- launch detection


def _int_var(env: Mapping[str, str], name: str, *, minimum: int = 0) -> int:
    raw = env[name]
    try:
        value = int(raw.strip())
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ValueError(f"{name}={value} must be >= {minimum}")
    return value


def _port(env: Mapping[str, str], name: str) -> int:
    port = _int_var(env, name, minimum=1)
    if port > 65535:
        raise ValueError(f"{name}={port} is not a TCP port (1..65535)")
    return port


def _check_ranks(rank: int, world_size: int, local_rank: int, names: tuple[str, str, str]) -> None:
    r, w, lr = names
    if rank >= world_size:
        raise ValueError(f"{r}={rank} must be smaller than {w}={world_size}")
    if local_rank > rank:
        raise ValueError(f"{lr}={local_rank} cannot exceed {r}={rank}: the environment is inconsistent")


def _detect_torchrun(env: Mapping[str, str], rendezvous: bool) -> LaunchEnv:
    needed = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if rendezvous else ("RANK", "WORLD_SIZE")
    missing = [n for n in needed if not env.get(n)]
    world_size = _int_var(env, "WORLD_SIZE", minimum=1) if "WORLD_SIZE" not in missing else None
    if world_size is not None and world_size > 1 and not env.get("LOCAL_RANK"):
        missing.append("LOCAL_RANK")
    if missing:
        raise ValueError(
            f"incomplete torchrun environment: {', '.join(missing)} not set "
            "(launch with torchrun, or set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT)"
        )
    assert world_size is not None
    rank = _int_var(env, "RANK")
    local_rank = _int_var(env, "LOCAL_RANK") if env.get("LOCAL_RANK") else 0
    _check_ranks(rank, world_size, local_rank, ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    if env.get("LOCAL_WORLD_SIZE"):
        local_world = _int_var(env, "LOCAL_WORLD_SIZE", minimum=1)
        if local_rank >= local_world:
            raise ValueError(f"LOCAL_RANK={local_rank} must be smaller than LOCAL_WORLD_SIZE={local_world}")
    return LaunchEnv(
        source="torchrun",
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        master_addr=env["MASTER_ADDR"].strip() if env.get("MASTER_ADDR") else None,
        master_port=_port(env, "MASTER_PORT") if env.get("MASTER_PORT") else None,
        run_id=env.get("TORCHELASTIC_RUN_ID") or None,
    )


def _detect_slurm(env: Mapping[str, str], rendezvous: bool) -> LaunchEnv:
    ntasks_var = "SLURM_NTASKS" if env.get("SLURM_NTASKS") else "SLURM_NPROCS"
    if not env.get(ntasks_var):
        raise ValueError("incomplete SLURM environment: SLURM_PROCID is set but SLURM_NTASKS is not")
    world_size = _int_var(env, ntasks_var, minimum=1)
    rank = _int_var(env, "SLURM_PROCID")
    if world_size > 1 and not env.get("SLURM_LOCALID"):
        raise ValueError("incomplete SLURM environment: SLURM_LOCALID not set (start the tasks with srun)")
    local_rank = _int_var(env, "SLURM_LOCALID") if env.get("SLURM_LOCALID") else 0
    _check_ranks(rank, world_size, local_rank, ("SLURM_PROCID", ntasks_var, "SLURM_LOCALID"))

    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    run_id = job_id.strip() if job_id else None
    if not rendezvous:
        return LaunchEnv("slurm", rank, world_size, local_rank, None, None, run_id)

    if env.get("MASTER_ADDR"):
        addr = env["MASTER_ADDR"].strip()
    else:
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if nodelist:
            addr = first_slurm_host(nodelist)
        elif world_size == 1:
            addr = "127.0.0.1"
        else:
            raise ValueError("incomplete SLURM environment: set MASTER_ADDR or SLURM_JOB_NODELIST")

    if env.get("MASTER_PORT"):
        port = _port(env, "MASTER_PORT")
    elif job_id and job_id.strip().isdigit():
        # Every task of a job derives the same port from the job id; different jobs sharing a
        # node get different ports.
        port = _SLURM_PORT_BASE + int(job_id) % _SLURM_PORT_SPAN
    else:
        raise ValueError(
            "incomplete SLURM environment: set MASTER_PORT (no numeric SLURM_JOB_ID to derive one from)"
        )
    return LaunchEnv(
        source="slurm",
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        master_addr=addr,
        master_port=port,
        run_id=run_id,
    )


def detect_launch(env: Mapping[str, str], *, require_rendezvous: bool = True) -> LaunchEnv | None:
    """Parse a launcher's environment; ``None`` when no launcher started this process.

    With ``require_rendezvous=False`` the rendezvous variables (``MASTER_ADDR``/``MASTER_PORT``, or
    SLURM's node list and job id) may be missing, because a store or ``init_method`` supplies it;
    ``master_addr``/``master_port`` are then ``None`` unless set.

    torchrun's variables (``RANK``/``WORLD_SIZE``) win over SLURM's, because ``srun torchrun ...``
    leaves both and the torchrun ones describe the actual worker. SLURM counts only when
    ``SLURM_PROCID`` is set, i.e. inside ``srun``; a bare ``salloc`` shell is not a launch.
    Raises ``ValueError`` for an incomplete or contradictory environment.
    """
    if any(env.get(name) for name in _TORCHRUN_TRIGGERS):
        return _detect_torchrun(env, require_rendezvous)
    if env.get("SLURM_PROCID"):
        return _detect_slurm(env, require_rendezvous)
    return None


# --------------------------------------------------------------------------- connect


def _tcp_url(addr: str, port: int) -> str:
    host = f"[{addr}]" if ":" in addr and not addr.startswith("[") else addr
    return f"tcp://{host}:{port}"


def _pick_backend(backend: str | None) -> str:
    if backend is not None:
        return backend
    return "nccl" if torch.cuda.is_available() else "gloo"


def _use_cuda_device(local_rank: int) -> None:
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise ValueError(
            f"local rank {local_rank} has no GPU: only {count} visible; start fewer ranks per node"
        )
    torch.cuda.set_device(local_rank)


def connect(
    *,
    backend: str | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    store: dist.Store | None = None,
    timeout: timedelta = timedelta(minutes=5),
    init_method: str | None = None,
) -> ConnectionInfo:
    """Initialise the default process group and say how.

    Explicit ``rank``/``world_size`` win (the local rank is then ``LOCAL_RANK`` or the rank);
    otherwise they come from the launch detected in the environment (torchrun, then SLURM). The
    rendezvous is ``store``, else ``init_method``, else TCP to ``master_addr``/``master_port``
    (explicit, else from the environment; a world of one needs none). The backend defaults to
    ``nccl`` with CUDA (the device is set to the local rank before the group exists, so NCCL binds
    the right GPU) and to ``gloo`` without. The timeout is always passed explicitly: a missing
    peer fails after ``timeout`` instead of hanging on a library default.
    """
    if not dist.is_available():
        raise RuntimeError("torch.distributed is not available in this torch build")
    if dist.is_initialized():
        raise RuntimeError("a default process group already exists; call disconnect() first")
    if (rank is None) != (world_size is None):
        raise ValueError("pass rank= and world_size= together, or neither to read them from the environment")
    if store is not None and init_method is not None:
        raise ValueError("pass either store= or init_method=, not both")
    if not isinstance(timeout, timedelta):
        raise TypeError(f"timeout must be a datetime.timedelta, got {type(timeout).__name__}")

    if rank is not None and world_size is not None:
        meet = _explicit(rank, world_size, master_addr, master_port, init_method, store)
    else:
        meet = _launched(master_addr, master_port, init_method, store)
    rank, world_size, local_rank, store = meet.rank, meet.world_size, meet.local_rank, meet.store
    addr, port, url = meet.addr, meet.port, meet.url
    chosen = _pick_backend(backend)
    if chosen == "nccl":
        _use_cuda_device(local_rank)
    if store is not None:
        dist.init_process_group(chosen, store=store, rank=rank, world_size=world_size, timeout=timeout)
        addr = port = None
    else:
        dist.init_process_group(chosen, init_method=url, rank=rank, world_size=world_size, timeout=timeout)
    return ConnectionInfo(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        backend=str(dist.get_backend()),
        source=meet.source,
        master_addr=addr,
        master_port=port,
    )


@dataclass
class _Meeting:
    """Where this process stands and how the group meets: a ``store``, else the ``url``
    (``init_method``), with the TCP address and port it names where there is one."""

    source: Source
    rank: int
    world_size: int
    local_rank: int
    store: dist.Store | None
    url: str | None
    addr: str | None = None
    port: int | None = None


def _explicit(
    rank: int, world_size: int, addr: str | None, port: int | None, url: str | None, store: dist.Store | None
) -> _Meeting:
    """Rank and world size given: the rendezvous as given, else ``MASTER_ADDR``/``MASTER_PORT``; a
    world of one needs none."""
    env = os.environ
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    source: Source = "store" if store is not None else "explicit"
    local_rank = _int_var(env, "LOCAL_RANK") if env.get("LOCAL_RANK") else rank
    if store is None and url is None:
        if addr is None and env.get("MASTER_ADDR"):
            addr = env["MASTER_ADDR"].strip()
        if port is None and env.get("MASTER_PORT"):
            port = _port(env, "MASTER_PORT")
        if addr is None or port is None:
            if world_size == 1:
                store = dist.HashStore()  # one process: nothing to rendezvous with
            else:
                raise ValueError(
                    "connect(rank=, world_size=) needs master_addr= and master_port= "
                    "(or MASTER_ADDR/MASTER_PORT, or store=, or init_method=)"
                )
        else:
            url = _tcp_url(addr, port)
    return _Meeting(source, rank, world_size, local_rank, store, url, addr, port)


def _launched(addr: str | None, port: int | None, url: str | None, store: dist.Store | None) -> _Meeting:
    """Rank and world size from the launch found in the environment (torchrun, then SLURM); the
    rendezvous as given, else the launch's."""
    launch = detect_launch(os.environ, require_rendezvous=store is None and url is None)
    if launch is None:
        raise ValueError(
            "no launch found in the environment (torchrun or srun); pass rank= and world_size= to connect()"
        )
    source: Source = "store" if store is not None else launch.source
    if url is None and store is None:
        addr = addr if addr is not None else launch.master_addr
        port = port if port is not None else launch.master_port
        assert addr is not None and port is not None  # required by detect_launch above
        url = _tcp_url(addr, port)
    return _Meeting(source, launch.rank, launch.world_size, launch.local_rank, store, url, addr, port)


def disconnect() -> None:
    """Destroy the default process group if there is one (safe to call twice)."""
    if is_ddp():
        dist.destroy_process_group()


__all__ = [
    "ConnectionInfo",
    "LaunchEnv",
    "connect",
    "data_parallel_rank",
    "data_parallel_world_size",
    "detect_launch",
    "disconnect",
    "first_slurm_host",
    "get_rank_safe",
    "get_world_size_safe",
    "is_ddp",
    "is_main_process",
    "iter_slurm_nodelist",
    "parse_slurm_nodelist",
]
