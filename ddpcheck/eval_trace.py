"""What a training script's own evaluation reported (issue 41), per rank: plain data in the rank's trace
(:attr:`ddpcheck.trace.ScriptRankTrace.evaluation`), recorded by :mod:`ddpcheck.checker.evaluation` and
judged by ``metric_equivalence`` (:mod:`ddpcheck.checks.eval_metric`).

Nothing of ddpcheck is imported here; the trace file's reader accepts this module's classes as it does
:mod:`ddpcheck.trace`'s.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReportedValue:
    """A number the script reported after an evaluation's loop: ``source`` (torchmetrics, evaluate, trainer,
    lightning, tensorboard, wandb, mlflow, log, print), ``name`` (its key; a printed line's template with
    ``{}`` for each number), ``position`` (which number of the line), ``occurrence`` (the n-th of that
    source, name and position in the round), ``unit`` (one unit in the last printed digit; 0.0: read as a
    number), ``shown`` (as printed), ``label`` (a printed number's words before it and unit after it)."""

    source: str
    name: str
    value: float
    occurrence: int = 0
    position: int = 0
    unit: float = 0.0
    shown: str = ""
    label: str = ""


@dataclass(frozen=True)
class EvalRound:
    """One evaluation: consecutive epochs (``epochs``: loader, epoch) iterated with gradients off or a known
    model in eval mode, no training batch between them, and what was reported until the next training
    batch or optimizer step. ``index``: the k-th round of the rank (runs are matched by it); ``whole``:
    every epoch handed to the script whole and iterated to its end; ``held``: "saved", "loaded" or why
    neither; ``weights``: a fingerprint per model evaluated, in call order; ``drew``: global random streams
    that moved during a loop; ``collectives``: torch.distributed calls in the round, by name; ``progress``:
    (source, name) also reported while a loop ran (never compared)."""

    index: int
    epochs: tuple[tuple[str, int], ...] = ()
    whole: bool = False
    held: str = ""
    weights: tuple[int, ...] = ()
    train_mode: bool = False  # a model evaluated was in train mode
    drew: tuple[str, ...] = ()
    collectives: tuple[tuple[str, int], ...] = ()
    values: tuple[ReportedValue, ...] = ()
    progress: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class EvalRecord:
    """A rank's evaluations; ``outside``: printed line templates seen outside any (never compared);
    ``libraries``: evaluation libraries the script imported; ``limit``: rounds compared (--eval-rounds)."""

    rounds: tuple[EvalRound, ...] = ()
    outside: tuple[str, ...] = ()
    libraries: tuple[str, ...] = ()
    limit: int = 0
