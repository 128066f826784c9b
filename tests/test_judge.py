"""The one judge (``ddpcheck/checks/judge.py``): every kind of launch is judged through one function, the
rewrites apply in one written order, and ``--allow`` once, last. Pure: synthetic traces, no processes."""

from __future__ import annotations

from dataclasses import replace

from ddpcheck.checks.diagnose import IGNORES_RANK
from ddpcheck.checks.diagnose import SAME_STREAM as SAME_STREAM_CAUSE
from ddpcheck.checks.eval_causes import PADDED
from ddpcheck.checks.fingerprint import EpochCheck
from ddpcheck.checks.judge import (
    LAUNCH_CHECKS,
    LOADER_CHECKS,
    REWRITES,
    Evaluations,
    Judged,
    Launch,
    LoaderRecord,
    Rules,
    ScriptFacts,
    judge,
    judge_finished,
)
from ddpcheck.checks.scripts import ALONE
from ddpcheck.checks.step_judge import StepRecord
from ddpcheck.layout import Layout
from ddpcheck.verdict import (
    ALL_CHECKS,
    COVERAGE,
    DATA_CHECKS,
    DETERMINISM,
    EQUAL_MICROSTEPS,
    METRIC_EQUIVALENCE,
    NO_OVERLAP,
    RNG_INDEPENDENCE,
    STEP_EQUIVALENCE,
    TRAINING_EQUIVALENCE,
    Verdict,
    failed,
)
from tests.test_eval_metric import LOADER, padded, printed, rank, single
from tests.trace_builders import ddp_run, permutations, reference, run

ORDERS = permutations(24, 2, seed=3)
SINGLE = reference(ORDERS, padding=True, has_set_epoch=True)
GOOD = ddp_run(ORDERS, 2)
SAME_STREAM = run([ORDERS, ORDERS], padding=False, has_set_epoch=True)  # every rank sees every sample
TWO = Layout.plain(2)


def _one(judged: tuple[Judged, ...], check: str) -> Verdict:
    (loader,) = judged
    found = [v for v in loader.verdicts if v.check == check]
    assert len(found) == 1, [v.check for v in loader.verdicts]
    return found[0]


def test_the_rewrites_apply_in_the_one_written_order() -> None:
    names = [r.__name__ for r in REWRITES]
    assert names == [
        "no_rerun", "max_idle", "script_words", "framework_sample", "ranks_alone", "mesh_told", "loader_line",
        "script_text",
    ]  # fmt: skip
    assert len(LOADER_CHECKS) >= 1 and len(LAUNCH_CHECKS) >= 1  # where new checks plug in


def test_a_loader_files_layout_gets_every_data_check_once() -> None:
    judged = judge(Launch(TWO, (LoaderRecord("", SINGLE, GOOD),)), Rules())
    (loader,) = judged
    checks = [v.check for v in loader.verdicts]
    assert sorted(checks) == sorted({*DATA_CHECKS, "replica_consistency"})
    assert not any(v.failed for v in loader.verdicts), [
        (v.check, v.detail) for v in loader.verdicts if v.failed
    ]
    assert loader.reference is SINGLE and loader.run is GOOD  # what the session draws its pictures from


def test_allow_turns_a_failure_allowed_once_and_leaves_the_others_failing() -> None:
    launch = Launch(TWO, (LoaderRecord("", SINGLE, SAME_STREAM),))
    plain = judge(launch, Rules())
    assert _one(plain, NO_OVERLAP).failed and IGNORES_RANK in _one(plain, NO_OVERLAP).cause
    allowed = judge(launch, Rules(allow=(NO_OVERLAP,)))
    assert _one(allowed, NO_OVERLAP).status == "allowed"
    assert _one(allowed, NO_OVERLAP).detail == _one(plain, NO_OVERLAP).detail  # the failure text stays
    assert _one(allowed, COVERAGE).status == _one(plain, COVERAGE).status


