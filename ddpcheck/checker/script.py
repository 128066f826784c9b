"""The rank side of a script audit: run the user's training script as written, record its loaders.

Inside one rank started as torchrun starts a worker, :func:`record_script` installs watchers on
torch's ``DataLoader`` (every subclass included; :mod:`ddpcheck.checker.watch`), runs the script as
``__main__`` with its own ``sys.argv`` (:mod:`ddpcheck.checker.script_env`), and records every loader
the script iterates: each ``iter()`` is an epoch, named by the line of the user's code that built the
loader (``train.py:42``; :mod:`ddpcheck.checker.frames`), except a peek: an iterator the script leaves
after at most :data:`PEEK_BATCHES` batches at one line while the same loader is iterated further at
another (the DDP tutorial's ``len(next(iter(loader))[0])`` before each epoch's loop) is no epoch, and a
note says so; a loop that leaves every epoch early at one line is still an epoch each time. Costs stay
the loader's, not the model's: the script receives the first ``model_steps`` batches of an epoch; the
rest of that epoch is drained past it (recorded, never handed to the model), then the epoch ends for
the script. When the loader the
script iterates most is about to start epoch ``epochs``, :class:`StopScript` (a ``BaseException``, so
``except Exception`` in the script cannot swallow it) ends the script at the same point on every rank;
its ``finally`` blocks run.

The result is a :class:`~ddpcheck.trace.ScriptRankTrace`: plain data, no user objects.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from types import FrameType, ModuleType
from typing import Any

from ddpcheck.checker.batch_hint import FirstInputs
from ddpcheck.checker.batch_source import BatchSources
from ddpcheck.checker.batches import BatchIds, is_collated
from ddpcheck.checker.evaluation import EvalEpoch, EvalOptions, Evaluations, watch_collectives
from ddpcheck.checker.face import OpenedLoader
from ddpcheck.checker.facts import len_or_none
from ddpcheck.checker.frames import assigned_name, user_site
from ddpcheck.checker.hooks import LoaderHooks
from ddpcheck.checker.identity import batch_digest
from ddpcheck.checker.index_log import dispatched, indices_of, log_of
from ddpcheck.checker.loaderfile import BadLoaderFile
from ddpcheck.checker.running import EndlessGuard, EpochBuilder
from ddpcheck.checker.script_env import (
    Outcome,
    RecorderError,
    ScriptTarget,
    accelerate_fallback,
    failure,
    in_group,
    joined_group,
    patch_cuda_choices,
    position,
    refuse_own_launch,
    run_target,
)
from ddpcheck.checker.step import active_watcher as step_watcher
from ddpcheck.checker.subsets import base_indices, to_base
from ddpcheck.checker.watch import drawn_at, install, mark_parts, watching
from ddpcheck.checker.work import Measured, WorkMeter, looks_like_tokens
from ddpcheck.eval_trace import EvalRecord
from ddpcheck.launch.beats import beat, report_progress
from ddpcheck.launch.userfiles import show_paths_from
from ddpcheck.options import IGNORE_INDEX
from ddpcheck.trace import EpochTrace, LoaderFacts, RankTrace, ScriptLoader, ScriptRankTrace


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
    ignore_index: int = IGNORE_INDEX  # the label value that supervises nothing (--ignore-index)
    batches: str = ""  # a batch function to record (--batches NAME); its windows are ``steps`` calls
    eval_rounds: int = 1  # evaluations handed whole and compared (ddpcheck.checker.evaluation); 0: none
    eval_save: str = ""  # where a single process saves the weights it evaluates
    eval_weights: str = ""  # the single process's launch whose weights this rank evaluates


DEFAULT_WINDOW = 8  # calls per window of a --batches function when no --steps is given
MAX_WINDOW_BATCHES = 256  # batches past model_steps an open accumulation window may still take
PEEK_BATCHES = 2  # an iterator left after at most this many batches, at another line, may be a peek
BATCH_WORDS = {0: "zero", 1: "one", 2: "two"}


class StopScript(BaseException):
    """Ends the script once its main loader has run the epochs asked for (not an error)."""


# --- one loader, as the script built and iterated it -------------------------------------------------


@dataclass
class LoaderRecord:
    """One loader of the script: its epochs so far and what the script did with it."""

    name: str
    order: int
    variable: str = ""  # what the user's line assigned it to (``train_loader``); "" none
    epochs: list[EpochTrace] = field(default_factory=list)
    facts: LoaderFacts | None = None
    id_source: str = "index"
    iterations: int = 0
    delivered: int = 0  # batches handed to the script over every epoch
    set_epoch_calls: int = 0  # set_epoch calls reaching this loader's sampling parts
    epochs_after_set: int = 0  # epochs after the first that began after a set_epoch call
    open: ScriptEpoch | None = None
    indexed: bool = False  # some batch was identified by its dataset indices
    peek_sites: set[str] = field(default_factory=set)  # lines whose short iterations were peeks
    work: str = ""  # what its batches' work was measured from (packed segments, tokens; "": not measured)


@dataclass(frozen=True)
class HeldPeek:
    """An iterator the script left after at most :data:`PEEK_BATCHES` batches, at another line than the
    ``iter()`` that followed: a peek if that iteration goes further, else an epoch before it."""

    trace: EpochTrace
    site: str
    asked: int
    handed: int


class ScriptEpoch:
    """One ``iter()`` of a recorded loader: hands the script ``model_steps`` batches, drains the rest."""

    def __init__(
        self,
        recorder: ScriptRecorder,
        record: LoaderRecord,
        outer: Any,
        inner: Iterator[Any],
        site: str = "",
        held: HeldPeek | None = None,
    ) -> None:
        self.recorder, self.record, self.outer, self.inner = recorder, record, outer, inner
        self.site, self.held = site, held  # the user's line of this iter(); the peek before it, if any
        self.built = EpochBuilder()
        self.handed = 0  # batches handed to the script in this epoch (or window)
        self.asked = 0  # next() calls of the script, the one answered by StopIteration included
        self.ended = False  # the script iterated until it was told the epoch ended (not left early)
        self.aside = False  # its last trace is kept in ``kept``, not stored: it may be a peek
        self.kept: EpochTrace | None = None
        self.done = False
        self.log = log_of(outer)
        self.log.clear()
        self.meter: WorkMeter | None = None
        self.metered: bool | None = None  # decided on the first batch
        self.len_loader = len_or_none(outer)
        self.base = base_indices(getattr(outer, "dataset", None))  # a Subset's positions as samples
        facts, hook = record.facts, recorder.sample_ids
        self.by_index = facts is not None and facts.dataset_kind == "map" and hook is None
        self.step = BatchIds(hook, is_collated(outer), self.base, indexed=record.indexed)
        # The guard loader files use, with the more permissive of the two rules scripts and loader files
        # had before it was shared (20,000 samples of slack past 4x the dataset, no probe of distinct ids).
        dataset_len = facts.dataset_len if facts is not None else None
        self.guard = EndlessGuard(
            dataset_len or None,
            recorder.options.steps is not None,
            subject=f"the loader built at {record.name}",
            probe_distinct=False,
        )
        self.evaluation: EvalEpoch | None = None  # decided as the script takes its first batch

    # the iterator protocol the script sees
    def __iter__(self) -> ScriptEpoch:
        return self

    def __next__(self) -> Any:
        if self.done:
            raise StopIteration
        self.asked += 1
        return self._next()

    def _next(self) -> Any:
        options = self.recorder.options
        window = options.steps
        if window is not None and self.built.count >= window:
            self._close_window()
        evaluation = self._evaluation()
        whole = evaluation is not None and evaluation.whole
        cut = options.model_steps is not None and self.handed >= options.model_steps
        if cut and not whole and not self._window_open():
            self.ended = True
            self._drain()
            if window is not None and not self.done:  # an endless loader: the next window goes on
                return self._next()
            raise StopIteration
        try:
            batch = next(self.inner)
        except StopIteration:
            self.ended = True
            if evaluation is not None and whole:
                evaluation.end()
            self.finish()
            raise
        self._add(batch)
        if evaluation is not None and self.handed == 0:
            evaluation.fetched()
        self.handed += 1
        if whole and evaluation is not None and self.handed == self.len_loader:  # its last batch (len())
            evaluation.end()
        if not cut:  # batches past the cut an evaluation is handed whole count nothing to the stop rule
            self.record.delivered += 1
        if evaluation is None and self.recorder.evaluations is not None:  # the epoch's last, cut after it
            self.recorder.evaluations.last_batch = self.handed == options.model_steps
        watcher = step_watcher()
        if watcher is None or (evaluation is not None and not evaluation.aborted):
            return batch
        position = self.built.count - 1
        return watcher.handed(
            self.record.name, len(self.record.epochs), position, batch, length=self.len_loader
        )

    def _evaluation(self) -> EvalEpoch | None:
        """This epoch's evaluation (None: it trains), decided as the script takes its first batch; a training
        batch closes the open evaluation round."""
        evaluations = self.recorder.evaluations
        if evaluations is None:
            return None
        if self.handed == 0 and self.evaluation is None and self.asked == 1:
            world_size = (self.recorder.position or position())[1]
            self.evaluation = evaluations.begin(self.record.name, len(self.record.epochs), world_size)
        elif self.evaluation is None or self.evaluation.aborted:
            evaluations.training(self.record.name)
        return self.evaluation

    def _window_open(self) -> bool:
        """The step watcher has an accumulation window open: the script receives batches past
        ``model_steps`` until its optimizer steps (compared steps are whole windows), up to
        :data:`MAX_WINDOW_BATCHES` more."""
        watcher = step_watcher()
        limit = (self.recorder.options.model_steps or 0) + MAX_WINDOW_BATCHES
        return watcher is not None and self.handed < limit and watcher.window_open()

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
        dispatched, worker = self.log.ready.popleft() if self.log.ready else (None, None)
        step, record = self.step, self.record
        ids = step.ids_of(batch, dispatched if self.by_index else None)
        record.indexed = step.indexed
        if step.by_data and step.found is not None:
            record.id_source = step.found
        digest = batch_digest(batch) if self.recorder.options.digest else None
        self.built.add((ids, worker, digest, self._measure(batch)))
        report_progress(f"{record.name}: epoch {len(record.epochs)}, batch {self.built.count}")
        self._guard()

    def _measure(self, batch: Any) -> Measured | None:
        """The batch's work, where the first batch showed it is measurable (None: not measured)."""
        if self.metered is None:
            recorder = self.recorder
            options = recorder.options
            self.metered = options.work and (recorder.work_hooks is not None or looks_like_tokens(batch))
            if self.metered:
                work_hook, token_hook = recorder.work_hooks or (None, None)
                self.meter = WorkMeter(
                    work_hook, token_hook, options.work_cost, ignore_index=options.ignore_index
                )
        if self.meter is None:
            return None
        measured = self.meter.measure(batch)
        if self.meter.source not in ("", "none"):
            self.record.work = self.meter.source  # the loader's facts say it, as a loader file's do
        return measured

    def _guard(self) -> None:
        ids = self.built.ids
        if len(ids) < self.guard.due:  # the guard has nothing to say before then
            return
        try:
            self.guard.check(ids)
        except BadLoaderFile as exc:
            raise RecorderError(str(exc)) from None

    def _drain(self) -> None:
        """The rest of the epoch (or window), recorded past the script: whole-stream checks see it all."""
        if self._drain_indices():
            self.finish()
            return
        window = self.recorder.options.steps
        while window is None or self.built.count < window:
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
        sent = dispatched(it, self.log)
        if sent is None:
            return False
        pending: list[tuple[Any, int | None]] = []
        worker_of: Callable[[], int | None] = lambda: None  # noqa: E731
        if kind is _MultiProcessingDataLoaderIter:
            if not getattr(it, "_in_order", True):
                return False  # delivered out of order: which tasks are left is not a range
            for task in range(it._rcvd_idx, it._send_idx):
                info = it._task_info.get(task, ())
                pending.append((sent.item(task), info[0] if info else None))
            worker_of = _next_worker(it)
        for item, worker in (*pending, *((i, worker_of()) for i in it._sampler_iter)):
            ids = indices_of(item)
            if ids is None:
                continue
            self.built.add((to_base(ids, self.base), worker, None, None))
            beat()  # a batch read past the script is progress too (--timeout)
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

    def peek_candidate(self, site: str) -> bool:
        """Left by the script after at most :data:`PEEK_BATCHES` batches, and the loader is iterated
        again at another line: a peek if that iteration goes further."""
        return not self.done and not self.ended and self.asked <= PEEK_BATCHES and site != self.site

    def discard(self) -> None:
        """A peek at a line known to peek: no epoch, nothing drained (its workers stop now)."""
        from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

        self.done = True
        watcher = step_watcher()
        if watcher is not None:
            watcher.fetch_draws(self.outer)  # its fetches' draws belong to no epoch
        inner: Any = self.inner
        if type(inner) is _MultiProcessingDataLoaderIter and not inner._persistent_workers:
            inner._shutdown_workers()

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
        options, built, epochs = self.recorder.options, self.built, self.record.epochs
        held, self.held = self.held, None
        if held is not None and (self.ended or self.asked > held.asked):
            self.recorder.peeked(self.record, held, self.site)  # this iteration went further
        elif held is not None:  # it did not: the short iteration before it was an epoch too
            epochs.append(replace(held.trace, epoch=len(epochs)))
        len_loader = None if options.steps is not None else self.len_loader
        digests = array("q", built.digests) if options.digest else None
        trace = built.trace(len(epochs), len_loader, digests, None)
        watcher = step_watcher()
        if watcher is not None:
            trace = replace(trace, draws=watcher.fetch_draws(self.outer))
        if self.aside:
            self.kept = trace
        else:
            epochs.append(trace)
        if self.evaluation is not None:
            self.evaluation.stored(trace.epoch)
        self.built = EpochBuilder()


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


