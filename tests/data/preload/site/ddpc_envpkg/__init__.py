"""A package that reads OMP_NUM_THREADS and sets a variable of its own at import."""

import os

seen = os.environ.get("OMP_NUM_THREADS")
os.environ["DDPC_ENVPKG_WAS_HERE"] = "1"