def test_the_verdicts_of_checks_with_their_own_runs_are_allowed_too() -> None:
    extra = (failed(TRAINING_EQUIVALENCE, "weights part at step 1"),)
    launch = Launch(TWO, (LoaderRecord("", SINGLE, GOOD),), extra=extra)
    assert _one(judge(launch, Rules()), TRAINING_EQUIVALENCE).failed
    assert _one(judge(launch, Rules(allow=(TRAINING_EQUIVALENCE,))), TRAINING_EQUIVALENCE).status == "allowed"
    assert judge_finished(extra, Rules(allow=(TRAINING_EQUIVALENCE,)))[0].status == "allowed"
    assert judge_finished(extra, Rules())[0].failed


def test_a_launch_that_runs_once_says_why_determinism_is_not_judged() -> None:
    record = (LoaderRecord("", SINGLE, GOOD),)
    said = _one(judge(Launch(TWO, record), Rules()), DETERMINISM)
    assert said.status == "skip" and "no second run" in said.detail
    once = _one(judge(Launch(TWO, record, once="a joined launch runs once"), Rules()), DETERMINISM)
    assert (once.status, once.detail) == ("skip", "a joined launch runs once")
    rerun = (LoaderRecord("", SINGLE, GOOD, GOOD),)  # a rerun recorded: judged, whatever ``once`` says
    assert _one(judge(Launch(TWO, rerun, once="runs once"), Rules()), DETERMINISM).status == "pass"


def test_ranks_alone_are_named_in_a_script_and_not_in_a_loader_file() -> None:
    record = (LoaderRecord("train.py:9", SINGLE, SAME_STREAM),)
    loader_file = _one(judge(Launch(TWO, record), Rules()), NO_OVERLAP)
    assert loader_file.cause == SAME_STREAM_CAUSE
    grouped = _one(judge(Launch(TWO, record, script=ScriptFacts(joined=True)), Rules()), NO_OVERLAP)
    assert grouped.cause == SAME_STREAM_CAUSE  # ranks in a group that ignore it: the sampler's bug
    alone = _one(judge(Launch(TWO, record, script=ScriptFacts(joined=False)), Rules()), NO_OVERLAP)
    assert alone.cause == ALONE


def test_a_loader_absent_at_a_layout_is_said_so_and_a_missing_reference_is_stood_in_for() -> None:
    absent = judge(Launch(TWO, (LoaderRecord("eval.py:3", absent="ranks 1 never iterate it"),)), Rules())
    assert [(v.check, v.status, v.detail) for v in absent[0].verdicts] == [
        (COVERAGE, "n/a", "ranks 1 never iterate it")
    ]
    launch = Launch(TWO, (LoaderRecord("train.py:9", None, GOOD),), script=ScriptFacts())
    coverage = _one(judge(launch, Rules()), COVERAGE)
    assert (
        coverage.status == "skip" and "the single-process run did not iterate this loader" in coverage.detail
    )
    assert _one(judge(launch, Rules()), NO_OVERLAP).status == "pass"  # judged against the ranks' union


def test_the_step_checks_land_on_the_loader_they_concern() -> None:
    step = StepRecord(steps=(None, None))  # recorded, no backward ran
    records = (LoaderRecord("a.py:1", SINGLE, GOOD), LoaderRecord("b.py:2", SINGLE, GOOD))
    judged = judge(Launch(TWO, records, step=step, script=ScriptFacts()), Rules())
    first, second = ([v.check for v in j.verdicts] for j in judged)
    assert first.count(RNG_INDEPENDENCE) == 1 and STEP_EQUIVALENCE in first and EQUAL_MICROSTEPS in first
    assert STEP_EQUIVALENCE not in second  # no batch reached backward: the first loader holds them


