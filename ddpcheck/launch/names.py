"""Machine-wide names a rank creates: POSIX shared memory segments named by the loader, not by chance.

A name in ``/dev/shm`` is seen by every process of the machine. A loader that picks such names itself
(mosaicml-streaming registers ``/000000_locals``, ``/000000_barrier``, ... by scanning for the first
free prefix, then creating it after a barrier) is safe in one job at a time: its ranks agree through
the job's own collectives. Two of ddpcheck's groups running side by side (a determinism rerun beside
its run, a reference window beside its layout, restores in other topologies) are two jobs, and their
scans race: one creates the name the other found free (``FileExistsError: '/000000_locals'``), or a
cleanup in one unlinks the other's segments. The user's single job never meets that.

So every rank flags, in a byte the parent reads, that it (or a DataLoader worker it forked) created a
segment by a name of its own, and notes the name in its group's work directory. The parent runs groups
whose ranks did so one at a time (:func:`named_memory`), and once the group is over unlinks what a
killed rank left behind (:func:`unlink_left`): a rank that ends normally runs its exit handlers (the
library unlinks its own), one stopped by SIGKILL cannot, and the names would outlive the run.
"""

from __future__ import annotations

import contextlib
from multiprocessing import shared_memory  # here, so that forked ranks find it imported
from typing import Any

from ddpcheck.wire.files import named_flag_offset, names_path


def watch_named_memory(flags: Any, offset: int, workdir: str) -> None:
    """From now on in this process and the DataLoader workers forked from it: a
    ``multiprocessing.shared_memory.SharedMemory`` created under a caller-given name sets
    ``flags[offset]`` and appends the name to the group's list (:func:`~ddpcheck.wire.files.names_path`). A
    segment created without a name gets a random one (``psm_...``) and cannot collide: it is not flagged."""
    cls: Any = shared_memory.SharedMemory
    real = cls.__init__
    path = names_path(workdir)

    def init(
        self: Any, name: str | None = None, create: bool = False, size: int = 0, *args: Any, **kw: Any
    ) -> None:
        real(self, name, create, size, *args, **kw)
        if create and name is not None:
            flags[offset] = b"\x01"
            with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as out:
                out.write(f"{self._name}\n")  # one short write: lines from several processes stay whole

    init.__doc__ = real.__doc__
    cls.__init__ = init


def named_memory(flags: Any, world_size: int) -> list[int]:
    """The ranks whose flag :func:`watch_named_memory` set."""
    return [r for r in range(world_size) if flags[named_flag_offset(world_size, r)] != b"\x00"]


def unlink_left(workdir: str) -> list[str]:
    """Unlink the segments the group's ranks created by name and left (a killed rank's); returns them.
    Call it once every rank of the group is gone."""
    try:
        with open(names_path(workdir), encoding="utf-8") as names:
            created = list(dict.fromkeys(line.strip() for line in names if line.strip()))
    except OSError:
        return []
    try:
        import _posixshmem  # type: ignore[import-not-found]
    except ImportError:  # no POSIX shared memory here: nothing was created
        return []
    left = []
    for name in created:
        try:
            _posixshmem.shm_unlink(name)
        except OSError:  # unlinked by its creator already (the normal way out)
            continue
        left.append(name)
    return left