# --- the recorder ---------------------------------------------------------------------------------------


class ScriptRecorder:
    """Records every DataLoader of one rank's script: the :class:`~ddpcheck.checker.watch.Watcher` that
    the watchers on torch report to while the script runs (:func:`~ddpcheck.checker.watch.watching`)."""

    def __init__(self, options: ScriptRecordOptions, hooks: ModuleType | None = None) -> None:
        self.options = options
        self.loaders: dict[str, LoaderRecord] = {}
        self.by_dataset: dict[int, str] = {}
        self.variables: dict[str, str] = {}  # loader name -> the variable its line assigned it to
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
        self.evaluations: Evaluations | None = None  # the script's evaluations (issue 41)

    # naming
    def name_for(self, loader: Any, frame: FrameType | None) -> str:
        """The user's line that built the loader (``train.py:42``, ``#2`` for the next one there; the
        variable it assigns the loader to is kept for the reports); a loader over a dataset already named
        (re-created or wrapped) takes that name."""
        dataset = getattr(loader, "dataset", None)
        if dataset is not None and id(dataset) in self.by_dataset:
            return self.by_dataset[id(dataset)]  # re-created or wrapped: the loader the user built
        site, via = user_site(frame)
        seen = self.site_counts.setdefault(site, [])
        name = site if not seen else f"{site}#{len(seen) + 1}"
        if via and site == "<unknown>":
            name = f"{via}#{len(seen) + 1}" if seen else via
        seen.append(id(dataset))
        self.variables.setdefault(name, assigned_name(frame))
        if dataset is not None:
            self.by_dataset[id(dataset)] = name
            self.keep.append(dataset)
        return name

    # iteration
    def open_epoch(
        self, outer: Any, name: str, inner: Iterator[Any], caller: FrameType | None = None
    ) -> Iterator[Any]:
        """``iter(outer)``, called from ``caller``, gave ``inner``: the script receives a
        :class:`ScriptEpoch` of it (or, when the epochs asked for are recorded, :class:`StopScript` ends
        the script)."""
        record = self.loaders.get(name)
        if record is None:
            variable = self.variables.get(name, "")
            record = self.loaders[name] = LoaderRecord(name=name, order=len(self.loaders), variable=variable)
        site = user_site(caller)[0]
        held = None
        previous, record.open = record.open, None
        if previous is not None and not previous.done:  # the previous iter() was abandoned
            if previous.peek_candidate(site):
                held = self._hold(record, previous)
            else:
                previous.drain_rest()  # its epoch is drained now
        if self.joined is None:
            self.joined = in_group()
            self.position = position()
        if self._should_stop(record):
            self.stop_script(record)
        if record.facts is None:
            facts = _facts(OpenedLoader.wrap(outer, self.hooks, position=self.position))
            drawn = drawn_at(getattr(outer, "dataset", None)) if facts.subset else ""
            record.facts = replace(facts, subset_call=drawn) if drawn else facts
            mark_parts(outer, name)
        if record.iterations > 0 and record.set_epoch_calls > 0:
            record.epochs_after_set += 1
        record.set_epoch_calls = 0
        record.iterations += 1
        epoch = ScriptEpoch(self, record, outer, inner, site, held)
        record.open = epoch
        return epoch

    def _hold(self, record: LoaderRecord, previous: ScriptEpoch) -> HeldPeek | None:
        """A short iteration left at one line before the loader is iterated at another: held aside (drained,
        so it can still be an epoch) until the next iteration shows whether it goes further; a line
        already known to peek peeks again. None: nothing held (a peek discarded)."""
        if previous.site in record.peek_sites:
            previous.discard()
            return None
        previous.aside = True
        previous.drain_rest()
        trace = previous.kept
        return None if trace is None else HeldPeek(trace, previous.site, previous.asked, previous.handed)

    def peeked(self, record: LoaderRecord, held: HeldPeek, loop_site: str) -> None:
        """``held`` was a peek: no epoch, and a note says so (once per loader and line)."""
        first = held.site not in record.peek_sites
        record.peek_sites.add(held.site)
        if first:
            size = BATCH_WORDS.get(held.handed, str(held.handed))
            self.notes.append(
                f"loader {record.name}: a {size}-batch peek at {held.site} is not counted as an epoch (the "
                f"iterator is left there while the loop at {loop_site} iterates the loader)"
            )

    def _should_stop(self, record: LoaderRecord) -> bool:
        """The loader the script iterates most (most iter() calls, then most batches handed to the
        script, then the first iterated) is about to start the epoch past those asked for."""
        if len(record.epochs) < self.options.epochs:
            return False
        main = max(self.loaders.values(), key=lambda r: (r.iterations, r.delivered, -r.order))
        return main is record

    def stop_script(self, record: LoaderRecord) -> None:
        self.stop_with(f"{record.name}: {self.options.epochs} epochs recorded")

    def stop_with(self, message: str) -> None:
        self.stopped = True
        raise StopScript(message)

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
                work=record.work or (record.facts or LoaderFacts()).work,
            )
            rank = self.position[0] if self.position is not None else position()[0]
            trace = RankTrace(rank=rank, epochs=tuple(record.epochs), facts=facts)
            set_epoch = not facts.has_set_epoch or record.epochs_after_set >= len(record.epochs) - 1
            handed, variable = record.delivered, record.variable
            out.append(ScriptLoader(record.name, trace, record.id_source, set_epoch, handed, variable))
        return tuple(out)


