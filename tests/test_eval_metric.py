"""``metric_equivalence`` on scripts (issue 41), the pure rule: built traces in, a verdict out.

Each bug comes with the neighbour it must not be confused with: padding counted against the same padding
dropped (equal values), a mean of per-rank means against the same split with equal values, a value from
rank 0's shard against rank 0 evaluating the whole set, random draws against none, weights that differ,
printed numbers that change with the world size by design. The scripts themselves, with truth measured
under torchrun, are in tests/test_eval_run.py."""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import replace

import pytest

from ddpcheck.checks.eval_causes import DROPPED, EVERY_RANK, MEAN_OF_MEANS, PADDED, UNEXPLAINED, UNSYNCED
from ddpcheck.checks.eval_metric import (
    NO_EVALUATION,
    NO_VALUES,
    NOT_RECORDED,
    evenly_note,
    judge_metric,
    revealing,
)
from ddpcheck.checks.reported import close, left_alone, read_line, unit_of
from ddpcheck.eval_trace import EvalRecord, EvalRound, ReportedValue
from ddpcheck.evidence import MetricEvidence
from ddpcheck.layout import Layout
from ddpcheck.trace import EpochTrace, LoaderFacts, RankTrace, ScriptLoader, ScriptRankTrace

LOADER = "train.py:40"
WEIGHTS = (1234,)


def printed(line: str, occurrence: int = 0) -> tuple[ReportedValue, ...]:
    """A printed line as the rank side records it."""
    template, numbers = read_line(line)
    return tuple(
        ReportedValue("print", template, n.value, occurrence, i, n.unit, n.shown, n.label)
        for i, n in enumerate(numbers)
    )


def rank(
    r: int,
    world: int,
    ids: Sequence[int] | None,
    values: Sequence[ReportedValue] = (),
    *,
    collectives: tuple[tuple[str, int], ...] = (("all_reduce", 1),),
    weights: tuple[int, ...] = WEIGHTS,
    drew: tuple[str, ...] = (),
    batch: int = 4,
    facts: LoaderFacts | None = None,
    outside: tuple[str, ...] = (),
) -> ScriptRankTrace:
    """One rank that evaluated ``ids`` (None: it never iterated the eval loader) and reported ``values``."""
    loaders: tuple[ScriptLoader, ...] = ()
    epochs: tuple[tuple[str, int], ...] = ()
    if ids is not None:
        sizes = [min(batch, len(ids) - i) for i in range(0, len(ids), batch)]
        epoch = EpochTrace(0, array("q", ids), array("q", sizes), len(sizes))
        trace = RankTrace(r, (epoch,), facts or LoaderFacts(sampler="DistributedSampler"))
        loaders = (ScriptLoader(LOADER, trace),)
        epochs = ((LOADER, 0),)
    held = "saved" if world == 1 else "loaded"
    evaluation = EvalRound(0, epochs, True, held, weights, False, drew, collectives, tuple(values))
    record = EvalRecord((evaluation,) if ids is not None or values else (), outside, ("torch",), 1)
    return ScriptRankTrace(r, world, loaders, evaluation=record)


def single(values: Sequence[ReportedValue], n: int = 21, **kw: object) -> dict[int, ScriptRankTrace]:
    return {0: rank(0, 1, list(range(n)), values, collectives=(), **kw)}  # type: ignore[arg-type]


