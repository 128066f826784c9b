"""The step checks on step traces built by hand: every cause, the passing controls, the refusals.

``step_equivalence``, ``equal_microsteps``, ``supervision`` and ``rng_independence`` are pure functions of
StepTraces (and, for loading draws, EpochTraces); tests/test_step_truth.py holds them to the truth of the
step fixtures measured under torchrun.
"""

from __future__ import annotations

import math
import random
from array import array
from dataclasses import replace
from typing import Any

import pytest

from ddpcheck.checks import step as step_check
from ddpcheck.checks.fixes import with_fix
from ddpcheck.checks.microsteps import MICRO_COUNTS, STEP_COUNTS, check_equal_microsteps
from ddpcheck.checks.registry import run_checks
from ddpcheck.checks.rng import (
    LOOP_SAME,
    MAIN_SAME,
    PEERS_DIFFER,
    SAME_BASE_SEED,
    WORKER_ID_SEED,
    WORKERS_ALIKE,
    WORKERS_SEEDED_ALIKE,
    check_rng_independence,
    check_rng_independence_run,
)
from ddpcheck.checks.step import (
    BATCHNORM,
    NAN,
    OTHER,
    RANKS_APART,
    UNPROBED,
    check_step_equivalence,
    fit_factor,
    loss_scale,
    tolerance_for,
    wants_loss_probe,
)
from ddpcheck.checks.supervision import EMPTY, UNSUPERVISED, check_step_supervision, check_supervision
from ddpcheck.layout import Layout, parse_mesh
from ddpcheck.trace import Draw, EpochTrace, FetchDraws, OptimizerStep, RankTrace, RunTrace, StepTrace
from ddpcheck.verdict import ALL_CHECKS, DATA_CHECKS, STEP_CHECKS
from tests.step_builders import micro, trace

W2 = Layout.plain(2)


def _grad(seed: int, n: int = 50) -> list[float]:
    rng = random.Random(seed)
    return [rng.gauss(0, 1) for _ in range(n)]


def _noisy(g: list[float], rel: float, seed: int = 9) -> list[float]:
    """``g`` moved by ``rel`` of its norm in a random direction."""
    d = _grad(seed, len(g))
    scale = rel * math.sqrt(sum(x * x for x in g)) / math.sqrt(sum(x * x for x in d))
    return [a + scale * b for a, b in zip(g, d, strict=True)]


def _run(grads: list[list[float]], micros: list[list[list]], **fields: object) -> list:  # type: ignore[type-arg]
    """Per rank a StepTrace: every rank holds ``grads`` (the averaged gradient), its own micro-steps."""
    return [trace(list(zip(grads, per_rank, strict=True)), **fields) for per_rank in micros]  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- step_equivalence


def test_an_exact_step_passes_and_says_how_close() -> None:
    ref = [_grad(k) for k in range(3)]
    run = _run([_noisy(g, 2e-7) for g in ref], [[[micro()]] * 3] * 2)
    verdict = check_step_equivalence(run, trace([(g, [micro(8)]) for g in ref]), W2)
    assert verdict.status == "pass", verdict
    assert "at 3 compared steps (1 micro-batch each; largest rel. difference 2e-07" in verdict.detail
    assert "tolerance 1e-05 for float32" in verdict.detail
    assert verdict.evidence is not None and verdict.evidence.tolerance == 1e-5


def test_ranks_that_hold_different_token_counts_under_a_per_rank_mean() -> None:
    ref = [_grad(k) for k in range(2)]
    run = [
        trace([(_noisy(ref[0], 0.13), [micro(4, 812)]), (_noisy(ref[1], 0.11), [micro(4, 800)])]),
        trace([(_noisy(ref[0], 0.13), [micro(4, 403)]), (_noisy(ref[1], 0.11), [micro(4, 397)])]),
    ]
    verdict = with_fix(check_step_equivalence(run, trace([(g, [micro(8)]) for g in ref]), W2))
    assert verdict.failed
    assert verdict.cause.startswith(
        "ranks' supervised-token counts differ (812 vs 403) and the loss is a mean"
    )
    assert "all-reduced over the data-parallel group" in verdict.fix
    assert "by 0.13 at step 0, 0.11 at step 1 (2 of 2 compared steps; 1 micro-batch each" in verdict.detail


