"""Running a loader's epochs as a training loop does, and recording each as an
:class:`~ddpcheck.trace.EpochTrace`.

:class:`Stream` runs one opened loader epoch by epoch (a fresh iterator each), or in windows of
``steps`` batches of one continuing iterator (what iteration-based trainers do; a new pass starts when
it ends). Guards stop an epoch that cannot end.
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ddpcheck.checker.batches import CONTENT_STEPS, IdBatches, SamplerBatches, head_digests
from ddpcheck.checker.face import OpenedLoader
from ddpcheck.checker.facts import len_or_none, restored_rng
from ddpcheck.checker.identity import batch_digest
from ddpcheck.checker.loaderfile import BadLoaderFile
from ddpcheck.checker.mixture import SourceReader
from ddpcheck.checker.recipe import RecordOptions
from ddpcheck.checker.work import Measured, WorkMeter, add_tally, looks_like_tokens, pad_token_of
from ddpcheck.launch.beats import report_progress
from ddpcheck.trace import EpochTrace, IdArray, IdBuffer, PackingTally, SourceCodes

ENDLESS_FACTOR = 4
ENDLESS_PROBE = 20_000
Batch = tuple[list[Hashable], "int | None", "int | None", "Measured | None"]  # ids, worker, digest, work


def record_indices(loader: Any, epoch: int) -> EpochTrace:
    """The index stream of the loader's (batch) sampler: who sees what, without loading data."""
    len_loader = len_or_none(loader)
    ids = IdBuffer()
    sizes: list[int] = []
    source = getattr(loader, "batch_sampler", None)
    if source is None:  # never `or`: truth-testing a sampler calls its __len__, which may not exist
        source = getattr(loader, "sampler", None)
    guard = EndlessGuard(len_or_none(getattr(loader, "dataset", None)), False, _samples(source, loader))
    for batch, _ in SamplerBatches(loader):
        ids.extend(batch)
        sizes.append(len(batch))
        if len(ids) >= guard.due:
            guard.check(ids)
    return EpochTrace(epoch=epoch, ids=ids.ids(), batch_sizes=sizes, len_loader=len_loader)


def _samples(source: Any, loader: Any) -> int | None:
    """How many samples an epoch holds by what the loader says of itself: its sampler's length, or its
    batches times their size (None: it does not say)."""
    sampler = getattr(loader, "sampler", None)
    if source is sampler:
        return len_or_none(sampler)
    batches, size = (
        len_or_none(source),
        getattr(loader, "batch_size", None) or getattr(source, "batch_size", None),
    )
    return batches * size if batches is not None and isinstance(size, int) and size > 0 else None


class EndlessGuard:
    """Stops an epoch that cannot end, judged by what the loader says of itself: more than several
    times its dataset (or the epoch its sampler announces), or, where it says nothing, several times
    as many samples as distinct ones. A never-repeating stream without a length runs into the deadline.
    A window (``--steps``) ends after its batches, whatever the loader says.

    ``subject`` names the loader in the message; ``probe_distinct`` False leaves out the probe of
    distinct ids (a training script's recorder: the more permissive rule, as scripts had before the
    guard was shared)."""

    def __init__(
        self,
        dataset_len: int | None,
        windowed: bool,
        expected: int | None = None,
        *,
        subject: str = "the loader",
        probe_distinct: bool = True,
    ) -> None:
        self.dataset_len = dataset_len
        self.windowed = windowed
        self.subject = subject
        self.probe_distinct = probe_distinct
        known = [n for n in (dataset_len, expected) if n is not None]
        self.limit = ENDLESS_FACTOR * max(known) + ENDLESS_PROBE if known else None
        self.next_probe = ENDLESS_PROBE
        self.due = 0  # the length below which :meth:`check` cannot raise or probe
        self._update_due()

    def _update_due(self) -> None:
        never = 1 << 62
        if self.windowed:
            self.due = never
            return
        probe = self.next_probe if self.probe_distinct else never
        self.due = probe if self.limit is None else min(probe, self.limit + 1)

    def check(self, ids: IdBuffer) -> None:
        n = len(ids)
        if self.windowed:
            return
        if self.limit is not None and n > self.limit:
            epoch = (self.limit - ENDLESS_PROBE) // ENDLESS_FACTOR
            said = (
                f"its dataset's {epoch:,}"
                if epoch == self.dataset_len
                else f"the {epoch:,} samples its sampler says an epoch holds"
            )
            raise BadLoaderFile(
                f"{self.subject} looks endless: one epoch passed {n:,} samples, more than {ENDLESS_FACTOR}x "
                f"{said}; check it in windows with --steps N"
            )
        if self.probe_distinct and n >= self.next_probe:
            self.next_probe = n * 2
            self._update_due()
            distinct = ids.distinct()
            if n > ENDLESS_FACTOR * distinct:
                raise BadLoaderFile(
                    f"{self.subject} looks endless: one epoch passed {n:,} samples but only {distinct:,} "
                    "distinct ones; check it in windows with --steps N"
                )


