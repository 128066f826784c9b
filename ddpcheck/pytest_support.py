"""Checking a loader from a test: ``from ddpcheck.pytest_support import assert_ddp_safe``.

The public face of :mod:`ddpcheck.plugin.check`, where the machinery lives (the pytest plugin's
hooks are in :mod:`ddpcheck.pytest_plugin`). ``assert_ddp_safe`` runs the full checker (real gloo
ranks at every world size) on a module-level loader factory or a loader file and fails with the
report table; relative loader paths resolve against pytest's rootdir.
"""

from __future__ import annotations

from ddpcheck.plugin.check import (
    DdpCheck,
    DdpCheckFailed,
    LoaderSource,
    assert_ddp_safe,
    check_options,
    failure_summary,
    loader_spec,
    plugin_session,
    record,
    report_stem,
    result_properties,
    run_check,
    running_item,
)

__all__ = [
    "DdpCheck",
    "DdpCheckFailed",
    "LoaderSource",
    "assert_ddp_safe",
    "check_options",
    "failure_summary",
    "loader_spec",
    "plugin_session",
    "record",
    "report_stem",
    "result_properties",
    "run_check",
    "running_item",
]
