"""The resume and elastic_resume checks: real ranks, real loaders, real restarts (fixtures/resume/).

Each fixture's truth is stated in its docstring and follows from how the loader saves its state;
``test_judge_*`` pin the pure judge on hand-made streams.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddpcheck.checks.resume import judge_resume, stop_points
from ddpcheck.checks.resume_common import BOUNDARY_EMPTY, BOUNDARY_REPLAY, GLOBAL_RANK_STATE, RANK0_STATE
from ddpcheck.checks.resume_elastic import judge_elastic
from ddpcheck.options import CheckOptions
from ddpcheck.restores import RankResume, Stop, StopResult
from ddpcheck.result import CheckResult
from ddpcheck.scenarios.resume_rank import failure_text
from ddpcheck.session import check_loader
from ddpcheck.verdict import ELASTIC_RESUME, RESUME
from tests.conftest import FIXTURES, RESUME_FIXTURES, ROOT


def _check(name: str, world_sizes: tuple[int, ...] = (1, 2), **kw: object) -> CheckResult:
    options = CheckOptions(world_sizes=world_sizes, epochs=2, timeout=120, determinism=False, **kw)  # type: ignore[arg-type]
    return check_loader(str(RESUME_FIXTURES / name), options)


def _status(result: CheckResult, check: str) -> dict[int, str]:
    return {r.world_size: next(v.status for v in r.verdicts if v.check == check) for r in result.runs}


def _verdict(result: CheckResult, ws: int, check: str):  # type: ignore[no-untyped-def]
    run = next(r for r in result.runs if r.world_size == ws)
    return next(v for v in run.verdicts if v.check == check)


def test_wrapper_state_resumes_exactly_and_elastically() -> None:
    result = _check("good_wrapper_state.py", (1, 2, 3), elastic=True)
    assert not any(r.failures for r in result.runs)
    assert _status(result, RESUME) == {1: "pass", 2: "pass", 3: "pass"}
    assert _status(result, ELASTIC_RESUME) == {1: "pass", 2: "pass", 3: "pass"}
    rows = [row for r in result.runs for row in r.resume]
    stops = {(row.epoch, row.step) for row in rows if row.world_size_from == row.world_size_to == 2}
    assert {e for e, _ in stops} == {0, 1} and len(stops) == 4  # first, middle, last of epoch 0; 1's middle
    pairs = {
        (row.world_size_from, row.world_size_to) for row in rows if row.world_size_from != row.world_size_to
    }
    assert pairs == {(a, b) for a in (1, 2, 3) for b in (1, 2, 3) if a != b}  # both directions
    assert result.exit_code == 0


def test_per_rank_states_lose_nothing_when_shrinking_and_repeat_when_growing() -> None:
    result = _check("bug_wrapper_per_rank_growing.py", (1, 2, 3), elastic=True)
    assert _status(result, RESUME) == {1: "pass", 2: "pass", 3: "pass"}
    assert _status(result, ELASTIC_RESUME) == {1: "pass", 2: "fail", 3: "fail"}
    into_one = [row for row in result.runs[0].resume if row.world_size_from > 1]
    assert into_one and {row.outcome for row in into_one} == {"resharded"}
    grown = [row for r in result.runs[1:] for row in r.resume if row.world_size_from < row.world_size_to]
    assert any(row.outcome == "failed" and row.repeated for row in grown)


def test_step_count_hook_is_right_at_the_same_world_size_and_not_elastic() -> None:
    result = _check("good_skip_hook.py", (1, 2, 4), elastic=True)
    assert _status(result, RESUME) == {1: "pass", 2: "pass", 4: "pass"}
    assert set(_status(result, ELASTIC_RESUME).values()) == {"fail"}
    verdict = _verdict(result, 2, ELASTIC_RESUME)
    assert verdict.detail.startswith("not elastic: ") and (
        "loses" in verdict.detail or "repeats" in verdict.detail
    )
    assert "not elastic" in verdict.cause


def test_a_hook_resumes_in_a_process_that_recorded_a_script_before(tmp_path: Path) -> None:
    """Ranks are forked from the process that runs the check. Where that process had recorded a script
    in-process (the script watchers, installed for its life, give every DataLoader an index log of its
    own), the hook's restore still reads what the resumed loader yielded: once, every restore here
    failed with "cannot tell which indices the resumed loader yielded" (an in-process test ran first)."""
    code = f"""
