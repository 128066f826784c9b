"""The rank side of a script audit: run the user's training script as written, record its loaders.

Inside one rank started as torchrun starts a worker, :func:`record_script` installs watchers on
torch's ``DataLoader`` (every subclass included), runs the script as ``__main__`` with its own
``sys.argv``, and records every loader the script iterates: each ``iter()`` is an epoch, named by the
line of the user's code that built the loader (``train.py:42``). Costs stay the loader's, not the
model's: the script receives the first ``model_steps`` batches of an epoch; the rest of that epoch is
drained past it (recorded, never handed to the model), then the epoch ends for the script. When the
loader the script iterates most is about to start epoch ``epochs``, :class:`StopScript` (a
``BaseException``, so ``except Exception`` in the script cannot swallow it) ends the script at the
same point on every rank; its ``finally`` blocks run.

The result is a :class:`~ddpcheck.trace.ScriptRankTrace`: plain data, no user objects.
"""

from __future__ import annotations

import functools
import os
import runpy
import sys
import traceback
from array import array
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

from ddpcheck.checker.batches import is_collated
from ddpcheck.checker.face import OpenedLoader
from ddpcheck.checker.hooks import LoaderHooks
from ddpcheck.checker.identity import batch_digest, make_id_extractor
from ddpcheck.checker.index_log import indices_of, log_of
from ddpcheck.checker.loaderfile import BadLoaderFile
from ddpcheck.checker.subsets import base_indices, to_base
from ddpcheck.checker.work import WorkMeter, add_tally, looks_like_tokens
from ddpcheck.trace import EpochTrace, IdBuffer, LoaderFacts, RankTrace, ScriptLoader, ScriptRankTrace

ENDLESS_FACTOR = 4  # an epoch past this many times its dataset is an endless loader (use --steps)
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


@dataclass(frozen=True)
class ScriptRecordOptions:
    """How a rank runs the script. Plain data: it travels to the rank on its command line."""

    epochs: int = 2
    model_steps: int | None = 2  # batches per epoch the script's own loop receives; None: all of them
    steps: int | None = None  # windows of this many batches (endless loaders), instead of epochs
    hooks: str = ""  # a file with loader-file hooks (sample_ids, batch_work, token_ids)
    digest: bool = False  # digest every loaded batch's content (replicas of a mesh compare it)
    work: bool = True
    work_cost: str = "tokens"


class StopScript(BaseException):
    """Ends the script once its main loader has run the epochs asked for (not an error)."""


class RecorderError(BaseException):
    """The recorder cannot go on (an endless epoch, an unusable id): ends the script with this message.

    A ``BaseException``, so the script's own ``except Exception`` cannot swallow it and train on."""


# --- what code is the user's ------------------------------------------------------------------------

_LIBRARY_ROOTS: tuple[str, ...] = ()


