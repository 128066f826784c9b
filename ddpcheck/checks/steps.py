"""equal_steps: every rank takes the same number of steps, and ``len(loader)`` says so truthfully.

DDP runs a collective every step; a rank that runs out of batches early leaves the others waiting
in that collective forever. A wrong ``len(loader)`` breaks schedulers and progress bars the same way.
"""

from __future__ import annotations

from dataclasses import replace

from ddpcheck.checks.context import Context
from ddpcheck.checks.wording import epochs_text
from ddpcheck.evidence import UnevenSteps
from ddpcheck.trace import RunTrace
from ddpcheck.verdict import EQUAL_STEPS, Verdict, passed, skipped

UNEVEN = (
    "ranks get different numbers of batches: the sampler gives ranks unequal shards "
    "(pad them, or drop the remainder)"
)
UNEVEN_ITERABLE = (
    "the iterable dataset gives ranks different numbers of samples: even the shards out, or stop every rank "
    "at the same step"
)
UNEVEN_BATCHES = "the batch sampler's batches are not split evenly across ranks: pad or drop whole batches"
WRONG_LEN = (
    "len(loader) does not match what the loader yields: "
    "the sampler's (or dataset's) __len__ ignores the rank split"
)


def check_equal_steps(
    reference: RunTrace, run: RunTrace, rerun: RunTrace | None = None, *, ctx: Context | None = None
) -> Verdict:
    ctx = ctx or Context(reference, run, rerun)
    if ctx.unjudgeable:
        return skipped(EQUAL_STEPS, ctx.unjudgeable)
    uneven: list[int] = []
    wrong_len: list[tuple[int, int, int, int]] = []  # (epoch, rank, len_loader, yielded)
    for e in range(run.num_epochs):
        traces = run.epoch(e)
        counts = [t.num_batches for t in traces]
        if min(counts) != max(counts):
            uneven.append(e)
        wrong_len += [
            (e, r, t.len_loader, t.num_batches)
            for r, t in enumerate(traces)
            if t.len_loader is not None and t.len_loader != t.num_batches
        ]
    wrong_epochs = sorted({w[0] for w in wrong_len})
    counted = UnevenSteps(uneven_epochs=len(uneven), len_mismatches=len(wrong_len))
    if uneven:
        e = uneven[0]
        counts = [t.num_batches for t in run.epoch(e)]
        hi, lo = max(counts), min(counts)
        r_hi, r_lo = counts.index(hi), counts.index(lo)
        more = f" (also {epochs_text(uneven[1:])})" if len(uneven) > 1 else ""
        detail = (
            f"rank {r_hi} yields {hi} batches, rank {r_lo} yields {lo} in epoch {e}{more}: "
            f"the next collective after step {lo} hangs (uneven steps)"
        )
        if wrong_len:
            detail += f"; len(loader) is also wrong on {len({w[1] for w in wrong_len})} ranks"
        if ctx.batch_level:
            cause = UNEVEN_BATCHES
        elif ctx.facts.dataset_kind == "iterable":
            cause = UNEVEN_ITERABLE
        else:
            cause = UNEVEN
        evidence = replace(counted, max_batches=hi, min_batches=lo)
        epochs = tuple(sorted({*uneven, *wrong_epochs}))
        return Verdict(EQUAL_STEPS, "fail", detail, cause, (r_hi, r_lo), epochs, (), evidence)
    if wrong_len:
        e, r, said, got = wrong_len[0]
        ranks = tuple(sorted({w[1] for w in wrong_len}))
        more = (
            f" (on {len(ranks)} ranks, {epochs_text(wrong_epochs)})"
            if len(ranks) > 1 or len(wrong_epochs) > 1
            else ""
        )
        detail = f"len(loader) says {said} but rank {r} yielded {got} in epoch {e}{more}"
        evidence = replace(counted, len_loader=said, yielded=got)
        return Verdict(EQUAL_STEPS, "fail", detail, WRONG_LEN, ranks[:8], tuple(wrong_epochs), (), evidence)
    steps = [run.epoch(e)[0].num_batches for e in range(run.num_epochs)]
    shown = ", ".join(map(str, steps))
    return passed(
        EQUAL_STEPS, f"all {run.world_size} ranks yield the same number of batches per epoch ({shown})"
    )
