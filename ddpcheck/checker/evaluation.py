"""The script's own evaluations, in one rank (issue 41): which epochs evaluate, the rounds they form, and
what happens in a round.

An epoch is an evaluation when, as the script takes its first batch, gradients are off (``no_grad``,
``inference_mode``: Lightning's validation loop) or every model the rank knows is in eval mode (the HF
Trainer calls ``model.eval()`` and takes ``no_grad`` per step), and its loader never fed an optimizer
step; a first forward with gradients on in train mode, or an optimizer step inside it, proves it training
after all, and it is treated as such from then on. Consecutive evaluation epochs with no training batch
between them form a round, numbered in order (the k-th round of one run is compared with the k-th of
another). A round closes at the next training batch, optimizer step, or the script's end.

In the first ``rounds`` rounds that run whole, the recorder hands every evaluation epoch to the script
whole (``--model-steps`` cuts the others), :class:`~ddpcheck.checker.eval_weights.WeightHolder` holds the
weights, and the round records: the torch.distributed collectives made in it, whether a global random
stream moved while a loop ran, and what the script reported (:mod:`ddpcheck.checker.eval_values`) after a
loop ended; keys reported while a loop still ran are progress, never compared.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ddpcheck.checker import patching, rng
from ddpcheck.checker.eval_weights import LOADED, SAVED, WeightHolder
from ddpcheck.checker.models import Models
from ddpcheck.checks.reported import read_line
from ddpcheck.eval_trace import EvalRecord, EvalRound, ReportedValue

COLLECTIVES = (
    "all_reduce", "reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "gather",
    "gather_object", "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
    "broadcast", "broadcast_object_list", "scatter", "scatter_object_list",
)  # fmt: skip
MAX_VALUES = 400  # values kept per round (a script that logs every weight would flood it)
MAX_OUTSIDE = 256  # line templates kept that were printed outside any evaluation
OWN_PREFIX = "ddpcheck"  # lines ddpcheck prints itself


@dataclass(frozen=True)
class EvalOptions:
    """``rounds``: rounds handed whole, held and recorded (0: none); ``save``: where the single process saves
    the weights it evaluates; ``load``: the single process's launch whose weights this rank evaluates."""

    rounds: int = 1
    save: str = ""
    load: str = ""


class EvalEpoch:
    """One evaluation epoch of a loader, as the recorder's epoch drives it."""

    def __init__(self, round_: _Round, loader: str, epoch: int, whole: bool) -> None:
        self.round, self.loader, self.epoch, self.whole = round_, loader, epoch, whole
        self.done = False  # stored among the loader's epochs
        self.ended = False  # the script iterated it to its end
        self.aborted = False  # it trained after all
        self.state: dict[str, bytes | None] | None = None

    def fetched(self) -> None:
        """The first batch is loaded (a shuffling sampler drew its seed): streams are watched from here."""
        if self.round.recorded and self.state is None:
            self.state = rng.snapshot()

    def end(self) -> None:
        """The script took the epoch's last batch (its loader's ``len()``), or the loader ran out while the
        script iterated it. The streams are read again at the round's next report (the last batch is still
        being evaluated now)."""
        if not self.ended:
            self.ended = True
            self.round.unsettled.append(self)

    def settle(self, after: dict[str, bytes | None]) -> None:
        if self.state is not None:
            self.round.drew.update(n for n, s in self.state.items() if s is not None and s != after.get(n))

    def stored(self, epoch: int) -> None:
        self.epoch, self.done = epoch, True

    @property
    def iterating(self) -> bool:
        return not self.ended and not self.done


@dataclass
class _Round:
    index: int
    recorded: bool
    epochs: list[EvalEpoch] = field(default_factory=list)
    values: list[ReportedValue] = field(default_factory=list)
    seen: Counter[tuple[str, str, int]] = field(default_factory=Counter)
    progress: set[tuple[str, str]] = field(default_factory=set)
    collectives: Counter[str] = field(default_factory=Counter)
    drew: set[str] = field(default_factory=set)
    train_mode: bool = False
    unsettled: list[EvalEpoch] = field(default_factory=list)  # ended, the streams not read again yet

    def settle(self) -> None:
        """The loops that ended are over by now: did a global stream move since their first batch?"""
        if self.unsettled:
            after = rng.snapshot()
            for epoch in self.unsettled:
                epoch.settle(after)
            self.unsettled.clear()


