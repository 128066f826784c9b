"""Issue 31's wrong verdicts and buried causes (items 1, 6, 9, 10, 11, 12), each on a fixture whose truth
was measured without ddpcheck (stated in the fixture's docstring, or the NOTES.md beside it).

Real ranks, real process groups (gloo), real libraries; no mocks. A rule that loosens a check is tested
with the buggy neighbour it must still catch.
"""

from __future__ import annotations

import pytest

from ddpcheck.checks.equivalence import DEPENDS_ON_RANK
from ddpcheck.checks.packed import TOKENS_EXTRA
from ddpcheck.checks.replicas import GLOBAL_RANK, SHARDED_TWICE_MESH
from ddpcheck.checks.resume_common import RANK0_SAVED, RANK0_STATE, WORKER_OFFSETS
from ddpcheck.figures import PACKED_NOTE
from ddpcheck.options import CheckOptions
from ddpcheck.report.html import render_html
from ddpcheck.report.markdown import render_markdown
from ddpcheck.report.table import render_table
from ddpcheck.report.view import build_view, evidence, resume_summary
from ddpcheck.result import CheckResult
from ddpcheck.session import check_loader
from ddpcheck.verdict import (
    COVERAGE,
    PACKING,
    REPLICA_CONSISTENCY,
    RESUME,
    SINGLE_PROCESS_EQUIVALENCE,
    WORK_BALANCE,
)
from tests.conftest import FIXTURES, RESUME_FIXTURES

MESH = FIXTURES / "mesh"


def _check(
    path: str, world_sizes: tuple[int, ...] = (), meshes: tuple[str, ...] = (), **kw: object
) -> CheckResult:
    options = CheckOptions(  # type: ignore[arg-type]
        world_sizes=world_sizes, meshes=meshes, epochs=2, timeout=120, determinism=False, **kw
    )
    return check_loader(path, options)


def _verdict(result: CheckResult, label: str, check: str):  # type: ignore[no-untyped-def]
    run = next(r for r in result.runs if r.label.removeprefix("ws=") == label)
    return next(v for v in run.verdicts if v.check == check)


# ----------------------------------------------------------------------------- item 10


def test_global_rank_on_a_mesh_leads_with_its_cause_when_the_sampler_pads() -> None:
    """66 samples on 4 global ranks: DistributedSampler pads 2 copies, the shards are no longer exactly
    disjoint; the cause is still the global rank (truth: plain_global_rank_padded.py's docstring)."""
    result = _check(str(MESH / "plain_global_rank_padded.py"), meshes=("dp=2,tp=2",), resume=False)
    found = build_view(result).causes
    assert found and found[0].text == GLOBAL_RANK, [c.text for c in found]
    assert [c.text for c in found] == [GLOBAL_RANK]  # one cause explains coverage, replicas and 1-proc
    for check in (COVERAGE, REPLICA_CONSISTENCY, SINGLE_PROCESS_EQUIVALENCE):
        verdict = _verdict(result, "dp=2,tp=2", check)
        assert verdict.status == "fail" and verdict.cause == GLOBAL_RANK, (check, verdict.cause)
    fix = _verdict(result, "dp=2,tp=2", REPLICA_CONSISTENCY).fix
    assert "ParallelAwareDataloader shards nothing" in fix and "split_dataset_by_node" in fix


def test_sharded_twice_on_a_mesh_keeps_its_cause() -> None:
    """The neighbour: split by dp rank, then by dp rank again (plain_sharded_twice.py)."""
    result = _check(str(MESH / "plain_sharded_twice.py"), meshes=("dp=2,tp=2",), resume=False)
    assert [c.text for c in build_view(result).causes] == [SHARDED_TWICE_MESH]


