"""resume and elastic_resume, the parent side: plan the stops, launch the resume and restore groups,
hand what comes back to the judges (:mod:`ddpcheck.checks.resume`). What runs inside a rank is
:mod:`ddpcheck.scenarios.resume_rank`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ddpcheck.checker.loaderfile import LoaderSpec, other_factories
from ddpcheck.checker.recipe import LoaderRecipe
from ddpcheck.checks.resume import judge_all, stop_points
from ddpcheck.checks.resume_common import HOW_TO_ENABLE, NOT_ELASTIC, NOT_ELASTIC_STATE, WORKER_OFFSETS, flat
from ddpcheck.checks.resume_elastic import change_text, judge_restore, restore_cause, topology_verdict
from ddpcheck.launch import GroupCall, GroupResult, TargetRef, run_groups, run_ranks
from ddpcheck.layout import Layout
from ddpcheck.restores import RankResume, Restore, ResumeRow, Stop, Topology
from ddpcheck.scenarios.protocol import DataRun, Outcome, rank_failures
from ddpcheck.scenarios.resume_rank import (  # noqa: F401
    ResumeJob,
    failure_text,
    restore_rank,
    resume_rank,
)
from ddpcheck.verdict import ELASTIC_RESUME, RESUME, not_applicable, skipped

if TYPE_CHECKING:
    from ddpcheck.options import CheckOptions


@dataclass
class _Saved:
    """What one layout's resume group left for restores in other topologies."""

    layout: Layout
    ranks: list[RankResume]
    stops: tuple[Stop, ...]
    pad_unit: int