def _library_roots() -> tuple[str, ...]:
    global _LIBRARY_ROOTS
    if not _LIBRARY_ROOTS:
        import sysconfig

        roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
        roots |= {p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages"))}
        roots.add(str(Path(__file__).resolve().parents[1]))  # ddpcheck itself
        _LIBRARY_ROOTS = tuple(sorted(os.path.realpath(r) + os.sep for r in roots))
    return _LIBRARY_ROOTS


def is_user_file(filename: str) -> bool:
    """A real file outside the standard library, the installed packages and ddpcheck."""
    if not filename or filename.startswith("<"):
        return False
    real = os.path.realpath(filename)
    return not real.startswith(_library_roots())


def shown_path(filename: str) -> str:
    """``train.py`` relative to the working directory where it lies below it, else as given."""
    real = os.path.realpath(filename)
    cwd = os.path.realpath(os.getcwd())
    return os.path.relpath(real, cwd) if real.startswith(cwd + os.sep) else real


def user_site(frame: FrameType | None) -> tuple[str, str]:
    """(``train.py:42`` of the innermost user frame, the library function between it and torch)."""
    via = ""
    while frame is not None:
        code = frame.f_code
        if is_user_file(code.co_filename):
            return f"{shown_path(code.co_filename)}:{frame.f_lineno}", via
        module = frame.f_globals.get("__name__", "")
        if not via and not str(module).startswith(("torch.", "ddpcheck.")):
            via = code.co_name
        frame = frame.f_back
    return "<unknown>", via


# --- one loader, as the script built and iterated it -------------------------------------------------


@dataclass
class _Loader:
    name: str
    order: int
    epochs: list[EpochTrace] = field(default_factory=list)
    facts: LoaderFacts | None = None
    id_source: str = "index"
    iterations: int = 0
    delivered: int = 0  # batches handed to the script over every epoch
    set_epoch_calls: int = 0  # set_epoch calls reaching this loader's sampling parts
    epochs_after_set: int = 0  # epochs after the first that began after a set_epoch call
    open: _Epoch | None = None
    indexed: bool = False  # some batch was identified by its dataset indices


class _Epoch:
    """One ``iter()`` of a recorded loader: hands the script ``model_steps`` batches, drains the rest."""

    def __init__(self, recorder: ScriptRecorder, record: _Loader, outer: Any, inner: Iterator[Any]) -> None:
        self.recorder, self.record, self.outer, self.inner = recorder, record, outer, inner
        self.ids = IdBuffer()
        self.sizes: list[int] = []
        self.workers: list[int | None] = []
        self.digests: list[int] = []
        self.work: list[tuple[float, ...]] = []
        self.supervised: list[int] = []
        self.packing: Any = None
        self.handed = 0  # batches handed to the script in this epoch (or window)
        self.done = False
        self.log = log_of(outer)
        self.log.clear()
        self.extract: Callable[[Any], list[Hashable]] | None = None
        self.meter: WorkMeter | None = None
        self.metered: bool | None = None  # decided on the first batch
        self.len_loader = _len_or_none(outer)
        self.base = base_indices(getattr(outer, "dataset", None))  # a Subset's positions as samples

    # the iterator protocol the script sees
    def __iter__(self) -> _Epoch:
        return self

    def __next__(self) -> Any:
        if self.done:
            raise StopIteration
        options = self.recorder.options
        window = options.steps
        if window is not None and len(self.sizes) >= window:
            self._close_window()
        if options.model_steps is not None and self.handed >= options.model_steps:
            self._drain()
            if window is not None and not self.done:  # an endless loader: the next window goes on
                return self.__next__()
            raise StopIteration
        try:
            batch = next(self.inner)
        except StopIteration:
            self.finish()
            raise
        self._add(batch)
        self.handed += 1
        self.record.delivered += 1
        return batch

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:  # frameworks reach into torch's iterator (_num_yielded)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    # recording
    def _add(self, batch: Any) -> None:
        try:
            self._add_batch(batch)
        except BadLoaderFile as exc:  # unhashable ids, a bad hook value: said as the recorder's error
            raise RecorderError(f"the loader built at {self.record.name}: {exc}") from None

    def _add_batch(self, batch: Any) -> None:
        ids, worker = self.log.ready.popleft() if self.log.ready else (None, None)
        facts = self.record.facts
        by_index = facts is not None and facts.dataset_kind == "map" and self.recorder.sample_ids is None
        if not (by_index and ids is not None):
            if self.extract is None:
                source, self.extract = make_id_extractor(
                    self.recorder.sample_ids, batch, is_collated(self.outer)
                )
                self.record.id_source = "mixed" if self.record.indexed else source
            ids = self.extract(batch)
        else:
            self.record.indexed = True
            ids = to_base(ids, self.base)
        self.ids.extend(ids)
        self.sizes.append(len(ids))
        self.workers.append(worker)
        options = self.recorder.options
        if options.digest:
            self.digests.append(batch_digest(batch))
        if self.metered is None:
            self.metered = options.work and (self.recorder.work_hooks is not None or looks_like_tokens(batch))
            if self.metered:
                work_hook, token_hook = self.recorder.work_hooks or (None, None)
                self.meter = WorkMeter(hook=work_hook, token_hook=token_hook, cost=options.work_cost)
        measured = self.meter.measure(batch) if self.meter is not None else None
        if measured is not None:
            self.work.append(measured.units)
            if measured.supervised is not None:
                self.supervised.append(measured.supervised)
            if measured.packing is not None:
                self.packing = add_tally(self.packing, measured.packing, len(self.sizes) - 1)
        self._guard()

    def _guard(self) -> None:
        n = len(self.ids)  # judged by the loader's own length, never a fixed count a real epoch exceeds
        dataset_len = self.record.facts.dataset_len if self.record.facts else None
        if self.recorder.options.steps is None and dataset_len and n > ENDLESS_FACTOR * dataset_len + 1000:
            raise RecorderError(
                f"the loader built at {self.record.name} looks endless: one epoch passed {n:,} samples, more "
                f"than {ENDLESS_FACTOR}x its dataset's {dataset_len:,}; check it in windows with --steps N"
            )

    def _drain(self) -> None:
        """The rest of the epoch (or window), recorded past the script: whole-stream checks see it all."""
        if self._drain_indices():
            self.finish()
            return
        window = self.recorder.options.steps
        while window is None or len(self.sizes) < window:
            try:
                batch = next(self.inner)
            except StopIteration:
                self.finish()
                return
            self._add(batch)
        self._close_window()

    def _drain_indices(self) -> bool:
        """A map-style epoch's rest read from torch's own iterator without loading any data: the indices
        its workers were sent and have not delivered, then what its (batch) sampler has left. Only for
        torch's two iterator classes (others may change the stream) and when nothing needs the data
        (no sample_ids hook, no token work, no windows). False: the rest must be loaded."""
        from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter, _SingleProcessDataLoaderIter

        it: Any = self.inner
        facts = self.record.facts
        kind = type(it)
        if kind not in (_SingleProcessDataLoaderIter, _MultiProcessingDataLoaderIter):
            return False
        if facts is None or facts.dataset_kind != "map" or self.recorder.sample_ids is not None:
            return False
        if self.meter is not None or self.recorder.options.steps is not None:
            return False
        sent = getattr(it, "_ddpcheck_sent", None)
        if sent is None or getattr(it, "_ddpcheck_log", None) is not self.log:
            return False
        pending: list[tuple[Any, int | None]] = []
        worker_of: Callable[[], int | None] = lambda: None  # noqa: E731
        if kind is _MultiProcessingDataLoaderIter:
            if not getattr(it, "_in_order", True):
                return False  # delivered out of order: which tasks are left is not a range
            base = it._ddpcheck_base
            for task in range(it._rcvd_idx, it._send_idx):
                info = it._task_info.get(task, ())
                pending.append((sent[base + task], info[0] if info else None))
            worker_of = _next_worker(it)
        for item, worker in (*pending, *((i, worker_of()) for i in it._sampler_iter)):
            ids = indices_of(item)
            if ids is None:
                continue
            ids = to_base(ids, self.base)
            self.ids.extend(ids)
            self.sizes.append(len(ids))
            self.workers.append(worker)
            self._guard()
        if kind is _MultiProcessingDataLoaderIter and not it._persistent_workers:
            it._shutdown_workers()  # the epoch is over for the script: its workers need not prefetch on
        return True

    def _close_window(self) -> None:
        """A window of an endless loader is over: it counts as an epoch; the script goes on with the
        same iterator (iteration-based trainers), and stops when the epochs asked for are recorded."""
        self._store()
        self.handed = 0
        if len(self.record.epochs) >= self.recorder.options.epochs:
            self.done = True
            self.recorder.stop_script(self.record)

    def drain_rest(self) -> None:
        """An epoch the script left unfinished: record its rest, then close it."""
        try:
            self._drain()
        finally:
            self.finish()

    def finish(self) -> None:
        if self.done:
            return
        self.done = True
        self._store()
        if self.record.open is self:
            self.record.open = None

    def _store(self) -> None:
        known = bool(self.workers) and all(w is not None for w in self.workers)
        windowed = self.recorder.options.steps is not None
        trace = EpochTrace(
            epoch=len(self.record.epochs),
            ids=self.ids.ids(),
            batch_sizes=self.sizes,
            len_loader=None if windowed else self.len_loader,
            worker_ids=[w for w in self.workers if w is not None] if known else None,
            digests=array("q", self.digests) if self.recorder.options.digest else None,
            work=self.work if self.work and len(self.work) == len(self.sizes) else None,
            supervised=self.supervised
            if self.supervised and len(self.supervised) == len(self.sizes)
            else None,
            packing=self.packing,
        )
        self.record.epochs.append(trace)
        self.ids = IdBuffer()
        self.sizes, self.workers, self.digests, self.work, self.supervised = [], [], [], [], []
        self.packing = None


def _next_worker(it: Any) -> Callable[[], int | None]:
    """The worker torch's multiprocessing iterator would send its next task to: round robin over its
    active workers (its own cycle, which it builds anew at every epoch's reset, so taking from it here
    changes nothing that comes later)."""

    def next_worker() -> int | None:
        for _ in range(it._num_workers):
            worker = next(it._worker_queue_idx_cycle)
            if it._workers_status[worker]:
                return int(worker)
        return None

    return next_worker


def _len_or_none(obj: Any) -> int | None:
    try:
        return len(obj)
    except Exception:
        return None


# --- the recorder: watchers on torch's DataLoader -----------------------------------------------------

_ITER_ATTR = "_ddpcheck_original_iter"
_NAME_ATTR = "_ddpcheck_loader_name"


class ScriptRecorder:
    """Watches every DataLoader of one rank's script. One per process (:data:`ACTIVE`)."""

    def __init__(self, options: ScriptRecordOptions, hooks: ModuleType | None = None) -> None:
        self.options = options
        self.loaders: dict[str, _Loader] = {}
        self.by_dataset: dict[int, str] = {}
        self.keep: list[Any] = []  # datasets named so far (their ids must not be reused)
        self.site_counts: dict[str, list[int]] = {}
        self.notes: list[str] = []
        self.stopped = False
        self.joined: bool | None = None  # in a process group when the first loader was iterated
        self.position: tuple[int, int] | None = None  # (rank, world size) then
        self.hooks = LoaderHooks.of(hooks)  # the same hooks an opened loader file's loader has
        self.sample_ids = self.hooks.sample_ids
        work, tokens = self.hooks.work, self.hooks.tokens
        self.work_hooks: tuple[Any, Any] | None = (work, tokens) if (work or tokens) else None

    # naming
    def name_for(self, loader: Any, frame: FrameType | None) -> str:
        dataset = getattr(loader, "dataset", None)
        if dataset is not None and id(dataset) in self.by_dataset:
            return self.by_dataset[id(dataset)]  # re-created or wrapped: the loader the user built
        site, via = user_site(frame)
        seen = self.site_counts.setdefault(site, [])
        name = site if not seen else f"{site}#{len(seen) + 1}"
        if via and site == "<unknown>":
            name = f"{via}#{len(seen) + 1}" if seen else via
        seen.append(id(dataset))
        if dataset is not None:
            self.by_dataset[id(dataset)] = name
            self.keep.append(dataset)
        return name

    # iteration
    def open_epoch(self, outer: Any, inner: Iterator[Any]) -> Iterator[Any]:
        name = getattr(outer, _NAME_ATTR, None) or self.name_for(outer, sys._getframe(2))
        record = self.loaders.get(name)
        if record is None:
            record = self.loaders[name] = _Loader(name=name, order=len(self.loaders))
        if record.open is not None:  # the previous iter() was abandoned: its epoch is drained now
            previous, record.open = record.open, None
            if not previous.done:
                previous.drain_rest()
        if self.joined is None:
            self.joined = _in_group()
            self.position = _position()
        if self._should_stop(record):
            self.stop_script(record)
        if record.facts is None:
            record.facts = _facts(OpenedLoader.wrap(outer, self.hooks, position=self.position))
            _mark_parts(outer, name)
        if record.iterations > 0 and record.set_epoch_calls > 0:
            record.epochs_after_set += 1
        record.set_epoch_calls = 0
        record.iterations += 1
        epoch = _Epoch(self, record, outer, inner)
        record.open = epoch
        return epoch

    def _should_stop(self, record: _Loader) -> bool:
        """The loader the script iterates most (most iter() calls, then most batches handed to the
        script, then the first iterated) is about to start the epoch past those asked for."""
        if len(record.epochs) < self.options.epochs:
            return False
        main = max(self.loaders.values(), key=lambda r: (r.iterations, r.delivered, -r.order))
        return main is record

    def stop_script(self, record: _Loader) -> None:
        self.stopped = True
        raise StopScript(f"{record.name}: {self.options.epochs} epochs recorded")

    def set_epoch_seen(self, loader_name: str) -> None:
        record = self.loaders.get(loader_name)
        if record is not None:
            record.set_epoch_calls += 1

    def finish(self) -> None:
        """Drain what the script left open (an abandoned iterator still holds its epoch's rest)."""
        for record in self.loaders.values():
            epoch = record.open
            if epoch is not None and not epoch.done:
                epoch.drain_rest()

    def traces(self) -> tuple[ScriptLoader, ...]:
        out = []
        for record in sorted(self.loaders.values(), key=lambda r: r.order):
            if not record.epochs:
                continue
            facts = replace(
                record.facts or LoaderFacts(),
                recorded="loader",
                steps=self.options.steps,
            )
            rank = self.position[0] if self.position is not None else _position()[0]
            trace = RankTrace(rank=rank, epochs=tuple(record.epochs), facts=facts)
            set_epoch = not facts.has_set_epoch or record.epochs_after_set >= len(record.epochs) - 1
            out.append(ScriptLoader(record.name, trace, record.id_source, set_epoch, record.delivered))
        return tuple(out)


def _facts(opened: OpenedLoader) -> LoaderFacts:
    try:
        return opened.facts
    except Exception:  # a loader that trains fine must never crash the recorder
        return LoaderFacts(dataset_kind="iterable")


def _in_group() -> bool:
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_initialized())


