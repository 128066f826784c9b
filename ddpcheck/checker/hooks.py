"""The loader file's hooks, read once.

A loader file may define, beside its factory, hooks that change how a rank treats its loader
(:data:`ddpcheck.checker.loaderfile.HOOKS`); :class:`LoaderHooks` reads them off the imported module
once, so every user of an opened loader (recording, the scenarios, a script's recorder) calls the same
ones. Where a loader keeps the state a resume restores, and how it is saved and loaded, is
:mod:`ddpcheck.checker.state`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ddpcheck.checker.loaderfile import optional_hook
from ddpcheck.checker.work import TOKEN_HOOK, WORK_HOOK

SAMPLE_IDS_HOOK = "sample_ids"  # sample_ids(batch) -> the batch's sample ids
SET_EPOCH_HOOK = "set_epoch"  # loader file hook: set_epoch(loader, epoch), what the user's loop calls
RESUME_HOOK = "resume_loader"
SAVE_HOOK = "save_state"  # what a rank writes to its checkpoint (scenarios.resume)
LOAD_HOOK = "load_state"  # what a rank restores from every old rank's checkpoint

Hook = Callable[..., Any]


@dataclass(frozen=True)
class LoaderHooks:
    """The hooks a loader file defines (None where it defines none), read once from its module."""

    sample_ids: Hook | None = None
    set_epoch: Hook | None = None
    resume: Hook | None = None
    save: Hook | None = None
    load: Hook | None = None
    work: Hook | None = None
    tokens: Hook | None = None
    forward: Hook | None = None
    metric: Hook | None = None
    make_model: Hook | None = None
    loss: Hook | None = None

    @classmethod
    def of(cls, module: ModuleType | None) -> LoaderHooks:
        """The hooks ``module`` defines (none for None: a loader with no loader file)."""
        if module is None:
            return cls()
        names = {
            "sample_ids": SAMPLE_IDS_HOOK, "set_epoch": SET_EPOCH_HOOK, "resume": RESUME_HOOK,
            "save": SAVE_HOOK, "load": LOAD_HOOK, "work": WORK_HOOK, "tokens": TOKEN_HOOK,
            "forward": "forward", "metric": "metric", "make_model": "make_model", "loss": "loss",
        }  # fmt: skip
        return cls(**{field: optional_hook(module, name) for field, name in names.items()})
