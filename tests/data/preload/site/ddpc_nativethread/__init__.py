"""A package that starts a native (non-Python) thread at import: faulthandler's watchdog."""

import faulthandler

faulthandler.dump_traceback_later(3600)


def stop() -> None:
    faulthandler.cancel_dump_traceback_later()