class Evaluations:
    """One rank's evaluations. The recorder calls :meth:`begin` at every epoch's first batch and
    :meth:`training` at every training batch; the value readers call :meth:`report` and :meth:`printed`."""

    def __init__(self, options: EvalOptions, models: Models) -> None:
        self.options, self.models = options, models
        self.holder = WeightHolder(models, options.save, options.load, self._training_forward)
        self.open: _Round | None = None
        self.rounds: list[EvalRound] = []
        self.count = 0  # rounds begun
        self.whole = 0  # rounds recorded that ran whole
        self.trained: set[str] = set()  # loaders that fed an optimizer step
        self.last_loader = ""
        self.outside: dict[str, None] = {}
        self.libraries: dict[str, None] = {}
        self.last_batch = False  # the training batch just handed is the last --model-steps leaves its epoch

    # --- the recorder's calls -----------------------------------------------------------------------

    def begin(self, loader: str, epoch: int, world_size: int) -> EvalEpoch | None:
        """Epoch ``epoch`` of ``loader`` hands its first batch: its :class:`EvalEpoch` when it evaluates."""
        if not self._evaluating(loader):
            self.training(loader)
            return None
        round_ = self.open
        if round_ is not None:
            round_.settle()
        if round_ is None:
            recorded = self.whole < self.options.rounds
            round_ = self.open = _Round(self.count, recorded)
            self.count += 1
            if recorded:
                self.holder.begin(round_.index, world_size)
        if round_.recorded and any(r.training for r in self.models.roots):
            round_.train_mode = True
        found = EvalEpoch(round_, loader, epoch, whole=round_.recorded)
        round_.epochs.append(found)
        return found

    def training(self, loader: str) -> None:
        """A training batch of ``loader`` is handed to the script: an open round is over."""
        self.last_loader = loader
        if self.open is not None:
            self.close()

    def stepped(self) -> None:
        """An optimizer step: a round still in a loop trained after all; any round is over."""
        round_ = self.open
        if round_ is not None and any(e.iterating for e in round_.epochs):
            self._abort(round_)
        elif self.last_loader:
            self.trained.add(self.last_loader)
        self.close()

    def close(self) -> None:
        round_, self.open = self.open, None
        if round_ is None:
            return
        holder = self.holder
        round_.settle()
        if round_.recorded:
            holder.end()
        if not round_.recorded or not round_.epochs:
            return
        whole = all(e.whole and e.ended and not e.aborted for e in round_.epochs)
        self.whole += whole
        held = holder.held if holder.held in (SAVED, LOADED) else holder.why
        self.rounds.append(
            EvalRound(
                index=round_.index,
                epochs=tuple((e.loader, e.epoch) for e in round_.epochs),
                whole=whole,
                held=held,
                weights=tuple(holder.fingerprints),
                train_mode=round_.train_mode,
                drew=tuple(sorted(round_.drew)),
                collectives=tuple(sorted(round_.collectives.items())),
                values=tuple(round_.values),
                progress=tuple(sorted(round_.progress)),
            )
        )

    def finish(self) -> EvalRecord:
        self.close()
        return EvalRecord(
            rounds=tuple(self.rounds),
            outside=tuple(self.outside),
            libraries=tuple(self.libraries),
            limit=self.options.rounds,
        )

    # --- what happens in a round ---------------------------------------------------------------------

    def collective(self, name: str) -> None:
        round_ = self.open
        if round_ is not None:
            round_.collectives[name] += 1

    def report(self, source: str, name: str, value: float) -> None:
        """A keyed number the script reported (a metric's compute, a logger's scalar)."""
        round_ = self.open
        if round_ is None or not round_.recorded:
            return
        if any(e.iterating for e in round_.epochs):
            round_.progress.add((source, name))
            return
        round_.settle()
        self._keep(round_, ReportedValue(source, name, value))

    def printed(self, line: str, source: str = "print") -> None:
        """A complete line the script printed (or logged)."""
        if not line.strip() or line.lstrip().startswith(OWN_PREFIX):
            return
        template, numbers = read_line(line)
        if not numbers:
            return
        round_ = self.open
        if round_ is None:
            if len(self.outside) < MAX_OUTSIDE:
                self.outside[template] = None
            return
        if not round_.recorded:
            return
        if any(e.iterating for e in round_.epochs):
            round_.progress.add((source, template))
            return
        round_.settle()
        for position, number in enumerate(numbers):
            kept = ReportedValue(
                source, template, number.value, 0, position, number.unit, number.shown, number.label
            )
            self._keep(round_, kept)

    def imported(self, library: str) -> None:
        self.libraries[library] = None

    def _keep(self, round_: _Round, value: ReportedValue) -> None:
        if len(round_.values) >= MAX_VALUES:
            return
        key = (value.source, value.name, value.position)
        occurrence = round_.seen[key]
        round_.seen[key] += 1
        value = ReportedValue(
            value.source,
            value.name,
            value.value,
            occurrence,
            value.position,
            value.unit,
            value.shown,
            value.label,
        )
        round_.values.append(value)

    # --- deciding -----------------------------------------------------------------------------------

    def _evaluating(self, loader: str) -> bool:
        import torch

        if loader in self.trained:
            return False
        if not torch.is_grad_enabled():
            return True
        self.models.find_roots()
        roots = self.models.roots
        return bool(roots) and not any(r.training for r in roots)

    def _training_forward(self) -> None:
        """A model's forward with gradients on in train mode: the round is over (a loop still running in it
        trained after all)."""
        round_ = self.open
        if round_ is not None and any(e.iterating for e in round_.epochs):
            self._abort(round_)
        self.close()

    def _abort(self, round_: _Round) -> None:
        for epoch in round_.epochs:
            if epoch.iterating:
                epoch.aborted = True
                epoch.whole = False
                self.trained.add(epoch.loader)