RANK_VARIABLES = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
WORLD_VARIABLES = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def _position() -> tuple[int, int]:
    """(rank, world size): the process group's when there is one, else the launcher's variables
    (torchrun's, SLURM's, Open MPI's, PMI's), else (0, 1)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    rank = next((os.environ[v] for v in RANK_VARIABLES if os.environ.get(v, "").isdigit()), "0")
    world = next((os.environ[v] for v in WORLD_VARIABLES if os.environ.get(v, "").isdigit()), "1")
    return int(rank), int(world)


ACTIVE: ScriptRecorder | None = None
_installed = False


def install() -> None:
    """Wrap ``DataLoader.__init__`` (name the loader, give it an index log before its first iterator)
    and ``__iter__`` of DataLoader and of every subclass that overrides it (when an instance is
    made). An ``__iter__`` called from a DataLoader's own method (``super().__iter__()``, timm's
    iterator built in ``__init__``) is the loader's inner business and is not recorded again."""
    global _installed
    if _installed:
        return
    from torch.utils.data import DataLoader

    original_init = DataLoader.__init__

    # wraps: the original's signature (inspect follows __wrapped__). Lightning re-creates a loader from
    # the arguments its __init__ was given, matched by name against inspect.signature(__init__);
    # behind a bare (*args, **kwargs) a positional dataset is lost ("no attribute '__dataset'").
    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        log_of(self)  # before the original: an iterator the constructor starts logs too
        original_init(self, *args, **kwargs)
        recorder = ACTIVE
        if recorder is not None:
            _wrap_iter(type(self))
            caller = sys._getframe(1)
            while caller.f_back is not None and caller.f_locals.get("self") is self:
                caller = caller.f_back  # a subclass's own __init__ (super().__init__): its caller built it
            name = recorder.name_for(self, caller)
            object.__setattr__(self, _NAME_ATTR, name)
            _mark_parts(self, name)
            _watch_dispatcher(sys._getframe(1).f_locals.get("self"))

    DataLoader.__init__ = __init__  # type: ignore[method-assign]
    _wrap_iter(DataLoader)
    _watch_set_epoch()
    _installed = True