@pytest.mark.parametrize(
    ("factor", "scale", "text", "hedged"),
    [(0.5, "", "exactly 1/2 of one process's, 1 / the world size", True),
     (0.5, "mean", "exactly 1/2 of one process's, 1 / the world size", False),
     (2.0, "mean", "exactly 2x one process's, the world size", False),
     (0.25, "mean", "exactly 1/4 of one process's, a constant", False)],
)  # fmt: skip
def test_an_exact_factor_is_named(factor: float, scale: str, text: str, hedged: bool) -> None:
    ref = [_grad(k) for k in range(2)]
    run = _run([[factor * v for v in g] for g in ref], [[[micro()]] * 2] * 2)
    verdict = check_step_equivalence(run, trace([(g, [micro(8)]) for g in ref], loss_scale=scale), W2)
    assert verdict.failed and text in verdict.cause, verdict.cause
    assert (UNPROBED in verdict.cause) is hedged
    assert "multiply by the world size" in verdict.fix


def test_a_loss_summed_over_a_fixed_normaliser_is_compared_with_the_replay_over_the_world_size() -> None:
    """The replay fed every rank's batch takes a step W times larger: with the probe's "sum" that is the
    expected step (good_sum_fixed_norm.py), while the same factor on a mean loss is the bug above."""
    ref = [_grad(k) for k in range(2)]
    run = _run([[0.5 * v for v in g] for g in ref], [[[micro()]] * 2] * 2)
    verdict = check_step_equivalence(run, trace([(g, [micro(8)]) for g in ref], loss_scale="sum"), W2)
    assert verdict.status == "pass", verdict
    assert "compared with the replay's step / world size" in verdict.detail
    doubled = _run([list(g) for g in ref], [[[micro()]] * 2] * 2)  # a sum loss that is W x too large
    wrong = check_step_equivalence(doubled, trace([(g, [micro(8)]) for g in ref], loss_scale="sum"), W2)
    assert wrong.failed and "exactly 2x" in wrong.cause


def test_only_the_tail_window_differs() -> None:
    ref = [_grad(k) for k in range(3)]
    grads = [_noisy(ref[0], 1e-7), _noisy(ref[1], 1e-7), _noisy(ref[2], 0.05)]
    rank0 = [[micro(4), micro(4)], [micro(4), micro(4)], [micro(4), micro(3)]]
    rank1 = [[micro(4), micro(4)], [micro(4), micro(4)], [micro(4), micro(2)]]
    verdict = check_step_equivalence(
        _run(grads, [rank0, rank1]), trace([(g, [micro(8)] * 2) for g in ref]), W2
    )
    assert verdict.failed
    assert verdict.cause.startswith("only the epoch's last accumulation window differs")
    assert "rank 0: 2 micro-batches of 7 samples, rank 1: 2 micro-batches of 6 samples" in verdict.cause
    assert "all-reduced count of the window" in verdict.fix
    assert "(1 of 3 compared steps" in verdict.detail


def test_batchnorm_per_rank_is_named_against_a_replay_of_the_global_batch() -> None:
    ref = [_grad(0)]
    run = _run([_noisy(ref[0], 0.3)], [[[micro()]]] * 2, per_rank_norm=("norm",))
    verdict = check_step_equivalence(run, trace([(ref[0], [micro(8)])]), W2)
    assert verdict.failed and verdict.cause == BATCHNORM.format(modules="norm")
    assert "SyncBatchNorm" in verdict.fix


def test_batchnorm_per_rank_is_compared_with_a_replay_that_normalises_each_part() -> None:
    """The replay normalised each rank's part of the union by its own statistics (its ``per_rank_norm``):
    an exact step passes with a note that says so; a loss normalised per rank still fails, named by its own
    cause, never by the batch norm."""
    ref = [_grad(0)]
    per_part = trace([(ref[0], [micro(8)])], per_rank_norm=("norm",))
    run = _run([_noisy(ref[0], 2e-7)], [[[micro()]]] * 2, per_rank_norm=("norm",))
    verdict = check_step_equivalence(run, per_part, W2)
    assert verdict.status == "pass" and step_check.PER_RANK_NORM + " (norm)" in verdict.detail
    counts = [[[micro(4, supervised=2)]], [[micro(4, supervised=4)]]]
    bad = check_step_equivalence(_run([_noisy(ref[0], 0.3)], counts, per_rank_norm=("norm",)), per_part, W2)
    assert bad.failed and bad.cause.startswith("ranks' supervised-token counts differ (2 vs 4)"), bad.cause
    assert step_check.PER_RANK_NORM in bad.detail


def test_a_nan_gradient_spread_by_the_all_reduce() -> None:
    ref = [_grad(0)]
    nan = [math.nan] * 50
    verdict = check_step_equivalence(_run([nan], [[[micro(2, 0)]]] * 2), trace([(ref[0], [micro(4)])]), W2)
    assert verdict.failed and verdict.cause == NAN and "NaN at step 0" in verdict.detail


