"""work_balance, packing and token-weighted losses: real token loaders (fixtures/tokens/) and the pure parts.

Each fixture's truth was measured without ddpcheck (fixtures/tokens/truth.py, NOTES.md): idle fractions
against random batching of the same documents, packing facts, token coverage, loss normalisation. The
statistic's calibration is tested on random batching of variable-length data, which must pass, and
on the bug patterns it exists for, which must fail.
"""

from __future__ import annotations

import functools
import importlib.util
import random
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from ddpcheck.checker.work import measure_batch, pack_facts, pad_token_of
from ddpcheck.checks.training import LOCAL_NORMALISATION
from ddpcheck.checks.work import (
    BUCKETS_PER_RANK,
    PACKED_PER_RANK,
    PADDING_UNKNOWN,
    POSITIONS_NOT_RESET,
    SORTED_SHARDS,
    UNDECLARED_CUT,
    check_work_balance,
    idle_fraction,
    with_max_idle,
)
from ddpcheck.options import CheckOptions
from ddpcheck.result import CheckResult
from ddpcheck.session import check_loader
from ddpcheck.trace import PADDED_WIDTH, EpochTrace, LoaderFacts, RankTrace, RunTrace
from ddpcheck.verdict import (
    COVERAGE,
    EQUAL_STEPS,
    PACKING,
    TRAINING_EQUIVALENCE,
    WORK_BALANCE,
)
from tests.conftest import FIXTURES

TOKENS = FIXTURES / "tokens"


@dataclass(frozen=True)
class Case:
    fixture: str
    world_sizes: tuple[int, ...] = (1, 2, 4)
    needs: str = "torch"
    fail: dict[int, frozenset[str]] = field(default_factory=dict)  # world size -> checks that fail
    must_pass: frozenset[str] = frozenset()  # at every world size (n/a at 1 rank for work_balance)
    cause: str = ""
    args: dict[str, object] = field(default_factory=dict)
    skipped: frozenset[str] = frozenset()  # could not be judged at every world size above 1


