"""The data checks on synthetic traces: correct splits pass, each planted bug fails the right check."""

from __future__ import annotations

import random
import time
from array import array
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddpcheck.checks import REGISTRY, Context, run_checks
from ddpcheck.checks.diagnose import SHARDED_TWICE
from ddpcheck.trace import EpochTrace, LoaderFacts, RankTrace, RunTrace
from ddpcheck.verdict import ALL_CHECKS, DATA_CHECKS, METRIC_EQUIVALENCE, Verdict
from tests.trace_builders import (
    batch_run,
    broken,
    ddp_run,
    epoch,
    per_rank,
    permutations,
    rebuild,
    reference,
    run,
    strided,
)


def by_id(verdicts: list[Verdict]) -> dict[str, Verdict]:
    return {v.check: v for v in verdicts}


def failed(verdicts: list[Verdict]) -> set[str]:
    return {v.check for v in verdicts if v.status == "fail"}


def check(name: str, ref: RunTrace, trace: RunTrace, rerun: RunTrace | None = None) -> Verdict:
    (verdict,) = run_checks(ref, trace, rerun, only=[name])
    return verdict


def correct(n: int = 10, w: int = 4, epochs: int = 2, **kwargs: object) -> tuple[RunTrace, RunTrace]:
    """A reshuffling single-process reference and a correct padded DDP split of other permutations."""
    ref = reference(permutations(n, epochs, seed=7))
    return ref, ddp_run(permutations(n, epochs, seed=1), w, **kwargs)  # type: ignore[arg-type]


# --- interface ---------------------------------------------------------------------------------


def test_one_verdict_per_data_check_in_order() -> None:
    ref, trace = correct()
    verdicts = run_checks(ref, trace, trace)
    assert [v.check for v in verdicts] == list(DATA_CHECKS)
    assert failed(verdicts) == set()
    # without workers, a custom batch sampler or tokens those checks do not apply, and say so
    not_applying = {
        "worker_sharding",
        "batch_integrity",
        "work_balance",
        "packing",
        "mixture",
        "supervision",
        "rng_independence",
        "prompt_groups",
    }  # no tokens, no labels, no watched draws, no runs of copies either
    assert all(v.status == "pass" and v.detail for v in verdicts if v.check not in not_applying)
    assert all(v.status == "n/a" and v.detail for v in verdicts if v.check in not_applying)


def test_registry_maps_every_data_check_and_runs_alone() -> None:
    ref, trace = correct()
    assert tuple(REGISTRY) == DATA_CHECKS
    for name, fn in REGISTRY.items():
        assert fn(ref, trace, trace).check == name  # without a shared Context


def test_only_narrows_keeps_order_and_ignores_metric_ids() -> None:
    ref, trace = correct()
    verdicts = run_checks(ref, trace, only=["reshuffle", "coverage", METRIC_EQUIVALENCE])
    assert [v.check for v in verdicts] == ["coverage", "reshuffle"]
    assert run_checks(ref, trace, only=[]) == []


def test_only_rejects_unknown_ids_and_bare_strings() -> None:
    ref, trace = correct()
    with pytest.raises(ValueError, match=r"unknown check id.*'coverge'.*choose from"):
        run_checks(ref, trace, only=["coverge"])
    with pytest.raises(TypeError, match="collection of check ids"):
        run_checks(ref, trace, only="coverage")


def test_reference_must_be_single_process_and_rerun_same_world_size() -> None:
    ref, trace = correct()
    with pytest.raises(ValueError, match="world size 1"):
        run_checks(trace, trace)
    with pytest.raises(ValueError, match="rerun has world size 1 but run has 4"):
        run_checks(ref, trace, ref)
    with pytest.raises(ValueError, match="at least one rank"):
        run_checks(ref, RunTrace(0, "gloo", ()))


@pytest.mark.parametrize("which", ["run", "reference"])
def test_broken_runs_skip_every_check_with_the_reason(which: str) -> None:
    ref, trace = correct()
    if which == "run":
        trace = broken(trace, rank=2, kind="hang", message="stuck in all_reduce")
    else:
        ref = broken(ref, rank=0, kind="error", message="ZeroDivisionError")
    verdicts = run_checks(ref, trace, trace)
    assert {v.status for v in verdicts} == {"skip"}
    expected = "rank 2 hang: stuck in all_reduce" if which == "run" else "rank 0 error: ZeroDivisionError"
    assert all(expected in v.detail for v in verdicts)


def test_skipped_world_size_and_missing_ranks_skip() -> None:
    ref, trace = correct()
    skipped_run = replace(trace, skipped="needs 4 CPUs, found 2")
    assert all("needs 4 CPUs" in v.detail and v.status == "skip" for v in run_checks(ref, skipped_run))
    partial = replace(trace, ranks=trace.ranks[:3])
    assert all("3 of 4 ranks" in v.detail for v in run_checks(ref, partial))


def test_no_epochs_recorded_skips() -> None:
    ref = reference([])
    trace = run([[], []])
    assert all(v.status == "skip" and "no epoch" in v.detail for v in run_checks(ref, trace))


def test_context_is_shared_and_lazy() -> None:
    ref, trace = correct(n=20, w=3)
    ctx = Context(ref, trace)
    assert ctx.view(0) is ctx.view(0)
    assert ctx.view(0).missing_count == 0
    assert ctx.view(0).cross_excess == 1  # 20 samples on 3 ranks: one padding copy
    assert ctx.stable


# --- correct traces and edge cases ----------------------------------------------------------