class ResumeCheck:
    """Parent side of ``resume`` (every layout) and ``elastic_resume`` (other world sizes, meshes and
    worker counts: ``--elastic`` and ``--resume-workers``)."""

    def __init__(self, spec: LoaderSpec, options: CheckOptions) -> None:
        self.spec = spec
        self.options = options
        self.recipe = LoaderRecipe.from_options(spec, options)
        self.saved: dict[str, _Saved] = {}
        self.layouts: dict[str, Layout] = {}
        self.mechanism = ""  # where the data state lives: the elastic failure's cause depends on it
        self.by_workers: dict[str, Outcome] = {}  # restores with other worker counts, kept for finish()
        self.factories = other_factories(spec)
        self.dcp_dir = _dcp_root() if options.dcp else ""

    @classmethod
    def maybe(cls, spec: LoaderSpec, options: CheckOptions, names: frozenset[str]) -> ResumeCheck | None:
        return cls(spec, options) if options.resume else None

    @property
    def topology_stops(self) -> bool:
        return self.options.elastic or bool(self.options.resume_workers)

    def _launch(self, target: Any, layout: Layout, kwargs: dict[str, Any]) -> GroupResult:
        return run_ranks(
            GroupCall(
                TargetRef.of(target),
                layout.world_size,
                backend=self.options.backend,
                timeout=self.options.timeout,
                max_time=self.options.max_time,
                kwargs={**kwargs, "recipe": self.recipe.evolve(layout=layout)},
            )
        )

    def world(self, ctx: DataRun) -> Outcome:
        layout = ctx.layout or Layout.plain(ctx.world_size)
        self.layouts[layout.label] = layout
        if not ctx.run.ranks:
            return Outcome()
        if not ctx.run.ranks[0].facts.resumable:  # read off the loader in the data run: nothing to launch
            return Outcome(verdicts=(not_applicable(RESUME, HOW_TO_ENABLE),))
        if self.options.simulate:
            return Outcome(verdicts=(skipped(RESUME, "resume is checked with real ranks, not --simulate"),))
        if self.options.steps is not None:
            return Outcome(verdicts=(skipped(RESUME, "resume is not checked in --steps windows"),))
        by_rank = {r.rank: tuple(len(e.batch_sizes) for e in r.epochs) for r in ctx.run.ranks}
        per_rank = tuple(by_rank.get(rank, ()) for rank in range(layout.world_size))
        counts = [
            max(c[e] for c in by_rank.values() if e < len(c)) for e in range(len(ctx.run.ranks[0].epochs))
        ]
        stops = stop_points(counts, self.options.epochs, self.topology_stops)
        epochs = 2  # the stops' epochs and the one after epoch 0 (its middle and its boundary run it)
        job = ResumeJob(
            stops,
            epochs,
            ctx.run.ranks[0].facts.resumable,
            other_workers=self.options.resume_workers,
            counts=per_rank,
            factories=self.factories,
            dcp_dir=self.dcp_dir,
        )
        if self.dcp_dir:  # one directory per layout: every layout saves at the same stops
            job = replace(job, dcp_dir=_dcp_path(self.dcp_dir, layout.label))
        kwargs = {"job": job}
        group = self._launch(resume_rank, layout, kwargs)  # every rank of a mesh restores
        failures = rank_failures(group, RESUME)
        if failures:
            return Outcome(failures=failures)
        ranks = [o.value for o in group.outcomes if isinstance(o.value, RankResume)]
        verdict, rows = judge_all(layout.world_size, ranks, layout.label if layout.mesh else "")
        outcome = Outcome(verdicts=(verdict,), resume=rows)
        if ranks and ranks[0].mechanism:
            self.mechanism = ranks[0].mechanism
            unit = max(ctx.run.ranks[0].facts.pad_unit, 1)
            self.saved[layout.label] = _Saved(layout, ranks, stops, unit)
            if self.options.resume_workers:
                workers = self._worker_outcome(layout, ranks, unit)
                if self.options.elastic and workers.resume:  # one elastic_resume with the other layouts'
                    self.by_workers[layout.label] = workers
                else:
                    outcome += workers
        return outcome

    def _worker_outcome(self, layout: Layout, ranks: list[RankResume], unit: int) -> Outcome:
        """Restores into loaders with other numbers of workers, made in the resume group itself."""
        if not ranks[0].workers_settable:
            name = self.spec.factory
            why = f"{name}() takes no num_workers: name it so its loader can be rebuilt with other counts"
            return Outcome(verdicts=(not_applicable(ELASTIC_RESUME, why),))
        rows: list[ResumeRow] = []
        cause = ""
        saved = _Saved(layout, ranks, (), unit)
        topology_stops = [s for s, _ in ranks[0].states]
        for position, (workers, _) in enumerate(ranks[0].other_workers):
            new = Topology(layout, workers)
            change = change_text(Topology(layout), new, ranks[0].workers)
            for k, stop in enumerate(topology_stops):
                rests = [r.other_workers[position][1][k] for r in ranks]
                room = _pad_room(_firsts(saved), stop) + layout.dp_world_size * unit - 1
                rows.append(judge_restore(layout, ranks, new, stop, rests, room, change=change))
                if rows[-1].outcome == "failed" and not cause:
                    cause = restore_cause(layout, new, ranks, rests, self.mechanism, rows[-1])
        return Outcome(verdicts=(topology_verdict(rows, cause or WORKER_OFFSETS),), resume=tuple(rows))

    def finish(self) -> dict[str, Outcome]:
        """Restores into other layouts (``--elastic``); then the DCP checkpoints (``--dcp``) go."""
        try:
            return self._restore_elsewhere()
        finally:
            if self.dcp_dir:
                import shutil

                shutil.rmtree(self.dcp_dir, ignore_errors=True)

    def _plans(self) -> list[tuple[Layout, list[tuple[_Saved, Stop, Restore]]]]:
        """For each layout, what every other layout saved at its topology stops."""
        plans = []
        for new in self.layouts.values():
            restores = []
            for saved in (s for s in self.saved.values() if s.layout != new):
                for stop in (s for s in saved.stops if s.elastic):
                    states = tuple(dict(r.states).get(stop) for r in saved.ranks)
                    seen = sum(
                        len(b) for r in _firsts(saved) for b in r.uninterrupted[stop.epoch][: stop.step]
                    )
                    restores.append((saved, stop, Restore(saved.layout.label, stop, states, seen)))
            if restores:
                plans.append((new, restores))
        return plans

    def _restore_elsewhere(self) -> dict[str, Outcome]:
        """For each layout one group restores, one after another, what every other layout saved; groups
        of layouts that fit the cores run side by side."""
        if not self.options.elastic or not self.saved:
            return {}
        plans = self._plans()
        calls = [
            GroupCall(
                TargetRef.of(restore_rank),
                new.world_size,
                backend=self.options.backend,
                timeout=self.options.timeout,
                max_time=self.options.max_time,
                kwargs={
                    "recipe": self.recipe.evolve(layout=new),
                    "restores": tuple(r for _, _, r in restores),
                    "mechanism": self.mechanism,
                    "dcp_dir": self.dcp_dir,
                },
            )
            for new, restores in plans
        ]
        out: dict[str, Outcome] = {}
        for (new, restores), group in zip(plans, _side_by_side(calls), strict=True):
            bad = rank_failures(group, ELASTIC_RESUME)
            if bad:
                out[new.label] = Outcome(failures=bad) + self.by_workers.pop(new.label, Outcome())
                continue
            out[new.label] = self._judge_layout(new, restores, [o.value for o in group.outcomes])
        for label, workers in self.by_workers.items():  # a layout no other layout's state was restored in
            out[label] = workers
        return out

    def _judge_layout(
        self, new: Layout, restores: list[tuple[_Saved, Stop, Restore]], per_rank: list[Any]
    ) -> Outcome:
        rows = []
        causes = []
        for k, (saved, stop, _) in enumerate(restores):
            rests = [values[k] for values in per_rank]
            room = _pad_room(_firsts(saved), stop) + new.dp_world_size * saved.pad_unit - 1
            change = f"{saved.layout.label} -> {new.label}"
            row = judge_restore(saved.layout, saved.ranks, Topology(new), stop, rests, room, change=change)
            rows.append(row)
            if row.outcome == "failed":
                causes.append(
                    restore_cause(saved.layout, Topology(new), saved.ranks, rests, self.mechanism, row)
                )
        cause = causes[0] if causes else NOT_ELASTIC.get(self.mechanism, NOT_ELASTIC_STATE)
        workers = self.by_workers.pop(new.label, None)
        if workers is not None:
            first = workers.verdicts[0]
            cause = first.cause if first.failed else cause
            rows = [*workers.resume, *rows]
        return Outcome(verdicts=(topology_verdict(rows, cause),), resume=tuple(rows))