CASES = [
    Case("plain_random_varlen.py", must_pass=frozenset({WORK_BALANCE, EQUAL_STEPS, COVERAGE})),
    Case(
        "bug_sorted_contiguous.py",
        fail={2: frozenset({WORK_BALANCE}), 4: frozenset({WORK_BALANCE})},
        cause=SORTED_SHARDS,
    ),
    Case(
        "bug_buckets_per_rank.py",
        fail={2: frozenset({WORK_BALANCE}), 4: frozenset({WORK_BALANCE})},
        must_pass=frozenset({COVERAGE, EQUAL_STEPS}),
        cause=BUCKETS_PER_RANK,
    ),
    Case(
        "bug_token_budget_per_rank.py",  # the fault is the step count: equal_steps, not chance work
        fail={2: frozenset({EQUAL_STEPS}), 4: frozenset({EQUAL_STEPS})},
        must_pass=frozenset({WORK_BALANCE, COVERAGE}),
    ),
    Case("plain_packed_good.py", must_pass=frozenset({PACKING, WORK_BALANCE, COVERAGE, EQUAL_STEPS})),
    Case(
        "bug_packed_positions.py",
        fail={1: frozenset({PACKING}), 2: frozenset({PACKING}), 4: frozenset({PACKING})},
        must_pass=frozenset({COVERAGE, WORK_BALANCE}),
        cause=POSITIONS_NOT_RESET,
    ),
    Case(
        "bug_packed_drops_tail.py",
        fail={2: frozenset({PACKING, COVERAGE, EQUAL_STEPS}), 4: frozenset({PACKING, COVERAGE, EQUAL_STEPS})},
        cause=PACKED_PER_RANK,
    ),
    Case(
        "bug_loss_local_norm.py",
        fail={2: frozenset({TRAINING_EQUIVALENCE}), 4: frozenset({TRAINING_EQUIVALENCE})},
        must_pass=frozenset({WORK_BALANCE, COVERAGE}),
        cause=LOCAL_NORMALISATION,
        args={"train_steps": 3},
    ),
    Case("hf_flattening.py", needs="transformers", must_pass=frozenset({PACKING, WORK_BALANCE, COVERAGE})),
    Case(
        "hf_group_by_length.py",  # rank 0 always the slowest, but below random batching's idle: passes
        world_sizes=(1, 2),
        needs="transformers",
        must_pass=frozenset({WORK_BALANCE, COVERAGE, EQUAL_STEPS}),
    ),
    Case("trl_bfd_padding_free.py", needs="trl", must_pass=frozenset({PACKING, WORK_BALANCE, COVERAGE})),
    Case(
        "trl_bfd_split.py",  # documents cut into pieces that restart positions: TRL's design, not declared
        needs="trl",
        fail={1: frozenset({PACKING}), 2: frozenset({PACKING}), 4: frozenset({PACKING})},
        must_pass=frozenset({COVERAGE, WORK_BALANCE}),
        cause=UNDECLARED_CUT,
    ),
    Case("trl_bfd_truncate.py", needs="trl", must_pass=frozenset({PACKING, COVERAGE})),
    Case("lhotse_buckets_synced.py", needs="lhotse", must_pass=frozenset({WORK_BALANCE, COVERAGE})),
    # issue 36 item 8: input_ids padded to the batch's longest row, no attention_mask
    Case("plain_padded_no_mask.py", must_pass=frozenset({WORK_BALANCE, COVERAGE, EQUAL_STEPS})),
    Case(
        "plain_padded_no_mask.py",  # the padding told by the labels' -100 tail
        world_sizes=(1, 2),
        must_pass=frozenset({WORK_BALANCE, COVERAGE}),
        args={"factory": "make_loader_labels"},
    ),
    Case(
        "plain_padded_no_mask.py",  # nothing tells the padding: not judged, and never the sampler's fault
        world_sizes=(1, 2),
        must_pass=frozenset({COVERAGE, EQUAL_STEPS}),
        skipped=frozenset({WORK_BALANCE}),
        args={"factory": "make_loader_unknown"},
    ),
    Case(
        "bug_buckets_per_rank_no_mask.py",  # the pad token read off the collate must not excuse this
        fail={2: frozenset({WORK_BALANCE}), 4: frozenset({WORK_BALANCE})},
        must_pass=frozenset({COVERAGE, EQUAL_STEPS}),
        cause=BUCKETS_PER_RANK,
    ),
]


def _run(case: Case) -> CheckResult:
    if importlib.util.find_spec(case.needs) is None:
        pytest.skip(f"{case.needs} is not installed (it comes with the 'integrations' extra)")
    options = CheckOptions(
        world_sizes=case.world_sizes,
        epochs=2,
        timeout=240,
        determinism=False,
        **case.args,  # type: ignore[arg-type]
    )
    return check_loader(str(TOKENS / case.fixture), options)


def _case_id(case: Case) -> str:
    factory = str(case.args.get("factory", ""))
    return case.fixture.removesuffix(".py") + (f"-{factory}" if factory else "")


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_token_loaders_are_judged_as_measured_without_ddpcheck(case: Case) -> None:
    result = _run(case)
    assert not any(run.failures for run in result.runs), [f.message for r in result.runs for f in r.failures]
    for run in result.runs:
        failed = {v.check for v in run.verdicts if v.status == "fail"}
        wanted = case.fail.get(run.world_size, frozenset())
        assert wanted <= failed, (run.label, failed)
        for check in case.must_pass:
            status = next(v.status for v in run.verdicts if v.check == check)
            assert status in (("pass", "n/a") if run.world_size == 1 else ("pass",)), (
                run.label,
                check,
                status,
            )
        for check in case.skipped if run.world_size > 1 else ():
            verdict = next(v for v in run.verdicts if v.check == check)
            assert verdict.status == "skip" and verdict.detail == PADDING_UNKNOWN, (run.label, verdict)
    if case.cause:
        causes = {v.cause for run in result.runs for v in run.verdicts if v.status == "fail"}
        assert case.cause in causes, causes


