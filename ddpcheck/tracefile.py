"""The trace files of a recorded launch: one module writes them (``ddpcheck.record``) and reads them
(``ddpcheck judge``, ``ddpcheck run``).

A launch's directory holds, per rank ``R``:

- ``rankR.trace``: what the rank saw except its ids (loaders, facts, batch sizes, how the script ended):
  a pickle of plain data (:class:`~ddpcheck.trace.ScriptRankTrace`), read back by an unpickler that
  refuses every class that is not part of a trace, so a foreign file cannot run code;
- ``rankR.L.E.ids.npy``: the ids of loader ``L``'s epoch ``E`` in yield order, a standard ``.npy`` array
  of the narrowest integer type that holds them (``uint32`` for a billion dataset indices), read by
  memory map a chunk at a time and never whole.

A rank writes its ids while it records: past :data:`SPILL_IDS` ids an epoch goes to disk as it grows
(:class:`SpillFile`), so no rank holds a large epoch in memory. Ids that are not integers stay in the
pickle. The files' names are :mod:`ddpcheck.wire.files`'.
"""

from __future__ import annotations

import os
import pickle
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, BinaryIO

from ddpcheck.trace import (
    ID_SINKS,
    SCRIPT_TRACE_VERSION,
    EpochTrace,
    IdArray,
    ScriptLoader,
    ScriptRankTrace,
    spill_threshold,
)
from ddpcheck.wire.files import IDS_NAME, IDS_SUFFIX, array_path, ids_name, spill_path, trace_path

_SAFE_BUILTINS = frozenset(
    {"set", "frozenset", "tuple", "list", "dict", "int", "float", "complex", "str", "bytes", "bytearray",
     "bool", "slice", "range"}
)  # fmt: skip
_NUMPY_DATA = frozenset(
    {(m, n) for m in ("numpy.core.multiarray", "numpy._core.multiarray") for n in ("scalar", "_reconstruct")}
    | {("numpy", "dtype"), ("numpy", "ndarray")}
)


def narrowest(lo: int, hi: int) -> str:
    """The narrowest numpy integer type holding every id in ``[lo, hi]``, as its dtype string."""
    import numpy as np

    kinds = (np.uint8, np.uint16, np.uint32) if lo >= 0 else (np.int8, np.int16, np.int32)
    for kind in kinds:
        info = np.iinfo(kind)
        if info.min <= lo and hi <= info.max:
            return np.dtype(kind).str
    return np.dtype(np.int64).str


# --- writing ----------------------------------------------------------------------------------------------


def write_ids(path: str, parts: Iterable[Any], count: int, lo: int, hi: int) -> IdArray:
    """Write ``count`` ids (int64 chunks) as a ``.npy`` of the narrowest type; the file's IdArray."""
    import numpy as np

    dtype = narrowest(lo, hi) if count else np.dtype(np.int64).str
    partial = f"{path}.{os.getpid()}.part"
    with open(partial, "wb") as handle:
        np.lib.format.write_array_header_1_0(
            handle, {"descr": dtype, "fortran_order": False, "shape": (count,)}
        )
        for part in parts:  # written from the array's own memory: a billion ids are not copied once more
            handle.write(np.ascontiguousarray(np.asarray(part).astype(dtype, copy=False)).data)
    os.replace(partial, path)
    return IdArray(path=path, dtype=dtype, size=count, lo=lo, hi=hi)


class SpillFile:
    """One epoch's ids on disk while they are recorded (int64, appended batch by batch); :meth:`close`
    writes them as a ``.npy`` of the narrowest type. Installed by :func:`spill_to`."""

    def __init__(self, directory: str, number: int) -> None:
        self.path = spill_path(directory, number)
        self._handle: BinaryIO | None = open(self.path, "wb")  # noqa: SIM115 - closed by close()
        self.count, self.lo, self.hi = 0, 0, -1

    def write(self, ids: array[int]) -> None:
        import numpy as np

        if not len(ids):
            return
        values = np.frombuffer(ids, dtype=np.int64)
        lo, hi = int(values.min()), int(values.max())
        self.lo, self.hi = (lo, hi) if not self.count else (min(self.lo, lo), max(self.hi, hi))
        self.count += len(values)
        assert self._handle is not None
        self._handle.write(values.tobytes())

    def close(self) -> IdArray:
        import numpy as np

        assert self._handle is not None
        self._handle.close()
        self._handle = None
        raw = np.memmap(self.path, dtype=np.int64, mode="r") if self.count else np.zeros(0, np.int64)
        step = 1 << 22
        try:
            parts = (raw[i : i + step] for i in range(0, len(raw), step))
            return write_ids(self.path + IDS_SUFFIX, parts, self.count, self.lo, self.hi)
        finally:
            del raw
            os.unlink(self.path)


_spilled_to: list[tuple[str, Iterator[int]]] = []  # (directory, numbers) while spill_to is in effect


def spill_to(directory: str) -> None:
    """From now on, epochs recorded in this process that grow past SPILL_IDS ids go to ``directory``."""
    os.makedirs(directory, exist_ok=True)
    numbers = iter(range(1 << 62))
    ID_SINKS[:] = [lambda: SpillFile(directory, next(numbers))]
    _spilled_to[:] = [(directory, numbers)]


def spill_array(values: Any) -> IdArray | None:
    """An epoch read as one integer array (already in its narrowest type), written to the directory of
    :func:`spill_to` when it holds SPILL_IDS ids or more: the file's IdArray, else None (kept in memory).
    A simulated rank's epoch of a hundred million ids then never crosses the pipe or stays in the parent."""
    if not _spilled_to or len(values) < spill_threshold():
        return None
    directory, numbers = _spilled_to[0]
    path = array_path(directory, next(numbers))
    lo, hi = (int(values.min()), int(values.max())) if len(values) else (0, -1)
    return write_ids(path, [values], len(values), lo, hi)


