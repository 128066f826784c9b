"""The rank side of a check: open the user's loader, run epochs like a training loop, record ids.

Map-style datasets are recorded from the loader's (batch) sampler alone, without loading data, which
is what decides who sees what and costs microseconds per batch. ``load_data`` iterates the real
loader, workers and all; iterable datasets always do. The result is a :class:`RankRecording`: plain
data, no user objects.

This module assembles the trace; each job lives in a module of its own: :mod:`~ddpcheck.checker.recipe`
(how a loader is built), :mod:`~ddpcheck.checker.face` (an opened loader),
:mod:`~ddpcheck.checker.batches` (ids), :mod:`~ddpcheck.checker.running` (epochs and windows).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ddpcheck.checker.face import OpenedLoader, open_loader
from ddpcheck.checker.facts import sampler_only_is_exact
from ddpcheck.checker.index_log import log_of
from ddpcheck.checker.mixture import SourceReader, source_reader
from ddpcheck.checker.recipe import RecordOptions
from ddpcheck.checker.running import Stream, peek, work_meter
from ddpcheck.checker.work import WorkMeter
from ddpcheck.launch.beats import report_progress
from ddpcheck.trace import LoaderFacts, RankTrace


@dataclass(frozen=True)
class RankRecording:
    trace: RankTrace
    id_source: str


def record_rank(options: RecordOptions) -> RankRecording:
    """Entry point inside a rank: rank and world size come from the initialised group."""
    report_progress("building the loader")
    opened = open_loader(options.recipe)
    unreached = opened.first_set_epoch()
    facts = opened.facts
    meter = work_meter(opened, options)
    reader = source_reader(opened.module, opened.loader, options.mixture, peek)
    by_sampler = records_by_sampler(opened, options, meter, reader)
    if not by_sampler:
        log_of(opened.loader)  # before the resume probe: a state_dict() call may already build the iterator
    facts = replace(
        facts,
        recorded="sampler" if by_sampler else "loader",
        steps=options.steps,
        resumable=opened.resume_mechanism(),
        set_epoch_unreached=unreached,
    )
    stream = Stream(opened, options, by_sampler, meter, reader)
    epochs = [stream.record(epoch) for epoch in range(options.epochs)]
    facts = _with_work(facts, meter)
    return RankRecording(RankTrace(rank=opened.rank, epochs=tuple(epochs), facts=facts), stream.source)


def records_by_sampler(
    opened: OpenedLoader, options: RecordOptions, meter: WorkMeter | None, reader: SourceReader | None
) -> bool:
    """Whether the (batch) sampler alone tells this loader's stream: a map-style dataset, nothing that
    needs the data (a ``sample_ids`` hook, work, sources, data ids, digests in windows), and a loader
    that iterates exactly what its sampler says."""
    return (
        opened.facts.dataset_kind == "map"
        and opened.hooks.sample_ids is None
        and meter is None
        and reader is None
        and not options.load_data
        and not options.recipe.ids_from_data
        and not (options.digest and options.steps is not None)
        and sampler_only_is_exact(opened.outer, opened.loader)
    )


def _with_work(facts: LoaderFacts, meter: WorkMeter | None) -> LoaderFacts:
    if meter is not None and meter.source not in ("", "none"):
        return replace(facts, work=meter.source)
    return facts
