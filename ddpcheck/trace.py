"""The Trace: what every rank saw, per epoch, as plain data.

This is the contract between the rank side (which records) and the checks (which judge). It holds
no user objects, only ids, counts and a few loader facts, so it crosses a process boundary as a small
pickle or as JSON. Integer ids are kept in compact ``array('q')`` buffers: a million-sample epoch
costs 8 MB, not the ~36 MB of a Python list of ints.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # plain data too, named for type checkers only: this module imports nothing of ddpcheck
    from ddpcheck.eval_trace import EvalRecord

IdSource = str
"""How sample identity was obtained: ``index``, ``hook``, ``field:<name>`` or ``content-hash``."""


def compact_ids(ids: Iterable[Hashable]) -> Sequence[Hashable]:
    """Store ids as ``array('q')`` when they are all ints that fit, else as a tuple."""
    items = ids if isinstance(ids, (list, tuple, array)) else list(ids)
    if isinstance(items, array):
        return items
    if all(type(i) is int for i in items):
        try:
            return array("q", items)
        except OverflowError:
            pass
    return tuple(items)


_NPY_STARTS: dict[tuple[str, int, str], int] = {}  # (.npy file, length, type) -> where its data starts


class IdArray(Sequence[int]):
    """Integer ids held as one numpy array: in memory, or in a ``.npy`` file opened only while read.

    The compact form of an epoch at scale: the narrowest integer type that holds its ids (a billion
    dataset indices cost 4 GB as ``uint32``, not 28 GB as Python ints). A file-backed one keeps no file
    open and no page mapped between reads (:meth:`array` maps the file afresh), so a run of 4096 ranks
    holds 4096 of them for the price of their names. Elements read one by one come back as Python ints;
    the checks read :meth:`array` in chunks instead. ``lo``/``hi``: the smallest and largest id
    (``hi < lo`` when empty), known without reading the ids.
    """

    __slots__ = ("_array", "dtype", "hi", "lo", "path", "size")

    def __init__(self, values: Any = None, *, path: str = "", dtype: str = "", size: int = 0,
                 lo: int = 0, hi: int = -1) -> None:  # fmt: skip
        import numpy as np

        if values is not None:
            values = np.asarray(values)
            if values.dtype.kind not in "iu" or values.ndim != 1:
                raise TypeError(f"IdArray holds a 1-d array of integers, not {values.dtype} x {values.shape}")
            self._array: Any = values
            self.path, self.dtype, self.size = "", values.dtype.str, len(values)
            self.lo, self.hi = (int(values.min()), int(values.max())) if len(values) else (0, -1)
        else:
            self._array, self.path, self.dtype, self.size, self.lo, self.hi = None, path, dtype, size, lo, hi

    def array(self) -> Any:
        """The ids as a numpy array (a read-only memory map for a file: drop it when done)."""
        if self._array is not None:
            return self._array
        import numpy as np

        if not self.size:
            return np.zeros(0, np.dtype(self.dtype))
        key = (self.path, self.size, self.dtype)  # a header is the same for the same length and type
        start = _NPY_STARTS.get(key)
        if start is None:  # the header read once: a judge maps each of 4096 files several times
            values = np.load(self.path, mmap_mode="r")
            if len(values) != self.size or values.dtype.str != self.dtype:
                raise ValueError(
                    f"{self.path} holds {len(values)} {values.dtype} ids, not {self.size} {self.dtype}"
                )
            _NPY_STARTS[key] = int(values.offset)
            return values
        return np.memmap(self.path, dtype=np.dtype(self.dtype), mode="r", offset=start, shape=(self.size,))

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.array()[index].tolist()
        return int(self.array()[index])

    def __iter__(self) -> Iterator[int]:
        values = self.array()
        for start in range(0, len(values), 1 << 16):
            yield from values[start : start + (1 << 16)].tolist()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, IdArray):
            return NotImplemented
        if len(self) != len(other) or (len(self) and (self.lo, self.hi) != (other.lo, other.hi)):
            return False
        a, b = self.array(), other.array()
        step = 1 << 20
        return all(bool((a[i : i + step] == b[i : i + step]).all()) for i in range(0, len(a), step))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        where = f" in {self.path}" if self.path else ""
        return f"IdArray({self.size} x {self.dtype}{where})"

    def __getstate__(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name in self.__slots__:
            object.__setattr__(self, name, state[name])


def _int_array(ids: object) -> bool:
    """Ids held as integers in one array (``array('q')``, an :class:`IdArray`, a numpy integer array)."""
    if type(ids) is array:
        return ids.typecode == "q"
    if isinstance(ids, IdArray):
        return True
    kind = getattr(getattr(ids, "dtype", None), "kind", "")
    return kind in ("i", "u") and getattr(ids, "ndim", 0) == 1 and str(getattr(ids, "dtype", "")) != "uint64"


def _numpy(ids: Any) -> Any:
    import numpy as np

    if type(ids) is array:
        return np.frombuffer(ids, dtype=np.int64) if len(ids) else np.zeros(0, np.int64)
    return ids.array() if isinstance(ids, IdArray) else ids


class UnionIds(Sequence[Hashable]):
    """Several streams' ids together, each once, in first-yield order (the first stream's, then the next
    one's new ids, ...): the stand-in reference of a launch recorded without a single-process run.

    Integer ids are produced a chunk at a time over a bitmap of their range (N/8 bytes), never held
    whole; the checks' tally recognises a union of the very ranks it counts and reads nothing twice.
    Other ids go through a dict, as they always did.
    """

    CHUNK = 1 << 22

    def __init__(self, parts: Sequence[Sequence[Hashable]]) -> None:
        self.parts = tuple(parts)
        self._len: int | None = None

    def settle(self, length: int) -> None:
        """Its length, when the caller counted it anyway (the tally does)."""
        self._len = length

    def numeric(self) -> bool:
        """Every part holds integer ids in one array."""
        return all(_int_array(p) for p in self.parts)

    def _dense(self) -> bool:
        """Integer ids in a range a bitmap covers cheaply (else :meth:`chunks` is not used)."""
        if not self.numeric():
            return False
        lo, hi = self._bounds()
        return hi < lo or hi - lo < 16 * sum(len(p) for p in self.parts) + (1 << 23)

    def _bounds(self) -> tuple[int, int]:
        found = []
        for p in self.parts:
            if isinstance(p, IdArray):
                found.append((p.lo, p.hi))
            elif len(p):
                values = _numpy(p)
                found.append((int(values.min()), int(values.max())))
        found = [(lo, hi) for lo, hi in found if hi >= lo]
        return (min(f[0] for f in found), max(f[1] for f in found)) if found else (0, -1)

    def chunks(self) -> Iterator[Any]:
        """The ids in order as int64 numpy arrays (integer parts only)."""
        import numpy as np

        lo, hi = self._bounds()
        seen = np.zeros(((hi - lo + 1) >> 3) + 1, np.uint8)
        one = np.uint8(1)
        for part in self.parts:
            values = _numpy(part)
            for start in range(0, len(values), self.CHUNK):
                k = values[start : start + self.CHUNK].astype(np.int64) - lo
                mask = np.left_shift(one, (k & 7).astype(np.uint8))
                fresh = (seen[k >> 3] & mask) == 0
                ordered = np.sort(k)
                if len(k) > 1 and (ordered[1:] == ordered[:-1]).any():  # later copies within the chunk
                    order = np.argsort(k, kind="stable")
                    ordered = k[order]
                    fresh[order[1:][ordered[1:] == ordered[:-1]]] = False
                new = k[fresh]
                np.bitwise_or.at(seen, new >> 3, mask[fresh])
                if len(new):
                    yield new + lo

    def ordered(self) -> Any:
        """Every id once, in first-yield order, as one int64 numpy array (None: not integer ids in a
        range a bitmap covers). Built by :meth:`chunks`, never by sorting all the streams together."""
        import numpy as np

        if not self._dense():
            return None
        found = list(self.chunks())
        return np.concatenate(found) if found else np.zeros(0, np.int64)

    def __len__(self) -> int:
        if self._len is None:
            if self._dense():
                self._len = sum(len(c) for c in self.chunks())
            else:
                self._len = len(dict.fromkeys(x for p in self.parts for x in p))
        return self._len

    def __iter__(self) -> Iterator[Hashable]:
        if self._dense():
            for c in self.chunks():
                yield from c.tolist()
        else:
            yield from dict.fromkeys(x for p in self.parts for x in p)

    def __getitem__(self, index: Any) -> Any:
        items = list(self)  # rare: only small stand-ins are read by position
        return items[index]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, UnionIds):
            return NotImplemented
        if self._dense() and other._dense():
            return _same_stream(self.chunks(), other.chunks())
        return list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]


def _same_stream(a: Iterator[Any], b: Iterator[Any]) -> bool:
    """Two streams of int64 chunks hold the same ids in the same order (chunked differently)."""
    import numpy as np

    x, y = np.zeros(0, np.int64), np.zeros(0, np.int64)
    while True:
        while len(x) < UnionIds.CHUNK and (more := next(a, None)) is not None:
            x = np.concatenate([x, more])
        while len(y) < max(len(x), 1) and (more := next(b, None)) is not None:
            y = np.concatenate([y, more])
        n = min(len(x), len(y))
        if not np.array_equal(x[:n], y[:n]):
            return False
        if n == 0:
            return len(x) == len(y) == 0
        x, y = x[n:], y[n:]


BITMAP_IDS = 1 << 26  # ids below this are counted in a bitmap (64 MB at most) whatever the epoch's length
SPILL_IDS = 1 << 20  # an epoch's integer ids beyond this many go to the installed sink as they arrive


def spill_threshold() -> int:
    """:data:`SPILL_IDS` as it is now (:func:`spill_every` changes it)."""
    return SPILL_IDS


class IdSink(Protocol):
    """Where an epoch's integer ids go while recorded (``ddpcheck.tracefile.SpillFile``): appended a
    buffer at a time, then closed into the :class:`IdArray` of the whole epoch."""

    def write(self, ids: array[int]) -> None: ...

    def close(self) -> IdArray: ...


ID_SINKS: list[Callable[[], IdSink]] = []  # empty: ids stay in memory; else the factory of every epoch's sink


def spill_every(count: int) -> None:
    """Ids go to the installed sink past ``count`` held (``ddpcheck.record --fingerprint``: a rank holds
    a few hundred kB of ids, not 8 MB)."""
    global SPILL_IDS
    SPILL_IDS = count


class IdBuffer:
    """One epoch's ids as they arrive, kept compact: an ``array('q')`` while batches come as arrays.

    A batch that is an ``array('q')`` holds plain ints by construction (recording builds one only
    from sources known to yield them); any other batch turns the buffer into a list, and
    :meth:`ids` then stores it with :func:`compact_ids`, exactly as a list of the same ids would be.
    ``distinct`` is incremental: the endless-loader guard asks it at doubling lengths, and it never
    sorts or hashes an id twice.
    """

    def __init__(self) -> None:
        self._ints: array[int] | None = array("q")
        self._list: list[Hashable] | None = None
        self._seen: Any = None  # numpy bitmap over [0, len(_seen)) of ints seen so far
        self._outside: Any = None  # sorted distinct ints seen outside the bitmap's range (numpy)
        self._counted = 0  # ids already folded into _seen / _outside
        self._set: set[Hashable] | None = None
        self._sink: IdSink | None = None  # where ids past SPILL_IDS went (ID_SINKS installed)
        self._spilled = 0
        self._stored: Sequence[Hashable] = ()  # the sink's IdArray once closed

    def extend(self, batch: Sequence[Hashable]) -> None:
        if self._ints is not None:
            if (type(batch) is array and batch.typecode == "q") or self._took_ints(batch):
                if type(batch) is array:
                    self._ints.extend(batch)
                if len(self._ints) >= SPILL_IDS and ID_SINKS:
                    self._spill()
                return
            if self._spilled:  # ids already on disk are ints: the rest must be too
                raise TypeError("an epoch whose ids were written as integers yields ids that are not")
            self._list, self._ints = list[Hashable](self._ints.tolist()), None
        assert self._list is not None
        self._list.extend(batch)

    def _took_ints(self, batch: Sequence[Hashable]) -> bool:
        """A list of plain ints that fit int64, appended as 8 bytes each from the start (a sampler ddpcheck
        does not know yields such lists), as :func:`compact_ids` would store them at the epoch's end."""
        if type(batch) is not list or set(map(type, batch)) - {int}:
            return False
        assert self._ints is not None
        try:
            self._ints.fromlist(batch)  # type: ignore[arg-type]  # all or nothing
        except OverflowError:  # beyond int64: kept as they are
            return False
        return True

    def _spill(self) -> None:
        """Move the buffered ids to the sink (counting them first, if distinct() is in use)."""
        assert self._ints is not None
        if self._seen is not None or self._outside is not None:
            self.distinct()
        if self._sink is None:
            self._sink = ID_SINKS[0]()
        self._sink.write(self._ints)
        self._spilled += len(self._ints)
        self._ints, self._counted = array("q"), 0

    def __len__(self) -> int:
        if self._sink is not None:
            return self._spilled + (len(self._ints) if self._ints is not None else 0)
        return len(self._ints) if self._ints is not None else len(self._list or ())

    def distinct(self) -> int:
        """How many distinct ids so far."""
        if self._ints is None:
            if self._set is None:
                self._set = set()
                self._counted = 0
            assert self._list is not None
            self._set.update(self._list[self._counted :])
            self._counted = len(self._list)
            return len(self._set)
        import numpy as np

        values = np.frombuffer(self._ints, dtype=np.int64)[self._counted :]
        self._counted += len(values)
        limit = max(8 * len(self._ints), BITMAP_IDS)  # a bitmap of at most this many bytes
        fits = (values >= 0) & (values < limit)
        inside_values = values[fits]
        if len(inside_values):
            high = int(inside_values.max())
            if self._seen is None or high >= len(self._seen):
                size = max(high + 1, 2 * len(self._seen) if self._seen is not None else 0)
                grown = np.zeros(min(size, limit), np.bool_)
                if self._seen is not None:
                    grown[: len(self._seen)] = self._seen
                self._seen = grown
            self._seen[inside_values] = True
        if len(inside_values) < len(values):  # sorted distinct ids outside the bitmap, merged
            held = [] if self._outside is None else [self._outside]
            outside = np.concatenate([*held, values[~fits]])
            outside.sort()
            if len(outside) > 1:
                outside = outside[np.concatenate([[True], outside[1:] != outside[:-1]])]
            self._outside = outside
        inside = int(np.count_nonzero(self._seen)) if self._seen is not None else 0
        o = self._outside
        if o is None:
            return inside
        if self._seen is not None:  # a bitmap that grew may hold some of them
            return inside + len(o) - int(np.count_nonzero(self._seen[o[(o >= 0) & (o < len(self._seen))]]))
        return inside + len(o)

    def ids(self) -> Sequence[Hashable]:
        """The epoch's ids, compact: what :func:`compact_ids` makes of the same ids in a list (an
        :class:`IdArray` on disk once they were spilled)."""
        if self._sink is not None:
            if self._ints is not None:
                self._sink.write(self._ints)
                self._ints, self._stored = None, self._sink.close()
            return self._stored
        if self._ints is not None:
            return self._ints
        return compact_ids(self._list or [])


