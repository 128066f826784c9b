"""The step checks held to the truth of the step fixtures (fixtures/steps/), measured without ddpcheck.

fixtures/steps/truth.py ran every fixture under a real ``torchrun`` (2 processes, 1, and 4 for the mesh
ones); each script logged what its own loop did (the ids of every micro-batch, backward passes, forward
calls per module, the gradient before every optimizer step, its random draws), and each replayable one
was replayed at one process fed the union of the ranks' micro-batches from the run's weights
(truth_logs/, truth_results.jsonl). Here those logs become the StepTraces the rank side records, and each
check's verdict must say what the truth says.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from ddpcheck.checks.microsteps import check_equal_microsteps
from ddpcheck.checks.rng import (
    LOOP_SAME,
    PEERS_DIFFER,
    SAME_BASE_SEED,
    WORKERS_SEEDED_ALIKE,
    check_rng_independence,
)
from ddpcheck.checks.step import NAN, TOLERANCE, check_step_equivalence
from ddpcheck.checks.supervision import UNSUPERVISED, check_step_supervision
from ddpcheck.layout import Layout, parse_mesh
from tests.step_builders import STEPS, fetch_epochs, load, step_trace, with_loop_draws

TRUTH: dict[tuple[str, int], dict[str, Any]] = {
    (line["script"], line["nproc"]): line["facts"]
    for line in map(json.loads, (STEPS / "truth_results.jsonl").read_text().splitlines())
}
TOL = TOLERANCE["float32"]

# fixture -> (step_equivalence's cause, or "" where the truth says the step is one process's; modules
# that normalise per rank, as the rank side finds them by type)
REPLAYED: dict[str, tuple[str, tuple[str, ...]]] = {
    "bug_rank_mean_ce": ("ranks' supervised-token counts differ", ()),
    "good_global_token_mean": ("", ()),
    "bug_accum_tail_constant": ("only the epoch's last accumulation window differs", ()),
    "good_accum_tail_global": ("", ()),
    "good_equal_batches": ("", ()),
    "bug_global_count_no_world": ("the gradient is exactly 1/2 of one process's, 1 / the world size", ()),
    "good_sum_fixed_norm": ("", ()),
    "hf_trainer_default": ("", ()),
    "hf_trainer_loss_override": ("ranks' supervised-token counts differ", ()),
    # per-rank BatchNorm: the truth's replay normalised each rank's part of the union on its own
    "good_batchnorm_per_rank": ("", ("norm",)),
    "bug_batchnorm_rank_mean": ("ranks' supervised-token counts differ", ("norm",)),
    "good_batchnorm_synced": ("", ()),
    "bug_two_tower": ("", ()),  # the ranks' work differs (equal_microsteps), not the averaged gradient
    "good_two_tower_dummy": ("", ()),
    "bug_sft_all_masked": (NAN, ()),
    "good_sft_filtered": ("", ()),
}
LOGGED = sorted({name for name, _ in TRUTH})


def _runs(name: str, nproc: int, **fields: Any) -> tuple[list[Any], dict[str, Any]]:
    log = load(name, nproc)
    return [step_trace(r, **fields) for r in log["ranks"]], log


def _truly_equivalent(facts: dict[str, Any], world: int) -> bool:
    """The truth's answer: every step within the tolerance of the replay, or (a loss summed over a fixed
    normaliser, by the probe) exactly the replay's step over the world size."""
    steps = facts["per_step"]
    if all(p["rel_diff"] is not None and p["rel_diff"] <= TOL for p in steps):
        return True
    exact = all(
        p.get("c") is not None and abs(p["c"] - 1 / world) < 1e-5 and p["residual"] < TOL for p in steps
    )
    return facts["loss_scale"] == "sum" and exact