import sys
from ddpcheck.checker.watch import install
from ddpcheck.options import CheckOptions
from ddpcheck.session import check_loader
install()
options = CheckOptions(world_sizes=(1, 2), epochs=2, timeout=120, determinism=False)
result = check_loader({str(RESUME_FIXTURES / "good_skip_hook.py")!r}, options)
for run in result.runs:
    for v in run.verdicts:
        if v.check == {RESUME!r}:
            print(run.world_size, v.status, v.detail)
"""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert [line.split(" ", 2)[:2] for line in lines] == [["1", "pass"], ["2", "pass"]], lines


def test_a_hook_that_continues_the_global_order_is_elastic() -> None:
    result = _check("good_elastic_hook.py", (1, 2, 3), elastic=True)
    assert _status(result, RESUME) == {1: "pass", 2: "pass", 3: "pass"}
    assert _status(result, ELASTIC_RESUME) == {1: "pass", 2: "pass", 3: "pass"}


def test_repeats_beyond_the_new_layouts_padding_are_not_elastic() -> None:
    """Re-trained samples must not pass as padding: the new layout pads fewer than W' copies."""
    result = _check("bug_elastic_floor_skip.py", (1, 2), elastic=True)
    assert _status(result, RESUME) == {1: "pass", 2: "pass"}
    verdict = _verdict(result, 2, ELASTIC_RESUME)
    assert verdict.status == "fail" and "repeats 4 samples" in verdict.detail, verdict.detail


@pytest.mark.parametrize(
    ("name", "epoch", "cause"),
    [
        ("bug_skip_resets_epoch.py", 1, "replays epoch 0's order"),
        ("bug_replays_epoch0.py", 1, "replays epoch 0's order"),
        ("bug_generator_saved_after_draw.py", 0, "saved after the epoch's permutation was drawn"),
    ],
)
def test_buggy_resumes_fail_with_the_stop_point_and_the_damage(name: str, epoch: int, cause: str) -> None:
    result = _check(name, (1, 2))
    assert _status(result, RESUME) == {1: "fail", 2: "fail"}
    verdict = _verdict(result, 2, RESUME)
    assert verdict.epochs == (epoch,)
    assert f"stopped at epoch {epoch} step " in verdict.detail and "diverges at step" in verdict.detail
    assert "skipped" in verdict.detail and "repeated" in verdict.detail
    assert cause in verdict.cause
    failing = [row for r in result.runs for row in r.resume if row.status == "fail"]
    assert failing and all(row.skipped + row.repeated > 0 for row in failing)
    assert result.exit_code == 1


def test_sampler_state_with_workers_fails_and_says_they_fetched_ahead() -> None:
    result = _check("bug_sampler_state_with_workers.py", (1, 2))
    assert _status(result, RESUME) == {1: "fail", 2: "fail"}
    verdict = _verdict(result, 2, RESUME)
    assert "workers had fetched 4 more batches" in verdict.cause  # 2 workers x prefetch_factor 2
    assert "StatefulDataLoader" in verdict.cause


def test_patched_loader_inside_a_stateful_dataloader_with_workers_resumes() -> None:
    pytest.importorskip("torchdata", reason="torchdata comes with the 'integrations' extra")
    result = _check("good_stateful_patched.py", (1, 2))
    assert _status(result, RESUME) == {1: "pass", 2: "pass"}
    assert result.exit_code == 0


def test_a_loader_without_state_gets_n_a_with_how_to_enable() -> None:
    options = CheckOptions(world_sizes=(1, 2), epochs=2, timeout=60, determinism=False)
    result = check_loader(str(FIXTURES / "good_distributed_sampler.py"), options)
    assert _status(result, RESUME) == {1: "n/a", 2: "n/a"}
    assert "resume_loader(loader, epoch, step, samples_seen)" in _verdict(result, 2, RESUME).detail
    assert result.exit_code == 0


def test_no_resume_turns_it_off() -> None:
    result = _check("bug_replays_epoch0.py", (1,), resume=False)
    assert all(v.check != RESUME for r in result.runs for v in r.verdicts)


def test_torchdata_stateful_loader_with_workers_resumes() -> None:
    pytest.importorskip("torchdata", reason="torchdata comes with the 'integrations' extra")
    options = CheckOptions(
        world_sizes=(1, 2), epochs=2, timeout=120, determinism=False, factory="make_loader_workers"
    )
    result = check_loader(str(FIXTURES / "frameworks" / "torchdata_stateful.py"), options)
    assert _status(result, RESUME) == {1: "pass", 2: "pass"}
    assert all("via loader" in row.note for r in result.runs for row in r.resume)