def test_ranks_that_hold_different_gradients() -> None:
    ref = _grad(0)
    run = [trace([(ref, [micro()])]), trace([(_noisy(ref, 0.5), [micro()])])]
    verdict = check_step_equivalence(run, trace([(ref, [micro(8)])]), W2)
    assert verdict.failed and verdict.cause == RANKS_APART
    assert "data-parallel rank 1's gradient differs from rank 0's by 0.5" in verdict.detail


def test_an_unnamed_difference_says_so() -> None:
    ref = [_grad(0)]
    verdict = check_step_equivalence(
        _run([_noisy(ref[0], 0.2)], [[[micro(4, 9)]]] * 2), trace([(ref[0], [])]), W2
    )
    assert verdict.failed and verdict.cause == OTHER


def test_the_tolerance_follows_the_dtype() -> None:
    assert tolerance_for("torch.bfloat16") == 5e-2 and tolerance_for("") == tolerance_for("float32") == 1e-5
    ref = [_grad(0)]
    run16 = _run([_noisy(ref[0], 1e-2)], [[[micro()]]] * 2, dtype="bfloat16")
    assert check_step_equivalence(run16, trace([(ref[0], [micro(8)])]), W2).status == "pass"
    run32 = _run([_noisy(ref[0], 1e-2)], [[[micro()]]] * 2)
    assert check_step_equivalence(run32, trace([(ref[0], [micro(8)])]), W2).failed
    autocast = _run([_noisy(ref[0], 1e-2)], [[[micro()]]] * 2, compute_dtype="bfloat16")  # float32 weights
    verdict = check_step_equivalence(autocast, trace([(ref[0], [micro(8)])]), W2)
    assert verdict.status == "pass" and "tolerance 0.05 for bfloat16" in verdict.detail


def test_what_cannot_be_compared_is_never_a_failure() -> None:
    ref = [_grad(0)]
    run = _run([_noisy(ref[0], 0.4)], [[[micro()]]] * 2)
    why = "train.py:57 torch.randn draws before the step's first batch: not replayed"
    replayed = trace([(ref[0], [micro(8)])])
    unfaithful = replace(replayed, steps=(replace(replayed.steps[0], not_comparable=why),))
    verdict = check_step_equivalence(run, unfaithful, W2)
    assert verdict.status == "n/a" and verdict.detail == f"the one-process replay is not faithful: {why}"
    on_rank = [
        replace(run[0], steps=(replace(run[0].steps[0], not_comparable="numpy's stream ..."),)),
        run[1],
    ]
    assert "not faithful: rank 0: numpy's stream" in check_step_equivalence(on_rank, replayed, W2).detail
    assert check_step_equivalence(run, None, W2).status == "skip"
    assert check_step_equivalence([run[0], None], trace([(ref[0], [])]), W2).status == "skip"
    kept_none = check_step_equivalence(run, trace([(None, [micro(8)])]), W2)
    assert kept_none.status == "n/a" and "no optimizer step kept its gradient" in kept_none.detail
    mesh = parse_mesh("dp=1,tp=2")
    shards = [trace([(ref[0][:25], [micro()])])] * 2
    by_hand = check_step_equivalence(shards, trace([(ref[0], [micro()])], replay_ranks=(0,)), mesh)
    assert by_hand.status == "n/a" and "hold shards of the parameters" in by_hand.detail
    every = check_step_equivalence([trace([(ref[0], [micro()])])] * 2, trace([(ref[0], [micro()])]), mesh)
    assert every.status == "n/a" and "the replay joined every rank's batches" in every.detail
    assert "record it with --mesh dp=1,tp=2" in every.detail
    assert check_step_equivalence(run, trace([([math.nan] * 50, [micro(8)])]), W2).status == "n/a"
    other_size = check_step_equivalence(run, trace([(ref[0][:40], [micro(8)])]), W2)
    assert other_size.status == "n/a" and "different sizes (40, 50 values)" in other_size.detail


def test_a_kept_sample_of_coordinates_compares_whole_norms() -> None:
    """Large models keep an evenly spaced sample of coordinates and the whole gradient's norm: the norms of
    the two whole gradients are compared, never a whole norm with a sample's."""
    ref = _grad(0)

    def kept(values: list[float], norm: float) -> object:
        base = trace([(values, [micro()])])
        return replace(base, steps=(replace(base.steps[0], grad_norm=norm),), parameters=5000)

    same = check_step_equivalence([kept(ref, 31.0)] * 2, kept(ref, 31.0), W2)  # type: ignore[list-item,arg-type]
    assert same.status == "pass", same
    apart = check_step_equivalence([kept(ref, 31.0)] * 2, kept(ref, 40.0), W2)  # type: ignore[list-item,arg-type]
    assert apart.failed and "by 0.23 at step 0" in apart.detail  # |31 - 40| / 40


