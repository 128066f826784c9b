"""A loader's data state: where it lives, and saving and loading it as a checkpoint does.

:func:`resume_mechanism` names where the state lives, in the documented order the resume check follows;
:class:`LoaderState` saves and loads it there as a trainer's checkpoint would: the loader file's
``save_state(loader, rank, world_size)`` (what that rank writes; ``None`` when it writes nothing) and
``load_state(loader, states, rank, world_size)`` (every old rank's value) when it defines them, else
the holder's ``state_dict``/``load_state_dict`` (rank r loads old rank r's); through
``torch.save``/``torch.load``, or with ``--dcp`` through ``torch.distributed.checkpoint``, every rank
together.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import Any

from ddpcheck.checker.hooks import LoaderHooks
from ddpcheck.checker.loaderfile import call_by_name, unwrap_loader
from ddpcheck.restores import State


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


def state_holder(outer: Any, mechanism: str) -> Any:
    """The part of the loader whose ``state_dict``/``load_state_dict`` a checkpoint saves and loads, by
    the name :func:`resume_mechanism` gave it."""
    loader = unwrap_loader(outer)
    if mechanism == "loader" or mechanism in ("hook", "hooks"):
        return outer if has_state(outer) else loader
    if mechanism == "batch_sampler.sampler":
        return loader.batch_sampler.sampler
    return getattr(loader, mechanism)


class LoaderState:
    """One opened loader's data state, saved and loaded as a checkpoint does (see the module docstring).

    ``outer``: what the loop iterates; ``hooks``: the loader file's; ``place``: what its hooks may name of
    this rank (:func:`ddpcheck.checker.recipe.rank_offer`); ``mechanism``: where the state lives;
    ``dcp``: through ``torch.distributed.checkpoint``.
    """

    def __init__(
        self, outer: Any, hooks: LoaderHooks, place: dict[str, int], mechanism: str, *, dcp: bool = False
    ) -> None:
        self.outer, self.hooks, self.place, self.mechanism, self.dcp = outer, hooks, place, mechanism, dcp

    def holder(self) -> Any:
        return state_holder(self.outer, self.mechanism)

    def save(self, where: str = "") -> State:
        """What this rank writes to its checkpoint: the ``save_state`` hook's value, else the holder's
        ``state_dict()``, through ``torch.save``; with DCP and ``where``, every rank saves
        ``{"dataloader": obj}`` there together (a collective) and the state names the checkpoint."""
        if self.dcp and where:
            import torch.distributed.checkpoint as dcp

            dcp.save({"dataloader": self._stateful()}, checkpoint_id=where)
            return f"{where}#{self.place['rank']}"  # one string per rank, so a global state is not mistaken
        save = self.hooks.save
        if save is not None:
            value = call_by_name(save, {"loader": self.outer, **self.place})
            return None if value is None else _save(value)
        return _save(self.holder().state_dict())

    def load(self, states: Sequence[State]) -> str:
        """Restore as ddpcheck does by default: DCP's load, the ``load_state`` hook, or rank r loads old
        rank r's state (a rank with no old counterpart starts without one). Returns a note ("" none)."""
        rank = self.place["rank"]
        own = states[rank] if rank < len(states) else None
        if self.dcp:
            import torch.distributed.checkpoint as dcp

            path = next((s for s in states if isinstance(s, str)), None)
            if path is not None:  # every rank of the group loads (a collective), from the one checkpoint
                dcp.load({"dataloader": self._stateful()}, checkpoint_id=path.rpartition("#")[0])
            return ""
        load = self.hooks.load
        if load is not None:
            values, note = loaded(states)
            call_by_name(load, {"loader": self.outer, "states": values, **self.place})
            return note
        if not isinstance(own, bytes):
            return ""
        saved, note = _load(own)
        self.holder().load_state_dict(saved)
        return note

    def _stateful(self) -> Any:
        """What DCP saves and loads: ``save_state``'s value when it is ``Stateful``, else the holder."""
        save = self.hooks.save
        if save is not None:
            value = call_by_name(save, {"loader": self.outer, **self.place})
            if has_state(value):
                return value
        return self.holder()


def loaded(states: Sequence[State]) -> tuple[list[Any], str]:
    """Every old rank's value as ``torch.load`` gives it (None where it saved nothing), and a note."""
    values, note = [], ""
    for data in states:
        value, why = _load(data) if isinstance(data, bytes) else (None, "")
        values.append(value)
        note = note or why
    return values, note


def user_order(resume_hook: Callable[..., Any] | None) -> bool:
    """The file's ``resume_loader`` names ``state`` or ``states``: it restores in the user's order."""
    import inspect

    try:
        params = inspect.signature(resume_hook).parameters if resume_hook is not None else {}
    except (TypeError, ValueError):
        return False
    return "state" in params or "states" in params


def _save(state: Any) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def _load(data: bytes) -> tuple[Any, str]:
    """As a checkpoint is loaded: ``weights_only=True`` (torch's default) first."""
    import torch

    try:
        return torch.load(io.BytesIO(data), weights_only=True), ""
    except Exception as exc:
        note = f"the state loads only with torch.load(weights_only=False) ({type(exc).__name__})"
        return torch.load(io.BytesIO(data), weights_only=False), note
