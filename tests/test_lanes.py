"""The suite's lanes (tests/conftest.py): README command 2, what CI runs, leaves out the tests marked
``release``; ``--release`` and a node id named on the command line bring them back."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

RELEASE_TEST = "tests/test_plugin.py::test_junit_families[xunit2]"  # in RELEASE_ONLY
KEPT_TEST = "tests/test_plugin.py::test_junit_families[xunit1]"  # its family's test in the CI lane


def _collected(*args: str) -> list[str]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            *args,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return [line for line in proc.stdout.splitlines() if "::" in line]


def test_the_ci_lane_leaves_out_release_tests_and_keeps_their_familys_test() -> None:
    ids = _collected("tests/test_plugin.py")
    assert KEPT_TEST in ids and RELEASE_TEST not in ids


def test_release_and_a_named_node_id_bring_them_back() -> None:
    assert RELEASE_TEST in _collected("--release", "tests/test_plugin.py")
    assert _collected(RELEASE_TEST) == [RELEASE_TEST]