def _facts(opened: OpenedLoader) -> LoaderFacts:
    try:
        return opened.facts
    except Exception:  # a loader that trains fine must never crash the recorder
        return LoaderFacts(dataset_kind="iterable")


def record_script(
    target: ScriptTarget, options: ScriptRecordOptions, hooks: ModuleType | None = None
) -> ScriptRankTrace:
    """Run the script in this rank and record its loaders (the entry point of ``ddpcheck.record``).
    Files are named relative to the script's folder (a module's: the working directory, where ``-m``
    finds it), so a report reads the same wherever ddpcheck ran."""
    show_paths_from(os.path.dirname(os.path.abspath(target.path)) if target.path else os.getcwd())
    install()
    recorder = ScriptRecorder(options, hooks)
    notes = patch_cuda_choices()
    refuse_own_launch()
    outcome = Outcome()
    first = FirstInputs(lambda: bool(recorder.loaders))
    first.install()
    sources = None
    if options.batches:
        window = options.steps or DEFAULT_WINDOW
        sources = BatchSources(options.batches, window, options.epochs, recorder.stop_with)
        sources.install()
    recorder.evaluations = _evaluations(options)
    try:
        with watching(recorder):
            run_target(target)
    except StopScript:
        pass
    except RecorderError as exc:
        outcome = Outcome("error", str(exc), "", 3)
    except SystemExit as exc:
        code = exc.code
        if code not in (None, 0):
            outcome = Outcome(
                "exit", f"the script exited with {code!r}", "", code if isinstance(code, int) else 1
            )
    except BaseException as exc:  # the script's own error: reported as it is, in one line
        outcome = failure(exc)
    first.remove()
    if sources is not None:
        sources.remove()
    outcome = _finish(recorder, outcome)
    evaluation = _finish_evaluations(recorder.evaluations)
    joined = recorder.joined if recorder.joined is not None else joined_group()
    rank, world_size = recorder.position if recorder.position is not None else position()
    return ScriptRankTrace(
        rank=rank,
        world_size=world_size,
        loaders=recorder.traces(),
        status=outcome.status,
        message=outcome.message,
        stack=outcome.stack,
        ignore_index=recorder.options.ignore_index,
        notes=tuple(dict.fromkeys([*notes, *recorder.notes])),
        joined_group=bool(joined),
        stopped=recorder.stopped,
        fallback=accelerate_fallback(),
        first_model_call=first.site,
        inputs_from=first.name,
        sources=sources.traces() if sources is not None else (),
        evaluation=evaluation,
    )


