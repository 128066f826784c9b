"""The report formats by name: plain data, cheap to import (the command line's parser lists them)."""

from __future__ import annotations

from typing import Literal, cast, get_args

Format = Literal["table", "json", "markdown", "junit", "html", "github"]
FORMATS: tuple[str, ...] = get_args(Format)
PRINTED: tuple[str, ...] = ("table", "json", "markdown", "github")  # what the command prints on stdout


def check_format(fmt: object) -> Format:
    """``fmt`` itself when it names a report format, else a ValueError that lists the valid ones."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown report format {fmt!r}; expected one of: {', '.join(FORMATS)}")
    return cast(Format, fmt)
