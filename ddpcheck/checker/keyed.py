"""Which recorded draw a replayed draw stands for: the same generator state, or the same place in the step.

A replay at one process fed the union of the ranks' batches makes the draws of every rank's rows. Two kinds
of draw reach it:

- **keyed by the data**: a draw from a generator seeded by the row, the prompt or the epoch (a private
  ``torch.Generator().manual_seed(prompt * 97 + copy)`` per completion, a ``torch.manual_seed(row)``
  before a draw). The replay reaches the same generator state the rank had before that draw, so it draws
  the same numbers by itself: a replayed draw whose stream, state fingerprint, call and shape equal a draw
  some rank recorded, and whose value equals that draw's, keeps its own value, and stands for one such
  draw of each rank that made it (a row's draw is one rank's; a step-wide draw from a generator seeded
  alike is every rank's). Its count may differ from any one rank's (each rank made its rows' draws, the
  replay every row's).
- **positional**: any other draw (a global stream's ``torch.randn(batch)``, a step-wide generator): the
  replay's k-th such draw is every rank's k-th draw that no keyed draw stood for, their values joined along
  the batch dimension (:func:`ddpcheck.checker.replay.union_draw`). Where the ranks' counts of these
  differ from the replay's (a global stream drawn once per row, whose count follows the batch split),
  no value is the right one: :class:`NotReplayable`, and the step is not compared.

After the window, every rank's draw must have been stood for, by key or by place (:meth:`unmatched`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ddpcheck.checker.draws import NotReplayable
from ddpcheck.checker.replay import union_draw
from ddpcheck.trace import Draw

Key = tuple[str, int, str, tuple[int, ...]]  # stream, state fingerprint, call, shape


@dataclass(frozen=True)
class RecordedDraw:
    """One draw a rank recorded in a compared step: its call and value, and its key (None: the record
    predates keys, or the state was unknown)."""

    call: str
    value: Any
    key: Key | None = None


def key_of(draw: Draw) -> Key | None:
    """``draw``'s key: None where its generator state was not read (a device without a readable state)."""
    return (draw.stream, draw.state, draw.call, tuple(draw.shape)) if draw.state else None


def _equal(a: Any, b: Any) -> bool:
    import numpy as np
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and bool(torch.equal(a.detach().cpu(), b.detach().cpu()))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(np.asarray(a), np.asarray(b)))
    try:
        return bool(a == b)
    except Exception:
        return False


@dataclass
class DrawMatcher:
    """Pairs one replayed window's draws with the ranks' recorded ones (rank order, as recorded)."""

    ranks: Sequence[int]
    draws: Sequence[Sequence[RecordedDraw]]
    used: list[set[int]] = field(default_factory=list)
    places: list[int] = field(default_factory=list)  # per rank, where its positional draws go on
    by_key: dict[Key, list[tuple[int, int]]] = field(default_factory=dict)
    keyed: int = 0  # replayed draws that reproduced a recorded one by key

    def __post_init__(self) -> None:
        self.used = [set() for _ in self.draws]
        self.places = [0 for _ in self.draws]
        for r, made in enumerate(self.draws):
            for i, recorded in enumerate(made):
                if recorded.key is not None:
                    self.by_key.setdefault(recorded.key, []).append((r, i))

    def substitute(self, draw: Draw, value: Any) -> Any:
        """The value the replayed ``draw`` returns: its own where a rank drew the same from the same state,
        else the ranks' draws at its place joined (:class:`NotReplayable` where there is none)."""
        key = key_of(draw)
        found = self.by_key.get(key) if key is not None else None
        if found:
            same = [(r, i) for r, i in found if _equal(self.draws[r][i].value, value)]
            if same:
                taken: set[int] = set()
                for r, i in same:  # one draw of each rank that drew it: a row's, or a step's shared one
                    if r not in taken and i not in self.used[r]:
                        self.used[r].add(i)
                        taken.add(r)
                self.keyed += 1
                return value
        values = []
        for r, made in enumerate(self.draws):
            i = self._next_free(r)
            if i >= len(made) or made[i].call != draw.call:
                raise NotReplayable(f"rank {self.ranks[r]} made no such draw at this point of the step")
            values.append(made[i].value)
        for r in range(len(self.draws)):
            i = self._next_free(r)
            self.used[r].add(i)
            self.places[r] = i + 1
        return union_draw(draw.call, values, value)

    def _next_free(self, r: int) -> int:
        i = self.places[r]
        while i < len(self.draws[r]) and i in self.used[r]:
            i += 1
        return i

    def unmatched(self) -> str:
        """Why the window's draws do not add up ("" where every rank's draw was stood for): the first rank
        with a draw the replay never made."""
        for r, made in enumerate(self.draws):
            left = [i for i in range(len(made)) if i not in self.used[r]]
            if left:
                first = made[left[0]]
                return (
                    f"rank {self.ranks[r]} made {len(made)} random draws here and the replay stood for "
                    f"{len(made) - len(left)} of them ({first.call} not replayed; a draw whose count depends "
                    "on how the batch is split, from a stream no row seeds)"
                )
        return ""