def test_steps_that_cannot_be_replayed_are_left_out_and_named() -> None:
    ref = [_grad(0), _grad(1)]
    run = _run([_noisy(ref[0], 1e-7), _noisy(ref[1], 0.3)], [[[micro()]] * 2] * 2)
    replayed = trace([(g, [micro(8)]) for g in ref])
    why = "rank 1 made 3 random draws here, the replay 2"
    second = replace(replayed.steps[1], not_comparable=why)
    verdict = check_step_equivalence(run, replace(replayed, steps=(replayed.steps[0], second)), W2)
    assert verdict.status == "pass" and verdict.detail.endswith(f"; 1 step not compared: {why}")


def test_fit_factor() -> None:
    g = _grad(3)
    c, residual = fit_factor([0.5 * v for v in g], g)
    assert abs(c - 0.5) < 1e-12 and residual < 1e-12
    assert fit_factor(_noisy(g, 0.3), g)[1] > 0.1


# ----------------------------------------------------------------------------- equal_microsteps


def test_equal_microsteps_passes_and_counts() -> None:
    fw = [("head", 1), ("embed", 1)]
    run = [trace([(None, [micro(forwards=fw)] * 2)] * 3)] * 2
    verdict = check_equal_microsteps(run, W2)
    assert verdict.status == "pass"
    assert verdict.detail == (
        "every rank ran the same micro-steps: 3 optimizer steps of 2 backward passes each, the same forward "
        "calls of 2 modules"
    )


def test_different_backward_passes_per_step() -> None:
    run = [
        trace([(None, [micro()] * 3), (None, [micro()])]),
        trace([(None, [micro()] * 2), (None, [micro()])]),
    ]
    verdict = with_fix(check_equal_microsteps(run, W2))
    assert verdict.failed and verdict.cause == MICRO_COUNTS and "all_reduce(count, op=MAX)" in verdict.fix
    assert verdict.detail == "backward passes: rank 0 ran 3, rank 1 ran 2 in step 0; 1 of 2 steps differ"


def test_a_module_skipped_on_some_ranks_is_named_by_its_outermost_name() -> None:
    with_tower = [("text_tower", 1), ("vision_tower", 2), ("vision_tower.proj", 2)]
    without = [("text_tower", 1)]
    run = [
        trace([(None, [micro(forwards=without)])] * 3 + [(None, [micro(forwards=with_tower)])]),
        trace([(None, [micro(forwards=without)])] * 4),
        trace([(None, [micro(forwards=without)])] * 3 + [(None, [micro(forwards=with_tower)])]),
    ]
    verdict = check_equal_microsteps(run, Layout.plain(3))
    assert verdict.failed and verdict.detail == (
        "vision_tower: ranks 0 and 2 ran 2, rank 1 ran 0 in step 3; 1 of 4 steps differ"
    )
    assert verdict.cause.startswith("vision_tower runs only on the micro-batches that need it")
    assert verdict.ranks == (1,) and "run vision_tower on every micro-batch" in verdict.fix


def test_other_step_counts_and_open_windows() -> None:
    three = trace([(None, [micro()])] * 3)
    two = trace([(None, [micro()])] * 2)
    verdict = check_equal_microsteps([three, two], W2)
    assert verdict.failed and verdict.cause == STEP_COUNTS
    assert verdict.detail == "optimizer steps: rank 0 ran 3, rank 1 ran 2"
    dangling = [trace([(None, [micro()])], open_micro=[micro()]), trace([(None, [micro()])])]
    late = check_equal_microsteps(dangling, W2)
    assert late.failed and "rank 0 ran 1, rank 1 ran 0 after the last optimizer step" in late.detail
    assert check_equal_microsteps([three], Layout.plain(1)).status == "n/a"
    assert check_equal_microsteps([three, None], W2).status == "skip"


# ----------------------------------------------------------------------------- supervision