@dataclass(frozen=True)
class LoaderFacts:
    """What the rank could read off the loader it was given; ``None`` where unknowable."""

    dataset_kind: str = "map"  # "map" | "iterable"
    dataset_len: int | None = None
    batch_size: int | None = None
    drop_last: bool | None = None
    sampler: str | None = None
    batch_sampler: str | None = None
    num_workers: int = 0
    padding: bool | None = None  # True when the sampler is known to pad, False when known to drop
    pad_unit: int = 1  # samples per padding unit: a batch when the loader pads whole batches (even_batches)
    batch_level: bool = False  # True when whole batches are sharded (custom batch sampler)
    per_rank_batches: str = ""  # "Grouping over DistributedSampler": a batch sampler over a rank's share
    has_set_epoch: bool = False
    shuffles: bool | None = None  # the sampler says it reshuffles every epoch (shuffle=True, RandomSampler)
    in_order: bool = True  # False: DataLoader(in_order=False) with workers, batch order may vary by run
    recorded: str = "sampler"  # "sampler": the (batch) sampler's index stream; "loader": real iteration
    steps: int | None = None  # windows of this many batches per rank instead of whole epochs
    resumable: str = ""  # where the data state lives, for the resume check ("" none; see checker.recording)
    set_epoch_unreached: str = ""  # parts with a set_epoch the training loop's call never reached
    work: str = ""  # what a batch's work was measured from ("" not measured; see checker.work)
    # the ids are the sampler's own indices into a dataset of this length (None: unknown, or mapped through
    # a Subset or an indices mapping to other samples): ids outside [0, index_space) overflowed
    index_space: int | None = None
    # what a rank-splitting sampler (DistributedSampler or alike) was told: the ranks it splits among and
    # this rank's place; None where no part of the loader says
    sampler_replicas: int | None = None
    sampler_rank: int | None = None
    # the dataset is drawn from a bigger one: "Subset" (torch Subset, what random_split returns) or
    # "indices mapping" (an HF datasets split, shuffle or select); "" when not
    subset: str = ""
    subset_digest: str = ""  # which samples the subset holds, in order (ranks that drew others differ)
    subset_call: str = ""  # the script's call that drew it, at its line ("random_split at train.py:17")
    # autograd was on where the facts were read (a script: its first iter() of the loader); False: iterated
    # under torch.no_grad() / inference_mode, an evaluation, whose order changes no result
    grad_enabled: bool | None = None


