"""Setting the epoch as a training loop does, and watching which parts of the loader it reached.

The set_epoch policy of an opened loader (:meth:`ddpcheck.checker.face.OpenedLoader.set_epoch`) calls
:func:`loop_set_epoch`; recording's first epoch calls :func:`first_set_epoch`, which also names the
parts the call never reached (the reshuffle check blames them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from ddpcheck.checker.facts import distinct, sampling_parts
from ddpcheck.checker.loaderfile import call_by_name, unwrap_loader


def loop_set_epoch(outer: Any, epoch: int, hook: Callable[..., Any] | None = None) -> None:
    """What a training loop calls before an epoch, no more: the loader file's ``set_epoch(loader,
    epoch)`` hook when it defines one; else the loader's own ``set_epoch`` when it has one (a framework
    loader such as Accelerate's decides what it forwards); else ``set_epoch`` on the loader's sampler,
    its batch sampler and the sampler that one chunks (as Lightning and transformers' Trainer reach
    them), and its dataset. Reaching deeper would hide a loader that never forwards the call."""
    if hook is not None:
        call_by_name(hook, {"loader": outer, "epoch": epoch})
        return
    setter = getattr(outer, "set_epoch", None)
    if callable(setter):
        setter(epoch)
        return
    loader = unwrap_loader(outer)
    batch_sampler = getattr(loader, "batch_sampler", None)
    parts = (
        getattr(loader, "sampler", None),
        batch_sampler,
        getattr(batch_sampler, "sampler", None),
        getattr(loader, "dataset", None),
    )
    for part in distinct(*parts):
        part_setter = getattr(part, "set_epoch", None)
        if callable(part_setter):
            part_setter(epoch)


def first_set_epoch(outer: Any, hook: Callable[..., Any] | None = None) -> str:
    """Epoch 0's :func:`loop_set_epoch`, watching every part of the loader that has a ``set_epoch``:
    returns the ones the call never reached (``"MyBatchSampler"``; "" when it reached all). Such a part
    keeps its first epoch's order whatever the loop does: the reshuffle check names it."""
    loader = unwrap_loader(outer)
    parts = [
        p
        for p in distinct(*sampling_parts(loader), getattr(loader, "dataset", None))
        if p is not outer and callable(getattr(p, "set_epoch", None))
    ]
    reached: list[Any] = []
    spied: list[Any] = []
    for part in parts:
        original = part.set_epoch

        def spy(epoch: int, *args: Any, _part: Any = part, _original: Any = original, **kwargs: Any) -> Any:
            reached.append(_part)
            return _original(epoch, *args, **kwargs)

        try:
            object.__setattr__(part, "set_epoch", spy)  # shadows the method on this instance only
            spied.append(part)
        except (AttributeError, TypeError):  # __slots__: cannot be watched, so not blamed either
            reached.append(part)
    try:
        loop_set_epoch(outer, 0, hook)
    finally:
        for part in spied:
            with contextlib.suppress(AttributeError, TypeError):
                object.__delattr__(part, "set_epoch")
    missed = [type(p).__name__ for p in parts if not any(p is r for r in reached)]
    return ", ".join(dict.fromkeys(missed))
