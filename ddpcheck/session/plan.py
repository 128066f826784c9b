"""The plan of a run: which layouts, what each records, which reruns; decided before anything starts.

Planning is pure (options in, plan out), so what a run will do can be read and tested without
launching a rank. Carrying the plan out is :mod:`ddpcheck.session.run`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ddpcheck.layout import Layout, shaped_like
from ddpcheck.options import CheckOptions
from ddpcheck.session.record import Job, rerun_sample


@dataclass(frozen=True)
class LayoutPlan:
    """What one layout records: ``jobs`` (the reference window, then the run) and the determinism rerun.

    ``run`` is None where the single-process reference is this layout's run (world size 1 with the
    correct ``set_epoch`` loop); ``rerun`` is None when determinism is off, or when world size 1's
    rerun was recorded beside the reference.
    """

    layout: Layout
    skip: str = ""  # non-empty: not run, and why
    window: Job | None = None  # --steps windows: the reference over the same global number of samples
    run: Job | None = None
    rerun: Job | None = None

    @property
    def jobs(self) -> list[Job]:
        return [job for job in (self.window, self.run) if job is not None]


@dataclass(frozen=True)
class RunPlan:
    """The whole run: the reference (and its rerun beside it, when world size 1 is checked on real
    ranks: the second core records it meanwhile), then every layout in order. ``reference.layout`` is
    the single process shaped like the meshes (every dimension of size 1)."""

    reference: Job
    reference_rerun: bool
    layouts: tuple[LayoutPlan, ...]


def plan_run(options: CheckOptions) -> RunPlan:
    # The reference is always the correct loop (set_epoch called); with --no-set-epoch only the runs
    # skip it, so reshuffle fails exactly when the order depends on that call.
    correct = replace(options, set_epoch=True)
    meshes = options.layouts
    sizes = tuple(sorted(set(options.world_sizes)))
    beside = options.determinism and options.set_epoch and 1 in sizes and not options.simulate
    reference = Job(correct, reference_layout(meshes))
    layouts = tuple(
        _plan_layout(options, layout, beside, reference.layout) for layout in run_layouts(sizes, meshes)
    )
    return RunPlan(reference=reference, reference_rerun=beside, layouts=layouts)


def run_layouts(world_sizes: tuple[int, ...], meshes: Sequence[Layout]) -> list[Layout]:
    """The world sizes (in order), then the meshes (as given). With meshes, a world size is the mesh of
    their dimension names whose first data dimension has that size and every other one size 1, so a
    factory that indexes its mesh by name (``mesh["tp"]``) runs at every world size too."""
    return [*(shaped_like(meshes, ws) for ws in world_sizes), *meshes]


def reference_layout(meshes: Sequence[Layout]) -> Layout:
    """The single process, shaped like ``meshes`` (every dimension of size 1)."""
    return shaped_like(meshes, 1)


def _plan_layout(options: CheckOptions, layout: Layout, beside: bool, single: Layout) -> LayoutPlan:
    ws = layout.world_size
    skip = _skip_reason(options, ws)
    if skip:
        return LayoutPlan(layout, skip=skip)
    window = None
    if options.steps is not None and layout.dp_world_size > 1:
        # windows: the reference runs the same global number of samples as the data replicas together
        steps = options.steps * layout.dp_world_size
        window = Job(replace(options, set_epoch=True, steps=steps), single)
    # a mesh's replicas must receive the same content: real ranks load and digest every batch
    digest = layout.replicas > 1 and (options.load_data or not options.simulate)
    run = None if ws == 1 and options.set_epoch else Job(options, layout, digest=digest)
    rerun = None
    if options.determinism and not (ws == 1 and beside):  # judged on ids: no content to digest
        # judged on ids alone: it measures no work (token batches would be loaded again for nothing)
        rerun = Job(replace(options, work=False, mixture=False), layout, _rerun_ranks(options, layout))
    return LayoutPlan(layout, window=window, run=run, rerun=rerun)


def _rerun_ranks(options: CheckOptions, layout: Layout) -> tuple[int, ...]:
    """Simulated ranks rerun for determinism: a sample of the data-parallel ranks, one replica each
    (replicas are judged on the first run). Real ranks rerun whole groups (() = all)."""
    if not options.simulate:
        return ()
    sample = rerun_sample(layout.dp_world_size)
    if layout.replicas == 1:
        return sample
    firsts = layout.representatives()
    return tuple(firsts[dp] for dp in sample) if sample else tuple(firsts)


def _skip_reason(options: CheckOptions, world_size: int) -> str:
    if options.backend == "nccl" and not options.simulate:
        import torch

        found = torch.cuda.device_count()
        if found < world_size:
            return f"NCCL world size {world_size} needs {world_size} GPUs, found {found}"
    return ""