PADDED_WIDTH = "input_ids width (padding unknown)"  # LoaderFacts.work when nothing says which tokens pad


@dataclass
class PackingTally:
    """One rank's packed batches of one epoch, summed (``ddpcheck.checker.work`` counts them)."""

    batches: int = 0
    segments: int = 0
    sources: tuple[str, ...] = ()  # boundary metadata seen: cu_seqlens, seq_idx, document_ids, ...
    disagree: int = 0  # batches whose metadata sources name different boundaries
    no_reset: int = 0  # metadata boundaries (not row starts) whose position is not 0
    reset_inside: int = 0  # positions that restart at 0 inside one metadata segment
    jumps: int = 0  # positions that neither continue (+1) nor restart (0) inside a segment
    mixed: int = 0  # segments holding tokens of several documents (token_ids)
    cut_continued: int = 0  # segments continuing a document cut earlier, positions continued: declared
    cut_restarted: int = 0  # continuations whose positions restart at 0: the cut is not declared
    first_batch: int | None = None  # the epoch's first batch with a problem
    runs: list[tuple[Any, int, int]] | None = None  # (document, first offset, length) per segment

    COUNTS = ("batches", "segments", "disagree", "no_reset", "reset_inside", "jumps", "mixed",
              "cut_continued", "cut_restarted")  # fmt: skip

    def add(self, other: PackingTally, index: int | None = None) -> PackingTally:
        """Sum ``other`` into this tally (in place, runs appended); ``index``: the batch ``other`` is,
        remembered when it is the first with a problem."""
        for name in self.COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.sources = tuple(sorted(set(self.sources) | set(other.sources)))
        if index is not None and other.problems and self.first_batch is None:
            self.first_batch = index
        if self.runs is not None and other.runs is not None:
            self.runs.extend(other.runs)
        return self

    @property
    def problems(self) -> int:
        return (
            self.disagree + self.no_reset + self.reset_inside + self.jumps + self.mixed + self.cut_restarted
        )