def test_world_size_one_equals_reference() -> None:
    orders = permutations(9, 3, seed=3)
    ref = reference(orders)
    trace = ddp_run(orders, 1)
    assert failed(run_checks(ref, trace, trace)) == set()


def test_empty_dataset_passes_everything_but_cannot_reshuffle() -> None:
    ref = reference([[], []])
    trace = ddp_run([[], []], 3)
    verdicts = by_id(run_checks(ref, trace, trace))
    assert failed(list(verdicts.values())) == set()
    assert verdicts["reshuffle"].detail == "reference keeps its order (no shuffle); nothing to compare"
    assert verdicts["equal_steps"].status == "pass"


def test_fewer_samples_than_ranks_with_padding() -> None:
    ref = reference([[0, 1], [1, 0]])
    trace = ddp_run([[0, 1], [1, 0]], 5)
    assert [len(e.ids) for r in trace.ranks for e in r.epochs[:1]] == [1] * 5
    verdicts = by_id(run_checks(ref, trace, trace))
    assert failed(list(verdicts.values())) == set()
    assert verdicts["padding_bound"].detail.startswith("at most 3 duplicated samples")


def test_fewer_samples_than_ranks_with_drop() -> None:
    ref = reference([[0, 1, 2]])
    trace = ddp_run([[0, 1, 2]], 5, pad=False)  # every sample dropped: 3 <= world_size - 1
    assert failed(run_checks(ref, trace)) == set()


def test_loader_drop_last_is_allowed_per_rank() -> None:
    orders = permutations(23, 2, seed=5)
    ref = reference(orders, batch_size=4, drop_last=True)
    trace = ddp_run(orders, 2, batch_size=4, drop_last=True)  # 12 per rank, 3 whole batches of 4 each
    verdicts = by_id(run_checks(ref, trace))
    assert failed(list(verdicts.values())) == set()
    assert ref.ranks[0].epochs[0].num_batches == 5


def test_sampler_drop_within_world_size_passes_when_padding_off() -> None:
    ref, trace = correct(n=10, w=4, pad=False)  # drops 2 of 10
    verdicts = by_id(run_checks(ref, trace))
    assert failed(list(verdicts.values())) == set()
    assert "at most 2 dropped, 3 allowed" in verdicts["coverage"].detail


def test_reference_without_shuffle_and_ddp_without_shuffle() -> None:
    orders = permutations(12, 2, seed=0, shuffle=False)
    verdict = check("reshuffle", reference(orders), ddp_run(orders, 3))
    assert verdict.status == "pass"
    assert "keeps its order" in verdict.detail


def test_string_ids_and_content_hash_duplicates() -> None:
    names = [f"img{i}.jpg" for i in range(8)] + ["img0.jpg"]  # a content hash maps two samples to one id
    ref = reference([names, names])
    trace = ddp_run([names, names], 3)
    assert failed(run_checks(ref, trace, trace)) == set()


def test_one_epoch_skips_reshuffle() -> None:
    ref, trace = correct(epochs=1)
    verdict = check("reshuffle", ref, trace)
    assert verdict.status == "skip" and "needs 2 epochs" in verdict.detail


# --- coverage ---------------------------------------------------------------------------------


def test_coverage_sampler_drops_more_than_padding_allows() -> None:
    ref, good = correct(n=10, w=4)
    ids = per_rank(good)
    ids[0] = [e[:-1] for e in ids[0]]  # rank 0 loses its last sample although the sampler pads
    trace = rebuild(good, ids)
    verdict = check("coverage", ref, trace)
    assert verdict.failed
    assert verdict.evidence.allowed == 0
    assert verdict.cause == "the loader's length depends on the rank: ranks yield between 2 and 3 samples"
    missing = set(range(10)) - set(ids[0][0] + ids[1][0] + ids[2][0] + ids[3][0])
    assert set(verdict.examples) == missing
    assert verdict.epochs == (0, 1)


def test_coverage_tail_dropped_evenly_names_tail_cause() -> None:
    orders = permutations(40, 2, seed=2)
    ref = reference(orders)
    # every rank yields 8 instead of 10: 8 samples never seen, padding=True so nothing may go missing
    trace = run([[o[r::4][:8] for o in orders] for r in range(4)], padding=True)
    verdict = check("coverage", ref, trace)
    assert verdict.failed
    assert verdict.cause == "the sampler drops the tail: pad or use fewer ranks"
    assert verdict.evidence.as_data() == {"missing": 8, "allowed": 0, "items": 40, "epochs_failing": 2}
    assert "8 samples of 40 are never seen by any rank in epoch 0" in verdict.detail


def test_coverage_says_what_may_be_dropped_and_why_apart_from_the_ids() -> None:
    """Not "at most 0 may be dropped: 0, 1, 4" (ids read as dropped): the bound, its reason, then the ids."""
    orders = permutations(40, 2, seed=2)
    padded = run([[o[r::4][:8] for o in orders] for r in range(4)], padding=True)
    detail = check("coverage", reference(orders), padded).detail
    assert "an honest split drops no samples here (no drop_last, and the sampler pads)" in detail
    assert "; never seen: " in detail and "may be dropped" not in detail
    tail = run([[o[r::4][:4] for o in orders] for r in range(4)], padding=False, drop_last=True, batch_size=4)
    detail = check("coverage", reference(orders), tail).detail
    assert (
        "an honest split drops at most 15 samples an epoch: drop_last drops up to 3 (batch_size - 1) on each "
        "rank; an even split without padding drops up to 3 (world size - 1)"
    ) in detail, detail
    equivalence = check("single_process_equivalence", reference(orders), padded).detail
    assert "(an honest split drops no samples here" in equivalence and "never seen: " in equivalence


