"""The live progress display on stderr: where every rank of the running group is, elapsed time, an ETA.

The launch layer calls :meth:`Display.update` with every rank's published position (see
``ddpcheck.launch.GroupCall(on_progress=...)``); the command's own progress messages go through
:meth:`Display.message`, so they never tear the live lines. Three renderers, picked by
:func:`make_display`:

- a terminal: a rich ``Live`` region, one line per running world size, erased when the group ends;
- anything else (a pipe, a CI log): plain lines, the first after a group has run a second, then
  spaced out as it runs longer (at most one a second per world size);
- ``--quiet``: nothing at all.

The rich display never starts a thread (it is refreshed from the caller's thread, on each update),
and never replaces ``sys.stdout``/``sys.stderr``: rank processes are forked while it is shown.
rich is imported only when a terminal display starts.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from typing import Any, TextIO

# "epoch 1, batch 4/13" as checker/recording.py publishes it; no total where len(loader) is unknown.
_POSITION = re.compile(r"^epoch (\d+), batch (\d+)(?:/(\d+))?")
# the session's messages that start a layout (or the reference): "world size 2: running 2 ranks"
_LAYOUT_START = re.compile(r": running \d|reference run \(|: reference window ")
PLAIN_FIRST_S = 1.0  # a group that ends sooner prints no plain line at all
PLAIN_MIN_GAP_S = 1.0


@dataclass(frozen=True)
class Position:
    """One rank's published position, parsed. ``label`` is the short text shown for it."""

    label: str
    epoch: int | None = None
    batch: int | None = None  # the batch being fetched, counted from 1
    total: int | None = None  # batches per epoch (or per --steps window), where known
    done: bool = False

    @property
    def batch_text(self) -> str:
        """``batch 4/13``; past the announced length (the fetch that ends the epoch, or a ``len()`` that
        undercounts) the total is left out: never ``batch 17/16``."""
        within = self.total and self.batch is not None and self.batch <= self.total
        return f"batch {self.batch}" + (f"/{self.total}" if within else "")

    def fraction(self, epochs: int) -> float | None:
        """How much of the rank's whole run (all epochs) is behind it; None when unknown."""
        if self.done:
            return 1.0
        if self.epoch is None or self.batch is None or not self.total:
            return None
        finished = min(self.batch - 1, self.total) / self.total
        return min(1.0, (self.epoch + finished) / max(epochs, 1))


def parse_position(text: str) -> Position:
    match = _POSITION.match(text)
    if match:
        epoch, batch, total = (int(g) if g else None for g in match.groups())
        position = Position("", epoch, batch, total)
        return replace(position, label=f"epoch {epoch} {position.batch_text}")
    if text.startswith("finished"):
        return Position("done", done=True)
    if not text:
        return Position("starting")
    if text.startswith("joining"):
        return Position("joining")
    if text.startswith("building"):
        return Position("building the loader")
    return Position(text.split(";", 1)[0][:40])


