"""Resumed as real runs do it (issue 29): twice, right after a restore, in the user's restore order,
through DCP, every loader factory of the file. Pure namers on hand-made streams first, then real ranks
on the engine fixtures (fixtures/resume/engine_*.py, truth in their docstrings)."""

from __future__ import annotations

import pytest

from ddpcheck.checker.loaderfile import LoaderSpec, other_factories
from ddpcheck.checks.resume import (
    batches_off,
    factory_cause,
    judge_resume,
    next_epoch_cause,
    offset_every_epoch,
)
from ddpcheck.checks.resume_chains import (
    INCOMPLETE_STATE,
    STALE_STATE,
    ChainDamage,
    chain_cause,
    chain_damage,
    judge_chains,
)
from ddpcheck.checks.resume_common import shift_of
from ddpcheck.options import CheckOptions
from ddpcheck.restores import ChainResult, RankResume, Stop, StopResult
from ddpcheck.result import CheckResult
from ddpcheck.scenarios.resume_rank import answerable, chain_lengths
from ddpcheck.session import check_loader
from ddpcheck.verdict import ELASTIC_RESUME, RESUME
from tests.conftest import RESUME_FIXTURES

EPOCH0 = ((0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (10, 11))
EPOCH1 = ((5, 0), (9, 2), (11, 1), (3, 7), (4, 10), (6, 8))


def _rank(**kw: object) -> RankResume:
    return RankResume(0, "loader", (EPOCH0, EPOCH1), **kw)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- pure namers


def test_a_constant_early_skip_is_named_off_by_n_even_when_the_step_1_stop_is_clamped() -> None:
    # accelerate PR #3952 at 2 processes: one batch early; at step 1 that is the epoch's start
    assert batches_off([(1, 0), (3, 2), (5, 4)]) == -1
    assert batches_off([(3, 5), (1, 3)]) == 2  # two late at every stop
    assert batches_off([(1, 0), (3, 0)]) is None  # starting over is no constant offset
    assert batches_off([(3, 2), (4, None)]) is None  # one stop is no tail at all


def test_shift_of_reads_where_a_tail_starts() -> None:
    assert shift_of(EPOCH0, EPOCH0[2:]) == 2
    assert shift_of(EPOCH0, ()) == len(EPOCH0)
    assert shift_of(EPOCH0, EPOCH1[2:]) is None


def test_an_offset_applied_to_the_next_epoch_is_named() -> None:
    assert offset_every_epoch(EPOCH1, EPOCH1[3:]) == 3
    assert offset_every_epoch(EPOCH1, EPOCH1[2:] + EPOCH1[:2]) == 2  # wrapped round
    assert offset_every_epoch(EPOCH1, EPOCH1) is None
    cause = next_epoch_cause(_rank(), Stop(0, 3), EPOCH1[3:])
    assert cause.startswith("offset applied every epoch") and "3 batches" in cause


def test_the_epoch_seed_lost_on_rebuild_is_named_for_the_next_epoch() -> None:
    assert next_epoch_cause(_rank(), Stop(0, 3), EPOCH0).startswith("epoch seed lost on rebuild")


def test_a_stop_in_epoch_1_that_follows_epoch_0s_order_is_the_seed_lost() -> None:
    rank = _rank(resumed=(StopResult(Stop(1, 2), rest=EPOCH0[2:]),))
    verdict, _ = judge_resume(1, [rank])
    assert verdict.failed and "epoch seed lost on rebuild" in verdict.cause


def test_judge_resume_names_off_by_one_batch_not_starting_over() -> None:
    resumed = (
        StopResult(Stop(0, 1), rest=EPOCH0, next_epoch=None),  # one early = the epoch's start
        StopResult(Stop(0, 3), rest=EPOCH0[2:], next_epoch=EPOCH1),
    )
    verdict, rows = judge_resume(1, [_rank(resumed=resumed)])
    assert verdict.failed and verdict.cause.startswith("off by 1 batch:") and "early" in verdict.cause
    assert [r.outcome for r in rows] == ["failed", "failed"]


def test_a_second_restore_that_repeats_the_first_run_is_stale_state() -> None:
    stop = Stop(0, 2)
    first = EPOCH0[2:3]
    second = StopResult(Stop(0, 3), rest=EPOCH0[2:], next_epoch=EPOCH1)  # restarts where the 1st did
    damage = chain_damage(_rank(), ChainResult(stop, 1, first, second))
    assert damage.stale and damage.repeated == 2 and not damage.ok
    assert chain_cause([(1, damage)], workers=0) == STALE_STATE


def test_a_checkpoint_within_num_workers_after_a_restore_is_incomplete_state() -> None:
    bad = ChainDamage(repeated=2, differs=1, stale=True)
    assert chain_cause([(1, bad), (3, ChainDamage())], workers=2) == INCOMPLETE_STATE
    assert chain_cause([(1, bad), (3, bad)], workers=2) == STALE_STATE  # past the window too: stale


def test_a_second_restore_that_skips_the_first_restores_fast_forward_again_is_named() -> None:
    """Issue 36 item 10: torchdata's naive fast-forward counts the skipped batches as yielded. Restored
    after 2 of 6 batches and run 1 more, the state says 5: the second restore starts at batch 6, or,
    restored after 3 and run 1 more (7 of 6), finds nothing at all."""
    exact = StopResult(Stop(0, 2), EPOCH0[2:])
    short = ChainResult(Stop(0, 2), 1, EPOCH0[2:3], StopResult(Stop(0, 3), EPOCH0[5:], EPOCH1))
    verdict, rows = judge_resume(1, [_rank(resumed=(exact,), chains=(short,))])
    assert verdict.failed and verdict.cause.startswith("skipped batches counted again")
    assert "the state saved then says 5 batches yielded, not 3" in verdict.cause
    assert (
        "torchdata's StatefulDataLoader" in verdict.cause and "state_dict()/load_state_dict()" in verdict.fix
    )
    assert "resumes at batch 6 instead of batch 4: 4 samples lost" in verdict.detail and rows[-1].skipped == 4
    error = "restoring failed: StopIteration before the first batch (the restored state points past the end)"
    past = ChainResult(Stop(0, 3), 1, EPOCH0[3:4], error=error)
    verdict, _ = judge_resume(1, [_rank(resumed=(exact,), chains=(past,))])
    assert "past the end of the epoch (6 batches): StopIteration" in verdict.cause
    assert "fast-forwards 7 batches of 6 and yields nothing: 4 samples lost" in verdict.detail
    # the neighbours it must not name: a first run that left the stream, a second restore elsewhere
    wrong_first = ChainResult(Stop(0, 2), 1, EPOCH0[4:5], StopResult(Stop(0, 3), EPOCH0[5:], EPOCH1))
    assert "counted again" not in judge_resume(1, [_rank(resumed=(exact,), chains=(wrong_first,))])[0].cause
    stale = ChainResult(Stop(0, 2), 1, EPOCH0[2:3], StopResult(Stop(0, 3), EPOCH0[2:], EPOCH1))
    assert judge_resume(1, [_rank(resumed=(exact,), chains=(stale,))])[0].cause == STALE_STATE


def test_judge_chains_rows_and_verdict() -> None:
    stop = Stop(0, 2)
    good = ChainResult(stop, 1, EPOCH0[2:3], StopResult(Stop(0, 3), EPOCH0[3:], EPOCH1))
    verdict, rows = judge_resume(1, [_rank(resumed=(StopResult(stop, EPOCH0[2:]),), chains=(good,))])
    assert verdict.status == "pass" and "resumed twice exactly" in verdict.detail
    chain_row = rows[-1]
    assert chain_row.topology == "1 -> 1, resumed twice" and chain_row.outcome == "exact"
    assert chain_row.note.startswith("resumed twice: stop at epoch 0 step 2, restore, stop 1 step later")
    stale = ChainResult(stop, 1, EPOCH0[2:3], StopResult(Stop(0, 3), EPOCH0[2:], EPOCH1))
    (judged,) = judge_chains([_rank(chains=(stale,))], 1)
    assert not judged.ok and judged.cause == STALE_STATE and judged.row.repeated == 2
    verdict, _ = judge_resume(1, [_rank(resumed=(StopResult(stop, EPOCH0[2:]),), chains=(stale,))])
    assert verdict.failed and "stale state after restore" in verdict.cause


def test_a_chain_whose_restore_raised_fails_with_its_message() -> None:
    broken = ChainResult(Stop(0, 2), 1, error="restoring failed: KeyError: 'pos'")
    (judged,) = judge_chains([_rank(chains=(broken,))], 1)
    assert not judged.ok and "KeyError" in judged.row.note


def test_chain_lengths_take_one_and_past_the_workers_window_inside_the_epoch() -> None:
    assert chain_lengths(0, 3, 6) == (1,)
    assert chain_lengths(2, 3, 12) == (1, 3)
    assert chain_lengths(2, 3, 6) == (1,)  # step 6 would be the epoch's end
    assert chain_lengths(0, 5, 6) == ()


def test_another_factorys_restart_is_named_by_the_factory() -> None:
    cause = factory_cause("make_valid_loader", "the restored loader starts the epoch over: ...")
    assert cause.startswith("the loader built by make_valid_loader restarts at sample 0 after a restore")


def test_a_base_exception_from_a_restore_is_an_answer_but_an_interrupt_is_not() -> None:
    class CheckpointLike(BaseException):
        pass

    assert answerable(CheckpointLike()) and answerable(ValueError())
    assert not answerable(KeyboardInterrupt()) and not answerable(SystemExit(1))


def test_other_factories_are_read_from_the_source(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "loaders.py"
    path.write_text(
        "def make_loader(): ...\ndef make_valid_loader(): ...\ndef make_eval_loader(): ...\n"
        "def make_loader_workers(): ...\ndef helper_loader(): ...\n"
    )
    assert other_factories(LoaderSpec(str(path))) == ("make_eval_loader", "make_valid_loader")
    assert other_factories(LoaderSpec(str(path), "make_valid_loader")) == ("make_eval_loader",)


# ----------------------------------------------------------------------------- real ranks


def _check(name: str, world_sizes: tuple[int, ...] = (2,), **kw: object) -> CheckResult:
    options = CheckOptions(world_sizes=world_sizes, epochs=2, timeout=120, determinism=False, **kw)  # type: ignore[arg-type]
    return check_loader(str(RESUME_FIXTURES / name), options)


def _verdicts(result: CheckResult, check: str) -> dict[int, object]:
    return {r.world_size: next(v for v in r.verdicts if v.check == check) for r in result.runs}


@pytest.mark.parametrize(
    ("bug", "phrase"),
    [
        ("", ""),
        ("stale", "stale state after restore"),
        ("every_epoch", "offset applied every epoch"),
        ("early", "off by 1 batch:"),
        ("valid_restarts", "the loader built by make_valid_loader restarts at sample 0 after a restore"),
    ],
)
def test_engine_sampler_mechanisms_are_named(bug: str, phrase: str) -> None:
    result = _check("engine_sampler.py", factory_args=(("bug", bug),))
    verdict = _verdicts(result, RESUME)[2]
    assert not any(r.failures for r in result.runs)
    rows = [row for r in result.runs for row in r.resume]
    assert any(row.topology == "2 -> 2, resumed twice" for row in rows)
    assert any(row.topology.endswith("make_valid_loader") for row in rows)
    if not bug:
        assert verdict.status == "pass", verdict.detail  # type: ignore[attr-defined]
    else:
        assert verdict.status == "fail" and phrase in verdict.cause, verdict.cause  # type: ignore[attr-defined]


@pytest.mark.parametrize(("order", "status"), [("load_first", "pass"), ("iter_first", "fail")])
def test_resume_loader_restores_in_the_users_order(order: str, status: str) -> None:
    pytest.importorskip("torchdata")
    result = _check("engine_user_order.py", factory_args=(("order", order),))
    verdict = _verdicts(result, RESUME)[2]
    assert verdict.status == status, verdict.detail  # type: ignore[attr-defined]
    if status == "fail":
        assert "starts the epoch over" in verdict.cause  # type: ignore[attr-defined]


def test_dcp_round_trip_is_exact_and_a_missing_rank_key_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import tempfile

    before = set(__import__("os").listdir(tempfile.gettempdir()))
    result = _check("engine_dcp.py", (1, 2), dcp=True, elastic=True)
    assert not any(r.failures for r in result.runs), [f.message for r in result.runs for f in r.failures]
    assert {ws: v.status for ws, v in _verdicts(result, RESUME).items()} == {1: "pass", 2: "pass"}  # type: ignore[attr-defined]
    grown = [row for r in result.runs for row in r.resume if row.topology == "1 -> 2"]
    assert grown and all(row.outcome == "refused" and "CheckpointException" in row.note for row in grown)
    assert _verdicts(result, ELASTIC_RESUME)[2].status == "pass"  # type: ignore[attr-defined]
    after = set(__import__("os").listdir(tempfile.gettempdir()))
    assert not [name for name in after - before if name.startswith("ddpcheck-dcp-")]  # removed


def test_torchdata_fast_forward_resumed_twice_is_named_with_its_fix() -> None:
    """chain_bug_torchdata_fast_forward.py on real torchdata 0.11 (truth: NOTES.md, truth_chains.jsonl):
    one restore exact, resumed twice the second restore fast-forwards 13 of 12 batches at W=2."""
    options = CheckOptions(world_sizes=(2,), epochs=2, timeout=180, determinism=False)  # type: ignore[arg-type]
    result = check_loader(str(RESUME_FIXTURES / "chain_bug_torchdata_fast_forward.py"), options)
    verdict = next(v for v in result.runs[0].verdicts if v.check == RESUME)
    assert verdict.failed and verdict.cause.startswith("skipped batches counted again")
    assert "says 13 batches yielded, not 7" in verdict.cause and "StopIteration" in verdict.cause
    assert "torchdata's StatefulDataLoader" in verdict.cause and "state_dict()" in verdict.fix
    assert "StopIteration before the first batch (the restored state points" not in verdict.cause
    once = [r for r in result.runs[0].resume if "resumed twice" not in r.topology]
    assert once and {r.outcome for r in once} == {"exact"}