@dataclass
class EpochBuilder:
    """What one epoch (or window) recorded so far, batch by batch."""

    ids: IdBuffer = field(default_factory=IdBuffer)
    sizes: list[int] = field(default_factory=list)
    workers: list[int | None] = field(default_factory=list)
    digests: list[int] = field(default_factory=list)
    work: list[tuple[float, ...]] = field(default_factory=list)
    supervised: list[int] = field(default_factory=list)
    packing: PackingTally | None = None
    total: int = 0

    @property
    def count(self) -> int:
        return len(self.sizes)

    def add(self, batch: Batch) -> None:
        batch_ids, worker, digest, measured = batch
        if digest is not None:
            self.digests.append(digest)
        if measured is not None:
            self.work.append(measured.units)
            if measured.supervised is not None:
                self.supervised.append(measured.supervised)
            if measured.packing is not None:
                self.packing = add_tally(self.packing, measured.packing, self.count)
        self.ids.extend(batch_ids)
        size = len(batch_ids)
        self.sizes.append(size)
        self.workers.append(worker)
        self.total += size

    def trace(
        self, epoch: int, len_loader: int | None, digests: array[int] | None, sources: SourceCodes | None
    ) -> EpochTrace:
        count = self.count
        workers = self.workers
        known_workers = all(w is not None for w in workers) and bool(workers)
        return EpochTrace(
            epoch=epoch,
            ids=self.ids.ids(),
            batch_sizes=self.sizes,
            len_loader=len_loader,
            worker_ids=[w for w in workers if w is not None] if known_workers else None,
            digests=digests,
            work=self.work if self.work and len(self.work) == count else None,
            supervised=self.supervised if self.supervised and len(self.supervised) == count else None,
            packing=self.packing,
            sources=sources,
        )