@pytest.mark.parametrize("name", sorted(REPLAYED))
def test_step_equivalence_is_the_truth(name: str) -> None:
    cause, norms = REPLAYED[name]
    facts = TRUTH[(name, 2)]
    assert _truly_equivalent(facts, 2) == (not cause), facts["per_step"]
    runs, log = _runs(name, 2, per_rank_norm=norms)
    replay = step_trace(log["replay"], loss_scale=facts["loss_scale"], per_rank_norm=norms)
    verdict = check_step_equivalence(runs, replay, Layout.plain(2))
    assert verdict.status == ("fail" if cause else "pass"), verdict
    assert verdict.cause.startswith(cause), verdict.cause
    if cause and cause != NAN:
        shown = [d for d in facts["per_step"] if d["rel_diff"] > TOL]
        assert f"by {shown[0]['rel_diff']:.2g} at step {shown[0]['step']}" in verdict.detail


def test_the_truth_behind_each_cause() -> None:
    """What each cause rests on, as measured: the ranks' token counts, the exact factor, the NaN."""
    mean_ce = TRUTH[("bug_rank_mean_ce", 2)]
    assert all(a != b for a, b in zip(*mean_ce["supervised_per_step"].values(), strict=True))
    tail = TRUTH[("bug_accum_tail_constant", 2)]
    assert tail["per_step"][0]["rel_diff"] < TOL < tail["per_step"][-1]["rel_diff"]
    assert tail["samples_per_step"] == {"0": [8, 7], "1": [8, 6]}
    factor = TRUTH[("bug_global_count_no_world", 2)]
    assert factor["loss_scale"] == "mean" and all(abs(p["c"] - 0.5) < 1e-6 for p in factor["per_step"])
    summed = TRUTH[("good_sum_fixed_norm", 2)]
    assert summed["loss_scale"] == "sum" and all(abs(p["c"] - 0.5) < 1e-6 for p in summed["per_step"])
    per_rank = TRUTH[("good_batchnorm_per_rank", 2)]  # the global batch's statistics give another step
    assert all(p["rel_diff"] > 0.2 for p in per_rank["per_step_global_stats"])
    assert all(p["rel_diff"] < TOL for p in per_rank["per_step"])
    sft = TRUTH[("bug_sft_all_masked", 2)]
    assert sft["unsupervised"] == [{"rank": 1, "step": 2, "micro": 0}] and sft["nan_steps"]["0"][0] == 2
    runs, log = _runs("bug_sft_all_masked", 2)
    verdict = check_step_equivalence(runs, step_trace(log["replay"], loss_scale="mean"), Layout.plain(2))
    assert "NaN at step 2" in verdict.detail and "1 later step not compared" in verdict.detail


def test_the_float_noise_of_an_exact_replay_is_far_below_the_tolerance() -> None:
    """The tolerance's margin, measured: float32 noise of the correct fixtures against the bugs' smallest."""
    noise = [
        p["rel_diff"]
        for name, (cause, _) in REPLAYED.items()
        if not cause and TRUTH[(name, 2)]["loss_scale"] != "sum"
        for p in TRUTH[(name, 2)]["per_step"]
    ]
    bugs = [
        p["rel_diff"]
        for name, (cause, _) in REPLAYED.items()
        if cause and cause != NAN
        for p in TRUTH[(name, 2)]["per_step"]
        if p["rel_diff"] is not None and p["rel_diff"] > TOL
    ]
    assert max(noise) * 10 < TOL < min(bugs) / 10, (max(noise), min(bugs))


MICRO = {"bug_two_tower": "vision_tower", "bug_token_budget": ""}  # fixtures whose ranks' work differs


