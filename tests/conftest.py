"""Paths every test module shares (import them: ``from tests.conftest import FIXTURES``)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository
FIXTURES = ROOT / "fixtures"  # example loader files, good and buggy
FRAMEWORKS = FIXTURES / "frameworks"  # loaders built with real libraries
RESUME_FIXTURES = FIXTURES / "resume"
DATA = ROOT / "tests" / "data"  # loader files only the tests use
HOSTILE = DATA / "hostile"
GOOD = FIXTURES / "good_distributed_sampler.py"  # the textbook loader: passes everything
JUNIT_XSD = ROOT.parent / "shared" / "schemas" / "junit-10.xsd"  # the JUnit schema CI systems read