def padded(n: int, world: int) -> list[list[int]]:
    """DistributedSampler(shuffle=False): rank r takes r, r + W, ... of the set padded by its first ids."""
    total = -(-n // world) * world
    order = [*range(n), *range(total - n)]
    return [order[r::world] for r in range(world)]


def strided(n: int, world: int) -> list[list[int]]:
    return [list(range(r, n, world)) for r in range(world)]


def judged(reference: dict[int, ScriptRankTrace], run: dict[int, ScriptRankTrace], world: int):  # type: ignore[no-untyped-def]
    found = judge_metric(reference, run, Layout.plain(world))
    return found.verdict


# --- the rule -----------------------------------------------------------------------------------------


def test_padding_copies_counted_fail_naming_the_copies_and_the_fix() -> None:
    reference = single(printed("epoch 0: val_acc 0.476190 val_loss 1.057498"))
    shares = padded(21, 4)
    run = {
        r: rank(r, 4, s, printed("epoch 0: val_acc 0.500000 val_loss 1.044744") if r == 0 else ())
        for r, s in enumerate(shares)
    }
    verdict = judged(reference, run, 4)
    assert verdict.status == "fail"
    assert verdict.cause.startswith(PADDED)
    assert "repeats 3 samples at ws=4 (DistributedSampler pads 21 to 24)" in verdict.cause
    assert "0.5 vs 0.47619 at one process" in verdict.cause
    assert "plain torch:" in verdict.fix
    evidence = verdict.evidence
    assert isinstance(evidence, MetricEvidence)
    assert (evidence.copies, evidence.dropped, evidence.set_size, evidence.shards) == (3, 0, 21, (6, 6, 6, 6))
    assert [v.equal for v in evidence.values] == [False, False]  # the epoch number is left alone


def test_the_same_padding_with_the_copies_dropped_passes() -> None:
    line = "epoch 0: val_acc 0.476190 val_loss 1.057498"
    shares = padded(21, 4)
    run = {r: rank(r, 4, s, printed(line) if r == 0 else ()) for r, s in enumerate(shares)}
    verdict = judged(single(printed(line)), run, 4)
    assert verdict.status == "pass", verdict.detail
    assert "2 values equal to the single process's after the 1st evaluation" in verdict.detail
    assert "loaded on every rank" in verdict.detail


def test_mean_of_means_over_unequal_shards_fails_naming_the_sizes() -> None:
    reference = single(printed("val acc 0.476190"))
    run = {
        r: rank(r, 2, s, printed("val acc 0.481818") if r == 0 else ()) for r, s in enumerate(strided(21, 2))
    }
    verdict = judged(reference, run, 2)
    assert verdict.status == "fail" and verdict.cause.startswith(MEAN_OF_MEANS)
    assert "the ranks evaluated 11 and 10 samples" in verdict.cause


def test_a_value_one_rank_reports_differently_is_unsynchronised_even_with_collectives() -> None:
    reference = single((ReportedValue("torchmetrics", "MulticlassAccuracy", 0.47619),))
    run = {
        r: rank(r, 2, s, (ReportedValue("torchmetrics", "MulticlassAccuracy", acc),))
        for r, (s, acc) in enumerate(zip(strided(21, 2), (0.545454, 0.4), strict=True))
    }
    verdict = judged(reference, run, 2)
    assert verdict.status == "fail" and verdict.cause.startswith(UNSYNCED)
    assert "rank 0 0.545454, rank 1 0.4" in verdict.cause
    assert "torchmetrics:" in verdict.fix or "plain torch:" in verdict.fix


def test_no_collective_while_rank_0_saw_a_part_is_unsynchronised() -> None:
    reference = single(printed("val acc 0.476190"))
    shares = padded(21, 2)
    run = {
        r: rank(r, 2, s, printed("val acc 0.545455") if r == 0 else (), collectives=())
        for r, s in enumerate(shares)
    }
    verdict = judged(reference, run, 2)
    assert verdict.status == "fail" and verdict.cause.startswith(UNSYNCED)
    assert "rank 0 evaluated 11 of 21 samples" in verdict.cause


def test_rank_0_evaluating_the_whole_set_without_collectives_passes() -> None:
    line = "val acc 0.476190"
    run = {0: rank(0, 2, list(range(21)), printed(line), collectives=()), 1: rank(1, 2, None)}
    verdict = judged(single(printed(line)), run, 2)
    assert verdict.status == "pass", verdict.detail
    assert isinstance(verdict.evidence, MetricEvidence) and verdict.evidence.shards == (21, 0)


def test_samples_dropped_by_drop_last_fail_naming_them() -> None:
    reference = single(printed("val acc 0.476190"))
    shares = [s[:5] for s in strided(21, 4)]  # DistributedSampler(drop_last=True): 20 of 21
    facts = LoaderFacts(sampler="DistributedSampler", padding=False)
    run = {
        r: rank(r, 4, s, printed("val acc 0.500000") if r == 0 else (), facts=facts)
        for r, s in enumerate(shares)
    }
    verdict = judged(reference, run, 4)
    assert verdict.status == "fail" and verdict.cause.startswith(DROPPED)
    assert "1 sample of 21 never evaluated at ws=4" in verdict.cause


def test_every_rank_evaluating_everything_and_adding_counts_is_named() -> None:
    reference = single(printed("val acc 0.476190"))
    run = {r: rank(r, 2, list(range(21)), printed("val acc 0.952381") if r == 0 else ()) for r in range(2)}
    verdict = judged(reference, run, 2)
    assert verdict.status == "fail" and verdict.cause.startswith(EVERY_RANK)


def test_random_draws_make_a_difference_not_applicable_and_named() -> None:
    reference = single(printed("val acc 0.476190"), drew=("torch",))
    run = {
        r: rank(r, 2, s, printed("val acc 0.428571") if r == 0 else (), drew=("torch",))
        for r, s in enumerate(strided(21, 2))
    }
    verdict = judged(reference, run, 2)
    assert verdict.status == "n/a"
    assert "drew random numbers" in verdict.detail and "torch global stream" in verdict.detail


def test_random_draws_do_not_hide_equal_values() -> None:
    line = "val acc 0.476190"
    run = {
        r: rank(r, 2, s, printed(line) if r == 0 else (), drew=("torch",))
        for r, s in enumerate(strided(21, 2))
    }
    assert judged(single(printed(line), drew=("torch",)), run, 2).status == "pass"


def test_other_weights_are_never_compared() -> None:
    reference = single(printed("val acc 0.476190"))
    run = {
        r: rank(r, 2, s, printed("val acc 0.9") if r == 0 else (), weights=(999,))
        for r, s in enumerate(strided(21, 2))
    }
    verdict = judged(reference, run, 2)
    assert verdict.status == "n/a" and "other weights than the single process's" in verdict.detail


def test_values_that_change_with_the_world_size_by_design_are_left_alone() -> None:
    reference = single(
        printed("epoch 0 took 3.2s, 8 steps, lr 0.1, train_loss 0.91, rank 0 of 1: val_acc 0.476190")
    )
    line = "epoch 0 took 1.9s, 4 steps, lr 0.2, train_loss 0.87, rank 0 of 2: val_acc 0.476190"
    run = {r: rank(r, 2, s, printed(line) if r == 0 else ()) for r, s in enumerate(strided(21, 2))}
    verdict = judged(reference, run, 2)
    assert verdict.status == "pass", verdict.detail
    assert isinstance(verdict.evidence, MetricEvidence)
    assert [v.name.split(" (")[0] for v in verdict.evidence.values] == ["val acc"]


def test_keys_that_change_by_design_and_templates_printed_in_training_are_left_alone() -> None:
    keyed = {"eval_loss": 0.5, "eval_runtime": 1.0, "eval_samples_per_second": 21.0, "epoch": 1.0}
    ws2 = {"eval_loss": 0.5, "eval_runtime": 0.6, "eval_samples_per_second": 35.0, "epoch": 2.0}
    outside = ("step {} loss {}",)
    reference = single(
        (*(ReportedValue("trainer", k, v) for k, v in keyed.items()), *printed("step 8 loss 0.71")),
        outside=outside,
    )
    run = {
        r: rank(
            r,
            2,
            s,
            (*(ReportedValue("trainer", k, v) for k, v in ws2.items()), *printed("step 4 loss 0.69"))
            if r == 0
            else (),
            outside=outside,
        )
        for r, s in enumerate(strided(21, 2))
    }
    verdict = judged(reference, run, 2)
    assert verdict.status == "pass", verdict.detail
    assert isinstance(verdict.evidence, MetricEvidence)
    assert [v.name for v in verdict.evidence.values] == ["eval_loss (trainer)"]


def test_nan_equals_nan_and_one_nan_is_a_difference() -> None:
    nan = ReportedValue("lightning", "val_loss", math.nan)
    run = {r: rank(r, 2, s, (nan,) if r == 0 else ()) for r, s in enumerate(strided(21, 2))}
    assert judged(single((nan,)), run, 2).status == "pass"
    finite = single((ReportedValue("lightning", "val_loss", 1.05),))
    verdict = judged(finite, run, 2)
    assert verdict.status == "fail" and "NaN at ws=2 vs 1.05 at one process" in verdict.detail


def test_a_number_labelled_with_no_metric_beside_the_metric_is_not_compared() -> None:
    """A training loss printed in the evaluation's line, over unequal shards (a mechanism that would explain
    a difference): not compared, so no false alarm; the metric beside it is."""
    reference = single(printed("epoch 0: loss 0.912 val_acc 0.476190"))
    line = "epoch 0: loss 0.871 val_acc 0.476190"
    run = {r: rank(r, 2, s, printed(line) if r == 0 else ()) for r, s in enumerate(strided(21, 2))}
    verdict = judged(reference, run, 2)
    assert verdict.status == "pass", verdict.detail
    assert isinstance(verdict.evidence, MetricEvidence)
    assert [v.name.split(" (")[0] for v in verdict.evidence.values] == ["val acc"]
    led = single(printed("val epoch 0: acc 0.476190, loss 0.912"))  # a line led by "val": every number
    run = {
        r: rank(r, 2, s, printed("val epoch 0: acc 0.476190, loss 0.871") if r == 0 else ())
        for r, s in enumerate(strided(21, 2))
    }
    assert judged(led, run, 2).status == "fail"


def test_a_printed_metric_that_differs_with_no_mechanism_fails_saying_the_cause_is_unknown() -> None:
    """Equal weights, every sample once, even shards and batches, the ranks combined: no mechanism is known,
    yet the printed metric moved (a sum all-reduced but divided by the rank's own count: twice the value).
    A divergence all the same: it fails, saying what was compared and what the recording rules out."""
    reference = single(printed("epoch 0: val_acc 0.500000 val_loss 1.052590"), n=20, batch=5)
    run = {
        r: rank(r, 2, s, printed("epoch 0: val_acc 1.000000 val_loss 2.105180") if r == 0 else (), batch=5)
        for r, s in enumerate(strided(20, 2))
    }
    verdict = judged(reference, run, 2)
    assert verdict.status == "fail", verdict.detail
    assert verdict.cause.startswith(UNEXPLAINED), verdict.cause
    assert "every sample of 20 evaluated once (shards of 10 and 10)" in verdict.cause
    assert "the ranks combined their results" in verdict.cause
    assert "val acc (printed" in verdict.detail and "1 at ws=2 vs 0.5 at one process" in verdict.detail
    assert "the 1st evaluation" in verdict.detail and "loaded on every rank" in verdict.detail
    assert "divided by this rank's own count" in verdict.fix
    equal = single(printed("epoch 0: val_acc 0.500000 val_loss 1.052590"), n=20, batch=5)
    same = {
        r: rank(r, 2, s, printed("epoch 0: val_acc 0.500000 val_loss 1.052590") if r == 0 else (), batch=5)
        for r, s in enumerate(strided(20, 2))
    }
    assert judged(equal, same, 2).status == "pass"  # the neighbour: the count all-reduced too
    keyed = single((ReportedValue("torchmetrics", "MulticlassAccuracy", 0.476190),), n=20, batch=5)
    value = (ReportedValue("torchmetrics", "MulticlassAccuracy", 0.5),)
    run = {r: rank(r, 2, s, value, batch=5) for r, s in enumerate(strided(20, 2))}
    verdict = judged(keyed, run, 2)  # a metric object's value: the same
    assert verdict.status == "fail" and verdict.cause.startswith(UNEXPLAINED)


def test_a_value_no_mean_of_means_can_reach_is_not_named_one() -> None:
    """Over shards of 11 and 10 (batches of 4, 4, 3 and 4, 4, 2) a mean of means moves a positive mean by
    21/22 to 21/20, a mean of batch means by 0.875 to 1.75: twice the truth (a sum divided by the rank's
    own count) is neither, so the cause is not identified; a mean of means printed with 2 decimals, within
    that precision, is still named."""
    reference = single(printed("val acc 0.476190"))
    run = {
        r: rank(r, 2, s, printed("val acc 0.952381") if r == 0 else ()) for r, s in enumerate(strided(21, 2))
    }
    verdict = judged(reference, run, 2)
    assert verdict.status == "fail" and verdict.cause.startswith(UNEXPLAINED), verdict.cause
    assert "nor a mean of means over unequal shards or batches (none moves a mean 2-fold)" in verdict.cause
    coarse = single(printed("val acc 0.48"))
    run = {r: rank(r, 2, s, printed("val acc 0.51") if r == 0 else ()) for r, s in enumerate(strided(21, 2))}
    verdict = judged(coarse, run, 2)  # 0.51 / 0.48 = 1.0625, but 0.505 / 0.485 = 1.041 is within 21/20
    assert verdict.status == "fail" and verdict.cause.startswith(MEAN_OF_MEANS), verdict.cause


def test_printed_precision_is_one_unit_in_the_last_digit() -> None:
    run = {
        r: rank(r, 2, s, printed("val acc 0.4763") if r == 0 else ()) for r, s in enumerate(strided(21, 2))
    }
    assert judged(single(printed("val acc 0.4762")), run, 2).status == "pass"
    assert judged(single(printed("val acc 0.4760")), run, 2).status == "fail"


def test_no_evaluation_and_no_record_are_not_applicable() -> None:
    run = {r: rank(r, 2, None) for r in range(2)}
    assert judged({0: rank(0, 1, None)}, run, 2).detail == NO_EVALUATION
    bare = {0: ScriptRankTrace(0, 1, ())}
    assert judged(bare, run, 2).detail == NOT_RECORDED
    silent = single(printed("took 3.2s, 21 samples"))  # nothing that names a metric
    assert judged(silent, {r: rank(r, 2, s) for r, s in enumerate(strided(21, 2))}, 2).detail == NO_VALUES
    stopped = {0: replace(rank(0, 1, None), stopped=True)}
    assert judged(stopped, run, 2).detail.startswith(NO_EVALUATION + " before ddpcheck stopped it")


def test_one_process_is_the_reference() -> None:
    reference = single(printed("val acc 0.476190"))
    verdict = judged(reference, reference, 1)
    assert verdict.status == "n/a" and "the reference (1 value reported" in verdict.detail


def test_a_split_that_divides_says_it_proves_nothing_about_padding() -> None:
    line = "val acc 0.5"
    run = {r: rank(r, 2, s, printed(line) if r == 0 else ()) for r, s in enumerate(strided(20, 2))}
    verdict = judged(single(printed(line), n=20), run, 2)
    assert verdict.status == "pass"
    assert (
        "20 samples split evenly over 2 ranks" in verdict.detail
        and "world size 3 would show them" in verdict.detail
    )
    assert isinstance(verdict.evidence, MetricEvidence)
    note = evenly_note([(2, verdict.evidence), (4, verdict.evidence)])
    assert "splits evenly at every world size compared (2, 4)" in note and "--world-sizes 1,3" in note
    assert evenly_note([(2, verdict.evidence), (3, verdict.evidence)]) == ""
    assert revealing(1000) == 3 and revealing(21) == 2


# --- reading printed numbers ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "template", "kept"),
    [
        ("epoch 3: val acc 0.8125, loss 0.4410", "epoch {}: val acc {}, loss {}", ["0.8125", "0.4410"]),
        ("took 12.3s acc 81.3%", "took {}s acc {}%", ["81.3"]),
        (
            "{'eval_loss': 0.693, 'eval_runtime': 0.1, 'epoch': 1.0}",
            "{'eval_loss': {}, 'eval_runtime': {}, 'epoch': {}}",
            ["0.693"],
        ),
        ("[10:23:11] rank 0: f1 0.5 at 0x7ffe", "[<>] rank {}: f1 {} at <>", ["0.5"]),
        ("2026-05-01 val 0.5 (12 samples, 3 it/s)", "<> val {} ({} samples, {} it/s)", ["0.5"]),
        ("correct 16/21, rank 0 of 2", "correct {}/{}, rank {} of {}", ["16"]),
        ("loss nan acc -1.5e-03", "loss {} acc {}", ["nan", "-1.5e-03"]),
    ],
)
def test_a_printed_line_reads_as_its_template_and_numbers(line: str, template: str, kept: list[str]) -> None:
    found, numbers = read_line(line)
    assert found == template
    assert [n.shown for n in numbers if not left_alone(n.label.replace("|", " "))] == kept


def test_units_and_closeness() -> None:
    assert (unit_of("0.8125"), unit_of("1.5e-03"), unit_of("812"), unit_of("nan")) == (1e-4, 1e-4, 1.0, 0.0)
    assert close(math.nan, math.nan, rel=1e-5, absolute=1e-8)
    assert not close(math.nan, 0.5, rel=1e-5, absolute=1e-8)
    assert close(1.0, 1.0 + 5e-6, rel=1e-5, absolute=1e-8) and not close(1.0, 1.0001, rel=1e-5, absolute=1e-8)
    assert close(math.inf, math.inf, rel=1e-5, absolute=1e-8) and not close(
        math.inf, 1e308, rel=1e-5, absolute=1e-8
    )