def test_torchtitan_parallel_aware_dataloader_shards_nothing_as_the_docs_say() -> None:
    """The fix text and docs/frameworks.md describe torchtitan 0.3.0 as it is: ParallelAwareDataloader
    keeps dp_rank only to key its state; the dataset (split_dataset_by_node) shards."""
    components = pytest.importorskip("torchtitan.components.dataloader")
    loader = components.ParallelAwareDataloader(list(range(8)), dp_rank=1, dp_world_size=2, batch_size=2)
    assert [int(x) for b in loader for x in b] == list(range(8))  # every item, on dp rank 1 of 2
    assert set(loader.state_dict()) == {"dp_rank_1", "world_size"}
    docs = (FIXTURES.parent / "docs" / "frameworks.md").read_text()
    assert "`ParallelAwareDataloader` does not" in docs


# ----------------------------------------------------------------------------- item 6


def test_hooks_apply_when_a_fresh_samplers_state_dict_raises() -> None:
    """Truth: rank 0's state restored on both ranks loses 44 and repeats 44 after step 1 (fixture)."""
    result = _check(str(RESUME_FIXTURES / "bug_rank0_saver_lazy_state.py"), (2,))
    verdict = _verdict(result, "2", RESUME)
    assert verdict.status == "fail" and verdict.cause == RANK0_STATE and verdict.fix
    first = next(row for row in result.runs[0].resume if (row.epoch, row.step) == (0, 1))
    assert (first.skipped, first.repeated) == (44, 44)
    last = next(row for row in result.runs[0].resume if (row.epoch, row.step) == (0, 12))
    assert last.outcome == "exact"


def test_hooks_restore_a_loader_without_state_dict() -> None:
    """Truth: exact at every stop at world sizes 2 and 3 (good_hooks_no_state_dict.py)."""
    result = _check(str(RESUME_FIXTURES / "good_hooks_no_state_dict.py"), (1, 2, 3))
    for label in ("1", "2", "3"):
        verdict = _verdict(result, label, RESUME)
        assert verdict.status == "pass" and "via save_state/load_state" in verdict.detail, verdict.detail
    assert result.exit_code == 0


# ----------------------------------------------------------------------------- item 9


def _stop_rows(result: CheckResult) -> dict[tuple[int, int], object]:
    return {(row.epoch, row.step): row for row in result.runs[0].resume}


def test_uneven_ranks_stop_where_each_rank_is() -> None:
    """Truth: batches [2, 1, 2]; after global step 1 and step 2 every rank continues exactly when it
    finishes the stopped epoch (good_uneven_ranks.py)."""
    pytest.importorskip("torchdata", reason="torchdata comes with the 'integrations' extra")
    result = _check(str(RESUME_FIXTURES / "good_uneven_ranks.py"), (3,))
    verdict = _verdict(result, "3", RESUME)
    assert verdict.status == "pass", verdict.detail
    rows = _stop_rows(result)
    assert {(0, 1), (0, 2)} <= set(rows)  # the stops follow the longest rank, not the shortest
    assert all(row.outcome == "exact" for row in rows.values())  # type: ignore[attr-defined]


def test_uneven_ranks_still_catch_a_restore_that_skips() -> None:
    """The neighbour: the same split, a restore that counts samples as batches; truth: after global step
    1 ranks 0 and 2 lose their last sample (2 in all), after step 2 every rank is exact."""
    result = _check(str(RESUME_FIXTURES / "bug_uneven_ranks_skip.py"), (3,))
    verdict = _verdict(result, "3", RESUME)
    assert verdict.status == "fail" and "skips" in verdict.cause
    rows = _stop_rows(result)
    assert (rows[(0, 1)].outcome, rows[(0, 1)].skipped, rows[(0, 1)].repeated) == ("failed", 2, 0)  # type: ignore[attr-defined]
    assert rows[(0, 2)].outcome == "exact"  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------- item 12