def test_an_unsupervised_micro_batch_is_named_with_what_the_loss_does() -> None:
    rank0 = trace([(None, [micro(2, 7)])] * 4)
    rank1 = trace([(None, [micro(2, 5)])] * 2 + [(None, [micro(2, 0)])] + [(None, [micro(2, 6)])])
    verdict = check_step_supervision([rank0, rank1])
    assert verdict.failed and verdict.cause == UNSUPERVISED
    assert verdict.detail == (
        "rank 1's micro-batch 0 of optimizer step 2 (epoch 0) holds no label other than -100 (2 samples); "
        "1 of 8 micro-batches on 2 ranks are unsupervised"
    )
    assert "NaN gradient that DDP's all-reduce spreads to every rank" in verdict.cause
    assert "zero gradient, a silently smaller step" in verdict.cause
    assert verdict.ranks == (1,) and "drop samples without a supervised token" in verdict.fix


def test_an_empty_micro_batch_and_padding_passes() -> None:
    empty = [trace([(None, [micro(4, 9)])]), trace([(None, [micro(0, 0)])])]
    verdict = check_step_supervision(empty)
    assert verdict.failed and verdict.cause == EMPTY and "holds no sample" in verdict.detail
    padded = [
        trace([(None, [micro(4, 9), micro(4, 9)])]),
        trace([(None, [micro(4, 9), micro(0, None, batches=())])]),
    ]
    ok = check_step_supervision(padded)
    assert (
        ok.status == "pass"
        and ok.detail == "every one of 3 micro-batches on 2 ranks holds a label other than -100"
    )
    unlabelled = check_step_supervision([trace([(None, [micro(4)])])] * 2)
    assert unlabelled.status == "pass" and "(batches carry no labels)" in unlabelled.detail


def _loader_run(sizes: list[list[int]], supervised: list[list[int]] | None) -> RunTrace:
    ranks = []
    for r, per_rank in enumerate(sizes):
        ids = array("q", range(r * 100, r * 100 + sum(per_rank)))
        sup = None if supervised is None else tuple(supervised[r])
        ranks.append(RankTrace(r, (EpochTrace(0, ids, tuple(per_rank), len(per_rank), supervised=sup),)))
    return RunTrace(len(sizes), "gloo", tuple(ranks))


def _single(run: RunTrace) -> RunTrace:
    """The single-process reference of ``run``: one rank with every rank's batches."""
    sizes = [s for r in run.ranks for s in r.epochs[0].batch_sizes]
    ids = array("q", [int(i) for r in run.ranks for i in r.epochs[0].ids])  # type: ignore[call-overload]
    return RunTrace(1, "gloo", (RankTrace(0, (EpochTrace(0, ids, tuple(sizes), len(sizes)),)),))


def test_supervision_of_a_loader_file() -> None:
    run = _loader_run([[4, 4], [4, 4]], [[10, 12], [9, 0]])
    verdict = check_supervision(_single(run), run)
    assert verdict.failed and verdict.detail.startswith(
        "rank 1's batch 1 (epoch 0) holds no label other than -100"
    )
    for sizes, sup, status in (([[4, 4], [4, 4]], None, "n/a"), ([[4, 4], [4, 4]], [[1, 2], [3, 4]], "pass")):
        other = _loader_run(sizes, sup)
        assert check_supervision(_single(other), other).status == status
    empty = _loader_run([[4, 0], [4, 4]], None)
    assert check_supervision(_single(empty), empty).cause == EMPTY


# ----------------------------------------------------------------------------- rng_independence


def _fetches(states: dict[Any, list[int]]) -> tuple[FetchDraws, ...]:
    """Fetches in batch order: ``(worker, stream) -> states``, round-robin over the workers."""
    out = []
    for (worker, stream), values in states.items():
        for k, state in enumerate(values):
            out.append(FetchDraws(2 * k + (worker or 0), worker, (Draw(stream, state),)))
    return tuple(sorted(out, key=lambda f: f.batch))


def _epochs(per_rank: Any) -> list[list[EpochTrace]]:
    return [
        [EpochTrace(e, array("q"), (), None, draws=_fetches(states)) for e, states in enumerate(epochs)]
        for epochs in per_rank
    ]


def _states(base: int, n: int = 6) -> list[int]:
    return [base * 1000 + k for k in range(n)]


