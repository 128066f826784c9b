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
from dataclasses import dataclass
from typing import Any

from ddpcheck.launch.beats import FINISHED, WAITING, read_beat


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
