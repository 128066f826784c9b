"""The plan of a run: which layouts, what each records, which reruns; decided before anything starts.

Planning is pure (options in, plan out), so what a run will do can be read and tested without
launching a rank. Carrying the plan out is :mod:`ddpcheck.session.run`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ddpcheck.checker.options import CheckOptions
from ddpcheck.layout import Layout
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
    ranks: the second core records it meanwhile), then every layout in order."""

    reference: Job
    reference_rerun: bool
    layouts: tuple[LayoutPlan, ...]


def plan_run(options: CheckOptions) -> RunPlan:
    # The reference is always the correct loop (set_epoch called); with --no-set-epoch only the runs
    # skip it, so reshuffle fails exactly when the order depends on that call.
    correct = replace(options, set_epoch=True)
    sizes = tuple(sorted(set(options.world_sizes)))
    beside = options.determinism and options.set_epoch and 1 in sizes and not options.simulate
    layouts = tuple(_plan_layout(options, Layout.plain(ws), beside) for ws in sizes)
    return RunPlan(reference=Job(correct, 1), reference_rerun=beside, layouts=layouts)


def _plan_layout(options: CheckOptions, layout: Layout, beside: bool) -> LayoutPlan:
    ws = layout.world_size
    skip = _skip_reason(options, ws)
    if skip:
        return LayoutPlan(layout, skip=skip)
    window = None
    if options.steps is not None and ws > 1:
        # windows: the reference runs the same global number of samples as the W ranks together
        window = Job(replace(options, set_epoch=True, steps=options.steps * ws), 1)
    run = None if ws == 1 and options.set_epoch else Job(options, ws)
    rerun = None
    if options.determinism and not (ws == 1 and beside):
        rerun = Job(options, ws, rerun_sample(ws) if options.simulate else ())
    return LayoutPlan(layout, window=window, run=run, rerun=rerun)


def _skip_reason(options: CheckOptions, world_size: int) -> str:
    if options.backend == "nccl" and not options.simulate:
        import torch

        found = torch.cuda.device_count()
        if found < world_size:
            return f"NCCL world size {world_size} needs {world_size} GPUs, found {found}"
    return ""
