"""The prompt-group rule (issue 42) on synthetic traces: pure functions, no processes.

The layouts are built as the real ones lay rows out: a repeat sampler's order (each prompt G times in a
row, TRL's ``RepeatSampler``), cut into batches of b rows, rank r taking batches r, r + W, ... (Accelerate's
``BatchSamplerShard``, what ``accelerator.prepare`` makes of TRL's loader); the real classes run under
torchrun in ``fixtures/groups`` (``tests/test_group_run.py``).
"""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from ddpcheck.checks.context import Context
from ddpcheck.checks.groups import (
    GROUPS_WHOLE,
    NO_RUNS,
    RANK_SEEDED,
    apart_steps,
    broken_steps,
    check_prompt_groups,
    gathered,
    group_size,
    split_groups,
)
from ddpcheck.checks.registry import run_checks
from ddpcheck.checks.step import OTHER
from ddpcheck.checks.step_judge import StepRecord, for_groups
from ddpcheck.evidence import ComparedStep, GroupEvidence, StepEvidence
from ddpcheck.layout import Layout
from ddpcheck.trace import MicroStep, OptimizerStep, RunTrace, StepTrace
from ddpcheck.verdict import COVERAGE, NO_OVERLAP, PROMPT_GROUPS, STEP_EQUIVALENCE, Verdict
from tests.trace_builders import epoch, run, strided


def repeated(order: list[int], size: int) -> list[int]:
    return [p for p in order for _ in range(size)]


