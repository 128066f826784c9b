"""One readable line out of any text or exception, and counted nouns: how every message of ddpcheck reads.

Plain string work, imported by the command line before torch and by ranks alike.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

# a content hash as ddpcheck.checker.identity makes them (63 bits): 16 to 19 digits standing alone
_HASH_ID = re.compile(r"(?<![\w#.:/-])\d{16,19}(?![\w.:/-])")


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


def short_id(value: int) -> str:
    """``#1a2b3c4``: a content-hash identity as people read it (seven hex digits, as git shortens a
    commit), instead of its 19-digit integer."""
    return "#" + f"{value % (1 << 64):016x}"[:7]


def short_hash_ids(text: str) -> str:
    """``text`` with every content-hash identity in it (a 16- to 19-digit integer standing alone) shown by
    :func:`short_id`: ``1087362260100484431, 2879755579529241734`` -> ``#0f17..., #27f4...``."""
    return _HASH_ID.sub(lambda m: short_id(int(m.group())), text)


def listed(label: str, items: Sequence[object], limit: int = 8) -> str:
    """``never seen: 0, 1, 4`` / ``never seen: 0, 1, 2 ... (10 in all)``: examples named for what they
    are, so ids cannot be read as the number before them (``at most 0 may be dropped: 0, 1, 4``)."""
    shown = ", ".join(str(item) for item in items[:limit])
    more = f" ... ({len(items)} in all)" if len(items) > limit else ""
    return f"{label}: {shown}{more}"


def spans(numbers: Iterable[int], limit: int = 12) -> str:
    """``0-23`` for a run of consecutive numbers, ``0, 2, 5-7`` otherwise; past ``limit`` runs, the rest
    counted (``... (+2040 more)``), so 4096 ranks read as one line."""
    ordered = sorted(dict.fromkeys(numbers))
    runs: list[tuple[int, int]] = []
    for n in ordered:
        if runs and n == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], n)
        else:
            runs.append((n, n))

    def said(first: int, last: int) -> str:
        return str(first) if first == last else f"{first}-{last}" if last > first + 1 else f"{first}, {last}"

    shown = ", ".join(said(*run) for run in runs[:limit])
    if len(runs) <= limit:
        return shown
    return f"{shown} ... (+{sum(last - first + 1 for first, last in runs[limit:])} more)"
