"""One readable line out of any text or exception, and counted nouns: how every message of ddpcheck reads.

Plain string work, imported by the command line before torch and by ranks alike.
"""

from __future__ import annotations


def one_line(text: str, limit: int) -> str:
    """The first line of ``text``, cut to ``limit`` characters with a count of what was cut."""
    first = text.splitlines()[0] if text.strip() else text
    if len(first) <= limit:
        return first
    return f"{first[:limit]}... ({len(first) - limit:,} more characters)"


def exception_text(exc: BaseException) -> str:
    """``str(exc)``, stripped; an exception whose ``__str__`` raises says so instead of raising again."""
    try:
        return str(exc).strip()
    except Exception as broken:
        return f"<{type(exc).__name__}: str() raised {type(broken).__name__}>"


def singular(noun: str) -> str:
    """``samples`` -> ``sample``, ``batches`` -> ``batch``, ``padding copies`` -> ``padding copy``."""
    for plural, one in (("ches", "ch"), ("ies", "y"), ("s", "")):
        if noun.endswith(plural):
            return noun[: -len(plural)] + one
    return noun


def count_text(n: int, noun: str) -> str:
    """``1 sample`` / ``3 samples``; ``noun`` is the plural."""
    return f"{n} {singular(noun) if n == 1 else noun}"