def _wrap_iter(cls: type) -> None:
    from torch.utils.data import DataLoader

    for klass in cls.__mro__:
        if not (isinstance(klass, type) and issubclass(klass, DataLoader)):
            continue
        _wrap_own_iter(klass)


def _wrap_own_iter(klass: type) -> None:
    """Record the epochs of ``klass.__iter__`` where the class defines one (once)."""
    own = klass.__dict__.get("__iter__")
    if own is not None and getattr(own, _ITER_ATTR, None) is None:
        klass.__iter__ = _iter_wrapper(own)  # type: ignore[method-assign,attr-defined]


DISPATCHERS = ("accelerate.data_loader.DataLoaderDispatcher",)


def _watch_dispatcher(owner: Any) -> None:
    """Record a dispatching adapter where the model meets it. Accelerate's ``DataLoaderDispatcher``
    (its default for an ``IterableDataset``) iterates the DataLoader it builds on rank 0 alone and
    hands every rank a slice of each batch; the DataLoader's own stream is no rank's data. Adapters
    that pass their DataLoader's batches through (``DataLoaderShard``) stay recorded at the DataLoader,
    by its indices."""
    kind = type(owner)
    if owner is None or f"{kind.__module__}.{kind.__qualname__}" not in DISPATCHERS:
        return
    _wrap_own_iter(kind)


