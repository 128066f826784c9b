"""A package that installs its own SIGTERM handler at import."""

import signal


def _on_term(signum, frame):
    raise SystemExit(143)


signal.signal(signal.SIGTERM, _on_term)
