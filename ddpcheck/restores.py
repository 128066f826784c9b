"""Plain data of resuming: what each rank resumed (its uninterrupted stream, the pieces every restore
yielded, what it saved) and each judged restore (:class:`ResumeRow`, with every rank's counts).

Below both the resume judges (:mod:`ddpcheck.checks.resume`) and the result (:mod:`ddpcheck.result`):
the rank side fills the first half, the judges the second, reports read the rows.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from ddpcheck.layout import Layout

Batches = tuple[tuple[Hashable, ...], ...]
State = bytes | str | None  # what one rank saved (torch.save'd; a str: its DCP checkpoint), None: nothing


@dataclass(frozen=True)
class Stop:
    """Stop after ``step`` batches (1-based count of finished batches) of ``epoch``.

    A stop after the epoch's last step (``boundary``) is read the two ways trainers restore it: a loop
    that finishes the stopped epoch (nothing left) and goes on, or one that starts the next epoch at once
    (Lightning, HF Trainer); a loader is right when it is exact under either.
    """

    epoch: int
    step: int
    next_epoch: bool = False  # also run epoch + 1 after the restore
    elastic: bool = False  # also restore in other topologies (--elastic, --resume-workers)
    boundary: bool = False  # the epoch's last step: the restored job's next pass is epoch + 1


@dataclass(frozen=True)
class StopResult:
    """One restore: the rest of the stopped epoch and the next epoch after it; at a boundary also
    ``next_pass``, the first pass of a job that starts the next epoch at once (None: not needed)."""

    stop: Stop
    rest: Batches = ()
    next_epoch: Batches | None = None
    error: str = ""
    next_pass: Batches | None = None
    read_rest: bool = True  # False: the boundary's next pass was exact, the other reading was not run
    planned: Stop | None = None  # the job's stop this answers (a rank with fewer batches stops earlier)
    saved_by: tuple[int, ...] | None = None  # the old ranks that saved a state (None: not known, a hook)
    logged: tuple[str, ...] = ()  # what the library logged (WARNING and above) or warned while restoring


@dataclass(frozen=True)
class ChainResult:
    """Resumed twice, as a job restarted twice does: restored at ``stop``, ran ``later`` more batches
    (``first``), saved again, restored again in a fresh module (``second``: the rest of the epoch and
    the next). ``error``: a restore or save raised (one line)."""

    stop: Stop
    later: int
    first: Batches = ()
    second: StopResult | None = None
    error: str = ""


@dataclass(frozen=True)
class RankResume:
    """One rank's uninterrupted stream (per epoch, per batch), its resumed pieces and what it saved."""

    rank: int
    mechanism: str  # "loader" | "batch_sampler" | "sampler" | "batch_sampler.sampler" | "hook" | "hooks" | ""
    uninterrupted: tuple[Batches, ...] = ()
    resumed: tuple[StopResult, ...] = ()
    states: tuple[tuple[Stop, State], ...] = ()  # this rank's states at the topology stops
    workers: int = 0  # DataLoader worker processes (they fetch ahead of the loop)
    in_order: bool = True  # False: DataLoader(in_order=False) with workers, batches may come in any order
    # restores into loaders with N workers: (N, per topology stop the rest, or the error it raised)
    other_workers: tuple[tuple[int, tuple[StopResult | str, ...]], ...] = ()
    workers_settable: bool = True  # the factory takes num_workers
    chains: tuple[ChainResult, ...] = ()  # resumed twice
    factory: str = ""  # "" the main factory; else another make_*_loader the file defines
    extra: tuple[RankResume, ...] = ()  # the file's other make_*_loader factories, resumed the same way


@dataclass(frozen=True)
class Restore:
    """What a rank of another layout starts from: every old rank's saved state (or, for the hook, the
    old counters), stopped at ``stop`` in layout ``old``."""

    old: str  # the old layout's label
    stop: Stop
    states: tuple[State, ...] = ()
    samples_seen: int = 0


@dataclass(frozen=True)
class Topology:
    """Where a restore happens: a layout and its DataLoader workers (None: the loader's own)."""

    layout: Layout
    workers: int | None = None

    @property
    def label(self) -> str:
        return self.layout.label


RESTORE_OUTCOMES = ("exact", "resharded", "refused", "failed")


@dataclass(frozen=True)
class RankRestore:
    """One rank's part of a restore: the samples it trained before the stop and after the restore, and
    what the restore lost or repeated of its stream. In another topology ``before`` and ``lost`` belong
    to the old rank ``rank`` (what it trained, what of its rest no new rank trained), ``after`` and
    ``repeated`` to the new rank ``rank`` (what it trained, how much of it had been trained already)."""

    rank: int
    before: int = 0
    after: int = 0
    lost: int = 0
    repeated: int = 0


@dataclass(frozen=True)
class ResumeRow:
    """One restore: stopped after ``step`` batches of ``epoch`` in one topology, restored in another.

    ``change`` names the topology change (``"2 -> 2"``, ``"2 -> 3"``, ``"workers 2 -> 0"``,
    ``"dp=2,tp=2 -> dp=4"``); ``outcome`` is ``exact`` (the stream continues exactly), ``resharded``
    (another topology: the epoch is covered once, repeats only from the new layout's padding),
    ``refused`` (the restore raised a clear error: an honest answer, not a failure) or ``failed``
    (samples silently lost or repeated). ``before``/``after`` count the samples trained before the stop
    and after the restore; ``skipped``/``repeated`` what the restore lost or repeated;
    ``first_divergence`` the first step where a resumed stream leaves the uninterrupted one; ``ranks``
    the same counts per rank (the picture draws a bar each). An ``outcome`` of "" with status ``skip``:
    the restore could not be judged (``note`` says why).
    """

    world_size_from: int
    world_size_to: int
    epoch: int
    step: int
    status: str  # a Verdict status: "pass" | "fail" | "skip" | "n/a" | "allowed"
    skipped: int = 0
    repeated: int = 0
    first_divergence: int | None = None
    note: str = ""
    change: str = ""  # "" = the world sizes' "from -> to"
    outcome: str = ""  # one of RESTORE_OUTCOMES ("" where not judged)
    before: int = 0
    after: int = 0
    ranks: tuple[RankRestore, ...] = ()  # every rank's counts (empty: not known, a row from before)

    @property
    def topology(self) -> str:
        return self.change or f"{self.world_size_from} -> {self.world_size_to}"