def _recorded_outside(inside: Any) -> bool:
    """``inside`` (the object whose method called ``__iter__``) is a loader recorded itself: what it
    iterates is its inner business."""
    from torch.utils.data import DataLoader

    if inside is None:
        return False
    kind = type(inside)
    wrapped = getattr(kind.__dict__.get("__iter__"), _ITER_ATTR, None) is not None
    return issubclass(kind, DataLoader) or wrapped


def _iter_wrapper(original: Callable[[Any], Iterator[Any]]) -> Callable[[Any], Iterator[Any]]:
    def __iter__(self: Any) -> Iterator[Any]:
        recorder = ACTIVE
        caller = sys._getframe(1)
        if recorder is None or _recorded_outside(caller.f_locals.get("self")):
            return original(self)
        return recorder.open_epoch(self, original(self))

    setattr(__iter__, _ITER_ATTR, original)
    __iter__.__doc__ = original.__doc__
    return __iter__


def _watch_set_epoch() -> None:
    """Count ``set_epoch`` calls that reach a recorded loader's sampler, batch sampler or dataset, so
    a cause can say the loop never called it (torch's samplers; other classes when a loader opens)."""
    from torch.utils.data import DistributedSampler

    _spy_class(DistributedSampler)


_SPIED_ATTR = "_ddpcheck_set_epoch_spy"


