"""The names of the files a rank writes for its parent, and of the bytes it shares with it: one owner.

A recording rank (``python -m ddpcheck.record``), a forked or simulated rank and the launcher that reads
what they leave all find a file through these functions; no other module spells a name (a test holds
that). In a launch's directory ``OUT``, per rank ``R``:

- ``rankR.trace`` and ``rankR.L.E.ids.npy`` (loader ``L``, epoch ``E``): the trace and its ids
  (:mod:`ddpcheck.tracefile` writes and reads them), ``spillPID-N.spill`` / ``arrayPID-N.ids.npy`` while
  the ids are recorded;
- ``fingerprint-rankR.json``: the rank's copy of the ``--fingerprint`` verdict (ids meanwhile under a
  ``.fingerprint-*`` folder);
- ``step/rankR/WINDOW.pt`` and ``step/params/WINDOW[.rankR]``: the compared step windows and their
  weights, for a replay; ``eval/roundI.pt``: the weights the one-process launch evaluated;
- ``progress``: the launch's progress region (one slot of :data:`PROGRESS_BYTES` a rank, mapped by both
  sides), ``rankR.log`` (its output) and ``rankR.stacks`` (its stacks when asked).

In a forked group's work directory: ``rankR.out``, ``rankR.stack``, ``rankR.error.json`` (torch
elastic's error file) and ``shm-names`` (the shared-memory names the ranks created); in a simulation
child's, ``ranks.stack``. A forked group's
shared bytes are the ranks' progress slots, then one "hashed a string" flag a rank, then one "created
shared memory by name" flag a rank (:func:`hash_flag_offset`, :func:`named_flag_offset`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# --- traces and ids ---------------------------------------------------------------------------------------

TRACE_SUFFIX = ".trace"
TRACE_GLOB = "rank*.trace"
IDS_SUFFIX = ".ids.npy"
SPILL_SUFFIX = ".spill"
IDS_NAME = re.compile(r"rank\d+\.\d+\.\d+\.ids\.npy")  # the only ids file a trace may name


def trace_path(directory: str | Path, rank: int) -> str:
    return os.path.join(directory, f"rank{rank}{TRACE_SUFFIX}")


def ids_name(rank: int, loader: int, epoch: int) -> str:
    """The ids file of ``loader``'s ``epoch`` on ``rank``, as the trace names it (beside the trace)."""
    return f"rank{rank}.{loader}.{epoch}{IDS_SUFFIX}"


def spill_path(directory: str, number: int) -> str:
    """Where this process appends an epoch's ids while it records them (int64)."""
    return os.path.join(directory, f"spill{os.getpid()}-{number}{SPILL_SUFFIX}")


def array_path(directory: str, number: int) -> str:
    """Where this process writes an epoch read as one array, until it is stored under its ids name."""
    return os.path.join(directory, f"array{os.getpid()}-{number}{IDS_SUFFIX}")


# --- the --fingerprint verdict ----------------------------------------------------------------------------

FINGERPRINT_GLOB = "fingerprint-rank*.json"
FINGERPRINT_HELD = ".fingerprint-"  # the prefix of the temporary folder of a rank's ids


def fingerprint_path(directory: str | Path, rank: int) -> str:
    return os.path.join(directory, f"fingerprint-rank{rank}.json")


def fingerprint_paths(directory: str | Path) -> list[Path]:
    """The verdict files in ``directory``, the lowest rank's first."""
    return sorted(Path(directory).glob(FINGERPRINT_GLOB), key=lambda p: (len(p.name), p.name))


# --- the step's windows and the evaluated weights ---------------------------------------------------------

STEP_DIR = "step"
PARAMS_DIR = "params"
EVAL_DIR = "eval"


def step_folder(out: str) -> str:
    """Where a ``--step`` launch saves its compared windows."""
    return os.path.join(out, STEP_DIR)


def step_rank_folder(out: str, rank: int) -> str:
    return os.path.join(out, STEP_DIR, f"rank{rank}")


def step_ranks(out: str) -> list[int]:
    """The ranks that saved windows in the launch recorded in ``out``; raises OSError without any."""
    folder = step_folder(out)
    return sorted(int(n[4:]) for n in os.listdir(folder) if n.startswith("rank") and n[4:].isdigit())


def window_name(loader: str, epoch: int, first: int) -> str:
    """The file name of the window whose first batch is ``loader``'s batch ``first`` of ``epoch``."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", loader)[-80:] or "loader"
    return f"{slug}-e{epoch}-b{first}.pt"


def params_path(out: str, name: str, rank: int | None = None) -> str:
    """Where the weights at window ``name``'s first batch are saved: rank 0's whole tensors, or
    (``rank``) one rank's shards of sharded parameters."""
    return os.path.join(out, STEP_DIR, PARAMS_DIR, name if rank is None else f"{name}.rank{rank}")


def eval_round_path(out: str, index: int) -> str:
    """The weights the one-process launch evaluated in its evaluation ``index``."""
    return os.path.join(out, EVAL_DIR, f"round{index}.pt")


# --- a script launch's ranks ------------------------------------------------------------------------------


def progress_path(out: str) -> str:
    """The launch's progress region: one slot of :data:`PROGRESS_BYTES` a rank, in rank order."""
    return os.path.join(out, "progress")


def log_path(out: str, rank: int) -> str:
    """A script rank's output (stdout and stderr)."""
    return os.path.join(out, f"rank{rank}.log")


def stacks_path(out: str, rank: int) -> str:
    """Where a script rank writes its threads' stacks when asked (a hang)."""
    return os.path.join(out, f"rank{rank}.stacks")


# --- a forked group's ranks -------------------------------------------------------------------------------

NAMES_FILE = "shm-names"  # one created shared-memory name a line, from every rank


def output_path(workdir: str, rank: int) -> str:
    """A forked rank's output."""
    return os.path.join(workdir, f"rank{rank}.out")


def stack_path(workdir: str, rank: int) -> str:
    """Where a forked rank writes its stacks when asked (a hang)."""
    return os.path.join(workdir, f"rank{rank}.stack")


def error_path(workdir: str, rank: int) -> str:
    """Torch elastic's error file of a forked rank (``TORCHELASTIC_ERROR_FILE``)."""
    return os.path.join(workdir, f"rank{rank}.error.json")


def child_stack_path(workdir: str) -> str:
    """Where a simulation's child, which runs many ranks, writes its stacks when asked (a hang)."""
    return os.path.join(workdir, "ranks.stack")


def names_path(workdir: str) -> str:
    """The group's list of the shared-memory segments its ranks created by name."""
    return os.path.join(workdir, NAMES_FILE)


# --- the bytes a rank shares with its parent --------------------------------------------------------------

PROGRESS_BYTES = 240  # one rank's progress slot (its layout: ddpcheck.launch.beats)


def hash_flag_offset(world_size: int, rank: int) -> int:
    """Where, after the ranks' progress slots, the byte saying "rank ``rank`` hashed a string" is."""
    return PROGRESS_BYTES * world_size + rank


def named_flag_offset(world_size: int, rank: int) -> int:
    """Where the byte saying "rank ``rank`` created shared memory by name" is: after the progress slots
    and the hash flags (one byte a rank each)."""
    return PROGRESS_BYTES * world_size + world_size + rank


def shared_bytes(world_size: int) -> int:
    """The size of a forked group's shared bytes: the slots and two flags a rank."""
    return (PROGRESS_BYTES + 2) * world_size