def numbers(value: Any, name: str, limit: int = 32) -> list[tuple[str, float]]:
    """A reported value as (name, number) pairs: a scalar tensor or number itself, a small tensor or list
    element by element (``name[i]``), a mapping key by key (``name/key``); anything else nothing."""
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, (int, float)):
        return [(name, float(value))]
    if hasattr(value, "items") and callable(value.items):
        out: list[tuple[str, float]] = []
        for key, item in list(value.items())[:limit]:
            out += numbers(item, f"{name}/{key}" if name else str(key), limit)
        return out
    size = getattr(value, "numel", None) or getattr(value, "size", None)
    if hasattr(value, "dtype") and hasattr(value, "tolist"):
        count = int(size() if callable(size) else size or 0)
        if count == 0 or count > limit:
            return []
        flat = value.reshape(-1).tolist() if hasattr(value, "reshape") else value.tolist()
        items = flat if isinstance(flat, list) else [flat]
        if count == 1:
            return [(name, _float(items[0]))]
        return [(f"{name}[{i}]", _float(x)) for i, x in enumerate(items)]
    plain = isinstance(value, (list, tuple)) and 0 < len(value) <= limit
    if plain and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value):
        return [(f"{name}[{i}]", float(x)) for i, x in enumerate(value)]
    return []


def _float(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


# --- collectives ----------------------------------------------------------------------------------------

_ACTIVE: list[Evaluations] = []


def watch_collectives(evaluations: Evaluations) -> None:
    """Count the torch.distributed collectives made while a round is open (installed once per process)."""
    import torch.distributed as dist

    if not dist.is_available():
        return
    first = not _ACTIVE
    _ACTIVE[:] = [evaluations]
    if not first:
        return
    from torch.distributed import distributed_c10d

    for name in COLLECTIVES:
        # each module's own binding: another watcher (the launch's progress beats) may have wrapped
        # ``dist.all_reduce`` and ``distributed_c10d.all_reduce`` apart, and a script calls either
        counted: dict[int, Any] = {}
        for module in (distributed_c10d, dist):
            original = getattr(module, name, None)
            if original is None or getattr(original, "__ddpcheck_counted__", False):
                continue
            wrapper = counted.setdefault(id(original), _counted(name, original))
            patching.replace(module, name, wrapper)


def _counted(name: str, original: Any) -> Any:
    def collective(*args: Any, **kwargs: Any) -> Any:
        if _ACTIVE:
            _ACTIVE[0].collective(name)
        return original(*args, **kwargs)

    collective.__wrapped__ = original  # type: ignore[attr-defined]
    collective.__ddpcheck_counted__ = True  # type: ignore[attr-defined]
    collective.__name__ = original.__name__
    collective.__doc__ = original.__doc__
    return collective