@dataclass(frozen=True)
class SourceCodes:
    """The source of every sample of one epoch (``ddpcheck.checker.mixture`` reads them): ``codes[i]`` is
    the index in ``names`` of the source of ``EpochTrace.ids[i]``; ``declared`` the file's
    ``source_weights()`` as ``(name, weight)`` pairs (empty: none declared)."""

    names: tuple[str, ...]
    codes: Sequence[int]  # array('h'), parallel to the epoch's ids
    declared: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class EpochTrace:
    """One rank's epoch: the ids in yield order, cut into batches by ``batch_sizes``."""

    epoch: int
    ids: Sequence[Hashable]
    batch_sizes: Sequence[int]
    len_loader: int | None
    worker_ids: Sequence[int] | None = None  # per batch, the DataLoader worker that produced it
    digests: Sequence[int] | None = None  # per batch, a digest of its whole content (replica checks)
    work: Sequence[tuple[float, ...]] | None = None  # per batch, each document's work (None: not measured)
    supervised: Sequence[int] | None = None  # per batch, tokens with a label (None: no labels)
    packing: PackingTally | None = None  # the epoch's packed batches (None: no position_ids)
    sources: SourceCodes | None = None  # each sample's mixture source (None: batches carry none)
    draws: tuple[FetchDraws, ...] | None = None  # random streams each fetch consumed (None: not watched)

    @property
    def num_batches(self) -> int:
        return len(self.batch_sizes)

    def batches(self) -> list[tuple[Hashable, ...]]:
        out: list[tuple[Hashable, ...]] = []
        start = 0
        for size in self.batch_sizes:
            out.append(tuple(self.ids[start : start + size]))
            start += size
        return out


