"""The plugin's settings: ``--ddp-*`` options, else the ``ddp_*`` ini keys (pytest.ini, pyproject.toml's
``[tool.pytest.ini_options]``, tox.ini, setup.cfg), else each marker's own value, as pytest-timeout does.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import pytest

from ddpcheck.pytest_plugin.marker import (
    MarkerError,
    Overrides,
    check_backend,
    check_timeout,
    parse_world_sizes,
)


def parse_timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise MarkerError(f"timeout must be a positive number of seconds, got {text!r}") from None
    return check_timeout(value)


# (option dest, ini key, parser): the command line wins over the ini file
SETTINGS: tuple[tuple[str, str, Callable[[str], Any]], ...] = (
    ("ddp_world_sizes", "ddp_world_sizes", parse_world_sizes),
    ("ddp_backend", "ddp_backend", check_backend),
    ("ddp_timeout", "ddp_timeout", parse_timeout),
    ("ddp_max_time", "ddp_max_time", parse_timeout),
)
INI_HELP = {
    "ddp_world_sizes": "world sizes for every @pytest.mark.ddp test instead of the marker's, e.g. 1,2",
    "ddp_backend": "process group backend for every @pytest.mark.ddp test (gloo or nccl)",
    "ddp_timeout": "seconds a rank of every @pytest.mark.ddp test may go without progress",
    "ddp_max_time": "seconds every @pytest.mark.ddp test's process group may run in all",
}


def argtype(check: Callable[[str], Any]) -> Callable[[str], Any]:
    """A marker validator as an argparse ``type``: a bad value is pytest's one-line usage error."""

    def convert(text: str) -> Any:
        try:
            return check(text)
        except MarkerError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def add_ini(parser: pytest.Parser) -> None:
    for _dest, key, _check in SETTINGS:
        parser.addini(key, INI_HELP[key], default="")


def overrides(config: pytest.Config) -> Overrides:
    """The command-line values, else the ini file's; a bad ini value is a UsageError naming the key."""
    found: dict[str, Any] = {}
    for dest, key, check in SETTINGS:
        value = config.getoption(dest)
        if value is None:
            text = str(config.getini(key) or "").strip()
            if text:
                try:
                    value = check(text)
                except MarkerError as exc:
                    where = config.inipath or "the ini file"
                    raise pytest.UsageError(f"{key} in {where}: {exc}") from None
        found[dest] = value
    return Overrides(
        world_sizes=found["ddp_world_sizes"],
        backend=found["ddp_backend"],
        timeout=found["ddp_timeout"],
        max_time=found["ddp_max_time"],
    )
