"""equal_microsteps: between consecutive optimizer steps every rank runs the same number of backward passes
and the same forward calls of each submodule that holds parameters (issue 35).

It judges what the rank side's step watcher recorded, one :class:`~ddpcheck.trace.StepTrace` per rank,
indexed by global rank; pure functions, no processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ddpcheck.evidence import MicroMismatch, MicroMismatches
from ddpcheck.layout import Layout
from ddpcheck.messages import count_text
from ddpcheck.trace import MicroStep, StepTrace
from ddpcheck.verdict import EQUAL_MICROSTEPS, Verdict, not_applicable, skipped

MICRO_COUNTS = (
    "the ranks form different numbers of micro-batches per optimizer step (token-budget or dynamic batching "
    "per rank): their gradients are weighed unequally, and under FSDP or ZeRO-3 the extra micro-batch's "
    "collectives hang"
)
MODULE_SKIPPED = (
    "{module} runs only on the micro-batches that need it, so the ranks call it a different number of "
    "times: its parameters get no gradient on some ranks (DDP needs find_unused_parameters), and under "
    "FSDP or ZeRO-3 its all-gather hangs"
)
STEP_COUNTS = (
    "the ranks take different numbers of optimizer steps: the last collective of the longer ranks hangs"
)
MICRO_FIXES = {
    MICRO_COUNTS: "agree on the micro-batch count before the step: all_reduce(count, op=MAX) and run empty, "
    "zero-weighted micro-batches on the ranks with fewer",
    MODULE_SKIPPED: "run {module} on every micro-batch: a dummy input weighted zero where the micro-batch "
    "has none",
    STEP_COUNTS: "give every rank the same number of batches per epoch (pad or drop whole windows)",
}


def _forward_counts(micro: Sequence[MicroStep]) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in micro:
        for name, n in m.forwards:
            out[name] = out.get(name, 0) + n
    return out


def _per_rank_text(counts: Sequence[int], ranks: Sequence[int]) -> str:
    """``rank 0 ran 2, rank 1 ran 0``; ranks with one count grouped (``ranks 0 and 2 ran 3``)."""
    groups: dict[int, list[int]] = {}
    for rank, n in zip(ranks, counts, strict=True):
        groups.setdefault(n, []).append(rank)
    parts = []
    for n, members in sorted(groups.items(), key=lambda kv: kv[1][0]):
        who = f"rank {members[0]}" if len(members) == 1 else _ranks_list(members)
        parts.append(f"{who} ran {n}")
    return ", ".join(parts[:4]) + (f" and {len(parts) - 4} more counts" if len(parts) > 4 else "")


def _ranks_list(members: Sequence[int]) -> str:
    shown = ", ".join(map(str, members[:5]))
    if len(members) > 5:
        return f"ranks {shown} and {len(members) - 5} more"
    head, _, tail = shown.rpartition(", ")
    return f"ranks {head} and {tail}"


def _outermost(names: Sequence[str]) -> list[str]:
    return [n for n in names if not any(n.startswith(o + ".") for o in names if o != n)]


@dataclass(frozen=True)
class Mismatch:
    step: str  # "in step 3" or "after the last optimizer step"
    module: str  # "" for backward passes
    counts: tuple[int, ...]


def _windows(trace: StepTrace) -> list[tuple[str, tuple[MicroStep, ...]]]:
    out = [(f"in step {s.index}", s.micro) for s in trace.steps]
    if trace.open_micro:
        out.append(("after the last optimizer step", trace.open_micro))
    return out


def _mismatches(traces: Sequence[StepTrace]) -> list[Mismatch]:
    found: list[Mismatch] = []
    windows = [_windows(t) for t in traces]
    longest = max(len(w) for w in windows)
    for w in windows:  # equal step counts: only the open window (after the last step) may be missing
        w.extend(("after the last optimizer step", ()) for _ in range(longest - len(w)))
    for k in range(longest):
        label = windows[0][k][0]
        micro = [w[k][1] for w in windows]
        backward = tuple(len(m) for m in micro)
        if len(set(backward)) > 1:
            found.append(Mismatch(label, "", backward))
            continue
        counts = [_forward_counts(m) for m in micro]
        names = sorted({n for c in counts for n in c})
        differ = [n for n in names if len({c.get(n, 0) for c in counts}) > 1]
        for name in _outermost(differ):
            found.append(Mismatch(label, name, tuple(c.get(name, 0) for c in counts)))
    return found


def check_equal_microsteps(run: Sequence[StepTrace | None], layout: Layout) -> Verdict:
    """Between consecutive optimizer steps every rank runs the same number of backward passes and the same
    forward calls of each submodule that holds parameters.

    ``run``: each rank's StepTrace by global rank (None: recorded none); every rank is compared, the
    non-data peers of a mesh included (a tensor peer with a micro-batch fewer hangs its group too).
    """
    missing = [r for r, t in enumerate(run) if t is None]
    if missing:
        return skipped(EQUAL_MICROSTEPS, f"rank {missing[0]} recorded no training step")
    traces = [t for t in run if t is not None]
    if len(traces) < 2:
        return not_applicable(EQUAL_MICROSTEPS, "one rank: no other rank to run in step with")
    if not any(t.steps or t.open_micro for t in traces):
        return not_applicable(EQUAL_MICROSTEPS, "no backward pass was recorded")
    ranks = list(range(len(traces)))
    steps = [len(t.steps) for t in traces]
    if len(set(steps)) > 1:
        return Verdict(
            EQUAL_MICROSTEPS, "fail", f"optimizer steps: {_per_rank_text(steps, ranks)}", STEP_COUNTS,
            ranks=tuple(ranks), fix=MICRO_FIXES[STEP_COUNTS],
        )  # fmt: skip
    found = _mismatches(traces)
    windows = len(_windows(traces[0]))
    if not found:
        backward = sorted({len(m) for _, m in _windows(traces[0])})
        passes = f"{backward[0]} backward pass" + ("" if backward[0] == 1 else "es")
        shape = passes if len(backward) == 1 else f"{backward[0]} to {backward[-1]} backward passes"
        modules = len({n for t in traces for _, m in _windows(t) for n in _forward_counts(m)})
        return Verdict(
            EQUAL_MICROSTEPS,
            "pass",
            f"every rank ran the same micro-steps: {count_text(len(traces[0].steps), 'optimizer steps')} of "
            f"{shape} each, the same forward calls of {count_text(modules, 'modules')}",
        )
    first = next((m for m in found if not m.module), found[0])
    affected = len({m.step for m in found})
    where = f"{first.step}; {affected} of {count_text(windows, 'steps')} differ"  # "in step 3; 2 of 8 ..."
    if not first.module:
        detail = f"backward passes: {_per_rank_text(first.counts, ranks)} {where}"
        cause, fix = MICRO_COUNTS, MICRO_FIXES[MICRO_COUNTS]
    else:
        detail = f"{first.module}: {_per_rank_text(first.counts, ranks)} {where}"
        cause = MODULE_SKIPPED.format(module=first.module)
        fix = MICRO_FIXES[MODULE_SKIPPED].format(module=first.module)
    odd = tuple(r for r, n in enumerate(first.counts) if n != max(set(first.counts), key=first.counts.count))
    evidence = MicroMismatches(tuple(MicroMismatch(m.step, m.module, tuple(m.counts)) for m in found[:64]))
    return Verdict(
        EQUAL_MICROSTEPS, "fail", detail, cause, ranks=odd or tuple(ranks), evidence=evidence, fix=fix
    )