@dataclass(frozen=True)
class RankTrace:
    rank: int
    epochs: tuple[EpochTrace, ...]
    facts: LoaderFacts = field(default_factory=LoaderFacts)


@dataclass(frozen=True)
class RankFailure:
    """A rank that crashed, hung or was killed; ``stack`` is its traceback or its dumped stacks,
    ``output`` the last lines the rank printed (a script's rank: what its own prints said)."""

    rank: int
    kind: str  # "error" | "hang" | "overtime" (ran past --max-time) | "killed" | "secondary"
    message: str
    stack: str = ""
    progress: str = ""  # last known position, e.g. "epoch 0, batch 4, in all_reduce"
    output: str = ""


@dataclass(frozen=True)
class SimulatedShortcuts:
    """What ``--simulate`` computed directly in one run: torch's ``DistributedSampler`` shares for
    ``direct`` rank-epochs, ``verified`` of them also run through the real sampler (identical); ``arrays``
    rank-epochs read as one array each (at scale), their arithmetic checked against the real sampler on
    ``probes`` small datasets of the same kind; or, with ``redone``, the direct computation that differed
    from the real one (every rank was run again)."""

    direct: int = 0
    verified: int = 0
    redone: str = ""
    arrays: int = 0
    probes: int = 0


@dataclass(frozen=True)
class RunTrace:
    """Every rank of one run at one world size; ``failures`` is non-empty when the run broke.

    ``bad_input``: every rank failed on bad input (the loader file's fault: an import error, no
    factory), said once; ``shortcuts``: what ``--simulate`` computed directly (None: nothing)."""

    world_size: int
    backend: str
    ranks: tuple[RankTrace, ...]
    id_source: IdSource = "index"
    set_epoch: bool = True
    failures: tuple[RankFailure, ...] = ()
    skipped: str = ""  # non-empty: this world size was not run, and why
    bad_input: str = ""
    shortcuts: SimulatedShortcuts | None = None
    # non-empty: only these ranks were recorded (a determinism rerun of a huge simulated world samples)
    rank_sample: tuple[int, ...] = ()
    # a rank created shared memory by a name of its own (machine-wide): this loader's groups never overlap
    named_memory: bool = False

    @property
    def ok(self) -> bool:
        return not self.failures and not self.skipped

    @property
    def num_epochs(self) -> int:
        return min((len(r.epochs) for r in self.ranks), default=0)

    def epoch(self, epoch: int) -> list[EpochTrace]:
        """The given epoch of every rank, in rank order."""
        return [r.epochs[epoch] for r in self.ranks]


