"""The bugs only size shows, on loader files whose truth was measured without ddpcheck
(``fixtures/scale/truth.py`` iterates every rank's real loader; ``truth_results.jsonl`` holds what the
loops received): an index map that overflowed its integer type, a looping stream that replays its first
pass, an index built per node that differs between nodes; and the neighbours each rule must leave alone
(the same map in int64, a dataset keyed by sparse ids, a loop that reshuffles every pass)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ddpcheck.checks.diagnose import PER_NODE, RANK_SEED
from ddpcheck.checks.ranges import OVERFLOW
from ddpcheck.checks.reshuffle import LOOP_REPLAYS
from ddpcheck.options import CheckOptions
from ddpcheck.session import check_loader
from ddpcheck.verdict import COVERAGE, NO_OVERLAP, RESHUFFLE
from tests.conftest import FIXTURES

SCALE = FIXTURES / "scale"
WORLD_SIZES = (1, 2, 4)
WINDOWS: dict[str, Any] = {"steps": 6, "epochs": 3}  # the looping fixtures' --steps 6 --epochs 3


def _truth() -> dict[tuple[str, int], dict[str, Any]]:
    lines = (SCALE / "truth_results.jsonl").read_text().splitlines()
    return {(d["fixture"], d["world_size"]): d["facts"] for d in map(json.loads, lines)}


TRUTH = _truth()


def _failed(name: str, **options: Any) -> dict[int, dict[str, Any]]:
    settings: dict[str, Any] = {"world_sizes": WORLD_SIZES, "epochs": 2, "timeout": 120.0, **options}
    result = check_loader(str(SCALE / f"{name}.py"), CheckOptions(**settings))
    out: dict[int, dict[str, Any]] = {}
    for run in result.runs:
        assert not run.failures, run.failures
        out[run.world_size] = {v.check: v for v in run.verdicts if v.failed}
    return out


@pytest.mark.parametrize("name", ["bug_int16_index_map", "good_int64_index_map", "good_keyed_dataset"])
def test_an_overflowed_index_map_fails_coverage_and_keys_do_not(name: str) -> None:
    failed = _failed(name)
    for ws in WORLD_SIZES:
        truth = TRUTH[(name, ws)]
        if truth["missed"]:  # the loop never trained on some samples: the overflow, named
            assert set(failed[ws]) == {COVERAGE}, failed[ws]
            verdict = failed[ws][COVERAGE]
            assert verdict.cause == OVERFLOW and verdict.evidence.overflow is True
            assert verdict.evidence.out_of_range == truth["bad_index"] // 2  # one epoch's wrapped indices
            assert verdict.evidence.value < 0 and "int16" in verdict.detail
        else:  # int64 map; sparse keys beyond len(dataset): no finding
            assert failed[ws] == {}, {c: v.detail for c, v in failed[ws].items()}


def test_an_index_built_per_node_is_named_where_nodes_disagree() -> None:
    failed = _failed("bug_per_node_index")
    for ws in WORLD_SIZES:
        truth = TRUTH[("bug_per_node_index", ws)]
        if not truth["missed"] and not truth["twice"]:
            assert failed[ws] == {}, failed[ws]
            continue
        assert {COVERAGE, NO_OVERLAP} <= set(failed[ws])
        for verdict in failed[ws].values():
            assert verdict.cause.startswith(PER_NODE.split("{")[0]), verdict.cause
            assert "groups of 2 consecutive ranks" in verdict.cause


def test_a_seed_per_rank_is_not_called_a_per_node_index() -> None:
    """The neighbour the per-node rule could hide: every rank its own order reads as a seed per rank."""
    result = check_loader(
        str(FIXTURES / "bug_seed_depends_on_rank.py"),
        CheckOptions(world_sizes=(4,), epochs=1, determinism=False),
    )
    causes = {v.check: v.cause for v in result.runs[0].verdicts if v.failed}
    assert causes[NO_OVERLAP] == RANK_SEED and causes[COVERAGE] == RANK_SEED


@pytest.mark.parametrize("name", ["bug_loop_replays_order", "good_loop_reshuffles"])
def test_a_loop_that_replays_its_first_pass_fails_reshuffle(name: str) -> None:
    failed = _failed(name, **WINDOWS)
    for ws in WORLD_SIZES:
        if TRUTH[(name, ws)]["replays"]:
            assert set(failed[ws]) == {RESHUFFLE}, failed[ws]
            assert failed[ws][RESHUFFLE].cause == LOOP_REPLAYS
            assert failed[ws][RESHUFFLE].evidence.pass_length == 48 // ws  # each rank's share of a pass
        else:
            assert failed[ws] == {}, {c: v.detail for c, v in failed[ws].items()}