def _evaluations(options: ScriptRecordOptions) -> Evaluations | None:
    """The rank's evaluations, watched (None: ``eval_rounds`` 0): the models it knows, the collectives and
    optimizer steps made, what the script reports."""
    if options.eval_rounds <= 0:
        return None
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from ddpcheck.checker import patching
    from ddpcheck.checker.eval_values import read_reports
    from ddpcheck.checker.eval_weights import known_models

    settings = EvalOptions(options.eval_rounds, options.eval_save, options.eval_weights)
    evaluations = Evaluations(settings, known_models())
    watch_collectives(evaluations)
    patching.keep_handle(register_optimizer_step_pre_hook(lambda o, a, k: evaluations.stepped()))
    read_reports(evaluations)
    return evaluations


def _finish_evaluations(evaluations: Evaluations | None) -> EvalRecord | None:
    if evaluations is None:
        return None
    from ddpcheck.checker.eval_values import stop_reading

    stop_reading()
    return evaluations.finish()


def _finish(recorder: ScriptRecorder, outcome: Outcome) -> Outcome:
    """Drain what the script left open; an error doing so is the outcome where the script's was ok."""
    try:
        recorder.finish()
    except StopScript:
        pass
    except RecorderError as exc:
        if outcome.status == "ok":
            return Outcome("error", str(exc), "", 3)
    except BaseException as exc:
        if outcome.status == "ok":
            return failure(exc)
    return outcome