def test_workers_seeded_from_the_worker_id_alone() -> None:
    """numpy equal for worker k of every rank while torch (also consumed) differs: the worker_init_fn."""
    ranks = [
        [
            {
                (0, "numpy"): _states(1),
                (1, "numpy"): _states(2),
                (0, "torch"): _states(10 + r),
                (1, "torch"): _states(20 + r),
            }
        ]
        for r in range(2)
    ]
    verdict = check_rng_independence(W2, loading={"train": _epochs(ranks)})
    assert verdict.failed and verdict.cause == WORKER_ID_SEED.format(stream="numpy", worker=0)
    assert (
        verdict.detail
        == "train: rank 0 worker 0 and rank 1 worker 0 draw numpy from the same states while loading "
        "(6 of 6 fetches)"
    )
    assert "torch.initial_seed()" in verdict.fix
    alone = [[{(0, "numpy"): _states(1)}] for _ in range(2)]  # numpy only, one epoch: either cause
    assert check_rng_independence(W2, loading={"t": _epochs(alone)}).cause == WORKERS_SEEDED_ALIKE.format(
        worker=0, stream="numpy"
    )
    twice = [[{(0, "numpy"): _states(1)}, {(0, "numpy"): _states(1)}] for _ in range(2)]  # re-seeded alike
    assert check_rng_independence(W2, loading={"t": _epochs(twice)}).cause == WORKER_ID_SEED.format(
        stream="numpy", worker=0
    )


def test_the_same_manual_seed_on_every_rank() -> None:
    ranks = [[{(0, "torch"): _states(1), (1, "torch"): _states(2)}] for _ in range(2)]
    verdict = check_rng_independence(W2, loading={"train": _epochs(ranks)})
    assert verdict.failed and verdict.cause == SAME_BASE_SEED.format(worker=0, stream="torch")
    assert "torch.manual_seed(seed + rank)" in verdict.fix


def test_workers_alike_within_a_rank_and_ranks_alike_without_workers() -> None:
    ranks = [[{(0, "random"): _states(1), (1, "random"): _states(1)}], [{(0, "random"): _states(3)}]]
    assert check_rng_independence(W2, loading={"t": _epochs(ranks)}).cause == WORKERS_ALIKE.format(
        stream="random"
    )
    main = [[{(None, "torch"): _states(5)}] for _ in range(2)]
    assert check_rng_independence(W2, loading={"t": _epochs(main)}).cause == MAIN_SAME.format(stream="torch")


def test_independent_streams_and_one_coincidence_pass() -> None:
    ranks = [[{(0, "torch"): _states(1 + 10 * r), (1, "torch"): _states(2 + 10 * r)}] for r in range(2)]
    ranks[1][0][(0, "torch")][3] = ranks[0][0][(0, "torch")][
        3
    ]  # one shared state: a padded sample, not a seed
    verdict = check_rng_independence(W2, loading={"train": _epochs(ranks)})
    assert verdict.status == "pass", verdict
    assert verdict.detail == (
        "train loading draws torch in 4 streams: every stream differs across the 2 data-parallel ranks and "
        "their workers"
    )


def _noise(states: list[int], site: str = "train.py:57", shape: tuple[int, ...] = (4, 4)) -> list:  # type: ignore[type-arg]
    return [Draw("generator", s, site, "torch.randn", shape) for s in states]


def _loop(per_rank_states: list[list[int]], **kw: object) -> list:  # type: ignore[type-arg]
    return [trace([(None, [micro(draws=[d])]) for d in _noise(s, **kw)]) for s in per_rank_states]  # type: ignore[arg-type]


def test_noise_drawn_alike_on_every_rank_names_the_line() -> None:
    verdict = check_rng_independence(W2, steps=_loop([_states(1), _states(1)]))
    assert verdict.failed
    assert verdict.cause == LOOP_SAME.format(
        what="torch.randn(...)", site="train.py:57", source="a torch.Generator"
    )
    assert (
        verdict.detail
        == "rank 0 and rank 1 draw torch.randn(...) at train.py:57 from the same states (6 of 6 draws)"
    )
    assert check_rng_independence(W2, steps=_loop([_states(1), _states(2)])).status == "pass"
    scalar = check_rng_independence(W2, steps=_loop([_states(1), _states(1)], shape=()))
    assert scalar.status == "pass"  # one number per step, shared on purpose (a resolution, a task)
    per_sample = [  # one number at a time, but four per micro-step: per-sample timesteps, drawn alike
        trace([(None, [micro(draws=_noise(_states(1)[4 * k : 4 * k + 4], shape=()))]) for k in range(2)])
        for _ in range(2)
    ]
    assert check_rng_independence(W2, steps=per_sample).failed
    unknown = check_rng_independence(W2, steps=_loop([[0] * 6, [0] * 6]))
    assert unknown.status == "pass"  # state 0: not known, never taken for equal