@dataclass(frozen=True)
class ScriptLoader:
    """One loader of a training script, as one rank recorded it (``ddpcheck run``/``ddpcheck.record``).

    ``name`` is the line of the user's code that built it (``train.py:42``, relative to the script's
    folder), ``variable`` what that line assigned it to, as the reports call it; ``set_epoch`` says whether
    the script's loop called ``set_epoch`` before every epoch after the first (True where the loader has
    nothing to call it on); ``handed`` counts the batches the script itself received."""

    name: str
    trace: RankTrace
    id_source: IdSource = "index"
    set_epoch: bool = True
    handed: int = 0
    variable: str = ""  # the variable the user's line assigned the loader to (``train_loader``); "" none


@dataclass(frozen=True)
class SourceTrace:
    """What one rank received from a batch function named with ``--batches`` (no DataLoader: nanoGPT's
    ``get_batch``, a generator, a ``next_batch`` method; :mod:`ddpcheck.checker.batch_source`): the rows
    of each call's inputs, calls made with gradients on only (an evaluation's are counted apart).

    ``kind`` "tokens": integer rows kept as tokens (``lengths`` per row, ``tokens`` concatenated), judged
    by content in units aligned across world sizes; "rows": any other rows, by a digest of each
    (``digests``); "mixed": calls of both kinds (not judged). ``follows`` per row: the token after it where
    the batch carries targets shifted by one (``y = x[1:]``), -1 where unknown: a single process whose rows
    follow one another reads a stream in order."""

    name: str  # "get_batch", "DataLoaderLite.next_batch", "distributed_data_generator#2"
    kind: str
    calls: Sequence[int]  # rows per call, in call order
    lengths: Sequence[int] = ()
    tokens: Sequence[int] = ()
    follows: Sequence[int] = ()
    digests: Sequence[int] = ()
    untrained: int = 0  # calls made with gradients off (evaluation): not recorded
    shape: str = ""  # the first call's inputs: "int64 4 x 32"
    window: int = 0  # calls per window (the checks' epochs)


