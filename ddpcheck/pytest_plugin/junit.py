"""ddpcheck's test properties in pytest's JUnit XML, valid under every ``junit_family``.

Per-test ``<properties>`` exist only in the ``xunit1`` (``legacy``) schema; under the default
``xunit2`` they make the file invalid for strict consumers (junit-10.xsd). The plugin always records
its values as the test's ``user_properties`` (other reporters read them too); where the XML is written
(the only process, or the xdist controller) :class:`SuiteProperties` moves them, just before pytest's
junitxml sees the report, into the suite's ``<properties>`` named ``<nodeid>::<name>``, as
``record_testsuite_property`` would.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

PER_TEST_FAMILIES = ("xunit1", "legacy")
PREFIXES = ("ddpcheck.", "ddpcheck#", "ddp.")  # the names this plugin records, and only those


def add_properties(item: Any, pairs: Iterable[tuple[str, str]]) -> None:
    properties = getattr(item, "user_properties", None)
    if properties is not None:
        properties.extend(pairs)


def needs_relocation(config: pytest.Config) -> bool:
    """This process writes JUnit XML of a family without per-test properties."""
    if not getattr(config.option, "xmlpath", None) or hasattr(config, "workerinput"):
        return False
    try:
        return str(config.getini("junit_family")) not in PER_TEST_FAMILIES
    except ValueError:  # junitxml disabled (-p no:junitxml)
        return False


class SuiteProperties:
    """Registered by the plugin where :func:`needs_relocation` holds."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        ours = [(n, v) for n, v in report.user_properties if str(n).startswith(PREFIXES)]
        if not ours:
            return
        report.user_properties = [(n, v) for n, v in report.user_properties if (n, v) not in ours]
        if report.when != "teardown":  # junitxml writes properties from the teardown report
            return
        xml = _log_xml(self.config)
        if xml is not None:
            for name, value in ours:
                xml.add_global_property(f"{report.nodeid}::{name}", str(value))


def _log_xml(config: pytest.Config) -> Any:
    try:
        from _pytest.junitxml import xml_key
    except ImportError:  # pragma: no cover - pytest moved it; the properties are then left out
        return None
    return config.stash.get(xml_key, None)
