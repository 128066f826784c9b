"""A package that starts a Python thread at import, as some telemetry or prefetch libraries do."""

import threading

_stop = threading.Event()
worker = threading.Thread(target=_stop.wait, name="ddpc-threadpkg-worker", daemon=True)
worker.start()


def stop() -> None:
    _stop.set()
    worker.join(timeout=5)
