"""Step traces for the step checks' tests: built by hand, or from what a step fixture's own loop logged
under torchrun (fixtures/steps/truth_logs, written by fixtures/steps/truth.py without ddpcheck).

The truth logs hold, per rank, each optimizer step's micro-steps (the sample ids of every batch the loop
received, supervised labels, forward calls per module) and the whole gradient before the step; the replay
log the same at one process fed the union of the ranks' micro-batches; the probe log the replay with
every micro-batch given twice. :func:`from_truth` turns them into the StepTraces the rank side records.
"""

from __future__ import annotations

import base64
import gzip
import json
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ddpcheck.trace import (
    Draw,
    EpochTrace,
    FetchDraws,
    MicroStep,
    ModelFeed,
    OptimizerStep,
    StepTrace,
    TokenRows,
)

STEPS = Path(__file__).resolve().parent.parent / "fixtures" / "steps"


def micro(
    samples: int = 4,
    supervised: int | None = None,
    forwards: Sequence[tuple[str, int]] = (),
    draws: Sequence[Draw] = (),
    batches: tuple[int, ...] = (0,),
    epoch: int = 0,
) -> MicroStep:
    return MicroStep("train", epoch, batches, samples, supervised, tuple(forwards), tuple(draws))


def trace(
    steps: Sequence[tuple[Sequence[float] | None, Sequence[MicroStep]]],
    *,
    dtype: str = "float32",
    open_micro: Sequence[MicroStep] = (),
    **fields: Any,
) -> StepTrace:
    """A StepTrace from ``(gradient, micro-steps)`` per optimizer step."""
    built = tuple(
        OptimizerStep(i, tuple(m), None if g is None else tuple(g), None) for i, (g, m) in enumerate(steps)
    )
    params = len(next((g for g, _ in steps if g is not None), ()))
    return StepTrace(built, tuple(open_micro), params, params, dtype, **fields)


# ----------------------------------------------------------------------------- from the truth logs


def load(name: str, nproc: int) -> dict[str, Any]:
    with gzip.open(STEPS / "truth_logs" / f"{name}-{nproc}.json.gz", "rt") as handle:
        return json.load(handle)


def _grad(packed: str) -> tuple[float, ...]:
    values = array("f")
    values.frombytes(base64.b64decode(packed))
    return tuple(values)


def step_trace(log: dict[str, Any], **fields: Any) -> StepTrace:
    """The StepTrace of one rank's (or the replay's) truth log; batches numbered in delivery order."""
    position = 0

    def micro_of(m: dict[str, Any]) -> MicroStep:
        nonlocal position
        real = [b for b in m["batches"] if not b["pad"]]
        positions = tuple(range(position, position + len(real)))
        position += len(real)
        sup = [b.get("supervised") for b in real]
        supervised = None if not real or any(s is None for s in sup) else sum(s for s in sup if s is not None)
        forwards = tuple(sorted(m["forwards"].items()))
        samples = sum(b["samples"] for b in real)
        return MicroStep("train", 0, positions, samples, supervised, forwards, feed=_feed(m, real))

    steps = tuple(
        OptimizerStep(k, tuple(micro_of(m) for m in s["micro"]), _grad(s["grad"]), s["norm"])
        for k, s in enumerate(log["steps"])
    )
    open_micro = tuple(micro_of(m) for m in log.get("open_micro", ()))
    size = len(steps[0].grad or ()) if steps else 0
    return StepTrace(steps, open_micro, size, size, "float32", **fields)


def _rows(values: list[list[int]]) -> TokenRows:
    return TokenRows(len(values), len(values[0]) if values else 0, array("q", [v for r in values for v in r]))


def _feed(micro: dict[str, Any], batches: list[dict[str, Any]]) -> ModelFeed | None:
    """What a context-parallel fixture's loop logged: the batch's input_ids and what its model was fed."""
    if "fed" not in micro or not batches or "tokens" not in batches[0]:
        return None
    fed = tuple((key, _rows(value)) for key, value in micro["fed"].items())
    return ModelFeed((("input_ids", _rows(batches[0]["tokens"])),), fed)


def with_loop_draws(trace: StepTrace, log: dict[str, Any]) -> StepTrace:
    """``trace`` with the loop draws the log holds, each in the micro-step it was made in."""
    by_place: dict[tuple[int, int], list[Draw]] = {}
    for d in log["draws"]:
        draw = Draw(d["stream"], d["state"], d["site"], "torch.randn", tuple(d["shape"]))
        by_place.setdefault((d["step"], d["micro"]), []).append(draw)
    steps = []
    for s in trace.steps:
        micro = tuple(
            MicroStep(m.loader, m.epoch, m.batches, m.samples, m.supervised, m.forwards,
                      tuple(by_place.get((s.index, k), ())))
            for k, m in enumerate(s.micro)
        )  # fmt: skip
        steps.append(OptimizerStep(s.index, micro, s.grad, s.grad_norm))
    return StepTrace(tuple(steps), trace.open_micro, trace.parameters, trace.kept, trace.grad_dtype)


def fetch_epochs(lines: Sequence[dict[str, Any]]) -> list[EpochTrace]:
    """One epoch whose fetches are the logged loading draws (a sample per fetch, in log order)."""
    fetches = tuple(
        FetchDraws(k, line["worker"], (Draw(line["stream"], line["state"]),)) for k, line in enumerate(lines)
    )
    return [
        EpochTrace(0, array("q", [line["sample"] for line in lines]), (1,) * len(lines), None, draws=fetches)
    ]


def loss_scale(truth: dict[str, Any]) -> str:
    """What the probe said (the replay fed every micro-batch twice): ``mean`` or ``sum``."""
    return str(truth.get("loss_scale") or "")