def shards(rows: list[int], per_rank: int, world: int) -> list[list[int]]:
    """Batches of ``per_rank`` rows, rank r taking batches r, r + W, ... (whole rounds only)."""
    batches = [rows[i : i + per_rank] for i in range(0, len(rows) - per_rank + 1, per_rank)]
    batches = batches[: len(batches) // world * world]
    return [[x for b in batches[r::world] for x in b] for r in range(world)]


def layout(orders: list[list[int]], size: int, per_rank: int, world: int) -> RunTrace:
    """``orders[r]``: the prompt order rank r's repeat sampler draws (one order: seeded alike)."""
    per = [shards(repeated(orders[r % len(orders)], size), per_rank, world)[r] for r in range(world)]
    return run([[ids] for ids in per], batch_size=per_rank)


def reference(order: list[int], size: int, rows: int) -> RunTrace:
    return run([[repeated(order, size)]], batch_size=rows)


def order(n: int, seed: int) -> list[int]:
    out = list(range(n))
    random.Random(seed).shuffle(out)
    return out


def test_group_size_reads_runs_of_copies() -> None:
    assert group_size([3, 3, 3, 3, 1, 1, 1, 1, 7, 7, 7, 7]) == 4
    assert group_size([3, 3, 1, 1, 1, 1, 7, 7]) == 2  # a prompt twice in a row: two groups
    assert group_size(list(range(12))) == 0  # each sample once
    assert group_size([1, 1, 2, 3, 3, 4]) == 0  # repeats apart from singles: sampling with replacement
    assert group_size([5, 5, 5]) == 0  # one run: nothing to tell a group from the epoch
    assert group_size(["a", "a", "b", "b"]) == 2  # ids that are no ints


@given(
    n=st.integers(min_value=8, max_value=16),
    size=st.integers(min_value=2, max_value=5),
    per_rank=st.integers(min_value=1, max_value=12),
    world=st.integers(min_value=1, max_value=4),
    seed=st.integers(min_value=0, max_value=99),
)
def test_trl_layout_keeps_groups_exactly_when_a_step_gathers_whole_multiples(
    n: int, size: int, per_rank: int, world: int, seed: int
) -> None:
    """One order for every rank, split by whole batches: each step gathers the order's next W x b rows,
    which are whole groups exactly when W x b is a multiple of G."""
    prompts = order(n, seed)
    ref = reference(prompts, size, per_rank * world)
    trace = layout([prompts], size, per_rank, world)
    if not any(r.epochs[0].ids for r in trace.ranks):
        return
    verdict = check_prompt_groups(ref, trace)
    assert verdict.status == ("pass" if (per_rank * world) % size == 0 else "fail"), verdict
    assert isinstance(verdict.evidence, GroupEvidence) and verdict.evidence.size == size


def test_groups_split_across_ranks_pass_and_are_no_overlap() -> None:
    """TRL's layout with b = 6, G = 4: a group's copies on both ranks in one step; the gather holds it
    whole. no_overlap judges against the reference's copies: a prompt on two ranks is no overlap."""
    prompts = order(12, 0)
    ref, trace = reference(prompts, 4, 12), layout([prompts], 4, 6, 2)
    verdicts = {v.check: v for v in run_checks(ref, trace)}
    groups = verdicts[PROMPT_GROUPS]
    assert groups.status == "pass" and "split across ranks at 4 of them" in groups.detail, groups
    assert verdicts[NO_OVERLAP].status == "pass" and verdicts[COVERAGE].status == "pass"
    g = gathered([r.epochs[0] for r in trace.ranks])
    assert [(s, rs) for s, _, rs in split_groups(g, 4)] == [(s, (0, 1)) for s in range(4)]


def test_a_repeat_sampler_seeded_per_rank_is_named() -> None:
    """Each rank cuts its batches from its own order: the gather's run of 4 at rows 4-7 holds two prompts,
    copies land on other steps, some prompts reach no rank; coverage names the same cause."""
    ref = reference(order(12, 0), 4, 12)
    trace = layout([order(12, 0), order(12, 1)], 4, 6, 2)
    verdicts = {v.check: v for v in run_checks(ref, trace)}
    groups = verdicts[PROMPT_GROUPS]
    assert groups.failed and groups.cause == RANK_SEEDED, groups
    assert "seed the repeat sampler alike" in groups.fix
    assert "holds prompts" in groups.detail and "other copies land on step" in groups.detail, groups.detail
    assert verdicts[COVERAGE].failed and verdicts[COVERAGE].cause == RANK_SEEDED, verdicts[COVERAGE]


def test_whole_groups_per_rank_pass_even_when_the_orders_differ() -> None:
    """b = G: every rank's batch is one whole group, so the gather holds whole groups whatever the ranks'
    orders; a per-rank seed then shows as copies some prompts never get (coverage), not as broken groups."""
    ref = reference(order(12, 0), 4, 8)
    same = check_prompt_groups(ref, layout([order(12, 0)], 4, 4, 2))
    assert same.status == "pass" and "each group is whole on one rank" in same.detail, same
    seeded = run_checks(ref, layout([order(12, 0), order(12, 1)], 4, 4, 2))
    by = {v.check: v for v in seeded}
    assert by[PROMPT_GROUPS].status == "pass"
    assert by[COVERAGE].failed and by[COVERAGE].cause == RANK_SEEDED, by[COVERAGE]


def test_partial_groups_straddle_steps() -> None:
    """6 rows a step for groups of 4 (AReaL #1419): at one process and at two ranks alike."""
    prompts = order(12, 0)
    for world, per_rank in ((1, 6), (2, 3)):
        verdict = check_prompt_groups(reference(prompts, 4, 6), layout([prompts], 4, per_rank, world))
        assert verdict.failed and verdict.cause.startswith(
            "a step gathers 6 rows, not a multiple of the group"
        )
        assert "fixed stride" in verdict.cause and "its other copies land on step 1" in verdict.detail, (
            verdict
        )


def test_a_row_by_row_split_keeps_groups_in_their_step() -> None:
    """Every W-th row of the repeated order (content-hashed duplicates in order look the same): each
    prompt's copies stay in one step, only not as runs in rank order; not broken groups, and said so."""
    rows = repeated(order(8, 0), 4)
    split = strided(rows, 2)
    ref = reference(order(8, 0), 4, 8)
    verdict = check_prompt_groups(ref, run([[ids] for ids in split], batch_size=4))
    assert verdict.status == "pass" and "not a fixed stride of 4 gathered rows" in verdict.detail, verdict
    g = gathered([r.epochs[0] for r in run([[ids] for ids in split], batch_size=4).ranks])
    assert apart_steps(g, 4).tolist() == list(range(4)) and broken_steps(g, 4).tolist() == []


def test_no_runs_and_rank_aware_samplers_are_not_judged() -> None:
    plain = run([[list(range(8))]], batch_size=4)
    assert check_prompt_groups(plain, run([[[0, 2, 4, 6]], [[1, 3, 5, 7]]])).detail == NO_RUNS
    # repeated augmentation: the sampler was told the ranks and spreads each sample's copies over them
    rows = repeated(order(8, 0), 2)
    aug = run([[ids] for ids in strided(rows, 2)], batch_size=4, sampler_replicas=2, sampler_rank=0)
    verdict = check_prompt_groups(reference(order(8, 0), 2, 4), aug)
    assert verdict.status == "n/a" and "num_replicas=2" in verdict.detail
    # equal samples in a row, identified by their content: duplicates in the data, not known copies
    ref, trace = reference(order(12, 0), 4, 12), layout([order(12, 0)], 4, 3, 2)  # partial groups by index
    assert check_prompt_groups(ref, trace).failed
    hashed = check_prompt_groups(
        replace(ref, id_source="content-hash"), replace(trace, id_source="content-hash")
    )
    assert hashed.status == "n/a" and "identified by their content" in hashed.detail


def test_broken_steps_counts_each_step_once() -> None:
    traces = [epoch(0, [1, 1, 2, 2], 2), epoch(0, [3, 3, 1, 1], 2)]
    g = gathered(traces)
    assert g.ids.tolist() == [1, 1, 3, 3, 2, 2, 1, 1]  # step 0: rank 0's rows then rank 1's
    assert broken_steps(g, 2).tolist() == [] and apart_steps(g, 2).tolist() == []
    assert broken_steps(g, 4).tolist() == [0, 1]  # 1 and 2 twice a step: half a group each
    assert Context(run([[[1, 1, 2, 2]]]), run([[[1, 1]], [[2, 2]]])).unjudgeable == ""


def _step_record(per_rank: list[list[list[int]]]) -> StepRecord:
    """Two ranks, one optimizer step per batch position of loader "l" (``per_rank[rank][position]``)."""
    steps = []
    for batches in per_rank:
        micro = [
            (MicroStep(loader="l", epoch=0, batches=(k,), samples=len(b)),) for k, b in enumerate(batches)
        ]
        steps.append(StepTrace(steps=tuple(OptimizerStep(k, m, grad=(1.0,)) for k, m in enumerate(micro))))
    loading = {"l": [(epoch(0, [i for b in batches for i in b], batch_sizes=[len(b) for b in batches]),)
                     for batches in per_rank]}  # fmt: skip
    return StepRecord(tuple(steps), loading=loading)


def _differs(steps: int) -> Verdict:
    compared = tuple(ComparedStep(k, 0.4, (1, 1), (6, 6), None) for k in range(steps))
    return Verdict(
        STEP_EQUIVALENCE, "fail", "differs", OTHER, evidence=StepEvidence(1e-5, "float32", "", compared)
    )


def test_the_step_names_per_rank_group_statistics_where_a_group_is_split() -> None:
    """A failing step over groups split across ranks: per-rank group statistics; over whole groups per
    rank: a statistic across groups; over rows without groups, or any other cause: as it was."""
    split = _step_record([[[0, 0, 0, 0, 1, 1]], [[1, 1, 2, 2, 2, 2]]])
    named = for_groups(_differs(1), split, Layout.plain(2), 4)
    assert named.cause.startswith(
        "the rows are prompt groups of 4 copies split across ranks (prompt 1 at step 0"
    )
    assert "rank 0's rows 4-5 and rank 1's rows 0-1" in named.cause and "gather the rewards" in named.fix
    whole = for_groups(_differs(1), _step_record([[[0, 0, 0, 0]], [[1, 1, 1, 1]]]), Layout.plain(2), 4)
    assert whole.cause == GROUPS_WHOLE.format(size=4)
    assert for_groups(_differs(1), split, Layout.plain(2), 0).cause == OTHER  # the loader has no groups
    factor = replace(_differs(1), cause="the gradient is exactly 2x one process's")
    assert for_groups(factor, split, Layout.plain(2), 4) is factor


def test_group_size_reads_an_epoch_of_int_ids_as_an_array_not_as_python_ints() -> None:
    """At 1e8 samples a loader file's epoch arrives as an array: reading it through ``__iter__`` made 3.6
    GB of Python ints in the parent and took a simulated 1e8-sample check from 2.7 to 5.2 GiB (measured
    with benchmarks/bench_simulate_scale.py). The grouped and the ungrouped stream, traced."""
    import tracemalloc

    import numpy as np

    from ddpcheck.trace import IdArray

    shuffled = IdArray(np.random.default_rng(0).permutation(2_000_000).astype(np.int64))
    grouped = IdArray(np.repeat(np.random.default_rng(1).permutation(500_000), 4).astype(np.int64))
    tracemalloc.start()
    try:
        assert group_size(shuffled) == 0
        ungrouped_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        assert group_size(grouped) == 4
        grouped_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert ungrouped_peak < 1 << 20  # told from the first two ids
    assert grouped_peak < 40 << 20  # one int64 copy (16 MB) and its run bounds; Python ints were 72 MB+