def _dcp_path(root: str, label: str) -> str:
    import os

    return os.path.join(root, "".join(c if c.isalnum() else "_" for c in label))


def _dcp_root() -> str:
    """A temporary directory for the DCP checkpoints of this check (removed in ``finish``)."""
    import tempfile

    return tempfile.mkdtemp(prefix="ddpcheck-dcp-")


def _side_by_side(calls: list[GroupCall]) -> list[GroupResult]:
    """Independent groups together where their ranks fit the cores, else one after another."""
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    out: list[GroupResult] = []
    batch: list[GroupCall] = []
    for call in calls:
        if batch and sum(c.world_size for c in batch) + call.world_size > max(cores, 1):
            out += run_groups(batch)
            batch = []
        batch.append(call)
    if batch:
        out += run_groups(batch)
    return out


def _firsts(saved: _Saved) -> list[RankResume]:
    by_rank = {r.rank: r for r in saved.ranks}
    return [by_rank[r] for r in saved.layout.representatives() if r in by_rank]


def _pad_room(ranks: Sequence[RankResume], stop: Stop) -> int:
    """Copies the old layout itself holds in that epoch (its padding)."""
    items = flat(b for r in ranks if stop.epoch < len(r.uninterrupted) for b in r.uninterrupted[stop.epoch])
    return len(items) - len(set(items))