def test_the_work_figures_reach_every_report() -> None:
    from ddpcheck.report.json_report import to_json_dict
    from ddpcheck.report.svg import pictures
    from ddpcheck.report.table import render_table

    result = _run(Case("bug_sorted_contiguous.py", world_sizes=(2,)))
    run = result.runs[0]
    verdict = next(v for v in run.verdicts if v.check == WORK_BALANCE)
    assert verdict.evidence.rank_totals[0] == (4211, 12759)  # type: ignore[index]  # truth: NOTES.md
    assert all(
        i > c for i, c in zip(verdict.evidence.idle, verdict.evidence.random_batching_p99, strict=False)
    )  # type: ignore[call-overload]
    assert "idle 34%" in render_table(result, width=120)
    assert to_json_dict(result)["runs"][0]["idle"].startswith("34%")
    assert run.figures is not None
    work = next(p for p in pictures(run.figures, frozenset({WORK_BALANCE})) if p.kind == "work")
    assert work.svg.count('class="work-strip"') == 2 and 'data-total="4211"' in work.svg


# --------------------------------------------------------------------------- the pure statistic


def _trace(per_rank: list[list[list[list[float]]]], source: str = "attention_mask") -> RunTrace:
    """per_rank[rank][epoch][step] = the documents' work of that batch."""
    ranks = []
    for r, epochs in enumerate(per_rank):
        traces = []
        for e, batches in enumerate(epochs):
            ids = [(r, e, s, d) for s, b in enumerate(batches) for d in range(len(b))]
            sizes = [len(b) for b in batches]
            traces.append(
                EpochTrace(e, ids, sizes, len(batches), work=[tuple(b) for b in batches], supervised=None)
            )
        ranks.append(RankTrace(r, tuple(traces), LoaderFacts(work=source)))
    return RunTrace(len(per_rank), "gloo", tuple(ranks))


def _judge(per_rank: list[list[list[list[float]]]], source: str = "attention_mask"):  # type: ignore[no-untyped-def]
    """work_balance of ``per_rank`` against a one-process reference holding every batch."""
    epochs = len(per_rank[0])
    merged = [[[b for rank in per_rank for b in rank[e]] for e in range(epochs)]]
    reference = _trace(merged, source)
    run = _trace(per_rank, source)
    return check_work_balance(reference, run)


def _random_batching(
    lengths: list[int], world: int, batch: int, rng: random.Random
) -> list[list[list[float]]]:
    order = lengths[:]
    rng.shuffle(order)
    mine = [order[r::world] for r in range(world)]
    return [[[float(x) for x in share[i : i + batch]] for i in range(0, len(share), batch)] for share in mine]


def test_idle_is_the_share_of_rank_steps_spent_waiting() -> None:
    assert idle_fraction([[4.0, 4.0], [2.0, 2.0]]) == 0.0
    assert idle_fraction([[4.0, 2.0], [4.0, 0.0]]) == pytest.approx((2 + 4) / (2 * 8))
    assert idle_fraction([]) == 0.0


def test_random_batching_of_variable_length_data_passes() -> None:
    """The null is exact for random batching: about 1% of epochs exceed the 99th percentile by chance,
    and both epochs must for a failure. Over 120 random runs at W = 2 and 4, at most 3% fail."""
    rng = random.Random(7)
    failures = runs = 0
    for _trial in range(60):
        lengths = [rng.randint(4, 128) for _ in range(256)]
        for world in (2, 4):
            epochs = [_random_batching(lengths, world, 4, rng) for _ in range(2)]
            per_rank = [[epochs[e][r] for e in range(2)] for r in range(world)]
            verdict = _judge(per_rank)
            runs += 1
            failures += verdict.status == "fail"
    assert failures <= 0.03 * runs, f"{failures} of {runs} correct runs failed"