def test_long_ids_read_short_in_details() -> None:
    from ddpcheck.checks.wording import ids_text
    from ddpcheck.messages import short_id

    assert ids_text([3, 1087362260100484431]) == f"3, {short_id(1087362260100484431)}"
    assert ids_text(["x" * 100]) == "x" * 37 + "..."


def test_coverage_rank_aware_dataset_under_distributed_sampler() -> None:
    n, w = 40, 4
    ref = reference([list(range(n))] * 2)
    shards = [list(range(r * 10, r * 10 + 10)) for r in range(w)]  # the dataset already split by rank
    trace = run([[s[r::w]] * 2 for r, s in enumerate(shards)], padding=True)  # ...and split again
    verdict = check("coverage", ref, trace)
    assert verdict.failed
    assert verdict.cause == SHARDED_TWICE  # one cause whatever the world size: each rank sees 1/W² of it
    assert "30 samples of 40 are never seen by any rank" in verdict.detail
    assert verdict.fix.startswith("shard once")
    with_len = run([[s[r::w]] * 2 for r, s in enumerate(shards)], padding=True, dataset_len=10)
    verdict = check("coverage", ref, with_len)
    assert verdict.cause == SHARDED_TWICE  # named before the per-rank length it implies


def test_coverage_with_resampling_reference_counts_only() -> None:
    rng = random.Random(0)
    subsets = [rng.sample(range(100), 30) for _ in range(2)]
    ref = reference(subsets, dataset_len=100)
    other = [rng.sample(range(100), 30) for _ in range(2)]  # the DDP run draws its own subsets
    trace = ddp_run(other, 3)
    verdicts = by_id(run_checks(ref, trace))
    assert verdicts["coverage"].status == "pass"
    assert "counts only" in verdicts["coverage"].detail
    assert verdicts["single_process_equivalence"].status == "pass"
    short = ddp_run([o[:20] for o in other], 3)
    verdict = check("coverage", ref, short)
    assert verdict.failed and verdict.evidence.missing == 9  # 21 yielded (20 padded to 21) of 30
    assert "the ranks together yield 21 samples in epoch 0 (also epoch 1), 9 fewer" in verdict.detail


# --- no_overlap / padding_bound -----------------------------------------------------------------


def test_sampling_with_replacement_repeats_are_not_overlap() -> None:
    rng = random.Random(1)
    draws = [[rng.randrange(20) for _ in range(40)] for _ in range(2)]  # a with-replacement sampler
    ref = reference(draws, dataset_len=20)
    own = [[rng.randrange(20) for _ in range(40)] for _ in range(2)]  # the DDP run draws its own
    verdicts = by_id(run_checks(ref, ddp_run(own, 4)))
    assert failed(list(verdicts.values())) == set()
    assert "samples with replacement" in verdicts["no_overlap"].detail
    same = run([own] * 4, padding=True)  # ...but every rank drawing the same stream is still caught
    verdict = check("no_overlap", ref, same)
    assert verdict.failed and "the sampler ignores the rank" in verdict.cause


def test_no_overlap_same_stream_on_every_rank() -> None:
    orders = permutations(10, 2, seed=4)
    trace = run([orders] * 4, padding=True)
    verdict = check("no_overlap", reference(orders), trace)
    assert verdict.failed
    assert verdict.cause == (
        "every rank sees the same stream: the sampler ignores the rank "
        "(no DistributedSampler, or num_replicas/rank not passed)"
    )
    assert verdict.ranks == (0, 1, 2, 3)
    assert verdict.examples == (0, 1, 2, 3, 4)
    assert verdict.detail.startswith("rank 0 and rank 1 both see samples 0, 1, 2, 3, 4 in epoch 0")


def test_no_overlap_rank_dependent_seed() -> None:
    n, w = 200, 4
    ref = reference(permutations(n, 2, seed=0))
    per = [[strided(o, w)[r] for o in permutations(n, 2, seed=100 + r)] for r in range(w)]
    trace = run(per, padding=True)
    verdict = check("no_overlap", ref, trace)
    assert verdict.failed
    assert verdict.cause == (
        "ranks draw different permutations: the sampler's seed (or random state) depends on the rank"
    )
    a, b = verdict.ranks
    shared = set(trace.ranks[a].epochs[0].ids) & set(trace.ranks[b].epochs[0].ids)
    assert set(verdict.examples) <= shared and verdict.examples
    assert check("coverage", ref, trace).cause == verdict.cause  # the same bug explains the gaps


def test_no_overlap_whole_epoch_per_rank_in_different_orders() -> None:
    n, w = 30, 3
    ref = reference(permutations(n, 2, seed=0))
    trace = run([permutations(n, 2, seed=50 + r) for r in range(w)])
    verdict = check("no_overlap", ref, trace)
    assert verdict.failed
    assert "every rank sees the whole epoch" in verdict.cause
    assert "the sampler ignores the rank" in verdict.cause


def test_no_overlap_off_by_one_chunks_names_pairs_and_ids() -> None:
    ids = list(range(40))
    chunks = [ids[max(0, 10 * r - 1) : 10 * r + 10] for r in range(4)]  # each chunk starts one early
    trace = run([[c] for c in chunks], padding=False)
    verdict = check("no_overlap", reference([ids]), trace)
    assert verdict.failed
    assert verdict.ranks == (0, 1)
    assert verdict.examples == (9,)
    assert verdict.detail.startswith("rank 0 and rank 1 both see sample 9 in epoch 0")
    assert "3 extra copies, at most 0 allowed since the sampler does not pad" in verdict.detail
    assert "num_replicas/rank arithmetic" in verdict.cause
    assert verdict.evidence.duplicates == 3