# --- the pure parts ---------------------------------------------------------------------------


def test_stop_points_are_first_middle_last_of_epoch_0_and_a_later_middle() -> None:
    stops = stop_points([5, 5], epochs=2, elastic=True)
    assert [(s.epoch, s.step) for s in stops] == [(0, 1), (0, 3), (0, 5), (1, 3)]
    assert [(s.epoch, s.step) for s in stops if s.next_epoch] == [(0, 3)]
    assert [(s.epoch, s.step) for s in stops if s.boundary] == [(0, 5)]  # read both ways trainers restore it
    assert all(s.elastic for s in stops)  # every one also restored in other topologies
    assert not any(s.elastic for s in stop_points([5, 5], epochs=2, elastic=False))
    assert [(s.epoch, s.step, s.boundary) for s in stop_points([1], epochs=1, elastic=False)] == [
        (0, 1, True)
    ]


def _rank(rank: int, epochs: list[list[list[int]]], resumed: list[StopResult]) -> RankResume:
    return RankResume(
        rank,
        "sampler",
        tuple(tuple(tuple(b) for b in e) for e in epochs),
        tuple(resumed),
    )


def test_judge_resume_passes_the_exact_rest_and_counts_the_damage() -> None:
    epochs = [[[0, 1], [2, 3], [4, 5]], [[5, 3], [1, 0], [4, 2]], [[2, 4], [0, 1], [3, 5]]]
    stop = Stop(1, 1, next_epoch=True)
    good = StopResult(stop, rest=((1, 0), (4, 2)), next_epoch=((2, 4), (0, 1), (3, 5)))
    verdict, rows = judge_resume(1, [_rank(0, epochs, [good])])
    assert verdict.status == "pass" and rows[0].status == "pass"
    replayed = StopResult(stop, rest=((2, 3), (4, 5)), next_epoch=((2, 4), (0, 1), (3, 5)))  # epoch 0's rest
    verdict, rows = judge_resume(1, [_rank(0, epochs, [replayed])])
    assert verdict.failed and rows[0].first_divergence == 2
    assert (rows[0].skipped, rows[0].repeated) == (2, 2)  # 1 and 0 lost; 3 and 5 seen twice in epoch 1
    assert "replays epoch 0" in verdict.cause
    changed_next = StopResult(stop, rest=((1, 0), (4, 2)), next_epoch=((0, 1), (2, 4), (3, 5)))
    verdict, _ = judge_resume(1, [_rank(0, epochs, [changed_next])])
    assert verdict.failed and "changes the next epoch" in verdict.detail


def test_judge_resume_reads_an_epochs_end_both_ways_trainers_restore_it() -> None:
    epochs = [[[0, 1], [2, 3]], [[3, 0], [2, 1]]]
    stop = Stop(0, 2, boundary=True)
    # a job that starts the next epoch at once gets epoch 1: exact (the other reading was not needed)
    starting = StopResult(stop, next_pass=((3, 0), (2, 1)), read_rest=False)
    verdict, rows = judge_resume(1, [_rank(0, epochs, [starting])])
    assert verdict.status == "pass" and rows[0].note == "via sampler" and rows[0].after == 4
    # only a loop that finishes the stopped epoch (empty) first gets epoch 1: exact, and the note says so
    finishing = StopResult(stop, rest=(), next_epoch=((3, 0), (2, 1)), next_pass=())
    verdict, rows = judge_resume(1, [_rank(0, epochs, [finishing])])
    assert verdict.status == "pass" and "finishes the stopped epoch" in rows[0].note
    # neither: the finished epoch again (a state that does not say the epoch is over)
    replayed = StopResult(stop, rest=((0, 1), (2, 3)), next_pass=((0, 1), (2, 3)))
    verdict, rows = judge_resume(1, [_rank(0, epochs, [replayed])])
    assert verdict.failed and verdict.cause == BOUNDARY_REPLAY and verdict.fix
    # neither: nothing at all in the next epoch
    empty = StopResult(stop, rest=(), next_epoch=(), next_pass=())
    verdict, rows = judge_resume(1, [_rank(0, epochs, [empty])])
    assert verdict.failed and verdict.cause == BOUNDARY_EMPTY and rows[0].skipped == 4


def test_judge_resume_names_one_state_restored_on_every_rank() -> None:
    stop = Stop(0, 1)
    ranks = [
        _rank(0, [[[0, 2], [4, 6]]], [StopResult(stop, rest=((4, 6),))]),
        _rank(1, [[[1, 3], [5, 7]]], [StopResult(stop, rest=((4, 6),))]),  # rank 0's remainder
    ]
    verdict, rows = judge_resume(2, ranks)
    assert verdict.failed and verdict.cause == RANK0_STATE and verdict.fix
    assert (rows[0].skipped, rows[0].repeated) == (2, 2)


