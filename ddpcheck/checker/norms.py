"""Batch normalisation in a replay: each rank's part of the union normalised by that part's statistics.

DDP without SyncBatchNorm normalises every rank's batch by the rank's own mean and variance; the
ImageNet references (pytorch/examples, torchvision, timm) train that way on purpose. One process fed the
union of the ranks' batches would normalise it by the global statistics: another computation, not the
ranks' bug. So while a replay runs a compared step, ``F.batch_norm`` in training mode (which every
``_BatchNorm`` layer, timm's fused ones included, calls) is applied to each rank's part of the union on
its own, in rank order, as the ranks did. SyncBatchNorm keeps the global batch (that is what it computes).
Where a batch norm's rows are not the union's samples (a norm over tokens flattened into rows), the parts
cannot be told apart, and the step is said not comparable rather than compared wrongly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


class PartNorm:
    """What the replay's batch norms need: the ranks' parts of the batch now handed, the modules being
    called (innermost last), and what was normalised per part (or could not be)."""

    def __init__(self) -> None:
        self.parts: tuple[int, ...] | None = None  # samples per rank in the union handed (None: not a union)
        self.calling: list[Any] = []  # modules whose forward is running, innermost last
        self.name: Callable[[Any], str | None] = lambda module: None
        self.modules: dict[str, None] = {}  # the modules that normalised per part, in order
        self.problems: list[str] = []

    def handed(self, parts: Sequence[int] | None) -> None:
        """A union of the ranks' batches is handed: ``parts`` their samples in rank order (None: unknown)."""
        self.parts = None if parts is None or any(n < 0 for n in parts) else tuple(parts)

    def batch_norm(self, original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``F.batch_norm`` as the ranks computed it (see the module docstring)."""
        training = kwargs.get("training", args[5] if len(args) > 5 else False)
        if not training or self.parts is None or self._synced():
            return original(*args, **kwargs)
        import torch

        rows = args[0] if args else kwargs["input"]
        where = self._where()
        if int(rows.shape[0]) != sum(self.parts):
            self.problems.append(
                f"BatchNorm ({where}) normalises {int(rows.shape[0])} rows, the union holds "
                f"{sum(self.parts)} samples: each rank's statistics cannot be replayed"
            )
            return original(*args, **kwargs)
        rest = args[1:]
        outs = [
            original(part, *rest, **kwargs)
            for part in torch.split(rows, list(self.parts))
            if part.shape[0]  # a rank that held no sample normalised nothing
        ]
        self.modules[where] = None
        return torch.cat(outs)

    def _synced(self) -> bool:
        from torch.nn import SyncBatchNorm

        return bool(self.calling) and isinstance(self.calling[-1], SyncBatchNorm)

    def _where(self) -> str:
        for module in reversed(self.calling):
            name = self.name(module)
            if name:
                return name
        return type(self.calling[-1]).__name__ if self.calling else "F.batch_norm"


def install(part_norm: Callable[[], PartNorm | None]) -> None:
    """Route ``F.batch_norm`` through the active replay's :class:`PartNorm` (None: as it is)."""
    import torch.nn.functional as F

    from ddpcheck.checker import patching

    original = F.batch_norm
    if getattr(original, "_ddpcheck_parts", False):
        return

    def batch_norm(*args: Any, **kwargs: Any) -> Any:
        parts = part_norm()
        if parts is None:
            return original(*args, **kwargs)
        return parts.batch_norm(original, args, kwargs)

    batch_norm._ddpcheck_parts = True  # type: ignore[attr-defined]
    batch_norm.__wrapped__ = original  # type: ignore[attr-defined]
    batch_norm.__doc__ = original.__doc__
    patching.replace(F, "batch_norm", batch_norm)