def test_sorted_contiguous_shards_and_per_rank_buckets_fail() -> None:
    rng = random.Random(3)
    lengths = sorted(rng.randint(4, 128) for _ in range(256))
    world = 4
    shards = [lengths[r * 64 : (r + 1) * 64] for r in range(world)]

    def epoch(shard: list[int]) -> list[list[float]]:
        mine = shard[:]
        rng.shuffle(mine)
        return [[float(x) for x in mine[i : i + 4]] for i in range(0, 64, 4)]

    verdict = _judge([[epoch(s), epoch(s)] for s in shards])
    assert verdict.status == "fail" and verdict.cause == SORTED_SHARDS and verdict.fix

    def bucketed(share: list[int]) -> list[list[float]]:  # each rank batches within its own length bucket
        ordered = sorted(share)
        batches = [[float(x) for x in ordered[i : i + 4]] for i in range(0, len(ordered), 4)]
        rng.shuffle(batches)
        return batches

    shuffled = lengths[:]
    rng.shuffle(shuffled)
    verdict = _judge([[bucketed(shuffled[r::world]), bucketed(shuffled[r::world])] for r in range(world)])
    assert verdict.status == "fail" and verdict.cause == BUCKETS_PER_RANK


def test_max_idle_is_an_absolute_limit_on_a_passing_run() -> None:
    rng = random.Random(5)
    lengths = [rng.randint(4, 128) for _ in range(256)]
    epochs = [_random_batching(lengths, 2, 4, rng) for _ in range(2)]
    verdict = _judge([[epochs[0][r], epochs[1][r]] for r in range(2)])
    assert verdict.status == "pass"
    idle = max(verdict.evidence.idle)  # type: ignore[type-var]
    assert with_max_idle(verdict, idle + 0.01).status == "pass"
    limited = with_max_idle(verdict, idle / 2)
    assert limited.status == "fail" and "--max-idle" in limited.detail and limited.fix


def test_a_one_rank_run_and_a_sample_loader_are_not_applicable() -> None:
    assert _judge([[[[3.0, 4.0]]]]).status == "n/a"
    plain = RunTrace(2, "gloo", tuple(RankTrace(r, (EpochTrace(0, [r], [1], 1),)) for r in range(2)))
    one = RunTrace(1, "gloo", (RankTrace(0, (EpochTrace(0, [0, 1], [1, 1], 2),)),))
    verdict = check_work_balance(one, plain)
    assert verdict.status == "n/a" and "batch_work" in verdict.detail


# --------------------------------------------------------------------------- measuring one batch


def test_a_batch_is_measured_from_its_mask_ids_or_hook() -> None:
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    labels = torch.tensor([[-100, 5, 6, -100], [7, -100, -100, -100]])
    measured = measure_batch({"input_ids": torch.ones(2, 4), "attention_mask": mask, "labels": labels})
    assert measured is not None and measured.units == (3.0, 2.0) and measured.supervised == 3
    assert measured.source == "attention_mask"
    squared = measure_batch({"input_ids": torch.ones(2, 4), "attention_mask": mask}, cost="attention")
    assert squared is not None and squared.units == (9.0, 4.0)
    ids_only = measure_batch({"input_ids": torch.ones(3, 5)})
    assert ids_only is not None and ids_only.units == (5.0, 5.0, 5.0) and ids_only.source == PADDED_WIDTH
    hooked = measure_batch(["anything"], hook=lambda batch: 42)
    assert hooked is not None and hooked.units == (42.0,) and hooked.source == "batch_work(batch)"
    assert measure_batch({"image": torch.ones(2, 3)}) is None
    assert measure_batch(torch.ones(4, 3)) is None


def test_padding_without_a_mask_is_counted_where_something_says_it() -> None:
    ids = torch.tensor([[5, 6, 7, 0], [8, 0, 0, 0], [0, 0, 9, 4]])  # right padding, and one left-padded row
    by_pad = measure_batch({"input_ids": ids}, pad_id=0)
    assert by_pad is not None and by_pad.units == (3.0, 1.0, 2.0) and "pad token 0" in by_pad.source
    labels = torch.tensor([[-100, 6, 7, -100], [8, -100, -100, -100], [-100, -100, 9, 4]])  # prompt, pad
    by_labels = measure_batch({"input_ids": ids[:2], "labels": labels[:2]})
    assert by_labels is not None and by_labels.units == (3.0, 1.0) and "-100 tail" in by_labels.source
    unknown = measure_batch({"input_ids": ids})
    assert unknown is not None and unknown.units == (4.0, 4.0, 4.0) and unknown.source == PADDED_WIDTH


PAD_ID = 3


def _global_pad(rows: list[Any]) -> Any:
    return rows, PAD_ID


