"""Which batch each backward pass consumed, where the loop fetched batches ahead of its backward passes.

A loop is handed batches and runs backward passes; the step watcher notes, per backward, the batches
handed since the one before. Loops that fetch ahead (HF Trainer 5's ``get_batch_samples``, Accelerate's
``DataLoaderShard``, Lightning's prefetching fetcher) hand a batch before the backward that consumes it:
these functions give each backward the batch it consumed, where the shape of the handoffs says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ddpcheck.trace import MicroStep

Handoff = tuple[str, int, int]  # (loader, epoch, position)
Part = tuple[Handoff, int, "int | None"]  # a handoff, its samples (-1 unknown), its supervised labels


def one_batch_each(micro: Sequence[MicroStep], parts: Sequence[Sequence[Part]]) -> tuple[MicroStep, ...]:
    """The window's micro-steps, each with the batch its backward consumed where the loop fetched ahead.

    A loop that takes a window's batches before its first backward (HF Trainer 5's ``get_batch_samples``
    fetches every micro-batch of the window, then runs one forward and backward per batch) hands all of
    them to the first micro-step. Where every backward had a batch fetched for it (the handoffs so far
    never fall behind the backward passes) and the window holds exactly one batch per backward, the batches
    go to the micro-steps in order; any other shape stays as handed."""
    flat = [part for handed in parts for part in handed]
    if len(parts) != len(micro) or len(flat) != len(micro) or all(len(p) == 1 for p in parts):
        return tuple(micro)
    ahead = 0
    for handed in parts:
        ahead += len(handed) - 1
        if ahead < 0:
            return tuple(micro)
    return tuple(
        replace(m, loader=h[0], epoch=h[1], batches=(h[2],), samples=n, supervised=labelled)
        for m, (h, n, labelled) in zip(micro, flat, strict=True)
    )


def fetched_ahead(
    micro: Sequence[MicroStep], parts: Sequence[Sequence[Part]]
) -> tuple[MicroStep, ...] | None:
    """Every micro-step of the run with the batch its backward consumed, where the loader fetched ahead
    across steps (None: not that shape; each keeps what was handed since the backward before).

    A loader wrapped to look one batch ahead (Accelerate's ``DataLoaderShard``, Lightning's prefetching
    fetcher) hands batch k+1 before the loop receives batch k: the first backward sees two handoffs, the
    others one, the epoch's last none. Where the handoffs so far never fall behind the backward passes and
    the run handed exactly one batch per backward (or one more, fetched and never consumed, after a first
    backward that saw several), the batches go to the backward passes in order."""
    flat = [part for handed in parts for part in handed]
    count = len(micro)
    if count < 2 or len(parts) != count or all(len(p) == 1 for p in parts):
        return None
    if len(flat) != count and not (len(flat) == count + 1 and len(parts[0]) > 1):
        return None
    seen = 0
    for i, handed in enumerate(parts):
        seen += len(handed)
        if seen < i + 1 or len({h[:2] for h, _, _ in handed}) > 1:
            return None
    if not _one_stream([h for h, _, _ in flat]):
        return None
    return tuple(
        replace(m, loader=h[0], epoch=h[1], batches=(h[2],), samples=n, supervised=labelled)
        for m, (h, n, labelled) in zip(micro, flat, strict=False)
    )


def _one_stream(handoffs: Sequence[Handoff]) -> bool:
    """Whether the handoffs are whole epochs read in order: each epoch from position 0, one position at a
    time, never returned to (a peek at a batch before the loop, or two loaders at once, is not)."""
    done: set[tuple[str, int]] = set()
    for before, after in zip([None, *handoffs], handoffs, strict=False):
        if before is not None and before[:2] == after[:2]:
            if after[2] != before[2] + 1:
                return False
            continue
        if after[2] != 0 or after[:2] in done:
            return False
        done.add(after[:2])
    return True