def _spy_class(cls: type) -> None:
    original = cls.__dict__.get("set_epoch")
    if original is None or getattr(original, _SPIED_ATTR, False):
        return

    def set_epoch(self: Any, epoch: int, *args: Any, **kwargs: Any) -> Any:
        recorder = ACTIVE
        if recorder is not None:
            for name in getattr(self, "_ddpcheck_loaders", ()):
                recorder.set_epoch_seen(name)
        return original(self, epoch, *args, **kwargs)

    setattr(set_epoch, _SPIED_ATTR, True)
    cls.set_epoch = set_epoch  # type: ignore[attr-defined]


def _mark_parts(loader: Any, name: str) -> None:
    """Tag the loader's sampling parts with its name, so their set_epoch calls are counted for it."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    parts = (
        loader,
        getattr(loader, "sampler", None),
        batch_sampler,
        getattr(batch_sampler, "sampler", None),
        getattr(batch_sampler, "batch_sampler", None),
        getattr(loader, "dataset", None),
    )
    for part in parts:
        if part is None or not callable(getattr(part, "set_epoch", None)):
            continue
        _spy_class(type(part))
        names = getattr(part, "_ddpcheck_loaders", ())
        if name not in names:
            try:
                object.__setattr__(part, "_ddpcheck_loaders", (*names, name))
            except (AttributeError, TypeError):
                pass


# --- running the script -------------------------------------------------------------------------------

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


def user_line(exc: BaseException) -> str:
    """``train.py:17`` and its source line: the innermost frame of the user's code in the traceback."""
    found = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        if is_user_file(frame.filename):
            found = f"{shown_path(frame.filename)}:{frame.lineno}" + (
                f" ({frame.line.strip()})" if frame.line else ""
            )
    return found


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