@dataclass
class _Group:
    """What the display knows of one running group (one world size)."""

    world_size: int
    rerun: bool = False  # the layout's determinism rerun (a second group of its size)
    positions: tuple[Position, ...] = ()
    elapsed: float = 0.0
    start: tuple[float, float] | None = None  # (elapsed, fraction) when the fraction was first known
    fraction: float | None = None
    eta: float | None = None
    printed_at: float | None = None  # plain lines: the display's clock when the last one went out

    def observe(self, positions: list[str], elapsed: float, epochs: int) -> None:
        self.positions = tuple(parse_position(p) for p in positions)
        self.elapsed = elapsed
        fractions = [p.fraction(epochs) for p in self.positions]
        known = [f for f in fractions if f is not None]
        self.fraction = min(known) if known and len(known) == len(fractions) else None
        self.eta = None
        if self.fraction is None:
            return
        if self.start is None:
            self.start = (elapsed, self.fraction)
        t0, f0 = self.start
        if self.fraction > f0 and elapsed > t0:  # the rate since the totals were first known
            self.eta = (elapsed - t0) * (1.0 - self.fraction) / (self.fraction - f0)

    def ranks_text(self) -> str:
        """Every rank's position for small groups; the slowest and the fastest for large ones."""
        if len(self.positions) <= 4:
            epochs = {p.epoch for p in self.positions}
            if len(epochs) == 1 and None not in epochs:  # all in one epoch: say it once
                ranks = (f"rank {r} {p.batch_text}" for r, p in enumerate(self.positions))
                return f"epoch {epochs.pop()}: " + " | ".join(ranks)
            return " | ".join(f"rank {r}: {p.label}" for r, p in enumerate(self.positions))
        order = sorted(range(len(self.positions)), key=self._rank_key)
        slow, fast = order[0], order[-1]
        return (
            f"{len(self.positions)} ranks, slowest rank {slow}: {self.positions[slow].label} | "
            f"fastest rank {fast}: {self.positions[fast].label}"
        )

    def _rank_key(self, rank: int) -> tuple[float, int]:
        p = self.positions[rank]
        if p.done:
            return (float("inf"), rank)
        return (float(p.epoch or 0) * 1e9 + float(p.batch or 0), rank)

    def times_text(self) -> str:
        eta = f", about {_duration(self.eta)} left" if self.eta is not None else ""
        return f"{_duration(self.elapsed)} elapsed{eta}"

    @property
    def name(self) -> str:
        """``world size 2``, or ``world size 2 (determinism rerun)`` for the layout's second run."""
        return f"world size {self.world_size}" + (" (determinism rerun)" if self.rerun else "")


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds + 0.5), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class Display:
    """The no-op display (``--quiet``), and the interface of the others."""

    def __init__(self, stream: TextIO, *, epochs: int = 1) -> None:
        self.stream = stream
        self.epochs = epochs
        self.groups: dict[int, _Group] = {}
        self.started: dict[int, int] = {}  # groups of each size since the current layout began

    def update(self, positions: list[str], elapsed_s: float, finished: bool) -> None:
        """The launch layer's ``on_progress``: every rank's position in the running group."""
        ws = len(positions)
        if finished:
            self.groups.pop(ws, None)
        else:
            group = self.groups.get(ws)
            if group is None or elapsed_s < group.elapsed:  # a new group of this size
                seen = self.started[ws] = self.started.get(ws, 0) + 1
                group = self.groups[ws] = _Group(ws, rerun=seen > 1)  # a layout's second: its rerun
            group.observe(positions, elapsed_s, self.epochs)
        self._show(finished)

    def layout_message(self, text: str) -> None:
        """Every message passes here first: a layout (or the reference) starting begins a new count of
        groups, so the second group of a size within it is labelled as the determinism rerun."""
        if _LAYOUT_START.search(text):
            self.started.clear()

    def message(self, text: str) -> None:
        """A progress message of the command itself ("ddpcheck: world size 2: ok")."""

    def close(self) -> None:
        """Take the display down; messages after this are still printed."""

    def _show(self, finished: bool) -> None:
        pass

    def __enter__(self) -> Display:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PlainDisplay(Display):
    """Plain lines for logs: a group's first line after :data:`PLAIN_FIRST_S`, then spaced out."""

    clock = staticmethod(time.monotonic)

    def message(self, text: str) -> None:
        self.layout_message(text)
        self._write(text)

    def _show(self, finished: bool) -> None:
        now = self.clock()
        for group in self.groups.values():
            if group.elapsed < PLAIN_FIRST_S:
                continue
            # at most one a second, and about ten per group: a long run does not flood a CI log
            gap = max(PLAIN_MIN_GAP_S, min(30.0, group.elapsed / 10))
            if group.printed_at is not None and now - group.printed_at < gap:
                continue
            group.printed_at = now
            ranks, times = group.ranks_text(), group.times_text()
            self._write(f"ddpcheck: {group.name}: {ranks}; {times}")

    def _write(self, line: str) -> None:
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stderr must not stop the checks
            pass


class LiveDisplay(Display):
    """A rich ``Live`` region on a terminal: one line per running group, gone when it finishes."""

    def __init__(self, stream: TextIO, *, epochs: int = 1, color: bool = True) -> None:
        super().__init__(stream, epochs=epochs)
        from rich.console import Console

        self.console = Console(
            file=stream,
            color_system="auto" if color else None,
            no_color=not color,
            highlight=False,
            markup=False,
            emoji=False,
        )
        self.live: Any = None

    def message(self, text: str) -> None:
        from rich.text import Text

        self.layout_message(text)
        self.console.print(Text(text), soft_wrap=True)

    def _show(self, finished: bool) -> None:
        if not self.groups:
            self.close()  # nothing running: the region goes, the cursor comes back
            return
        if self.live is None:
            from rich.live import Live

            # No refresh thread (ranks are forked meanwhile), no stream redirection (they inherit it).
            self.live = Live(
                self._render(),
                console=self.console,
                auto_refresh=False,
                transient=True,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self.live.start(refresh=True)
            return
        self.live.update(self._render(), refresh=True)

    def _render(self) -> Any:
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        grid = Table.grid(padding=(0, 1), expand=True)  # the ranks' column takes what is left
        grid.add_column(no_wrap=True, style="bold")
        grid.add_column(no_wrap=True)
        grid.add_column(no_wrap=True, overflow="ellipsis", ratio=1)
        grid.add_column(no_wrap=True, justify="right", style="dim", min_width=28)
        for group in sorted(self.groups.values(), key=lambda g: g.world_size):
            fraction = group.fraction
            bar = ProgressBar(total=1.0, completed=fraction or 0.0, width=20, pulse=fraction is None)
            grid.add_row(
                Text(group.name),
                bar,
                Text(group.ranks_text()),
                Text(group.times_text()),
            )
        return grid

    def close(self) -> None:
        if self.live is not None:
            live, self.live = self.live, None
            live.stop()


def make_display(stream: TextIO, *, quiet: bool = False, color: bool = False, epochs: int = 1) -> Display:
    """``--quiet``: nothing; a terminal (not ``TERM=dumb``): the live display; else plain lines.

    ``color`` is the command's colour decision for this stream (``--color``, ``NO_COLOR``, ...).
    """
    import os

    if quiet:
        return Display(stream, epochs=epochs)
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty() and os.environ.get("TERM") != "dumb":
        return LiveDisplay(stream, epochs=epochs, color=color)
    return PlainDisplay(stream, epochs=epochs)
