"""Small wording helpers so every check names ranks, ids and epochs the same way (counts: ``messages``)."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from ddpcheck.messages import short_id

MAX_EXAMPLES = 5


def few(items: Iterable[object], limit: int = MAX_EXAMPLES) -> tuple[object, ...]:
    """The ``limit`` smallest items, for stable examples whatever order a set hands them out in."""
    pool = list(items)
    try:
        return tuple(heapq.nsmallest(limit, pool))  # type: ignore[type-var]
    except TypeError:  # mixed id types: order by their text instead
        return tuple(heapq.nsmallest(limit, pool, key=repr))


def first(items: Iterable[object], limit: int = MAX_EXAMPLES) -> tuple[object, ...]:
    """The first ``limit`` items in the given order (for evidence where the order matters)."""
    out: list[object] = []
    for item in items:
        if len(out) == limit:
            break
        out.append(item)
    return tuple(out)


MAX_ID_CHARS = 40


def id_text(item: object) -> str:
    """One id as a detail line shows it: a content hash (16+ digits) in its short form, a long id cut,
    so a line of five examples stays one readable line."""
    if type(item) is int and abs(item) >= 10**15:
        return short_id(item)
    text = str(item)
    return text if len(text) <= MAX_ID_CHARS else text[: MAX_ID_CHARS - 3] + "..."


def ids_text(items: Sequence[object]) -> str:
    return ", ".join(id_text(i) for i in items)


def ranks_text(ranks: Sequence[int], limit: int = 6) -> str:
    """``rank 1`` / ``ranks 1 and 3`` / ``ranks 0, 1, 2 and 5 more``."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) <= limit:
        return f"ranks {', '.join(map(str, ranks[:-1]))} and {ranks[-1]}"
    return f"ranks {', '.join(map(str, ranks[:limit]))} and {len(ranks) - limit} more"


def epochs_text(epochs: Sequence[int]) -> str:
    return f"epoch {epochs[0]}" if len(epochs) == 1 else f"epochs {', '.join(map(str, epochs))}"
