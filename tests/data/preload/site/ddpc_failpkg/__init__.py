"""A package whose import fails."""

raise RuntimeError("ddpc_failpkg cannot be imported here")
