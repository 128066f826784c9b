"""The parent's side of deadlines on progress: when each rank last made progress, and which ranks stall.

A rank counts its progress in its slot (:mod:`ddpcheck.launch.beats`); the parent notes, on its own
clock, when each count last changed. ``--timeout S`` fires for a rank that made no progress for S
seconds while working (stuck in its own code: a loader that stopped yielding, an endless loop), or
when every rank still running is silent, each waiting for another (a collective only some ranks call).
A rank silent inside a collective while a peer still makes progress is waiting for that peer, not hung.
``--max-time`` is a separate cap on a group's whole time, off unless asked for.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ddpcheck.launch.beats import FINISHED, WAITING, read_beat

JOIN_ALLOWANCE_S = 60.0  # on top of ``timeout``, for ranks to start and join the group


@dataclass(frozen=True)
class Limits:
    """``timeout``: seconds a rank may go without progress; ``max_time``: a group's whole time (None: no
    cap), as ``--timeout`` and ``--max-time`` give them."""

    timeout: float = 120.0
    max_time: float | None = None


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class Silence:
    """How long a rank had been without progress when it was stopped, and since when (wall clock)."""

    seconds: float
    since: float

    def clock(self) -> str:
        return time.strftime("%H:%M:%S", time.localtime(self.since))


def stall_message(silence: Silence, timeout: float) -> str:
    """What a hung rank's report says: how long it made no progress, against which bound, since when."""
    return f"no progress for {silence.seconds:.1f} s (--timeout {timeout:g}), since {silence.clock()}"


def overtime_message(max_time: float, silence: Silence) -> str:
    """What a rank stopped by ``--max-time`` says: the cap, and that it was still making progress."""
    return (
        f"still running when --max-time ({max_time:g} s) ran out; its last progress was "
        f"{silence.seconds:.1f} s before"
    )


class Watchdog:
    """Per slot (a rank, or a simulated part): its progress count, when it last changed, whether the
    rank waits for peers. ``timeout``: seconds without progress that make a working rank hung."""

    def __init__(self, buffer: Any, slots: int, timeout: float, started: float) -> None:
        self.buffer = buffer
        self.timeout = timeout
        self.counts = [-1] * slots
        self.last = [started] * slots
        self.waiting = [False] * slots
        self.finished = [False] * slots

    def observe(self, now: float) -> None:
        for slot in range(len(self.counts)):
            count, state = read_beat(self.buffer, slot)
            self.waiting[slot], self.finished[slot] = state == WAITING, state == FINISHED
            if count != self.counts[slot]:
                self.counts[slot], self.last[slot] = count, now

    def restart(self, slot: int, now: float) -> None:
        """Count the slot's silence from ``now`` (a simulated part's next rank starts)."""
        self.last[slot] = now

    def stalled(self, now: float, active: Sequence[int], allowance: Callable[[int], float]) -> list[int]:
        """The slots in ``active`` that stall the group now: those silent for ``timeout`` (plus their
        ``allowance``) while working; else, when every active slot is silent, all of them. A slot whose
        rank has finished (it exits) is never one of them."""
        active = [s for s in active if not self.finished[s]]
        silent = [s for s in active if now - self.last[s] >= self.timeout + allowance(s)]
        working = [s for s in silent if not self.waiting[s]]
        if working:
            return working
        return silent if silent and len(silent) == len(active) else []

    def due(self, now: float, active: Sequence[int], allowance: Callable[[int], float]) -> float:
        """Seconds until the earliest slot in ``active`` not yet silent could be (inf: none)."""
        dues = [self.last[s] + self.timeout + allowance(s) - now for s in active if not self.finished[s]]
        return min((d for d in dues if d > 0), default=float("inf"))

    def silence(self, slot: int, now: float) -> Silence:
        seconds = max(0.0, now - self.last[slot])
        return Silence(seconds, time.time() - seconds)


def no_allowance(slot: int) -> float:
    return 0.0


@dataclass
class Deadline:
    """``timeout``: seconds a rank may go without progress; a rank still joining the group (fork,
    rendezvous, group init) gets ``JOIN_ALLOWANCE_S`` more: joining can be slow for reasons that are not
    the job's (a loaded machine, a resolver that times out while the store client logs its address).
    ``max_time``: the group's whole time, counted from the moment every rank has joined (None: no cap).
    """

    started: float
    timeout: float
    max_time: float | None = None
    joined_at: float | None = None

    @property
    def cap(self) -> float:
        """When ``max_time`` runs out (inf without one); while ranks join, counted as if they had joined
        at the end of their allowance."""
        if self.max_time is None:
            return float("inf")
        joined = self.joined_at if self.joined_at is not None else self.started + JOIN_ALLOWANCE_S
        return joined + self.max_time


@dataclass
class Ending:
    """Why a group's collection ended before every rank did: the ranks that stalled (their silences),
    ``max_time`` run out, or a failure's grace spent (neither)."""

    deadline: Deadline
    silences: dict[int, Silence] = field(default_factory=dict)  # every rank still running, when stopped
    stalled: tuple[int, ...] = ()
    overtime: bool = False

    def judge(self, rank: int) -> tuple[str, str]:
        """The kind and message of a rank still running without a result when the group was stopped:
        hung, over time, or stopped for a peer's sake."""
        silence = self.silences.get(rank, Silence(0.0, time.time()))
        if self.overtime and self.deadline.max_time is not None:
            return "overtime", overtime_message(self.deadline.max_time, silence)
        if rank in self.stalled:
            return "hang", stall_message(silence, self.deadline.timeout)
        if self.stalled:
            ranks = ", ".join(str(r) for r in self.stalled)
            return (
                "secondary",
                f"stopped while waiting: rank{'s' if len(self.stalled) > 1 else ''} {ranks} hung",
            )
        return "secondary", "stopped after a peer failed"