def test_the_pad_token_is_read_where_the_collate_function_or_tokenizer_names_it() -> None:
    from torch.utils.data import DataLoader

    data = list(range(4))

    def closure_collate(pad_id: int) -> Any:
        return lambda rows: (rows, pad_id)

    class Collator:
        def __init__(self) -> None:
            self.tokenizer = type("Tok", (), {"pad_token_id": 7})()

        def __call__(self, rows: list[Any]) -> Any:
            return rows

    assert pad_token_of(DataLoader(data, collate_fn=_global_pad)) == 3  # a module global its code reads
    assert pad_token_of(DataLoader(data, collate_fn=closure_collate(5))) == 5  # a closure cell
    assert pad_token_of(DataLoader(data, collate_fn=functools.partial(_sum, padding_value=2))) == 2
    assert pad_token_of(DataLoader(data, collate_fn=Collator())) == 7  # its tokenizer
    assert pad_token_of(DataLoader(data)) is None  # torch's default collate names none
    two = functools.partial(_global_pad)  # PAD_ID read by the code, and another pad named: which one?
    two.__dict__["pad_value"] = 9
    assert pad_token_of(DataLoader(data, collate_fn=two)) is None


def _sum(rows: list[Any], padding_value: int = 0) -> Any:
    return rows


def test_padded_widths_are_not_judged_and_fixed_blocks_are() -> None:
    padded = [[[[9.0] * 4, [3.0] * 4, [12.0] * 4]], [[[4.0] * 4, [11.0] * 4, [2.0] * 4]]]
    for source in (PADDED_WIDTH, ""):  # "": a training script's recorder names no source
        verdict = _judge(padded, source)
        assert verdict.status == "skip" and verdict.detail == PADDING_UNKNOWN and not verdict.cause
    blocks = [[[[8.0] * 4] * 3], [[[8.0] * 4] * 3]]  # fixed-length blocks: the width is the work
    assert _judge(blocks, PADDED_WIDTH).status == "pass"
    measured = [[[[9.0, 2.0], [3.0, 3.0]]], [[[4.0, 7.0], [11.0, 1.0]]]]  # rows of a batch differ
    assert _judge(measured, "").status != "skip"
    assert _judge(padded, "attention_mask").status != "skip"  # a mask measured them: equal rows are real


def _packed(positions: list[list[int]], cu: list[int] | None = None) -> dict[str, torch.Tensor]:
    batch = {
        "input_ids": torch.ones(len(positions), len(positions[0])),
        "position_ids": torch.tensor(positions),
    }
    if cu is not None:
        batch["cu_seqlens"] = torch.tensor(cu, dtype=torch.int32)
    return batch


def test_packing_facts_find_unreset_positions_disagreement_and_undeclared_cuts() -> None:
    good, lengths = pack_facts(_packed([[0, 1, 2, 0, 1, 0]], cu=[0, 3, 5, 6]))
    assert good.problems == 0 and lengths == [3, 2, 1] and good.sources == ("cu_seqlens",)
    no_reset, _ = pack_facts(_packed([[0, 1, 2, 3, 4, 5]], cu=[0, 3, 6]))
    assert no_reset.no_reset == 1
    disagree, _ = pack_facts(_packed([[0, 1, 0, 1, 2, 3]], cu=[0, 4, 6]))
    assert disagree.reset_inside == 1 and disagree.no_reset == 1

    def tokens(starts: list[tuple[int, int]]) -> object:
        return lambda batch: starts

    cut = _packed([[0, 1, 2, 0, 1, 2]], cu=[0, 3, 6])
    declared, _ = pack_facts(
        _packed([[0, 1, 2, 3, 4, 5]], cu=[0, 3, 6]), tokens([(0, 0), (0, 1), (0, 2), (1, 3), (1, 4), (1, 5)])
    )  # type: ignore[arg-type]
    assert declared.cut_continued == 1 and declared.cut_restarted == 0
    restarted, _ = pack_facts(cut, tokens([(0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (0, 5)]))  # type: ignore[arg-type]
    assert restarted.cut_restarted == 1 and restarted.runs == [(0, 0, 3), (0, 3, 3)]