def test_a_shared_order_drawn_before_the_batch_is_a_decision_noise_is_not() -> None:
    """Drawn alike on every rank before the micro-step's batch arrived: a permutation of the dataset
    (re-splitting it each epoch, as DistributedSampler does) is shared on purpose; noise shaped by the
    batch's samples, or the same permutation drawn after the batch arrived, is per sample."""

    def ranks(shape: tuple[int, ...], before: bool) -> list:  # type: ignore[type-arg]
        draws = [replace(d, before_batch=before) for d in _noise(_states(1), shape=shape)]
        return [trace([(None, [micro(samples=4, draws=[d])]) for d in draws]) for _ in range(2)]

    assert check_rng_independence(W2, steps=ranks((32,), True)).status == "pass"
    assert check_rng_independence(W2, steps=ranks((32,), False)).failed
    assert check_rng_independence(W2, steps=ranks((4, 3), True)).failed  # pre-drawn noise for the batch


def test_non_data_peers_draw_one_noise_per_sample() -> None:
    mesh = parse_mesh("dp=2,tp=2")
    good = check_rng_independence(mesh, steps=_loop([_states(1), _states(1), _states(2), _states(2)]))
    assert good.status == "pass" and good.detail.endswith("are equal across each rank's non-data peers")
    bad = check_rng_independence(mesh, steps=_loop([_states(1), _states(3), _states(2), _states(4)]))
    assert bad.failed and bad.cause == PEERS_DIFFER.format(what="torch.randn(...)", site="train.py:57")
    assert bad.ranks == (0, 1)
    alike = check_rng_independence(mesh, steps=_loop([_states(1)] * 4))
    assert alike.failed and alike.ranks == (0, 2)  # dp ranks 0 and 1 share their noise


def test_nothing_drawn_passes_and_nothing_watched_is_not_applicable() -> None:
    quiet = [trace([(None, [micro()])])] * 2
    assert (
        check_rng_independence(W2, steps=quiet).detail
        == "no random stream was consumed while loading or in the loop"
    )
    assert check_rng_independence(W2).status == "n/a"
    run = _loader_run([[4], [4]], None)
    assert check_rng_independence_run(_single(run), run).status == "n/a"


# ----------------------------------------------------------------------------- wiring


def test_the_step_checks_are_known_everywhere_a_check_id_is() -> None:
    assert set(STEP_CHECKS) <= set(ALL_CHECKS)
    assert (
        ALL_CHECKS.index("training_equivalence")
        < ALL_CHECKS.index("step_equivalence")
        < ALL_CHECKS.index("resume")
    )
    run = _loader_run([[4, 4], [4, 4]], [[3, 3], [3, 3]])
    verdicts = run_checks(_single(run), run)
    assert [v.check for v in verdicts] == list(DATA_CHECKS)
    by = {v.check: v for v in verdicts}
    assert by["supervision"].status == "pass" and by["rng_independence"].status == "n/a"
    assert step_check.TOLERANCE["float32"] == 1e-5


def test_allow_accepts_the_step_checks() -> None:
    """``--allow`` and ``[tool.ddpcheck]`` are validated by one function against ALL_CHECKS: the step
    checks are accepted, a misspelt one is refused naming them."""
    from ddpcheck.options import BadInput, CheckOptions
    from ddpcheck.verdict import Verdict, allow

    assert CheckOptions(allow=STEP_CHECKS).allow == STEP_CHECKS
    with pytest.raises(BadInput, match=r"choose from .*step_equivalence, equal_microsteps"):
        CheckOptions(allow=("step_equivalenc",))
    assert allow(Verdict("step_equivalence", "fail", "d", "c")).status == "allowed"


# ----------------------------------------------------------------------------- the loss probe


def _losses(values: list[float], grad: tuple[float, ...] = (1.0,)) -> Any:
    return trace([(grad, [replace(micro(), loss=v)]) for v in values])


def test_a_loss_that_adds_up_over_the_ranks_asks_for_the_probe() -> None:
    """The replay's loss is the ranks' sum (a sum over a fixed normaliser, or a count all-reduced without
    the world size): only the probe tells them apart. A mean, a loss never kept, or losses whose sum and
    mean coincide (zero) ask for nothing."""
    ranks = [_losses([1.0, 2.0]), _losses([3.0, 4.0])]
    assert wants_loss_probe(ranks, _losses([4.0, 6.0]), W2)
    assert not wants_loss_probe(ranks, _losses([2.0, 3.0]), W2)  # the mean
    assert not wants_loss_probe(ranks, _losses([4.0, 3.0]), W2)  # one step a sum, one a mean: no rule
    assert not wants_loss_probe([_losses([0.0]), _losses([0.0])], _losses([0.0]), W2)
    unkept = [trace([((1.0,), [micro()])]) for _ in range(2)]
    assert not wants_loss_probe(unkept, trace([((1.0,), [micro()])]), W2)
    assert not wants_loss_probe(ranks, replace(_losses([4.0, 6.0]), loss_scale="mean"), W2)  # probed