@dataclass
class _Outcome:
    status: str = "ok"  # "ok" | "error" | "exit"
    message: str = ""
    stack: str = ""
    code: int = 0


def record_script(
    target: ScriptTarget, options: ScriptRecordOptions, hooks: ModuleType | None = None
) -> ScriptRankTrace:
    """Run the script in this rank and record its loaders (the entry point of ``ddpcheck.record``)."""
    global ACTIVE
    install()
    recorder = ScriptRecorder(options, hooks)
    notes: list[str] = []
    patched = _patch_cuda_choices(notes)
    _refuse_own_launch()
    ACTIVE = recorder
    outcome = _Outcome()
    try:
        run_target(target)
    except StopScript:
        pass
    except RecorderError as exc:
        outcome = _Outcome("error", str(exc), "", 3)
    except SystemExit as exc:
        code = exc.code
        if code not in (None, 0):
            outcome = _Outcome(
                "exit", f"the script exited with {code!r}", "", code if isinstance(code, int) else 1
            )
    except BaseException as exc:  # the script's own error: reported as it is, in one line
        outcome = _failure(exc)
    finally:
        ACTIVE = None
    try:
        recorder.finish()
    except StopScript:
        pass
    except RecorderError as exc:
        if outcome.status == "ok":
            outcome = _Outcome("error", str(exc), "", 3)
    except BaseException as exc:
        if outcome.status == "ok":
            outcome = _failure(exc)
    notes.extend(patched)
    joined = recorder.joined if recorder.joined is not None else _in_group() or _JOINED[0]
    rank, world_size = recorder.position if recorder.position is not None else _position()
    return ScriptRankTrace(
        rank=rank,
        world_size=world_size,
        loaders=recorder.traces(),
        status=outcome.status,
        message=outcome.message,
        stack=outcome.stack,
        notes=tuple(dict.fromkeys(notes)),
        joined_group=bool(joined),
        stopped=recorder.stopped,
        fallback=_accelerate_fallback(),
    )


def _script_stack(exc: BaseException) -> str:
    """The traceback from the script's own first frame on (ddpcheck's and runpy's frames left out)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not (filename.startswith("<frozen") or filename.startswith(_OWN_DIR)):
            break
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


_OWN_DIR = str(Path(__file__).resolve().parents[1])


def _failure(exc: BaseException) -> _Outcome:
    stack = _script_stack(exc)
    where = user_line(exc)
    if needs_cuda(exc):
        call = where or "the script"
        here = _no_gpu_text().replace("no GPU", "none")
        message = (
            f"{call}: {NEEDS_CUDA} and {here} ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); choose the device from "
            "torch.cuda.is_available(), or record it on GPUs: torchrun ... -m ddpcheck.record"
        )
        return _Outcome("error", message, stack, 3)
    first = str(exc).splitlines()[0] if str(exc) else ""
    prefix = f"{where}: " if where else ""
    return _Outcome("error", f"{prefix}{type(exc).__name__}: {first}".rstrip(": "), stack, 3)


_JOINED = [False]  # the script's init_process_group returned


def _patch_cuda_choices(notes: list[str]) -> list[str]:
    """On a machine without CUDA, run what asks for NCCL (and CUDA meshes) on gloo (CPU), as the
    issue of a CPU check requires, and say so; remember that a group was joined."""
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
    return said


OWN_LAUNCH = (
    "the script starts its own ranks with torch.multiprocessing.{name}; ddpcheck run starts them as "
    "torchrun does: call the training function once per process, with the rank and world size from "
    "torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK), then run ddpcheck run -- SCRIPT"
)


def _refuse_own_launch() -> None:
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


def _accelerate_fallback() -> str:
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
