"""Issue 29: resume chains (stop, restore, run j batches, save, restore again) judged against truth
measured without ddpcheck (``fixtures/resume/truth_chains.py`` -> ``truth_chains.jsonl``, NOTES.md).

For every ``fixtures/resume/chain_*.py`` the ``resume`` verdict at world sizes 1 and 2 must be ``fail``
exactly where the measured truth has a bug, and a failing verdict's cause must name the mechanism
(issue 29's contract phrases). Real ranks (gloo), real libraries (torchdata, datasets, torchtitan,
accelerate), no mocks. Also the ``batch_integrity`` false alarm on Accelerate's ``BatchSamplerShard``
and its buggy neighbour.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest

from ddpcheck.options import CheckOptions
from ddpcheck.result import CheckResult
from ddpcheck.session import check_loader
from ddpcheck.verdict import BATCH_INTEGRITY, ELASTIC_RESUME, RESUME
from tests.conftest import RESUME_FIXTURES

TRUTH = RESUME_FIXTURES / "truth_chains.jsonl"
CHAINS = sorted(p.name for p in RESUME_FIXTURES.glob("chain_*.py"))
WORLD_SIZES = (1, 2)


def _truth_rows() -> list[dict[str, Any]]:
    return [json.loads(line) for line in TRUTH.read_text().splitlines() if line.strip()]


def _truth(name: str, ws: int) -> tuple[bool, str]:
    """(bug anywhere in the chains measured at ``ws``, the mechanism phrase)."""
    rows = [r for r in _truth_rows() if r["fixture"] == name and r.get("world_size") == ws]
    assert rows, f"no measured truth for {name} at world size {ws}: run fixtures/resume/truth_chains.py"
    bugs = [r for r in rows if r["bug"]]
    return bool(bugs), (bugs[0]["mechanism"] if bugs else "")


def _module_flag(name: str, flag: str) -> bool:
    """``DCP = True`` at module level: the fixture is checked with ``--dcp`` (read, not imported)."""
    return f"\n{flag} = True" in (RESUME_FIXTURES / name).read_text()


@cache
def _check(name: str, elastic: bool = False) -> CheckResult:
    options = CheckOptions(  # type: ignore[arg-type]
        world_sizes=WORLD_SIZES,
        epochs=2,
        timeout=180,
        determinism=False,
        dcp=_module_flag(name, "DCP"),
        elastic=elastic,
    )
    return check_loader(str(RESUME_FIXTURES / name), options)


def _verdict(result: CheckResult, ws: int, check: str) -> Any:
    run = next(r for r in result.runs if r.world_size == ws)
    return next(v for v in run.verdicts if v.check == check)


def test_truth_file_covers_every_chain_fixture_at_both_world_sizes() -> None:
    rows = _truth_rows()
    for name in CHAINS:
        for ws in WORLD_SIZES:
            assert any(r["fixture"] == name and r.get("world_size") == ws for r in rows), (name, ws)
    for row in rows:
        if "chain" in row and row["bug"]:
            assert row["mechanism"], row
        if "chain" in row and not row.get("refused"):
            measured_bug = bool(
                row["lost"] or row["repeated"] or row["order_differs"] or row["later_epoch_differs"]
            )
            assert row["bug"] == measured_bug, row


def test_truth_names_the_expected_mechanisms() -> None:
    """The measured truth is what the fixtures' docstrings say: bugs only in chain_bug_*, each named."""
    for name in CHAINS:
        bug = any(_truth(name, ws)[0] for ws in WORLD_SIZES)
        assert bug == name.startswith("chain_bug_"), name
    # the worker window: one batch after a restore is incomplete, num_workers + 1 batches is not
    hf = [r for r in _truth_rows() if r["fixture"] == "chain_bug_torchdata_hf_workers.py" and "chain" in r]
    assert any(r["bug"] for r in hf if r["chain"]["j"] == 1)
    assert not any(r["bug"] for r in hf if r["chain"]["j"] == 3)