class Stream:
    """One rank's batches, epoch by epoch (a fresh iterator each), or in windows of ``steps`` batches
    of one continuing iterator (what iteration-based trainers do; a new pass starts when it ends).
    ``source`` says how samples were identified (the last pass that decided it)."""

    def __init__(
        self,
        opened: OpenedLoader,
        options: RecordOptions,
        by_sampler: bool,
        meter: WorkMeter | None = None,
        reader: SourceReader | None = None,
    ) -> None:
        self.opened, self.options, self.by_sampler = opened, options, by_sampler
        self.meter, self.reader = meter, reader
        self.source = "index"
        self.passes = 0
        self.head: list[int] | None = (
            None  # content of the epoch's first batches, when ids come from the sampler
        )
        self._pass: IdBatches | SamplerBatches | None = None
        self._iterator: Iterator[Batch] | None = None

    def _note_source(self) -> None:
        if self._pass is not None and self._pass.found is not None:
            self.source = self._pass.found

    def _open(self, epoch: int) -> Iterator[Batch]:
        self._note_source()
        opened = self.opened
        if self.by_sampler:
            indices = self._pass = opened.indices(epoch)
            if self.options.digest:
                self.head = head_digests(opened.loader, CONTENT_STEPS)
            return ((ids, worker, None, None) for ids, worker in indices)
        batches = self._pass = opened.batches(epoch)
        digest, meter, reader = self.options.digest, self.meter, self.reader
        return (
            (
                ids if reader is None else reader.tap(batch, ids),
                worker,
                batch_digest(batch) if digest else None,
                meter.measure(batch) if meter else None,
            )
            for batch, ids, worker in batches
        )

    def _next_pass(self) -> tuple[Iterator[Batch], Batch | None]:
        """A pass ended within a window: the next pass's iterator and first batch (None: it has none)."""
        self.passes += 1  # an iteration-based loop starts the next pass of the loader
        self._iterator = iterator = self._open(self.passes)
        return iterator, next(iterator, None)

    def record(self, epoch: int) -> EpochTrace:
        steps = self.options.steps
        if steps is None:
            iterator = self._open(epoch)
            whole = self._pass.whole() if isinstance(self._pass, SamplerBatches) else None
            if whole is not None:
                return self._whole_epoch(epoch, *whole)
        else:
            if self._iterator is None:
                self._iterator = self._open(0)
            iterator = self._iterator
        n = steps or len_or_none(self.opened.outer)  # once per epoch: len(loader) walks the samplers' __len__
        size = self.opened.facts.batch_size
        guard = EndlessGuard(
            self.opened.facts.dataset_len, steps is not None, n * size if n and size else None
        )
        built = EpochBuilder()
        add = built.add
        of = f"/{n}" if n else ""
        count = 0
        while steps is None or count < steps:
            report_progress(f"epoch {epoch}, batch {count + 1}{of if n and count < n else ''}")  # never 17/16
            try:
                batch = next(iterator)
            except StopIteration:
                if steps is None:
                    break
                iterator, found = self._next_pass()
                if found is None:
                    break
                batch = found
            add(batch)
            count += 1
            if built.total >= guard.due:  # the guard has nothing to say before then
                guard.check(built.ids)
        self._note_source()
        return self._finish(built, epoch)

    def _whole_epoch(self, epoch: int, ids: Any, sizes: array[int]) -> EpochTrace:
        """An epoch read as one array (a recognised sampler at scale under ``--simulate``): its ids held
        in the narrowest integer type, never as Python ints."""
        from ddpcheck.tracefile import narrowest, spill_array

        report_progress(f"epoch {epoch}: {len(ids):,} indices read as one array")
        lo, hi = (int(ids.min()), int(ids.max())) if len(ids) else (0, -1)
        narrow = ids.astype(narrowest(lo, hi), copy=False)
        stored = spill_array(narrow)  # on disk where the process spills (a simulated rank in a run)
        digests = array("q", self.head) if self.options.digest and self.head is not None else None
        return EpochTrace(
            epoch=epoch,
            ids=IdArray(narrow) if stored is None else stored,
            batch_sizes=sizes,
            len_loader=len_or_none(self.opened.outer),
            digests=digests,
        )

    def _finish(self, built: EpochBuilder, epoch: int) -> EpochTrace:
        len_loader = None if self.options.steps is not None else len_or_none(self.opened.outer)
        digests = None
        if self.options.digest:
            head = self.head if self.by_sampler and self.head is not None else built.digests
            digests = array("q", head)
        sources = self.reader.take() if self.reader is not None else None
        return built.trace(epoch, len_loader, digests, sources)


def work_meter(opened: OpenedLoader, options: RecordOptions) -> WorkMeter | None:
    """A meter when this loader's work is measurable: the file has ``batch_work`` or ``token_ids``, or a
    sample carries token fields (then the real loader is iterated: tokens live in the data)."""
    if not options.work:
        return None
    hook, tokens = opened.hooks.work, opened.hooks.tokens
    if hook is None and tokens is None and not _sample_has_tokens(opened.loader):
        return None
    return WorkMeter(hook=hook, token_hook=tokens, cost=options.work_cost, pad_id=pad_token_of(opened.loader))


def peek(dataset: Any) -> Any:
    """The first sample of a map-style dataset, read with every random state put back (None: none)."""
    with restored_rng():
        try:
            return dataset[0] if len(dataset) > 0 else None
        except Exception:
            return None


def _sample_has_tokens(loader: Any) -> bool:
    """One sample of a map-style dataset (read with every random state put back) carries token fields;
    an iterable dataset is iterated anyway and measured from its first batch."""
    dataset = getattr(loader, "dataset", None)
    if dataset is None or not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        return dataset is not None  # iterable: decided by the first batch
    with restored_rng():
        try:
            return len(dataset) > 0 and looks_like_tokens(dataset[0])
        except Exception:
            return False