def test_no_overlap_allows_padding_only_when_padding_possible() -> None:
    ref, trace = correct(n=10, w=4)  # 2 padding copies
    assert check("no_overlap", ref, trace).status == "pass"
    no_pad = rebuild(trace, per_rank(trace))
    no_pad = replace(
        no_pad, ranks=tuple(replace(r, facts=replace(r.facts, padding=False)) for r in no_pad.ranks)
    )
    assert check("no_overlap", ref, no_pad).failed
    verdict = check("padding_bound", ref, no_pad)
    assert verdict.failed
    assert "but the sampler does not pad, so none are allowed" in verdict.detail
    assert verdict.evidence.as_data() == {
        "duplicates": 2, "bound": 0, "epochs_failing": 2, "copies": 2, "samples": 10, "noun": "samples"
    }  # fmt: skip


def test_padding_bound_pads_to_whole_batches() -> None:
    n, w, bs = 10, 4, 4
    orders = permutations(n, 2, seed=9)
    padded = [(o * 2)[: w * bs] for o in orders]  # 16 slots: 6 copies > world_size - 1
    trace = ddp_run(padded, w, batch_size=bs)
    ref = reference(orders)
    verdict = check("padding_bound", ref, trace)
    assert verdict.failed
    assert verdict.evidence.duplicates == 6 and verdict.evidence.bound == 3
    assert "pads more than world_size - 1" in verdict.cause
    assert "6 duplicated samples in epoch 0" in verdict.detail


def test_padding_bound_counts_within_rank_repeats() -> None:
    orders = [list(range(8))]
    per = strided(orders[0], 2)
    per[0] = per[0] + [per[0][0]] * 3
    trace = run([[p] for p in per], padding=True)
    verdict = check("padding_bound", reference(orders), trace)
    assert verdict.failed
    assert "within its own epoch" in verdict.cause
    assert check("no_overlap", reference(orders), trace).status == "pass"


# --- equal_steps ------------------------------------------------------------------------------


def test_equal_steps_uneven_batches() -> None:
    trace = run([[list(range(20))], [list(range(20, 36))]], batch_size=4)
    verdict = check("equal_steps", reference([list(range(36))]), trace)
    assert verdict.failed
    assert verdict.detail == (
        "rank 0 yields 5 batches, rank 1 yields 4 in epoch 0: "
        "the next collective after step 4 hangs (uneven steps)"
    )
    assert verdict.ranks == (0, 1)
    assert verdict.evidence.max_batches == 5 and verdict.evidence.min_batches == 4


def test_equal_steps_wrong_len_loader() -> None:
    ref, good = correct(n=32, w=4)  # 8 per rank, 2 batches each
    ranks = list(good.ranks)
    lying = replace(ranks[2].epochs[0], len_loader=5, batch_sizes=(4, 4), ids=ranks[2].epochs[0].ids)
    ranks[2] = replace(ranks[2], epochs=(lying, *ranks[2].epochs[1:]))
    verdict = check("equal_steps", ref, replace(good, ranks=tuple(ranks)))
    assert verdict.failed
    assert verdict.detail == "len(loader) says 5 but rank 2 yielded 2 in epoch 0"
    assert verdict.ranks == (2,) and verdict.epochs == (0,)
    assert "__len__" in verdict.cause


def test_equal_steps_iterable_cause() -> None:
    trace = run([[list(range(9))], [list(range(9, 13))]], dataset_kind="iterable")
    verdict = check("equal_steps", reference([list(range(13))]), trace)
    assert verdict.failed and "iterable dataset" in verdict.cause


# --- reshuffle --------------------------------------------------------------------------------


def test_reshuffle_set_epoch_not_called() -> None:
    n, w = 40, 4
    ref = reference(permutations(n, 3, seed=0))
    same = permutations(n, 1, seed=1) * 3
    trace = ddp_run(same, w)
    verdict = check("reshuffle", ref, trace)
    assert verdict.failed
    assert verdict.detail.startswith(
        "epoch 1 repeats epoch 0 on rank 0: "
        "set_epoch is not called, or the generator is re-seeded every epoch"
    )
    assert verdict.ranks == (0, 1, 2, 3) and verdict.epochs == (0, 1)
    no_call = replace(trace, set_epoch=False)
    assert (
        "the loop did not call set_epoch, and the order depends on it"
        in check("reshuffle", ref, no_call).cause
    )
    no_method = ddp_run(same, w, has_set_epoch=False)
    assert "has no set_epoch" in check("reshuffle", ref, no_method).cause


def test_reshuffle_one_rank_repeats() -> None:
    n, w = 60, 3
    orders = permutations(n, 2, seed=3)
    good = per_rank(ddp_run(orders, w))
    good[1][1] = list(good[1][0])  # rank 1 alone keeps its order
    verdict = check("reshuffle", reference(orders), run(good, padding=True))
    assert verdict.failed and verdict.ranks == (1,)


def test_reshuffle_frozen_shards() -> None:
    n, w = 40, 4
    orders = permutations(n, 2, seed=0)
    rng = random.Random(5)
    shards = strided(orders[0], w)
    per = []
    for s in shards:
        again = list(s)
        while again == s:
            rng.shuffle(again)
        per.append([s, again])
    verdict = check("reshuffle", reference(orders), run(per, padding=True))
    assert verdict.failed
    assert (
        verdict.cause == "the sample-to-rank assignment never changes: each rank only reorders its own shard"
    )