@pytest.mark.slow
@pytest.mark.parametrize("name", CHAINS)
def test_resume_verdict_matches_measured_truth(name: str) -> None:
    result = _check(name)
    assert not any(r.failures for r in result.runs), [r.failures for r in result.runs]
    for ws in WORLD_SIZES:
        bug, mechanism = _truth(name, ws)
        verdict = _verdict(result, ws, RESUME)
        assert verdict.status == ("fail" if bug else "pass"), (
            ws,
            verdict.status,
            verdict.detail,
            verdict.cause,
        )
        if bug:
            if mechanism.startswith(
                "make_"
            ):  # a named extra factory: "<factory> ... restarts at sample 0 ..."
                factory, phrase = mechanism.split(" ", 1)
                assert factory in verdict.cause and phrase in verdict.cause, verdict.cause
            else:
                assert mechanism in verdict.cause, verdict.cause


@pytest.mark.slow
def test_dcp_restore_into_another_world_size_is_refused_not_a_crash() -> None:
    """DCP's CheckpointException (a BaseException) on the missing ``dp_rank_1`` key is a refused restore."""
    rows = [r for r in _truth_rows() if r["fixture"] == "chain_good_dcp_dp_rank_keys.py" and "elastic" in r]
    assert {(r["elastic"]["from"], r["elastic"]["to"]): r["outcome"] for r in rows} == {
        (1, 2): "refused",
        (2, 1): "refused",
    }
    assert "CheckpointException" in next(r["refused"] for r in rows if r["elastic"] == {"from": 1, "to": 2})
    result = _check("chain_good_dcp_dp_rank_keys.py", elastic=True)
    assert not any(r.failures for r in result.runs), [r.failures for r in result.runs]
    grown = [
        row for r in result.runs for row in r.resume if (row.world_size_from, row.world_size_to) == (1, 2)
    ]
    assert grown and {row.outcome for row in grown} == {"refused"}
    assert _verdict(result, 2, ELASTIC_RESUME).status != "fail"


def _integrity(name: str) -> dict[int, str]:
    options = CheckOptions(world_sizes=WORLD_SIZES, epochs=2, timeout=120, determinism=False, resume=False)  # type: ignore[arg-type]
    result = check_loader(str(RESUME_FIXTURES / name), options)
    assert not any(r.failures for r in result.runs)
    return {ws: _verdict(result, ws, BATCH_INTEGRITY).status for ws in WORLD_SIZES}


def test_accelerate_batch_sampler_shard_around_a_plain_batch_sampler_is_not_a_custom_batch_sampler() -> None:
    """Issue 29's false alarm: BatchSamplerShard(BatchSampler(DistributedSampler), 1 process) batches as
    the BatchSampler it holds does; batch_integrity has no custom batch structure to judge."""
    assert _integrity("good_accelerate_batch_sampler_shard.py") == {1: "n/a", 2: "n/a"}


def test_accelerate_split_batches_over_class_balanced_batches_still_fails() -> None:
    """The neighbour the rule must not excuse: split_batches cuts purposeful batches across ranks."""
    assert _integrity("bug_accelerate_batch_sampler_shard_split.py") == {1: "pass", 2: "fail"}


def test_only_a_batch_sampler_that_passes_its_held_one_through_reads_as_plain() -> None:
    """The rule's width: a ``.batch_sampler`` holder is plain only where it yields the held batches as
    they are and the held batch sampler is itself plain."""
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler, SequentialSampler

    from ddpcheck.checker.facts import plain_batching

    data = list(range(16))
    plain = BatchSampler(SequentialSampler(data), 4, drop_last=False)
    assert plain_batching(BatchSamplerShard(plain, 1, 0), data)
    assert not plain_batching(BatchSamplerShard(plain, 2, 1), data)  # every other batch: a shard
    assert not plain_batching(BatchSamplerShard(plain, 2, 0, split_batches=True), data)  # cut batches
    grouped = [[0, 4, 8, 12], [1, 5, 9, 13]]  # a list of batches: purposeful, not chunks of a sampler
    holder = BatchSamplerShard(BatchSampler(SequentialSampler(data), 4, drop_last=False), 1, 0)
    holder.batch_sampler = grouped  # type: ignore[assignment]
    assert not plain_batching(holder, data)