@pytest.mark.parametrize("name", [n for n in LOGGED if (n, 2) in TRUTH or (n, 4) in TRUTH])
def test_equal_microsteps_is_the_truth(name: str) -> None:
    nproc = 2 if (name, 2) in TRUTH else 4
    facts = TRUTH[(name, nproc)]
    assert bool(facts["backward_differ"] or facts["forwards_differ"]) == (name in MICRO)
    runs, _ = _runs(name, nproc)
    verdict = check_equal_microsteps(runs, Layout.plain(nproc))
    assert verdict.status == ("fail" if name in MICRO else "pass"), verdict
    if facts["forwards_differ"] and not facts["backward_differ"]:
        first = facts["forwards_differ"][0]
        counts = ", ".join(f"rank {r} ran {n}" for r, n in first["per_rank"].items())
        assert verdict.detail.startswith(f"{first['module']}: {counts} in step {first['step']}")
    if facts["backward_differ"]:
        first = facts["backward_differ"][0]
        assert f"in step {first['step']};" in verdict.detail


@pytest.mark.parametrize(("name", "nproc"), sorted(TRUTH), ids=[f"{n}-{p}" for n, p in sorted(TRUTH)])
def test_supervision_is_the_truth(name: str, nproc: int) -> None:
    facts = TRUTH[(name, nproc)]
    runs, _ = _runs(name, nproc)
    verdict = check_step_supervision(runs)
    bad = facts["unsupervised"] + facts["empty"]
    assert verdict.status == ("fail" if bad else "pass"), verdict
    if bad:
        first = facts["unsupervised"][0]
        assert verdict.cause == UNSUPERVISED
        assert verdict.detail.startswith(
            f"rank {first['rank']}'s micro-batch {first['micro']} of optimizer step {first['step']}"
        )


RNG = {  # fixture -> rng_independence's cause ("" where the truth says every stream is its own)
    "bug_worker_init_rank_blind": WORKERS_SEEDED_ALIKE.format(worker=0, stream="numpy"),
    "good_worker_default_seed": "",
    "bug_same_seed_workers": SAME_BASE_SEED.format(worker=0, stream="torch"),
    "good_seed_by_rank_workers": "",
    "bug_noise_same_generator": LOOP_SAME.split("{")[0],
    "good_noise_seeded_by_rank": "",
    "good_shared_step_choice": "",
    "good_mesh_noise": "",
    "bug_mesh_noise_global_rank": PEERS_DIFFER.split("{")[0],
}