def test_reshuffle_too_few_samples_to_tell() -> None:
    orders = [[0, 1, 2, 3], [3, 2, 1, 0]]
    trace = ddp_run([[0, 1, 2, 3], [0, 1, 2, 3]], 2)  # repeats, but 1 in 24 by chance
    verdict = check("reshuffle", reference(orders), trace)
    assert verdict.status == "pass"
    assert "too few samples per rank to tell" in verdict.detail and "1 in 24" in verdict.detail


def test_reshuffle_without_set_epoch_in_both_runs_notes_it() -> None:
    orders = permutations(30, 1, seed=0) * 2
    ref = replace(reference(orders, has_set_epoch=True), set_epoch=False)
    verdict = check("reshuffle", ref, replace(ddp_run(orders, 2), set_epoch=False))
    assert verdict.status == "pass"
    assert verdict.detail.startswith("reference keeps its order (no shuffle); nothing to compare")
    assert "did not call set_epoch" in verdict.detail


def test_rank_dependent_dataset_length_explains_shuffled_shards() -> None:
    n, w = 60, 3
    ref = reference(permutations(n, 2, seed=0), dataset_len=n)
    per = [[strided(o, w)[r] for o in permutations(n + r, 2, seed=0)] for r in range(w)]
    trace = run(per, padding=True)
    ranks = tuple(replace(rt, facts=replace(rt.facts, dataset_len=n + rt.rank)) for rt in trace.ranks)
    verdict = check("no_overlap", ref, replace(trace, ranks=ranks))
    assert verdict.failed
    assert verdict.cause.startswith(
        "the loader's length depends on the rank: "
        "the dataset has 61 samples on rank 1 but 60 in a single process; "
    )
    assert "local to the rank" in verdict.cause and "sample_ids(batch) hook" in verdict.cause  # index ids
    assert verdict.ranks == (1, 2)


def test_reshuffle_passes_with_set_epoch_note() -> None:
    ref, trace = correct(n=50, w=2)
    verdict = check("reshuffle", ref, replace(trace, set_epoch=False))
    assert verdict.status == "pass"
    assert "did not call set_epoch, and the order changed without it" in verdict.detail


# --- determinism ------------------------------------------------------------------------------


def test_determinism_needs_a_rerun() -> None:
    ref, trace = correct()
    verdict = check("determinism", ref, trace)
    assert verdict.status == "skip" and "second run" in verdict.detail
    verdict = check("determinism", ref, trace, broken(trace))
    assert verdict.status == "skip" and "the rerun broke" in verdict.detail


def test_determinism_names_first_difference() -> None:
    ref, trace = correct(n=20, w=2)
    ids = per_rank(trace)
    ids[1][0][3], ids[1][0][4] = ids[1][0][4], ids[1][0][3]
    rerun = rebuild(trace, ids)
    verdict = check("determinism", ref, trace, rerun)
    assert verdict.failed
    assert verdict.ranks == (1,) and verdict.epochs == (0,)
    assert verdict.evidence.position == 3
    assert "rank 1, epoch 0 differs between two runs with the same seed at position 3" in verdict.detail
    assert (
        verdict.cause
        == "the order changes from run to run: an unseeded generator or per-process random state"
    )


def test_determinism_batch_boundaries() -> None:
    ref, trace = correct(n=16, w=2)
    rerun = rebuild(trace, per_rank(trace), batch_size=3)
    verdict = check("determinism", ref, trace, rerun)
    assert verdict.failed and "batch 0" in verdict.detail


def test_determinism_compares_arrays_with_tuples() -> None:
    ref, trace = correct(n=12, w=2)
    as_tuples = replace(
        trace,
        ranks=tuple(
            replace(r, epochs=tuple(replace(e, ids=tuple(e.ids)) for e in r.epochs)) for r in trace.ranks
        ),
    )
    assert isinstance(trace.ranks[0].epochs[0].ids, array)
    assert check("determinism", ref, trace, as_tuples).status == "pass"


# --- batch_integrity --------------------------------------------------------------------------


def _batches(n: int, size: int, seed: int) -> list[list[int]]:
    order = permutations(n, 1, seed)[0]
    return [order[i : i + size] for i in range(0, n, size)]


def test_batch_integrity_not_custom() -> None:
    ref, trace = correct()
    verdict = check("batch_integrity", ref, trace)
    assert verdict.status == "n/a" and "only chunks its sampler into batches" in verdict.detail


def test_batch_integrity_whole_batches_pass_and_split_batches_fail() -> None:
    epochs = [_batches(24, 4, seed) for seed in (0, 1)]
    ref = batch_run([epochs])
    whole = batch_run([[e[r::2] for e in epochs] for r in range(2)])
    verdicts = by_id(run_checks(ref, whole, whole))
    assert failed(list(verdicts.values())) == set()
    assert verdicts["coverage"].detail.startswith("every epoch's batches reach some rank (6 per epoch")

    # samples sharded under the batch sampler: each rank re-forms batches of 4 from its half
    resplit = []
    for r in range(2):
        mine = [[x for b in e for x in b][r::2] for e in epochs]
        resplit.append([[ids[i : i + 4] for i in range(0, len(ids), 4)] for ids in mine])
    trace = batch_run(resplit)  # the recorder still reports a custom batch sampler
    verdicts = by_id(run_checks(ref, trace))
    assert failed(list(verdicts.values())) == {"batch_integrity"}  # samples are still split correctly
    assert "samples" in verdicts["coverage"].detail
    verdict = verdicts["batch_integrity"]
    assert verdict.failed
    assert verdict.cause.startswith(
        "batches are split or re-formed across ranks: "
        "shard whole batches (wrap the batch sampler) instead of samples"
    )
    assert "--allow batch_integrity" in verdict.cause
    assert verdict.ranks == (0, 1) and verdict.epochs == (0, 1)
    (example,) = verdict.examples
    assert isinstance(example, tuple) and sorted(example) == sorted(resplit[0][0][0])
    assert "rank 0 yields a batch the single-process loader never forms in epoch 0" in verdict.detail