# --- what the training step did with the data (issue 35): recorded by the rank side's step watcher,
# judged by the step checks. Plain data, like everything above.


@dataclass(frozen=True)
class Draw:
    """One random draw, or one random stream a fetch consumed.

    ``state`` fingerprints the generator's state just before the draw (64 bits): two draws from equal
    states give equal numbers, whatever their shapes, so equal fingerprints on two data-parallel ranks
    mean the ranks draw the same noise. ``stream``: ``torch`` (the default CPU generator), ``cuda``,
    ``numpy`` (the legacy global state), ``random`` (the stdlib), ``generator`` (a ``torch.Generator``
    object the call was given)."""

    stream: str
    state: int
    site: str = ""  # "train.py:57": the user's line that drew ("" unknown)
    call: str = ""  # "torch.randn_like"
    shape: tuple[int, ...] = ()
    before_batch: bool = False  # a loop draw made before its micro-step's first batch was handed over


@dataclass(frozen=True)
class FetchDraws:
    """The random streams one fetch consumed (a batch built by a DataLoader worker, or by the main
    process without workers): one :class:`Draw` per stream, with its state at the fetch's start."""

    batch: int  # the batch's position in its epoch, in delivery order
    worker: int | None  # None: built in the main process
    draws: tuple[Draw, ...]


@dataclass(frozen=True)
class TokenRows:
    """A 2-D integer tensor as plain data: ``rows`` x ``width`` values, row-major (an ``array('q')``)."""

    rows: int
    width: int
    values: Sequence[int]


@dataclass(frozen=True)
class ModelFeed:
    """One micro-step's token tensors, by key (``input_ids``, ``position_ids``, ``labels``): ``handed`` those
    of the batch the loop was handed, ``fed`` those the model's outermost forward was given (a context-
    parallel rank's slices of the sequences)."""

    handed: tuple[tuple[str, TokenRows], ...] = ()
    fed: tuple[tuple[str, TokenRows], ...] = ()


@dataclass(frozen=True)
class MicroStep:
    """One backward pass, and what the loop did since the previous one.

    ``batches`` are positions in ``loader``'s epoch ``epoch`` of the batches the script received in
    this micro-step; ``samples`` the samples they held (-1 unknown); ``supervised`` their labels other
    than the ignore index (None: the batches carry no labels); ``forwards`` the forward calls of each
    submodule that holds parameters, by qualified name; ``draws`` the random draws the loop made
    outside any module's forward (noise, timesteps, masks); ``loss`` the value backward started from."""

    loader: str = ""
    epoch: int = 0
    batches: tuple[int, ...] = ()
    samples: int = -1
    supervised: int | None = None
    forwards: tuple[tuple[str, int], ...] = ()
    draws: tuple[Draw, ...] = ()
    loss: float | None = None  # the scalar given to backward, in compared windows (None: not kept)
    feed: ModelFeed | None = None  # the tokens handed and fed to the model, in compared windows


