"""ddpcheck's pytest plugin, and checking a loader from a test: ``from ddpcheck.pytest_plugin import
assert_ddp_safe``.

``plugin`` is the pytest surface only (hooks, options, fixtures; the ``pytest11`` entry point), as in
pytest-xdist's ``plugin.py``. The machinery beside it: ``marker`` reads ``@pytest.mark.ddp`` and the
command line, ``options`` the ini keys, ``ranks`` runs a test body in every rank of a process group,
``failure`` turns a failed group into one readable pytest failure, ``check`` runs the full checker on a
loader (``assert_ddp_safe``, the ``ddpcheck`` fixture's object), ``junit`` adds its test properties.
Nothing here imports torch until a marked test runs.
"""

from __future__ import annotations

from ddpcheck.pytest_plugin.check import (
    CheckSession,
    DdpCheck,
    DdpCheckFailed,
    LoaderSource,
    assert_ddp_safe,
    check_options,
    current_session,
    failure_summary,
    loader_spec,
    record,
    report_stem,
    result_properties,
    run_check,
    running_item,
)

__all__ = [
    "CheckSession",
    "DdpCheck",
    "DdpCheckFailed",
    "LoaderSource",
    "assert_ddp_safe",
    "check_options",
    "current_session",
    "failure_summary",
    "loader_spec",
    "record",
    "report_stem",
    "result_properties",
    "run_check",
    "running_item",
]