def test_batch_level_overlap_and_coverage_count_batches() -> None:
    epochs = [_batches(24, 4, 0)]
    ref = batch_run([epochs])
    same = batch_run([epochs, epochs])  # both ranks get every batch
    verdict = check("no_overlap", ref, same)
    assert verdict.failed and "batches" in verdict.detail
    assert isinstance(verdict.examples[0], tuple)
    missing = batch_run([[epochs[0][:2]], [epochs[0][2:4]]], padding=True)
    verdict = check("coverage", ref, missing)
    assert verdict.failed and verdict.evidence.missing == 2


def test_whole_batch_padding_on_one_rank_is_not_a_worker_repeat() -> None:
    batches = _batches(20, 4, 0)  # 5 batches on 2 ranks: one padded batch
    ref = batch_run([[batches]])
    trace = batch_run([[batches[0::2]], [[*batches[1::2], batches[1]]]], padding=True)
    verdicts = by_id(run_checks(ref, trace))
    assert failed(list(verdicts.values())) == set()
    assert "within the padding" in verdicts["worker_sharding"].detail


def test_batch_integrity_unseeded_batches_compares_sizes() -> None:
    ref = batch_run([[_batches(24, 4, 0), _batches(24, 4, 1)]])
    first, second = ([_batches(24, 4, s), _batches(24, 4, s + 1)] for s in (2, 4))
    trace = batch_run([[e[r::2] for e in first] for r in range(2)])
    rerun = batch_run([[e[r::2] for e in second] for r in range(2)])  # a different draw: unseeded
    verdict = check("batch_integrity", ref, trace, rerun)
    assert verdict.status == "pass" and "only their sizes were compared" in verdict.detail
    assert check("batch_integrity", ref, trace, trace).failed  # seeded, yet not the reference's batches
    halves = batch_run([[[b[:2] for b in e[r::2]] for e in first] for r in range(2)])
    assert check("batch_integrity", ref, halves, rerun).failed


# --- worker_sharding --------------------------------------------------------------------------


def _iterable_rank(rank: int, per_worker: list[list[int]], batch_size: int = 2) -> RankTrace:
    """Batches alternate between workers, as DataLoader does, each worker cutting its own stream."""
    streams = [[s[i : i + batch_size] for i in range(0, len(s), batch_size)] for s in per_worker]
    batches, workers = [], []
    for i in range(max(len(s) for s in streams)):
        for w, s in enumerate(streams):
            if i < len(s):
                batches.append(s[i])
                workers.append(w)
    ids = [x for b in batches for x in b]
    trace = epoch(0, ids, batch_sizes=[len(b) for b in batches], worker_ids=workers)
    facts = LoaderFacts(dataset_kind="iterable", num_workers=len(per_worker), batch_size=batch_size)
    return RankTrace(rank, (trace,), facts)


def test_worker_sharding_iterable_not_split_across_workers() -> None:
    ref = reference([list(range(16))])
    ranks = tuple(_iterable_rank(r, [list(range(r, 16, 2))] * 2) for r in range(2))  # both workers replay
    trace = RunTrace(2, "gloo", ranks)
    verdict = check("worker_sharding", ref, trace)
    assert verdict.failed
    assert (
        verdict.cause == "the iterable dataset is not split across DataLoader workers (use get_worker_info())"
    )
    assert verdict.ranks == (0, 1)
    assert verdict.examples == (0, 2, 4, 6, 8)
    assert "(from workers 0, 1)" in verdict.detail
    split = RunTrace(
        2,
        "gloo",
        tuple(_iterable_rank(r, [list(range(r, 16, 4)), list(range(r + 2, 16, 4))]) for r in range(2)),
    )
    assert check("worker_sharding", ref, split).status == "pass"


def test_worker_sharding_reference_replays_too() -> None:
    ref = RunTrace(1, "gloo", (_iterable_rank(0, [list(range(8))] * 2),))
    ranks = tuple(_iterable_rank(r, [list(range(r, 8, 2))] * 2) for r in range(2))
    verdict = check("worker_sharding", ref, RunTrace(2, "gloo", ranks))
    assert verdict.failed
    assert "get_worker_info" in verdict.cause
    assert "the single-process loader repeats them the same way" in verdict.detail


def test_worker_sharding_replay_without_worker_ids() -> None:
    def unrecorded(rank: RankTrace) -> RankTrace:
        return replace(rank, epochs=tuple(replace(e, worker_ids=None) for e in rank.epochs))

    ref = RunTrace(1, "gloo", (unrecorded(_iterable_rank(0, [list(range(8))] * 2)),))
    ranks = tuple(unrecorded(_iterable_rank(r, [list(range(r, 8, 2))] * 2)) for r in range(2))
    verdict = check("worker_sharding", ref, RunTrace(2, "gloo", ranks))
    assert verdict.failed and "get_worker_info" in verdict.cause
    thrice = tuple(unrecorded(_iterable_rank(r, [list(range(r, 8, 2))] * 3)) for r in range(2))
    facts = replace(thrice[0].facts, num_workers=2)  # 3 copies cannot come from 2 workers
    thrice = tuple(replace(r, facts=facts) for r in thrice)
    ref3 = RunTrace(1, "gloo", (replace(unrecorded(_iterable_rank(0, [list(range(8))] * 3)), facts=facts),))
    assert check("worker_sharding", ref3, RunTrace(2, "gloo", thrice)).status == "pass"


