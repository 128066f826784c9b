"""The tokens a rank hands its model, read where the model is called (issue 42).

A context-parallel rank is handed whole sequences by its loader and slices them in the loop before the
forward (contiguous, or head-tail for load balance); what reached the model is only known at the model's
call. The step watcher keeps, per compared micro-step, the ``input_ids``, ``position_ids`` and ``labels``
of the batch handed and of the model's outermost forward (keyword arguments, positional ones bound to the
forward's names, or a dict given whole) as plain integer rows. Nothing here judges them:
:mod:`ddpcheck.checks.sequence_split` does.
"""

from __future__ import annotations

import inspect
from array import array
from collections.abc import Mapping
from typing import Any

from ddpcheck.trace import TokenRows

KEYS = ("input_ids", "position_ids", "labels")
FEED_LIMIT = 1 << 16  # values kept per key and micro-step: a longer feed is left out (the check says so)

Tokens = tuple[tuple[str, TokenRows], ...]


def token_rows(value: Any) -> TokenRows | None:
    """A 1-D (one row) or 2-D integer tensor as rows; None for anything else, or beyond FEED_LIMIT values."""
    import torch

    if not isinstance(value, torch.Tensor) or hasattr(value, "to_local") or value.dim() not in (1, 2):
        return None
    if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
        return None
    if value.numel() > FEED_LIMIT:
        return None
    rows = value.detach().reshape(1, -1) if value.dim() == 1 else value.detach()
    values = array("q")
    values.frombytes(rows.to(device="cpu", dtype=torch.int64).contiguous().numpy().tobytes())
    return TokenRows(int(rows.shape[0]), int(rows.shape[1]), values)


def _found(source: Mapping[str, Any] | Any) -> Tokens:
    out = []
    for key in KEYS:
        try:
            value = source[key] if key in source else None  # noqa: SIM401 - BatchEncoding, UserDict
        except Exception:
            value = None
        rows = token_rows(value) if value is not None else None
        if rows is not None:
            out.append((key, rows))
    return tuple(out)


def batch_tokens(batch: Any) -> Tokens:
    """The token tensors of a handed batch (a dict, a ``BatchEncoding``, a tuple whose first item is one)."""
    from ddpcheck.checker.work import token_view

    view = token_view(batch)
    if isinstance(view, Mapping) or (hasattr(view, "keys") and hasattr(view, "__getitem__")):
        return _found(view)
    return ()


def forward_tokens(module: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tokens:
    """The token tensors a model's forward was given: by keyword, by the forward's own parameter names
    for positional arguments, or inside a dict passed as the first argument."""
    given: dict[str, Any] = {k: v for k, v in kwargs.items() if k in KEYS}
    if args:
        if len(args) == 1 and isinstance(args[0], Mapping) and not given:
            return _found(args[0])
        given.update({k: v for k, v in _bound(module, args).items() if k in KEYS and k not in given})
    return _found(given)


def _bound(module: Any, args: tuple[Any, ...]) -> dict[str, Any]:
    """Positional arguments by the names of the wrapped model's forward (DDP's takes ``*inputs``)."""
    from ddpcheck.checker.models import unwrap_model

    try:
        parameters = list(inspect.signature(unwrap_model(module).forward).parameters.values())
    except (TypeError, ValueError):
        return {}
    named = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return dict(zip(named, args, strict=False))