def test_torchtitan_rank0_only_checkpoint_is_named_with_the_librarys_warning() -> None:
    """Truth: rank 1 logs "DataLoader state is empty for dp rank 1, expected key dp_rank_1" and starts
    its epoch over (bug_torchtitan_rank0_checkpoint.py)."""
    pytest.importorskip("torchtitan", reason="pip install --no-deps torchtitan==0.3.0 spmd_types==0.2.3")
    result = _check(str(RESUME_FIXTURES / "bug_torchtitan_rank0_checkpoint.py"), (2,))
    verdict = _verdict(result, "2", RESUME)
    assert verdict.status == "fail" and verdict.cause == RANK0_SAVED and verdict.fix
    assert 1 in verdict.ranks
    said = dict(evidence(verdict))
    assert said["logged"] == "rank 1: DataLoader state is empty for dp rank 1, expected key dp_rank_1"
    first = next(row for row in result.runs[0].resume if (row.epoch, row.step) == (0, 1))
    assert (first.skipped, first.repeated) == (0, 4)  # rank 1 runs its first batch again


def test_every_rank_restoring_rank_0s_state_keeps_its_cause() -> None:
    """The neighbour: a state every rank can load (fixtures/streaming/bug_rank0_state_only.py): the ranks
    restore one and the same rest, truth 44 lost / 44 repeated after step 1."""
    result = check_loader(
        str(FIXTURES / "streaming" / "bug_rank0_state_only.py"),
        CheckOptions(world_sizes=(2,), epochs=2, timeout=120, determinism=False),
    )
    verdict = _verdict(result, "2", RESUME)
    assert verdict.status == "fail" and verdict.cause == RANK0_STATE
    first = next(row for row in result.runs[0].resume if (row.epoch, row.step) == (0, 1))
    assert (first.skipped, first.repeated) == (44, 44)


# ----------------------------------------------------------------------------- item 1

TOKENS = FIXTURES / "tokens"


def _packed(name: str, **kw: object) -> CheckResult:
    pytest.importorskip("torchtitan", reason="pip install --no-deps torchtitan==0.3.0 spmd_types==0.2.3")
    return _check(str(TOKENS / name), meshes=("dp=2,tp=2",), resume=False, **kw)


def test_a_loader_packing_each_dp_ranks_documents_passes_on_tokens() -> None:
    """Truth: every document on exactly one dp rank, the dp ranks hold the single process's 896 tokens,
    tp peers identical; only 12 of its 28 rows occur among the dp ranks' rows (torchtitan_packed_dp.py)."""
    result = _packed("torchtitan_packed_dp.py")
    assert result.exit_code == 0, [(v.check, v.detail) for r in result.runs for v in r.verdicts if v.failed]
    for check in (COVERAGE, SINGLE_PROCESS_EQUIVALENCE):
        verdict = _verdict(result, "dp=2,tp=2", check)
        assert verdict.status == "pass" and "compared token by token" in verdict.detail, verdict.detail
        assert verdict.evidence.tokens == 896
    # torchtitan's batch keys ({"input", "positions"}, labels) are tokens: work and packing see them
    assert _verdict(result, "dp=2,tp=2", WORK_BALANCE).status == "pass"
    packing = _verdict(result, "dp=2,tp=2", PACKING)
    assert packing.status == "pass" and packing.evidence.tokens_lost == 0, packing.detail
    figures = result.runs[0].figures
    assert figures is not None and figures.packed_rows and PACKED_NOTE in figures.note


@pytest.mark.parametrize("cost", ["tokens", "attention"])
def test_without_token_ids_a_packed_loader_is_judged_on_token_counts(cost: str) -> None:
    result = _packed("torchtitan_packed_dp_counts.py", work_cost=cost)
    assert result.exit_code == 0
    verdict = _verdict(result, "dp=2,tp=2", SINGLE_PROCESS_EQUIVALENCE)
    assert verdict.status == "pass" and "compared by token count" in verdict.detail
    assert verdict.evidence.tokens == 896  # segments' work squared under attention cost: counted back


def test_a_packed_loader_that_gives_documents_to_two_ranks_still_fails() -> None:
    """Truth: documents 24..27 on both dp ranks: 960 tokens held, 64 copies (the neighbour)."""
    result = _packed("bug_torchtitan_packed_overlap.py")
    verdict = _verdict(result, "dp=2,tp=2", SINGLE_PROCESS_EQUIVALENCE)
    assert verdict.status == "fail" and verdict.cause == TOKENS_EXTRA and verdict.fix
    assert verdict.evidence.tokens_extra == 64 and "64 of them copies" in verdict.detail
    assert verdict.examples[0] == (24, 0)


