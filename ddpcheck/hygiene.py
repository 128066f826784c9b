"""Process hygiene for the command: signals, standard streams, garbage collection, the way out.

The command (:mod:`ddpcheck.cli`) installs these before importing torch or the checker, so an interrupt,
a closed pipe or an exit handler that blocks can never cost a report or turn into a traceback.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import signal
import sys
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any, NoReturn

INTERRUPTS = (signal.SIGINT, signal.SIGTERM)


class ForgivingStream:
    """stderr that a closed pipe, a closed descriptor or a full disk cannot turn into a traceback or
    another exit code (``ddpcheck ... 2>&1 | head -1``): what cannot be written is dropped. The
    reports on disk and the exit code carry the result."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except (OSError, ValueError):
            self._drop()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except (OSError, ValueError):
            self._drop()

    def _drop(self) -> None:
        self._stream = open(os.devnull, "w")  # noqa: SIM115 - stands in for stderr until exit

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def sane_standard_streams() -> None:
    """Descriptors 0-2 that were closed at start point at /dev/null (so no file or socket of ours, and
    no rank, ever takes their number); stderr forgives a reader that went away."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            try:
                null = os.open(os.devnull, os.O_RDWR)
                if null != fd:
                    os.dup2(null, fd)
                    os.close(null)
            except OSError:
                pass
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    if not isinstance(sys.stderr, ForgivingStream):
        sys.stderr = ForgivingStream(sys.stderr if sys.stderr is not None else open(os.devnull, "w"))  # noqa: SIM115


class Interrupts:
    """SIGINT/SIGTERM policy: the first raises KeyboardInterrupt (the run stops, ranks are cleaned up);
    those that follow within ``GRACE`` seconds, or at any time once reports are being written, are only
    noted, so neither cleanup nor a report write is cut short; the exit code is 130 either way.

    A signal mask would not do: torch and the launch layer run threads, and a signal delivered to any
    of them still makes the main thread's Python handler run.
    """

    GRACE = 10.0

    def __init__(self) -> None:
        self.first: float | None = None
        self.noted: list[int] = []
        self.publishing = False
        self.swallowed = False

    def handle(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if self.publishing or (self.first is not None and now - self.first < self.GRACE):
            self.noted.append(signum)
            return
        self.first = now
        raise KeyboardInterrupt

    def unraisable(self, info: Any) -> None:
        """A KeyboardInterrupt that landed where Python swallows exceptions (an at-fork hook, ``__del__``)
        would be lost with a stray traceback: keep quiet and raise it at the next progress line."""
        if info.exc_type is not KeyboardInterrupt:
            self.previous_hook(info)
        elif not self.publishing:
            self.swallowed = True

    def checkpoint(self) -> None:
        """Called by the runner's progress lines, a point where an interrupt is handled properly."""
        if self.swallowed and not self.publishing:
            self.swallowed = False
            raise KeyboardInterrupt

    previous_hook: Any = staticmethod(sys.__unraisablehook__)

    @property
    def happened(self) -> bool:
        return self.first is not None or bool(self.noted)


interrupts = Interrupts()  # replaced by install_signal_handlers; read it as hygiene.interrupts


def install_signal_handlers() -> dict[int, Any]:
    """SIGINT and SIGTERM go to :class:`Interrupts` from here on; returns the previous handlers."""
    global interrupts
    interrupts = Interrupts()
    interrupts.previous_hook = sys.unraisablehook
    sys.unraisablehook = interrupts.unraisable
    previous: dict[int, Any] = {}
    for signum in INTERRUPTS:
        previous[signum] = signal.getsignal(signum)
        signal.signal(signum, interrupts.handle)
    return previous


def exit_now(code: int) -> NoReturn:
    """End the process without tearing the interpreter down: with torch imported that teardown costs
    0.3-0.6 s and does nothing a finished command needs. Exit handlers (``atexit``, weakref finalizers,
    logging) still run, and output is flushed; nothing of ddpcheck's own is left to clean up here.
    """
    import threading

    # exit handlers that imported libraries registered may block: they get a few seconds, not forever
    threading.Timer(EXIT_HANDLERS_S, os._exit, (code,)).start()
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed pipe (``ddpcheck ... | head``), a stream that is None
                pass
        os._exit(code)


EXIT_HANDLERS_S = 5.0


def ignore_interrupts() -> None:
    """SIG_IGN for both, so interpreter shutdown (which resets Python handlers) cannot die by a signal.

    A signal that arrived just before is still handled once afterwards, and with SIG_IGN in place Python
    reports it as an OSError ("ignored due to race condition"): absorb it at a checkpoint here.
    """
    for _ in range(10):
        try:
            for signum in INTERRUPTS:
                signal.signal(signum, signal.SIG_IGN)
            sum(range(100))  # a point where Python processes a signal that was already on its way
            return
        except (OSError, KeyboardInterrupt):
            continue


@contextlib.contextmanager
def gc_paused(*, freeze: bool) -> Iterator[None]:
    """No cyclic garbage collection while torch is imported: a collection then walks over up to a
    million objects that all stay alive (50-90 ms each, several per import). ``freeze`` (the command's
    own process) moves what was imported out of collection for good, so the first collection
    afterwards does not walk it either (see ``ddpcheck.launch.preload.frozen_heap``)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if enabled:
            gc.enable()
