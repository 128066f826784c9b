"""Every exit code ddpcheck's commands end with, in one place (plain data: nothing of ddpcheck imported).

``ddpcheck``, ``ddpcheck run`` and ``ddpcheck judge``: 0 every check passed, 1 a check failed, 2 bad input
or usage, 3 a rank failed, 130 interrupted (Ctrl-C or SIGTERM). ``python -m ddpcheck.record`` (inside the
user's own launch) speaks the same numbers of what it does: 0 recorded, 2 bad usage, 3 the script failed,
and with ``--fingerprint`` 1 when an epoch is not every index exactly once.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_RANK_FAILED = 3
EXIT_INTERRUPTED = 130

EXIT_SCRIPT_FAILED = EXIT_RANK_FAILED  # ddpcheck.record: the script raised, exited non-zero, iterated nothing
EXIT_FINGERPRINT_FAILED = EXIT_CHECK_FAILED  # ddpcheck.record --fingerprint: an epoch's ids are not each once