def _stored_epoch(directory: str, rank: int, loader: int, epoch: EpochTrace) -> EpochTrace:
    """The epoch with its integer ids in their ``.npy`` file, named by rank, loader and epoch."""
    import numpy as np

    name = ids_name(rank, loader, epoch.epoch)
    path = os.path.join(directory, name)
    ids = epoch.ids
    if isinstance(ids, IdArray) and ids.path:
        os.replace(ids.path, path)
        stored = IdArray(path=name, dtype=ids.dtype, size=ids.size, lo=ids.lo, hi=ids.hi)
    elif isinstance(ids, IdArray) or (isinstance(ids, array) and ids.typecode == "q"):
        values = ids.array() if isinstance(ids, IdArray) else np.frombuffer(ids, np.int64) if len(ids) else []
        lo, hi = (int(np.min(values)), int(np.max(values))) if len(values) else (0, -1)
        step = 1 << 22
        parts = (values[i : i + step] for i in range(0, len(values), step))
        written = write_ids(path, parts, len(values), lo, hi)
        stored = IdArray(path=name, dtype=written.dtype, size=written.size, lo=lo, hi=hi)
    else:
        return replace(epoch, batch_sizes=_compact(epoch.batch_sizes))
    return replace(epoch, ids=stored, batch_sizes=_compact(epoch.batch_sizes))


def _compact(sizes: Any) -> Any:
    """Batch sizes as a compact array: a rank of 4096 keeps thousands of them per epoch."""
    if isinstance(sizes, array):
        return sizes
    try:
        return array("q", sizes)
    except (TypeError, OverflowError):
        return sizes


def write_rank(directory: str | Path, trace: ScriptRankTrace) -> str:
    """Write one rank's trace into ``directory`` (its ids as ``.npy`` files); the trace file's path."""
    folder = str(directory)
    os.makedirs(folder, exist_ok=True)
    loaders = []
    for number, loader in enumerate(trace.loaders):
        epochs = tuple(_stored_epoch(folder, trace.rank, number, e) for e in loader.trace.epochs)
        loaders.append(replace(loader, trace=replace(loader.trace, epochs=epochs)))
    stored = replace(trace, loaders=tuple(loaders))
    final = trace_path(folder, trace.rank)
    partial = f"{final}.{os.getpid()}.part"
    with open(partial, "wb") as handle:
        pickle.dump(stored, handle, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(partial, final)
    return final


# --- reading ----------------------------------------------------------------------------------------------


TRACE_MODULES = ("ddpcheck.trace", "ddpcheck.eval_trace")  # where a trace's classes live


class _TraceUnpickler(pickle.Unpickler):
    """Trace files are plain data: a file that names any other class (a hostile or foreign pickle,
    which could run code as it loads) is refused, never imported."""

    def find_class(self, module: str, name: str) -> Any:
        if (
            module in TRACE_MODULES
            or module == "array"
            or (module == "builtins" and name in _SAFE_BUILTINS)
            or (module, name) in _NUMPY_DATA  # ids a hook returned as numpy scalars
        ):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is no part of a trace")


class BadTraceFile(ValueError):
    """A trace file that is not one of this version, or whose ids file is missing or does not match."""


def _resolved(directory: str, ids: IdArray) -> IdArray:
    """An ids file named by a trace, found beside it and checked against what the trace says of it."""
    import numpy as np

    if not IDS_NAME.fullmatch(ids.path):
        raise BadTraceFile(f"names an ids file {ids.path!r} outside its directory")
    path = os.path.join(directory, ids.path)
    try:
        with open(path, "rb") as handle:
            version = np.lib.format.read_magic(handle)
            read = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, fortran, dtype = read(handle)
    except (OSError, ValueError) as exc:
        raise BadTraceFile(f"its ids file {ids.path} cannot be read: {exc}") from None
    if shape != (ids.size,) or dtype.str != ids.dtype or fortran:
        raise BadTraceFile(f"its ids file {ids.path} holds {shape} {dtype}, not ({ids.size},) {ids.dtype}")
    return IdArray(path=path, dtype=ids.dtype, size=ids.size, lo=ids.lo, hi=ids.hi)


def _with_files(directory: str, trace: ScriptRankTrace) -> ScriptRankTrace:
    loaders: list[ScriptLoader] = []
    for loader in trace.loaders:
        epochs = tuple(
            replace(e, ids=_resolved(directory, e.ids)) if isinstance(e.ids, IdArray) else e
            for e in loader.trace.epochs
        )
        loaders.append(replace(loader, trace=replace(loader.trace, epochs=epochs)))
    return replace(trace, loaders=tuple(loaders))


def read_rank(path: str | Path, *, untrusted: bool = False) -> ScriptRankTrace | None:
    """A rank's trace, its ids left on disk until read; None for a file that is no trace of this
    version. ``untrusted`` (a directory given to ``ddpcheck judge``): plain data only. Raises
    :class:`BadTraceFile` when the trace names ids files that are missing or do not match."""
    try:
        with open(path, "rb") as handle:
            trace = _TraceUnpickler(handle).load() if untrusted else pickle.load(handle)
    except Exception:  # unreadable, truncated, foreign or hostile: no trace of this version
        return None
    if not isinstance(trace, ScriptRankTrace) or trace.version != SCRIPT_TRACE_VERSION:
        return None
    return _with_files(os.path.dirname(os.path.abspath(path)), trace)