def test_a_rank_dependent_dataset_still_fails_single_process_equivalence() -> None:
    """The neighbour with index ids (fixtures/bug_rank_dependent_length.py): ranks > 0 read rank-local
    samples; not packed, so judged on samples as before."""
    result = _check(str(FIXTURES / "bug_rank_dependent_length.py"), (2,), resume=False)
    verdict = _verdict(result, "2", SINGLE_PROCESS_EQUIVALENCE)
    assert verdict.status == "fail" and verdict.cause == DEPENDS_ON_RANK


def test_the_html_picture_of_packed_rows_does_not_count_rows_as_missing() -> None:
    result = _packed("torchtitan_packed_dp.py")
    html = render_html(result)
    caption = (
        html.split('<figure class="samples">', 1)[1].split("<figcaption>", 1)[1].split("</figcaption>")[0]
    )
    assert "missing" not in caption and "judged on the tokens" in caption


# ----------------------------------------------------------------------------- item 11


def test_a_restore_into_the_same_worker_count_is_not_made_and_the_terminal_summarises() -> None:
    """Truth (fixtures/streaming/NOTES.md): hf_iterable_stateful.py is exact at the same topology,
    refused with "State doesn't contain key '_num_yielded'" on workers 2 -> 0, broken on most world-size
    changes. The loader has 2 workers: "--resume-workers 0,2" restores into 0 only."""
    pytest.importorskip("torchdata", reason="torchdata comes with the 'integrations' extra")
    result = check_loader(
        str(FIXTURES / "streaming" / "hf_iterable_stateful.py"),
        CheckOptions(
            world_sizes=(1, 2), epochs=2, timeout=120, determinism=False, elastic=True, resume_workers=(0, 2)
        ),
    )
    rows = [row for r in result.runs for row in r.resume]
    changes = {row.topology for row in rows}
    assert "workers 2 -> 2" not in changes and "workers 2 -> 0" in changes
    assert {row.outcome for row in rows if row.topology == "workers 2 -> 0"} == {"refused"}
    assert all(v.cause != WORKER_OFFSETS for r in result.runs for v in r.verdicts)  # no worker count changed
    text = render_table(result, width=100, not_applicable_in="reports/ddpcheck.md")
    section = text.split("Resume and elastic restores", 1)[1].split("\n\n", 1)[0]
    assert "stop at step" not in section  # the full table is in the files, not the terminal
    summary = {s.topology: s for s in resume_summary(build_view(result))}
    assert summary["workers 2 -> 0"].refused == summary["workers 2 -> 0"].restores == 8
    assert summary["2 -> 2"].exact == summary["2 -> 2"].restores == 4
    assert section.count("_num_yielded") == 1 and "(8 restores)" in section  # identical notes once
    assert "every restore, one line each: reports/ddpcheck.md" in section
    assert "| workers 2 -\\> 0 " in render_markdown(result)  # the full table stays in the report files


def test_an_unchanged_data_parallel_layout_is_an_exact_restore() -> None:
    """Truth (fixtures/resume/truth_mesh_restore.py, NOTES.md): from dp=2,tp=2 into dp=2, each new dp
    rank's rest equals the old dp rank's uninterrupted stream after steps 1, 4 and 8."""
    pytest.importorskip("torchdata", reason="torchdata comes with the 'integrations' extra")
    options = CheckOptions(
        world_sizes=(), meshes=("dp=2,tp=2", "dp=2"), epochs=2, timeout=120, determinism=False, elastic=True
    )
    result = check_loader(str(RESUME_FIXTURES / "mesh_state_by_dp_rank.py"), options)
    rows = [row for r in result.runs for row in r.resume if row.topology == "dp=2,tp=2 -> dp=2"]
    assert rows and {row.outcome for row in rows} == {"exact"}, [(r.outcome, r.note) for r in rows]
    assert "data-parallel layout is unchanged" in rows[0].note