def test_the_scripts_evaluation_is_judged_here_and_lands_on_its_eval_loader() -> None:
    """metric_equivalence is a launch check: judged from the launch's evaluations (the session gathers
    them), said of the eval loader (not the first), through --allow; n/a against a stand-in reference;
    absent where the evaluations are not judged (--no-metrics)."""
    line = "epoch 0: val_acc {} val_loss 1.0"
    evaluations = Evaluations(
        single(printed(line.format("0.476190"))),
        {
            r: rank(r, 2, s, printed(line.format("0.500000")) if r == 0 else ())
            for r, s in enumerate(padded(21, 2))
        },
    )
    records = (LoaderRecord("train.py:9", SINGLE, GOOD), LoaderRecord(LOADER, SINGLE, GOOD))
    launch = Launch(TWO, records, script=ScriptFacts(), evaluations=evaluations)
    train, evaluation = judge(launch, Rules())
    assert METRIC_EQUIVALENCE not in [v.check for v in train.verdicts]
    (said,) = [v for v in evaluation.verdicts if v.check == METRIC_EQUIVALENCE]
    assert said.status == "fail" and said.cause.startswith(PADDED), said.cause
    allowed = judge(launch, Rules(allow=(METRIC_EQUIVALENCE,)))[1]
    assert [v.status for v in allowed.verdicts if v.check == METRIC_EQUIVALENCE] == ["allowed"]
    standin = judge(replace(launch, standin="no --reference given"), Rules())[1]
    (na,) = [v for v in standin.verdicts if v.check == METRIC_EQUIVALENCE]
    assert na.status == "n/a" and "needs the single process's evaluation: no --reference given" in na.detail
    off = judge(replace(launch, evaluations=None), Rules())
    assert not [v for j in off for v in j.verdicts if v.check == METRIC_EQUIVALENCE]


def test_a_fingerprint_launch_is_judged_through_the_same_judge() -> None:
    copied = EpochCheck("train.py:5", 0, ids=12, dataset=10, buckets_differing=2, extra=2, status="fail",
                        twice=[(3, [0, 1])])  # fmt: skip
    record = (LoaderRecord("train.py:5", fingerprints=(copied,)),)
    (loader,) = judge(Launch(TWO, record), Rules())
    statuses = {v.check: v.status for v in loader.verdicts}
    assert statuses[NO_OVERLAP] == "fail" and statuses[DETERMINISM] == "n/a"
    assert set(statuses) == set(ALL_CHECKS[: len(DATA_CHECKS) + 1])
    (allowed,) = judge(Launch(TWO, record), Rules(allow=(NO_OVERLAP,)))
    assert {v.check: v.status for v in allowed.verdicts}[NO_OVERLAP] == "allowed"
    assert replace(copied, status="pass").status == "pass"


def test_why_a_check_with_its_own_launch_is_not_judged_is_decided_in_the_checks() -> None:
    """The scenarios ask these and launch nothing when they answer; each answers None when the check
    is launched (the neighbour a wrong rule would skip)."""
    from ddpcheck.checks.metric import metric_unjudged
    from ddpcheck.checks.resume import resume_unjudged
    from ddpcheck.checks.resume_elastic import workers_unjudged
    from ddpcheck.checks.training import training_unjudged
    from ddpcheck.verdict import ELASTIC_RESUME, METRIC_EQUIVALENCE, NOT_APPLICABLE, RESUME, SKIP

    assert training_unjudged() is None and metric_unjudged() is None
    assert training_unjudged(simulate=True).status == SKIP  # type: ignore[union-attr]
    assert training_unjudged(skip="no optimizer step").detail == "no optimizer step"  # type: ignore[union-attr]
    assert metric_unjudged(reference_failed=True).check == METRIC_EQUIVALENCE  # type: ignore[union-attr]
    assert resume_unjudged("state_dict") is None
    assert resume_unjudged("").status == NOT_APPLICABLE  # type: ignore[union-attr]
    assert resume_unjudged("state_dict", window=True).check == RESUME  # type: ignore[union-attr]
    assert resume_unjudged("state_dict", simulate=True).status == SKIP  # type: ignore[union-attr]
    assert workers_unjudged(True, "make_loader") is None
    elastic = workers_unjudged(False, "make_loader")
    assert elastic is not None and elastic.check == ELASTIC_RESUME and "make_loader()" in elastic.detail
