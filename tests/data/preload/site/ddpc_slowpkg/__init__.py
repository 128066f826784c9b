"""A package that is slow to import and says which process imported it (see tests/test_preload.py)."""

import os
import time

time.sleep(0.5)
_log = os.environ.get("DDPC_PRELOAD_LOG")
if _log:
    with open(_log, "a", encoding="utf-8") as handle:
        handle.write(f"{os.getpid()}\n")
