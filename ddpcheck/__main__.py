"""``python -m ddpcheck`` is the CLI.

SIGINT and SIGTERM are turned into KeyboardInterrupt before anything else is imported, so an interrupt
at any moment ends with exit 130 and one line, never a traceback or a signal death.
"""

import signal
import sys

_seen: list[int] = []


def _interrupt(signum: int, frame: object) -> None:
    _seen.append(signum)
    if len(_seen) == 1:  # the first stops the import; the rest must not cut the exit short
        raise KeyboardInterrupt


try:
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    from ddpcheck.cli import main
except KeyboardInterrupt:
    for _ in range(10):  # see ddpcheck.cli.ignore_interrupts: SIG_IGN, absorbing one already on its way
        try:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            sum(range(100))
            break
        except OSError:
            continue
    print("ddpcheck: interrupted", file=sys.stderr)
    sys.exit(130)  # ddpcheck.exits.EXIT_INTERRUPTED, not imported: the package may be half imported here

sys.exit(main())
