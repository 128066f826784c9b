"""What a process and the machine hold in memory, read from /proc; and handing freed memory back.

Simulated ranks run one after another in a few processes (:mod:`ddpcheck.launch.simulate`): each rank's
peak is measured on its own (the kernel's high-water mark, reset before the rank), and after a rank
whose loader held a lot (torch's ``DistributedSampler`` materialises a Python list of the whole dataset
per rank) the memory it freed is handed back to the system: CPython keeps freed small objects in its
arenas and glibc keeps freed heap pages, so without :func:`return_freed_memory` a process's size is
its largest rank's forever, and the next fork starts from there. Elsewhere than Linux every reading is
0 (unknown) and nothing is handed back.
"""

from __future__ import annotations

import ctypes
import gc
import os
from typing import Any

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_libc: Any = None


def rss_bytes(pid: int | str = "self") -> int:
    """Resident memory of process ``pid`` now (0: unknown)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as handle:
            return int(handle.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def reset_peak() -> bool:
    """Start this process's high-water mark of resident memory afresh (Linux 4.0+); False: not here."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def peak_bytes() -> int:
    """This process's high-water mark of resident memory (VmHWM) since it started or the last
    :func:`reset_peak` (0: unknown)."""
    return _status_kb("/proc/self/status", "VmHWM") * 1024


def available_bytes() -> int:
    """Memory the machine can still give without swapping (MemAvailable; 0: unknown)."""
    return _status_kb("/proc/meminfo", "MemAvailable") * 1024


def total_bytes() -> int:
    return _status_kb("/proc/meminfo", "MemTotal") * 1024


def _status_kb(path: str, field: str) -> int:
    try:
        with open(path, "rb") as handle:
            for line in handle:
                if line.startswith(field.encode() + b":"):
                    return int(line.split()[1])
    except (OSError, IndexError, ValueError):
        pass
    return 0


def return_freed_memory() -> None:
    """Collect cycles, then hand the heap's free pages back to the system (glibc's ``malloc_trim``):
    after a rank that built a list of a hundred million ints, the process shrinks to what it holds."""
    gc.collect()
    global _libc
    if _libc is None:
        _libc = False
        try:
            libc = ctypes.CDLL(None)  # the process's own symbols: glibc's malloc_trim where it is glibc
            _libc = libc if hasattr(libc, "malloc_trim") else False
        except OSError:
            pass
    if _libc:
        _libc.malloc_trim(0)


def gib(n: float) -> str:
    """``3.2 GiB`` / ``420 MiB``: a size for a message."""
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    return f"{n / (1 << 20):.0f} MiB"