@dataclass(frozen=True)
class OptimizerStep:
    """One ``optimizer.step()`` and the micro-steps (backward passes) it applied.

    ``grad`` holds the gradient the step applied, before clipping, as float32 values of the
    optimizer's parameters flattened in their param-group order (``StepTrace.kept`` coordinates of
    each step: all of them, or an evenly spaced sample for large models); None when not kept. Where the
    parameters are sharded (DTensors), ``held`` is a packed bitmap (numpy ``packbits`` order), one bit per
    kept value: the rank's shard holds it (the others are 0 here and held by other ranks); None: all."""

    index: int
    micro: tuple[MicroStep, ...] = ()
    grad: Sequence[float] | None = None
    grad_norm: float | None = None  # L2 norm of the whole gradient (every coordinate; None: a shard)
    not_comparable: str = ""  # why this step cannot be compared with a replay ("": it can; see StepTrace)
    held: bytes | None = None


@dataclass(frozen=True)
class StepTrace:
    """What one rank's training step did: every optimizer step it ran while recorded.

    ``open_micro``: backward passes after the last optimizer step (a window never stepped);
    ``parameters``: how many values the optimizer steps; ``kept``: gradient coordinates kept per step;
    ``grad_dtype``: the parameters' dtype (the tolerance depends on it); ``per_rank_norm``: modules
    that normalise over the rank's batch (BatchNorm without SyncBatchNorm); ``dropout_off``: dropout
    was switched off while steps were compared; ``replay``: a reference replay of another launch ("":
    a run of its own); ``twice``: a replay fed every rank's batch twice (the loss probe);
    ``loss_scale`` (a replay's): how the loss answers a micro-batch given twice,
    ``mean`` (the same gradient), ``sum`` (twice the gradient: a sum over a fixed normaliser, which
    one process fed every rank's batch scales by the world size), "" not probed; ``compute_dtype``: the
    autocast dtype the compared steps ran under ("" none): float32 parameters under bf16 autocast carry
    bf16's noise, and the tolerance follows the coarser of the two."""

    steps: tuple[OptimizerStep, ...] = ()
    open_micro: tuple[MicroStep, ...] = ()
    parameters: int = 0
    kept: int = 0
    grad_dtype: str = ""
    per_rank_norm: tuple[str, ...] = ()
    dropout_off: bool = False
    replay: str = ""
    notes: tuple[str, ...] = ()
    loss_scale: str = ""
    twice: bool = False
    compute_dtype: str = ""
    replay_ranks: tuple[int, ...] | None = None  # a replay's: the recorded ranks it joined (None: every one)


SCRIPT_TRACE_VERSION = 3  # 3: integer ids in .npy files beside the trace (ddpcheck.tracefile)


@dataclass(frozen=True)
class ScriptRankTrace:
    """What one rank of a training script saw: every loader it iterated, and how the script ended.

    ``status``: ``ok`` (ended, or stopped after the epochs asked for: ``stopped``), ``error`` (raised:
    ``message`` is one line, ``stack`` its traceback) or ``exit`` (exited with a non-zero code).
    ``joined_group``: whether it ran in a torch.distributed process group; ``fallback`` names a
    framework that ran non-distributed although the launch had several processes."""

    rank: int
    world_size: int
    loaders: tuple[ScriptLoader, ...]
    status: str = "ok"
    message: str = ""
    stack: str = ""
    notes: tuple[str, ...] = ()
    joined_group: bool = False
    stopped: bool = False
    fallback: str = ""
    steps: StepTrace | None = None  # what the training step did (None: not recorded)
    frameworks: tuple[str, ...] = ()  # training frameworks the script imported: "lightning", "accelerate"...
    # no DataLoader iterated before the model's first call: that call's line, and the script's function
    # its inputs came from as --batches takes it ("" unknown); see ddpcheck.checker.batch_hint
    first_model_call: str = ""
    inputs_from: str = ""
    sources: tuple[SourceTrace, ...] = ()  # batch functions named with --batches
    # the label value its supervised counts left out (--ignore-index; None: recorded before it was
    # recorded, with cross_entropy's default); ``ddpcheck judge`` judges with it
    ignore_index: int | None = None
    evaluation: EvalRecord | None = None  # the script's evaluations (None: not recorded)
    version: int = SCRIPT_TRACE_VERSION