def test_worker_sharding_generic_repeat_and_reference_duplicates() -> None:
    ref = reference([list(range(12))])
    trace = run([[[0, 1, 2, 3, 4, 5, 0]], [[6, 7, 8, 9, 10, 11]]], padding=False)
    verdict = check("worker_sharding", ref, trace)
    assert verdict.failed
    assert verdict.cause.startswith("a rank yields the same sample twice in one epoch")
    assert verdict.ranks == (0,) and verdict.examples == (0,)
    ref_dup = reference([[*range(12), 0]])  # one process yields 0 twice as well
    assert check("worker_sharding", ref_dup, trace).status == "n/a"  # no workers, no excess repeat
    ranks = list(trace.ranks)  # a map dataset: batches alternate between two workers, as they do
    ranks[0] = replace(ranks[0], epochs=(replace(ranks[0].epochs[0], worker_ids=(0, 1)),))
    with_workers = replace(trace, ranks=tuple(ranks))
    verdict = check("worker_sharding", ref, with_workers)
    assert verdict.failed and "(from workers 0, 1)" in verdict.detail
    assert verdict.cause.startswith("a rank yields the same sample twice")


def test_worker_sharding_padding_repeat_on_one_rank_is_allowed() -> None:
    trace = run([[[0, 1, 2, 0]], [[3, 4, 5, 6]]], padding=True)  # 7 samples padded to 8, copy lands on rank 0
    verdict = check("worker_sharding", reference([list(range(7))]), trace)
    assert verdict.status == "n/a" and "within the padding" in verdict.detail  # no workers to judge
    workers = run([[[0, 1, 2, 0]], [[3, 4, 5, 6]]], padding=True, num_workers=2)
    verdict = check("worker_sharding", reference([list(range(7))]), workers)
    assert verdict.status == "pass" and "within the padding" in verdict.detail


# --- single_process_equivalence ---------------------------------------------------------------


def test_equivalence_rank_dependent_dataset() -> None:
    ref = reference([list(range(12))] * 2)
    per = [[list(range(r, 12, 3))] * 2 for r in range(3)]
    per[2] = [[x + 1000 for x in e] for e in per[2]]  # rank 2 builds its own samples
    verdict = check("single_process_equivalence", ref, run(per, padding=True))
    assert verdict.failed
    assert verdict.detail.startswith(
        "rank 2 sees ids the single-process loader never yields: 1002, 1005, 1008, 1011"
    )
    assert verdict.cause.startswith("the dataset depends on the rank")
    assert verdict.ranks == (2,) and verdict.epochs == (0, 1)
    assert verdict.evidence.as_data() == {"extra": 4, "epochs_failing": 2}


def test_equivalence_missing_samples() -> None:
    ref = reference([list(range(12))])
    trace = run([[list(range(0, 6))], [list(range(6, 9))]], padding=False)
    verdict = check("single_process_equivalence", ref, trace)
    assert verdict.failed
    assert "the ranks together see 9 of the 12 samples" in verdict.detail
    assert verdict.examples == (9, 10, 11)


# --- properties -------------------------------------------------------------------------------

