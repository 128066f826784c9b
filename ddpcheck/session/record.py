"""Recording: jobs become process groups (real or simulated), group results become traces.

A :class:`Job` is one group to record (options, world size, which ranks). Real ranks of every job of a
layout, and of the held determinism rerun, are forked up front, so no rank inherits traces that arrive
later; they are let go side by side where they fit the cores. Simulated ranks take every core: their
jobs run one after another. What comes back is plain data (:class:`~ddpcheck.trace.RunTrace`).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from ddpcheck.checker.batches import MIXED_IDS
from ddpcheck.checker.loaderfile import LoaderSpec
from ddpcheck.checker.recipe import RecordOptions, record_options
from ddpcheck.checker.recording import RankRecording, record_rank
from ddpcheck.launch import (
    GroupCall,
    GroupResult,
    ProgressCallback,
    StartedGroups,
    TargetRef,
    started_groups,
)
from ddpcheck.layout import Layout
from ddpcheck.options import BadInput, CheckOptions
from ddpcheck.scenarios import rank_failures
from ddpcheck.trace import RunTrace, SimulatedShortcuts

T = TypeVar("T")
Note = Callable[[str], None]  # a line for the session's messages

RERUN_SAMPLE_FROM = 128  # simulated worlds from this size on rerun a sample of ranks for determinism
RERUN_SAMPLE_EDGE = 8  # the first and the last ranks sampled
RERUN_SAMPLE_SPREAD = 16  # evenly spaced ranks sampled between them


@dataclass(frozen=True)
class Job:
    """One group to record: these options in this layout; ``ranks`` only these ranks (() = all);
    ``digest`` the content of every batch (a mesh's replicas are compared by it)."""

    options: CheckOptions
    layout: Layout
    ranks: tuple[int, ...] = ()
    digest: bool = False

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    def record_options(self, spec: LoaderSpec) -> RecordOptions:
        return record_options(spec, self.options, self.layout, digest=self.digest)


def rerun_sample(world_size: int) -> tuple[int, ...]:
    """The ranks a simulated determinism rerun records (() = all): a full rerun of a huge simulated world
    doubles its cost, and a seed that varies between runs shows on any rank. The edges are where
    padding and uneven shares live; the spread covers the middle."""
    if world_size < RERUN_SAMPLE_FROM:
        return ()
    edge = set(range(RERUN_SAMPLE_EDGE)) | set(range(world_size - RERUN_SAMPLE_EDGE, world_size))
    step = world_size / (RERUN_SAMPLE_SPREAD + 1)
    spread = {round(step * (i + 1)) for i in range(RERUN_SAMPLE_SPREAD)}
    return tuple(sorted(edge | spread))


def record(
    spec: LoaderSpec,
    jobs: Sequence[Job],
    *,
    alone: bool = False,
    on_progress: ProgressCallback | None = None,
    on_note: Note | None = None,
) -> list[RunTrace]:
    """Record each job: side by side where their ranks fit the cores, else one by one (``alone``:
    always, for a loader that names shared memory machine-wide). Only the first job reports live
    progress, to ``on_progress`` (the live display's, when there is one)."""
    with recording(spec, jobs, None, alone=alone, on_progress=on_progress, on_note=on_note) as started:
        return started.jobs()


class Recording:
    """One layout's recordings (see the module docstring); ``held`` is the determinism rerun, let go
    only when asked (:meth:`held_run`), unless it fits the cores beside the jobs. ``alone``: no two groups
    side by side (the loader names shared memory machine-wide, as two jobs on one machine never would)."""

    def __init__(
        self,
        spec: LoaderSpec,
        jobs: Sequence[Job],
        held: Job | None,
        started: StartedGroups | None,
        alone: bool = False,
        on_note: Note | None = None,
    ) -> None:
        self.spec, self._jobs, self.held, self._started = spec, list(jobs), held, started
        self.alone, self.on_note = alone, on_note
        self._held_group: GroupResult | None = None  # the held rerun, when it ran beside the jobs

    def jobs(self) -> list[RunTrace]:
        if self._started is None:  # simulated: one job at a time, each over every core
            return [simulate(self.spec, job, self.on_note) for job in self._jobs]
        indices = list(range(len(self._jobs)))
        if not self.alone and self._jobs and self.held is not None and fits_cores([*self._jobs, self.held]):
            *groups, self._held_group = self._started.collect(*indices, len(self._jobs))
        elif not self.alone and fits_cores(self._jobs):
            groups = self._started.collect(*indices)
        else:
            groups = [self._started.collect(i)[0] for i in indices]
        return [
            to_run_trace(g, set_epoch=job.options.set_epoch)
            for g, job in zip(groups, self._jobs, strict=True)
        ]

    def held_run(self, work: Callable[[], T]) -> tuple[RunTrace, T]:
        """Let the held rerun go (unless it already ran), do ``work`` meanwhile (no forking in it), then
        collect the rerun. Simulated ranks, which take every core, run after ``work``."""
        assert self.held is not None
        if self._started is None:
            done = work()
            return simulate(self.spec, self.held, self.on_note), done
        index = len(self._jobs)
        if self._held_group is None:
            self._started.open(index)
        done = work()
        group = self._held_group or self._started.collect(index)[0]
        return to_run_trace(group, set_epoch=self.held.options.set_epoch), done


@contextlib.contextmanager
def recording(
    spec: LoaderSpec,
    jobs: Sequence[Job],
    held: Job | None,
    *,
    alone: bool = False,
    on_progress: ProgressCallback | None = None,
    on_note: Note | None = None,
) -> Iterator[Recording]:
    """Fork every real rank of ``jobs`` and ``held`` (nothing runs yet); stop and reap them on the way
    out. ``alone``: the groups run one after another (see :class:`Recording`); ``on_progress``: hears
    the first job's ranks, and the held one's (it runs alone, after the jobs); ``on_note``: the session's
    message line, for what simulated ranks say before they go on (a long run's estimate)."""
    first = jobs[0] if jobs else held
    if first is None or first.options.simulate:
        yield Recording(spec, jobs, held, None, on_note=on_note)
        return
    calls = [_group_call(spec, job, on_progress if i == 0 else None) for i, job in enumerate(jobs)]
    if held is not None:
        calls.append(_group_call(spec, held, on_progress))  # it runs alone, after the jobs
    with started_groups(calls, hold=True) as started:
        yield Recording(spec, jobs, held, started, alone)


def _group_call(spec: LoaderSpec, job: Job, on_progress: ProgressCallback | None) -> GroupCall:
    options = job.options
    return GroupCall(
        TargetRef.of(record_rank),
        job.world_size,
        backend=options.backend,
        timeout=options.timeout,
        max_time=options.max_time,
        kwargs={"options": job.record_options(spec)},
        on_progress=on_progress,
    )


def fits_cores(jobs: Sequence[Job]) -> bool:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return sum(job.world_size for job in jobs) <= max(cores, 1)


def simulate(spec: LoaderSpec, job: Job, on_note: Note | None = None) -> RunTrace:
    """A job's ranks simulated (``--simulate``); a recognised sampler's shortcut that proves wrong is
    redone through the real sampler."""
    from ddpcheck.launch.simulate import NeedsCollectives, SimulationTooLarge, simulate_ranks
    from ddpcheck.launch.watchdog import Limits

    options, world_size = job.options, job.world_size
    kwargs = {"options": job.record_options(spec)}
    limits = Limits(options.timeout, options.max_time)
    run = functools.partial(
        simulate_ranks, record_rank, world_size, kwargs=kwargs, limits=limits, ranks=job.ranks or None,
        on_note=on_note,
    )  # fmt: skip
    try:
        group = run(shortcuts=True)
        mismatch = group.shortcuts.get("mismatch")
        if mismatch:  # the recognised sampler's shortcut was wrong: nothing of that run can be trusted
            group = run(shortcuts=False)
            group.shortcuts = {"redone": mismatch}
    except (NeedsCollectives, SimulationTooLarge) as exc:
        raise BadInput(str(exc)) from None
    trace = to_run_trace(group, set_epoch=options.set_epoch)
    return replace(trace, rank_sample=job.ranks, shortcuts=simulated_shortcuts(group.shortcuts))


def simulated_shortcuts(found: dict[str, Any]) -> SimulatedShortcuts | None:
    """What the simulated ranks reported of their shortcuts, typed (None: they reported nothing)."""
    if not found:
        return None
    return SimulatedShortcuts(
        direct=int(found.get("direct") or 0),
        verified=int(found.get("verified") or 0),
        redone=str(found.get("redone") or ""),
        arrays=int(found.get("arrays") or 0),
        probes=int(found.get("probes") or 0),
    )


def shortcut_note(trace: RunTrace, name: str) -> str:
    """What the report says about a recognised sampler computed directly under --simulate (``name``:
    the layout, as progress lines name it)."""
    done = trace.shortcuts or SimulatedShortcuts()
    if done.redone:
        return (
            f"{name}: the direct computation of DistributedSampler differed from the "
            f"real one ({done.redone}); every simulated rank was run again through the real sampler"
        )
    said = []
    if done.direct:
        said.append(
            f"--simulate computed torch's DistributedSampler shares directly "
            f"for {done.direct} rank-epochs, and ran the real DistributedSampler.__iter__ on "
            f"{done.verified} of them: identical"
        )
    if done.arrays:
        said.append(
            f"--simulate read {done.arrays} DistributedSampler rank-epochs as arrays of indices, their "
            f"arithmetic checked against the real DistributedSampler.__iter__ on {done.probes} small "
            "datasets of the same kind: identical"
        )
    return f"{name}: {'; '.join(said)}" if said else ""


def to_run_trace(group: GroupResult, *, set_epoch: bool = True) -> RunTrace:
    """Rank outcomes -> a RunTrace (plain data); failed ranks become RankFailures."""
    recordings = [o.value for o in group.outcomes if o.ok and isinstance(o.value, RankRecording)]
    failures = rank_failures(group)
    if group.diagnosis and failures:
        first = failures[0]
        failures = (replace(first, message=f"{first.message}\n{group.diagnosis}"), *failures[1:])
    bad = [o for o in group.outcomes if o.exc_type == "BadLoaderFile"]
    return RunTrace(
        world_size=group.world_size,
        backend=group.backend,
        ranks=tuple(r.trace for r in recordings),
        id_source=common_source(recordings),
        set_epoch=set_epoch,
        failures=failures,
        bad_input=bad[0].message if bad and len(bad) == len(group.outcomes) else "",
        named_memory=bool(group.named_memory),
    )


def common_source(recordings: Sequence[RankRecording]) -> str:
    """How the ranks identified samples: their one way, or ``mixed`` where they differ."""
    sources = {r.id_source for r in recordings}
    if not sources:
        return "index"
    return sources.pop() if len(sources) == 1 else MIXED_IDS
