"""The loader file's hooks, read once, and where a loader keeps the state a resume restores.

A loader file may define, beside its factory, hooks that change how a rank treats its loader
(:data:`ddpcheck.checker.loaderfile.HOOKS`); :class:`LoaderHooks` reads them off the imported module
once, so every user of an opened loader (recording, the scenarios, a script's recorder) calls the same
ones. The names of the resume hooks are here too: the resume scenario imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ddpcheck.checker.loaderfile import optional_hook, unwrap_loader
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


def has_state(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def usable_state(obj: Any) -> bool:
    """``state_dict``/``load_state_dict`` exist and ``state_dict()`` works on the fresh object.

    Accelerate's ``DataLoaderShard`` has both methods whatever its configuration, and they raise
    unless it was built with ``use_stateful_dataloader=True``: such a loader has no state to resume.
    """
    if not has_state(obj):
        return False
    try:
        obj.state_dict()
    except Exception:
        return False
    return True


def resume_mechanism(outer: Any, resume_hook: Any, save_hook: Any = None, load_hook: Any = None) -> str:
    """Where the data state lives, in the documented order (the resume check); "" when nowhere.

    "loader" (the loader or its framework wrapper, e.g. torchdata's ``StatefulDataLoader``),
    "batch_sampler", "sampler", "batch_sampler.sampler", "hook" (the file's ``resume_loader``) or
    "hooks" (the file's ``save_state`` and ``load_state`` carry a state no part of the loader has).
    A file that defines ``save_state``/``load_state`` says there is a state: a part whose fresh
    ``state_dict()`` raises (it reads a position set by ``__iter__``) then still holds it.
    """
    from torch.utils.data import DataLoader

    loader = unwrap_loader(outer)
    batch_sampler = getattr(loader, "batch_sampler", None)
    parts = (
        *(("loader", obj) for obj in (outer, loader) if type(obj) is not DataLoader),
        ("batch_sampler", batch_sampler),
        ("sampler", getattr(loader, "sampler", None)),
        ("batch_sampler.sampler", getattr(batch_sampler, "sampler", None)),
    )
    for name, part in parts:
        if part is not None and usable_state(part):
            return name
    hooks = save_hook is not None or load_hook is not None
    for name, part in parts if hooks else ():
        if part is not None and has_state(part):
            return name
    if resume_hook is not None:
        return "hook"
    return "hooks" if save_hook is not None and load_hook is not None else ""