def test_judge_elastic_counts_lost_and_repeated_against_padding() -> None:
    old = [
        _rank(0, [[[0, 1], [2, 3]]], []),
        _rank(1, [[[4, 5], [6, 7]]], []),
    ]
    stop = Stop(0, 1)
    exact = judge_elastic(old, 1, stop, [((2, 3), (6, 7))], pad_room=0)
    assert exact.status == "pass"
    lossy = judge_elastic(old, 1, stop, [((2, 3),)], pad_room=0)
    assert (
        lossy.status == "fail" and lossy.skipped == 2 and "2 -> 1" in lossy.note and "loses 2" in lossy.note
    )
    repeats = judge_elastic(old, 1, stop, [((0, 2, 3), (6, 7))], pad_room=0)
    assert repeats.status == "fail" and repeats.repeated == 1
    assert judge_elastic(old, 1, stop, [((0, 2, 3), (6, 7))], pad_room=1).status == "pass"
    refused = judge_elastic(old, 1, stop, ["StopIteration: "], pad_room=0)  # loud: an answer, not a failure
    assert refused.outcome == "refused" and refused.status == "pass"
    assert "refused: restoring raised StopIteration" in refused.note
    assert (exact.outcome, lossy.outcome) == ("resharded", "failed")


def test_judge_resume_takes_out_of_order_batches_as_a_multiset() -> None:
    epochs = [[[0, 1], [2, 3], [4, 5]], [[5, 3], [1, 0], [4, 2]]]
    shuffled = StopResult(Stop(0, 1), rest=((4, 5), (2, 3)))  # the two remaining batches, swapped
    in_order = RankResume(0, "loader", tuple(tuple(tuple(b) for b in e) for e in epochs), (shuffled,))
    assert judge_resume(1, [in_order])[0].failed
    free = RankResume(0, "loader", in_order.uninterrupted, (shuffled,), in_order=False)
    assert judge_resume(1, [free])[0].status == "pass"


def test_a_resume_that_skips_too_many_batches_says_by_how_many() -> None:
    epochs = [[[0, 1], [2, 3], [4, 5], [6, 7]]]
    stop = Stop(0, 1)
    too_far = StopResult(stop, rest=((6, 7),))  # resumed at step 4 instead of step 2
    verdict, _ = judge_resume(1, [_rank(0, epochs, [too_far])])
    assert verdict.failed and "resumes at step 4 instead of step 2" in verdict.cause
    assert "skips 2 batches too many" in verdict.cause


def test_a_stop_past_what_a_rank_recorded_is_not_judged_and_nothing_crashes() -> None:
    """Issue 36 item 9: a rank with one batch an epoch finishes epoch 1 at the job's stop in epoch 1; its
    next pass (epoch 2) was never recorded. The judge used to read ``uninterrupted[2]`` (IndexError)."""
    epochs = [[[0, 1]], [[1, 0]]]
    end0, end1 = Stop(0, 1, boundary=True), Stop(1, 1, boundary=True)
    rank = _rank(0, epochs, [
        StopResult(end0, next_pass=((1, 0),), read_rest=False),  # epoch 0's end, then epoch 1: exact
        StopResult(end1, rest=((3, 2),), next_pass=((3, 2),)),  # epoch 1's end: epoch 2 not recorded
    ])  # fmt: skip
    verdict, rows = judge_resume(1, [rank])
    assert verdict.status == "pass" and "not judged: rank 0 had finished epoch 1" in verdict.detail
    assert [r.status for r in rows] == ["pass", "skip"] and rows[1].outcome == ""
    assert "no uninterrupted epoch" in rows[1].note
    # a finished epoch whose rest is empty is judged that far (a loop that finishes it first is right)
    empty_rest = _rank(0, epochs, [StopResult(end1, rest=(), next_pass=((3, 2),))])
    verdict, rows = judge_resume(1, [empty_rest])
    assert verdict.status == "pass" and rows[0].status == "pass" and "not judged" in rows[0].note
    # an epoch the rank never recorded at all: nothing to judge, said so
    verdict, rows = judge_resume(1, [_rank(0, epochs, [StopResult(Stop(2, 1), rest=((0,),))])])
    assert verdict.status == "skip" and "recorded no epoch 2" in verdict.detail