def _noise_sites(facts: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The loop's draw sites that draw a batch's worth of numbers (a single number per step is a shared
    decision, left out by the check: good_shared_step_choice.py)."""
    return {site: v for site, v in facts.get("loop", {}).items() if math.prod(v["shape"]) > 1}


@pytest.mark.parametrize("name", sorted(RNG))
def test_rng_independence_is_the_truth(name: str) -> None:
    nproc = 4 if "mesh" in name else 2
    facts = TRUTH[(name, nproc)]
    layout = parse_mesh("dp=2,tp=2") if nproc == 4 else Layout.plain(2)
    dp = [layout.dp_rank(r) for r in range(nproc)]
    sites = _noise_sites(facts)
    across_dp = [p for v in sites.values() for p in v["equal_pairs"] if dp[p[0]] != dp[p[1]]]
    peers_apart = [
        (a, b) for v in sites.values() for a in range(nproc) for b in range(a + 1, nproc)
        if dp[a] == dp[b] and [a, b] not in v["equal_pairs"]
    ]  # fmt: skip
    fetch_alike = facts.get("fetch_equal_pairs", [])
    assert bool(across_dp or peers_apart or fetch_alike) == bool(RNG[name]), facts
    log = load(name, nproc)
    steps = [with_loop_draws(step_trace(r), r) for r in log["ranks"]]
    loading = {"train": [fetch_epochs(log["fetch"].get(str(r), [])) for r in range(nproc)]}
    verdict = check_rng_independence(layout, steps=steps, loading=loading)
    assert verdict.status == ("fail" if RNG[name] else "pass"), verdict
    assert verdict.cause.startswith(RNG[name]), verdict.cause
    if name == "bug_noise_same_generator":
        assert next(iter(sites)) in verdict.cause  # the line the truth logged the noise at


def test_the_noise_of_the_same_seed_is_the_same_numbers() -> None:
    """Equal state fingerprints are equal numbers: the first draws themselves, as logged."""
    (same,) = TRUTH[("bug_noise_same_generator", 2)]["loop"].values()
    assert same["first"]["0"] == same["first"]["1"]
    (apart,) = TRUTH[("good_noise_seeded_by_rank", 2)]["loop"].values()
    assert apart["first"]["0"] != apart["first"]["1"]
    workers = TRUTH[("bug_same_seed_workers", 2)]["fetch_first"]
    assert workers["r0w0"] == workers["r1w0"] and workers["r0w0"] != workers["r0w1"]
    assert all(not math.isnan(v) for v in workers["r0w0"])


@pytest.mark.slow
def test_the_stored_truth_is_what_torchrun_shows_today(tmp_path: Path) -> None:
    """Re-measure one fixture under a real torchrun (the run, its replay and the probe): the stored facts
    hold, up to float noise."""
    sys.path.insert(0, str(STEPS))
    try:
        import truth  # fixtures/steps/truth.py
    finally:
        sys.path.remove(str(STEPS))
    now = json.loads(json.dumps(truth.measure("bug_global_count_no_world", 2, logs=tmp_path)["facts"]))
    stored = TRUTH[("bug_global_count_no_world", 2)]
    assert now["supervised_per_step"] == stored["supervised_per_step"] and now["loss_scale"] == "mean"
    for a, b in zip(now["per_step"], stored["per_step"], strict=True):
        assert abs(a["rel_diff"] - b["rel_diff"]) < 1e-6 and abs(a["c"] - b["c"]) < 1e-6


CONTEXT = ("good_cp_contiguous", "good_cp_zigzag", "bug_cp_zigzag_off_by_one", "bug_cp_positions_per_slice",
           "bug_cp_labels_per_slice")  # fmt: skip


@pytest.mark.parametrize("nproc", [4, 2], ids=["dp2-cp2", "dp1-cp2"])
@pytest.mark.parametrize("name", CONTEXT)
def test_context_parallel_checks_are_the_truth(name: str, nproc: int) -> None:
    """What each cp rank fed its model, as its own loop logged it (tokens, positions, labels), against the
    sequences it was handed: ``sequence_split`` fails exactly where the truth found a position held twice
    or by no rank, or tokens that do not sit where their positions say, naming that mechanism; the step
    against one process on the whole sequences differs exactly where the truth measured it (the labels
    shifted inside each slice among them, invisible in the data)."""
    from ddpcheck.checks.sequence_split import check_sequence_split

    facts = TRUTH[(name, nproc)]
    layout = parse_mesh(f"dp={nproc // 2},cp=2")
    runs, log = _runs(name, nproc)
    split = check_sequence_split(runs, layout)
    wrong_data = facts["positions_held_twice"] or facts["positions_held_by_none"]
    assert split.status == ("fail" if wrong_data or facts["tokens_misplaced_ranks"] else "pass"), split
    if facts["positions_restarted_ranks"]:
        assert split.cause.startswith(
            f"positions restarted per slice: rank {facts['positions_restarted_ranks'][0]}"
        )
    if facts["positions_held_twice"] and not facts["positions_restarted_ranks"]:
        first, last = facts["positions_held_twice"][0], facts["positions_held_twice"][-1]
        assert f"(positions {first}-{last}) is held by two ranks" in split.cause, split.cause
    ranks = tuple(layout.representatives())
    replay = step_trace(log["replay"], loss_scale=facts["loss_scale"], replay_ranks=ranks)
    step = check_step_equivalence(runs, replay, layout)
    apart = any(p["rel_diff"] > TOL for p in facts["per_step"])
    assert step.status == ("fail" if apart else "pass"), step
    if name == "bug_cp_labels_per_slice":
        assert split.status == "pass" and step.cause.startswith(
            "the step differs from one process's on the whole"
        )