layouts = st.fixed_dictionaries(
    {
        "n": st.integers(0, 60),
        "w": st.integers(1, 8),
        "pad": st.booleans(),
        "shuffle": st.booleans(),
        "batch_size": st.integers(1, 5),
        "seed": st.integers(0, 2**16),
    }
)
PROPERTY = settings(
    max_examples=60, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def _layout(p: dict[str, int]) -> tuple[RunTrace, RunTrace]:
    ref = reference(permutations(p["n"], 2, p["seed"], bool(p["shuffle"])), batch_size=p["batch_size"])
    trace = ddp_run(
        permutations(p["n"], 2, p["seed"] + 1, bool(p["shuffle"])),
        p["w"],
        pad=bool(p["pad"]),
        batch_size=p["batch_size"],
    )
    return ref, trace


@PROPERTY
@given(layouts)
def test_property_correct_split_passes_everything(p: dict[str, int]) -> None:
    ref, trace = _layout(p)
    verdicts = run_checks(ref, trace, trace)
    assert failed(verdicts) == set(), [v for v in verdicts if v.failed]


@PROPERTY
@given(layouts, st.booleans(), st.integers(1, 3), st.integers(2, 4))
def test_property_correct_split_with_drop_last_and_repeated_ids_passes(
    p: dict[str, int], drop_last: bool, copies: int, epochs: int
) -> None:
    """DataLoader drop_last on every rank, and ids that repeat (content hashes of equal samples)."""
    n, w, bs, shuffle = p["n"], p["w"], p["batch_size"], bool(p["shuffle"])
    as_ids = [[i // copies for i in order] for order in permutations(n, epochs, p["seed"], shuffle)]
    ref = reference(as_ids, batch_size=bs, drop_last=drop_last)
    ddp_ids = [[i // copies for i in order] for order in permutations(n, epochs, p["seed"] + 1, shuffle)]
    trace = ddp_run(ddp_ids, w, pad=bool(p["pad"]), batch_size=bs, drop_last=drop_last)
    ref, trace = (replace(t, id_source="content-hash") for t in (ref, trace))  # equal samples, one hash
    verdicts = run_checks(ref, trace, trace)
    assert failed(verdicts) == set(), [v for v in verdicts if v.failed]


@PROPERTY
@given(layouts, st.data())
def test_property_duplicate_beyond_padding_fails_no_overlap(p: dict[str, int], data: st.DataObject) -> None:
    ref, trace = _layout(p)
    w = p["w"]
    ids = per_rank(trace)
    extra = 1 if not p["pad"] else w  # one copy is already too many without padding; w more with it
    pool = sorted(set(ids[0][0]))
    if w < 2 or len(pool) < extra:
        return
    for x in data.draw(st.permutations(pool))[:extra]:
        ids[data.draw(st.integers(1, w - 1))][0].append(x)
    verdicts = by_id(run_checks(ref, rebuild(trace, ids, p["batch_size"])))
    assert verdicts["no_overlap"].failed
    assert verdicts["padding_bound"].failed
    assert verdicts["no_overlap"].ranks[0] == 0


@PROPERTY
@given(layouts, st.data())
def test_property_dropping_w_samples_fails_coverage(p: dict[str, int], data: st.DataObject) -> None:
    ref, trace = _layout(p)
    w = p["w"]
    ids = per_rank(trace)
    seen = [x for r in ids for x in r[0]]
    once = sorted(x for x in set(seen) if seen.count(x) == 1)
    if len(once) < w:
        return
    gone = set(data.draw(st.permutations(once))[:w])
    for r in ids:
        r[0] = [x for x in r[0] if x not in gone]
    verdicts = by_id(run_checks(ref, rebuild(trace, ids, p["batch_size"])))
    assert verdicts["coverage"].failed
    assert verdicts["single_process_equivalence"].failed
    assert set(verdicts["coverage"].examples) <= gone | (set(range(p["n"])) - set(seen))
    assert verdicts["coverage"].epochs == (0,)


@PROPERTY
@given(layouts, st.data())
def test_property_uneven_steps_fail_equal_steps(p: dict[str, int], data: st.DataObject) -> None:
    ref, trace = _layout(p)
    w = p["w"]
    if w < 2 or trace.ranks[0].epochs[0].num_batches == 0:
        return
    short = data.draw(st.integers(0, w - 1))
    ranks = list(trace.ranks)
    first = ranks[short].epochs[0]
    cut = sum(first.batch_sizes[:-1])
    shorter = EpochTrace(0, first.ids[:cut], first.batch_sizes[:-1], first.len_loader)
    ranks[short] = replace(ranks[short], epochs=(shorter, *ranks[short].epochs[1:]))
    verdict = check("equal_steps", ref, replace(trace, ranks=tuple(ranks)))
    assert verdict.failed
    assert short in verdict.ranks


@PROPERTY
@given(layouts, st.data())
def test_property_moving_one_sample_breaks_only_determinism(p: dict[str, int], data: st.DataObject) -> None:
    ref, trace = _layout(p)
    w = p["w"]
    ids = per_rank(trace)
    if w < 2 or not ids[0][1]:
        return
    b = data.draw(st.integers(1, w - 1))
    ids[b][1].append(ids[0][1].pop(0))
    moved = rebuild(trace, ids, p["batch_size"])
    verdicts = by_id(run_checks(ref, moved, trace))
    assert verdicts["determinism"].failed
    assert verdicts["determinism"].epochs == (1,)
    for name in ("coverage", "no_overlap", "padding_bound", "single_process_equivalence"):
        assert verdicts[name].status == "pass", verdicts[name]
    assert not verdicts["worker_sharding"].failed, verdicts["worker_sharding"]  # n/a: no workers


# --- scale ------------------------------------------------------------------------------------


def _interleaved(n: int, m: int, shift: int) -> array:
    """A permutation of range(n) built with C-level slicing: every m-th id, m times, then rotated."""
    base = array("q", range(n))
    out = array("q")
    for k in range(m):
        out.extend(base[k::m])
    return out[shift:] + out[:shift]


def test_million_samples_on_1024_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    n, w, bs = 1_000_000, 1024, 32
    ref_orders = [_interleaved(n, 7, 3), _interleaved(n, 11, 5)]
    ddp_orders = [_interleaved(n, 13, 1), _interleaved(n, 17, 2)]
    total = -(-n // w) * w
    ranks = []
    facts = LoaderFacts(dataset_len=n, batch_size=bs, drop_last=False, padding=True, has_set_epoch=True)
    padded = [order + order[: total - n] for order in ddp_orders]
    for r in range(w):
        epochs = []
        for e, order in enumerate(padded):
            ids = order[r::w]
            sizes = [bs] * (len(ids) // bs) + ([len(ids) % bs] if len(ids) % bs else [])
            epochs.append(EpochTrace(e, ids, tuple(sizes), len(sizes)))
        ranks.append(RankTrace(r, tuple(epochs), facts))
    trace = RunTrace(w, "gloo", tuple(ranks))
    ref = reference(ref_orders, batch_size=bs)
    start, cpu = time.perf_counter(), time.process_time()
    verdicts = run_checks(ref, trace, trace)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    with capsys.disabled():
        print(f"\n[scale] N={n:,} W={w}: run_checks took {seconds:.2f} s wall, {cpu:.2f} s CPU")
    assert [v.check for v in verdicts] == list(DATA_CHECKS)
    assert failed(verdicts) == set(), [v for v in verdicts if v.failed]
    assert (
        by_id(verdicts)["no_overlap"].detail
        == f"ranks share only {total - n} padding copies (at most {w - 1})"
    )


def test_all_check_ids_are_known() -> None:
    assert set(DATA_CHECKS) <= set(ALL_CHECKS)