def test_rows_carry_every_ranks_counts() -> None:
    stop = Stop(0, 1)
    ranks = [
        _rank(0, [[[0, 2], [4, 6]]], [StopResult(stop, rest=((4, 6),))]),
        _rank(1, [[[1, 3], [5, 7]]], [StopResult(stop, rest=((1, 3), (5, 7)))]),  # started over
    ]
    _, rows = judge_resume(2, ranks)
    assert [(r.rank, r.before, r.after, r.lost, r.repeated) for r in rows[0].ranks] == [
        (0, 2, 2, 0, 0),
        (1, 2, 4, 0, 2),
    ]
    assert (rows[0].before, rows[0].after, rows[0].repeated) == (4, 6, 2)
    elastic = judge_elastic(ranks, 1, stop, [((4, 6),)], pad_room=0)  # old rank 1's rest lost
    assert [(r.rank, r.before, r.after, r.lost) for r in elastic.ranks] == [(0, 2, 2, 0), (1, 2, 0, 2)]


def test_lhotse_split_twice_fails_its_checks_and_resume_says_what_it_could_not_judge() -> None:
    """bug_lhotse_split_twice.py, truth in its docstring (measured under torchrun): 36 of 48 cuts never
    trained at W=4; the restore at epoch 0's end is exact for a job that starts epoch 1 at once; the stop
    in epoch 1 is every rank's epoch end, whose next pass was never recorded."""
    result = _check("bug_lhotse_split_twice.py", world_sizes=(4,))
    assert result.exit_code == 1  # a verdict, not an internal error
    assert _status(result, "coverage") == {4: "fail"}
    coverage = _verdict(result, 4, "coverage")
    assert "36 samples of 48 are never seen" in coverage.detail
    assert _status(result, RESUME) == {4: "pass"}
    rows = {(r.epoch, r.step): r for r in result.runs[0].resume}
    assert rows[(0, 1)].outcome == "exact"
    assert rows[(1, 1)].status == "skip" and rows[(1, 1)].note.startswith("not judged: rank ")


def test_failure_text_is_one_readable_line() -> None:
    assert failure_text(StopIteration()).startswith("StopIteration before the first batch")
    worker = (
        "Caught IndexError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
        '  File "/home/u/data.py", line 7, in load\n    return rows[i]\nIndexError: list index out of range\n'
    )
    assert failure_text(IndexError(worker)) == (
        "IndexError: list index out of range [DataLoader worker process 0, /home/u/data.py:7 in load]"
    )
    assert failure_text(ValueError("x" * 1000)).endswith("(712 more characters)")
    assert "\n" not in failure_text(ValueError("a\nb"))


def _mesh_check(name: str) -> CheckResult:
    pytest.importorskip("torchdata", reason="torchdata comes with the 'integrations' extra")
    meshes = ("dp=2,tp=2", "dp=2")
    options = CheckOptions(
        world_sizes=(), meshes=meshes, epochs=2, timeout=120, determinism=False, elastic=True
    )
    return check_loader(str(RESUME_FIXTURES / name), options)


def test_a_state_keyed_by_dp_rank_restores_across_meshes() -> None:
    result = _mesh_check("mesh_state_by_dp_rank.py")
    assert not any(r.failures for r in result.runs)
    by_label = {r.label: {v.check: v.status for v in r.verdicts} for r in result.runs}
    assert by_label["dp=2,tp=2"][RESUME] == by_label["dp=2"][RESUME] == "pass"
    assert by_label["dp=2,tp=2"][ELASTIC_RESUME] == by_label["dp=2"][ELASTIC_RESUME] == "pass"
    changes = {row.topology for r in result.runs for row in r.resume}
    assert {"dp=2,tp=2 -> dp=2,tp=2", "dp=2 -> dp=2,tp=2", "dp=2,tp=2 -> dp=2"} <= changes


def test_a_state_keyed_by_global_rank_on_a_mesh_is_named() -> None:
    result = _mesh_check("bug_mesh_state_by_global_rank.py")
    run = next(r for r in result.runs if r.label == "dp=2,tp=2")
    verdict = next(v for v in run.verdicts if v.check == ELASTIC_RESUME)
    assert verdict.status == "fail" and verdict.cause == GLOBAL_RANK_STATE and verdict.fix
    row = next(r for r in run.resume if r.topology == "dp=2 -> dp=2,tp=2" and (r.epoch, r.step) == (0, 1))
    assert row.outcome == "failed" and (row.skipped, row.repeated) == (0, 4)