def test_the_probe_reads_twice_the_loss_as_a_sum_and_the_same_loss_as_a_mean() -> None:
    replay = _losses([4.0, 6.0])
    assert loss_scale(replay, _losses([8.0, 12.0])) == "sum"
    assert loss_scale(replay, _losses([4.0, 6.0])) == "mean"
    assert loss_scale(replay, _losses([8.0, 6.0])) == ""  # neither throughout
    assert loss_scale(replay, trace([((1.0,), [micro()])])) == ""  # no loss kept


# ----------------------------------------------------------------------------- sharded gradients


def _shard(values: list[float], held: list[bool]) -> tuple[list[float], bytes]:
    """A rank's kept gradient of a sharded model: its values where it holds them, 0 elsewhere."""
    import numpy as np

    return [v if h else 0.0 for v, h in zip(values, held, strict=True)], np.packbits(held).tobytes()


def _sharded_run(grads: list[list[float]], masks: list[list[bool]]) -> list[Any]:
    """One trace per rank: rank r keeps its shard (``masks[r]``) of every step's gradient."""
    out = []
    for mask in masks:
        steps = []
        for k, g in enumerate(grads):
            values, held = _shard(g, mask)
            steps.append(OptimizerStep(k, (micro(),), array("f", values), None, held=held))
        out.append(StepTrace(tuple(steps), (), len(grads[0]), len(grads[0]), "float32"))
    return out


def test_shards_of_a_gradient_are_put_together_before_the_comparison() -> None:
    """dp=2 x tp=2, every parameter a DTensor: each rank keeps only its shard; a position is held by one
    rank, or by the tensor peers of a replicated bias (both must agree). Put together, the step is one
    process's; a shard held apart, or positions no rank holds, are said so."""
    ref = [_grad(k, 12) for k in range(2)]
    mesh = parse_mesh("dp=2,tp=2")
    own = [[i % 4 == r for i in range(10)] + [r % 2 == 0, r % 2 == 1] for r in range(4)]
    peers = [[i % 4 == r for i in range(10)] + [r < 2, r >= 2] for r in range(4)]  # tp peers share 10, 11
    for masks in (own, peers):
        run = _sharded_run([_noisy(g, 1e-7) for g in ref], masks)
        verdict = check_step_equivalence(
            run, trace([(g, [micro(8)]) for g in ref], replay_ranks=(0, 2)), mesh
        )
        assert verdict.status == "pass", verdict
    scaled = _sharded_run([[2 * x for x in g] for g in ref], own)
    replay = trace([(g, [micro(8)]) for g in ref], replay_ranks=(0, 2))
    factor = check_step_equivalence(scaled, replay, mesh)
    assert factor.status == "fail" and "exactly 2x one process's" in factor.cause
    apart = _sharded_run(ref, peers)
    bias = apart[1].steps[0]
    moved = array("f", bias.grad or ())
    moved[10] += 1.0
    apart[1] = replace(apart[1], steps=(replace(bias, grad=moved), *apart[1].steps[1:]))
    verdict = check_step_equivalence(apart, replay, mesh)
    assert verdict.status == "fail" and verdict.cause == step_check.SHARDS_APART, verdict
    assert verdict.detail.startswith("rank 1's shard of the gradient differs from rank 0's")
    assert verdict.ranks == (0, 1)
    holes = _sharded_run(ref, [[i % 4 == r and i != 3 for i in range(12)] for r in range(4)])
    verdict = check_step_equivalence(holes, replay, mesh)
    assert verdict.status == "n/a" and "hold 11 of its 12 kept values" in verdict.detail


def test_sequences_sliced_by_the_loader_are_not_replayed() -> None:
    """DeepSpeed Ulysses' loader adapter hands every sp rank a slice of each sequence: one rank per
    data-parallel coordinate holds a slice, not the sequences, so the replay is not compared."""
    from ddpcheck.checks.step_judge import StepRecord, judge_step

    ref = [_grad(0)]
    run = [trace([(ref[0], [micro()])])] * 4
    record = StepRecord(tuple(run), replay=trace([(ref[0], [micro(8)])], replay_ranks=(0, 2)))
    verdicts = {v.check: v for v in judge_step(record, parse_mesh("dp=2,sp=2"))}
    step = verdicts["step_equivalence"]
    assert step.status == "n/a" and "its own slice of every sequence" in step.detail
    compared = {v.check: v for v in judge_step(record, parse_mesh("dp=2,cp=2"))}
    assert compared["step_equivalence"].status == "pass"
