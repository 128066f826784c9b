"""``sequence_split`` on step traces built by hand: context-parallel slices as the model got them (issue 42).

Each rank's micro-step carries the sequences it was handed and the ``input_ids``/``position_ids``/``labels``
its model's forward was given (:class:`~ddpcheck.trace.ModelFeed`). The check is held to the truth of the
context-parallel step fixtures in ``tests/test_step_truth.py`` and end to end in ``tests/test_step_mesh.py``;
here every rule meets the correct neighbour it could wrongly fail.
"""

from __future__ import annotations

from array import array

import pytest

from ddpcheck.checks.sequence_split import (
    HELD_UNEVEN,
    MISPLACED,
    MIXED,
    check_sequence_split,
    lines,
)
from ddpcheck.layout import Layout, parse_mesh
from ddpcheck.trace import MicroStep, ModelFeed, OptimizerStep, StepTrace, TokenRows

LENGTH = 16
SEQUENCES = [[(7 * i + 3 * k) % 29 + 1 for k in range(LENGTH)] for i in range(2)]  # no chunk repeats


def rows(values: list[list[int]]) -> TokenRows:
    return TokenRows(len(values), len(values[0]) if values else 0, array("q", [v for r in values for v in r]))


def chunks(split: str, rank: int, n: int) -> list[int]:
    if split == "contiguous":
        return [rank]
    return [rank, 2 * n - 1 - rank] if split == "zigzag" else [rank, max(2 * n - 2 - rank, 0)]


def sliced(row: list[int], split: str, rank: int, n: int) -> list[int]:
    pieces = n if split == "contiguous" else 2 * n
    size = len(row) // pieces
    return [x for c in chunks(split, rank, n) for x in row[c * size : (c + 1) * size]]


def feed(
    rank: int, n: int, split: str = "contiguous", positions: str = "global", **extra: TokenRows
) -> ModelFeed:
    """Cp rank ``rank`` of ``n``: handed SEQUENCES, fed its slice (positions global, restarted, none)."""
    tokens = [sliced(s, split, rank, n) for s in SEQUENCES]
    fed = [("input_ids", rows(tokens))]
    if positions == "global":
        fed.append(("position_ids", rows([sliced(list(range(LENGTH)), split, rank, n)] * len(tokens))))
    elif positions == "per_slice":
        fed.append(("position_ids", rows([list(range(len(tokens[0])))] * len(tokens))))
    fed += list(extra.items())
    return ModelFeed((("input_ids", rows(SEQUENCES)),), tuple(fed))


def traces(feeds: list[ModelFeed | None]) -> list[StepTrace]:
    return [StepTrace((OptimizerStep(0, (MicroStep("train", 0, (0,), 2, feed=f),)),)) for f in feeds]


def cp_run(layout: Layout, **how: str) -> list[StepTrace]:
    """Every rank of ``layout`` feeds the slice its cp coordinate says (tp peers alike)."""
    n = dict(layout.dims).get("cp", 1)
    cp_axis = layout.names.index("cp")
    return traces([feed(layout.coords(r)[cp_axis], n, **how) for r in range(layout.world_size)])


@pytest.mark.parametrize("mesh", ["dp=2,cp=2", "dp=1,cp=2", "dp=2,cp=2,tp=2", "dp=1,cp=4"])
@pytest.mark.parametrize("split", ["contiguous", "zigzag"])
@pytest.mark.parametrize("positions", ["global", "none"])
def test_correct_splits_reassemble_every_sequence_once(mesh: str, split: str, positions: str) -> None:
    layout = parse_mesh(mesh)
    verdict = check_sequence_split(cp_run(layout, split=split, positions=positions), layout)
    assert verdict.status == "pass", verdict
    assert "put each of" in verdict.detail


def test_a_head_tail_split_off_by_one_chunk_names_the_chunks() -> None:
    layout = parse_mesh("dp=2,cp=2")
    verdict = check_sequence_split(cp_run(layout, split="zigzag_off_by_one"), layout)
    assert verdict.status == "fail", verdict
    assert (
        "chunk 1 of 4 (positions 4-7) is held by two ranks and chunk 3 of 4 (positions 12-15)"
        in verdict.cause
    )
    assert "off by one chunk" in verdict.cause and verdict.ranks == (1,)
    assert verdict.detail.startswith("cp peers 0, 1 in micro-batch 0 of optimizer step 0, sequence 0")
    without = check_sequence_split(cp_run(layout, split="zigzag_off_by_one", positions="none"), layout)
    assert without.status == "fail" and "chunk 1 of 4 (positions 4-7) is held by two ranks" in without.cause


def test_positions_restarted_per_slice_are_named_with_where_the_tokens_sit() -> None:
    layout = parse_mesh("dp=1,cp=2")
    verdict = check_sequence_split(cp_run(layout, positions="per_slice"), layout)
    assert verdict.status == "fail", verdict
    assert verdict.cause.startswith("positions restarted per slice: rank 1 feeds the model position_ids 0..7")
    assert "positions 8-15 of the sequence" in verdict.cause and "arange(local_len)" in verdict.cause


def test_positions_that_do_not_place_the_tokens_and_mixed_slices() -> None:
    layout = parse_mesh("dp=1,cp=2")
    run = cp_run(layout)
    wrong = feed(1, 2)
    fed = dict(wrong.fed)
    shifted = [list(range(9, 17))] * 2  # one past where rank 1's tokens sit
    fed["position_ids"] = rows([[p % LENGTH for p in r] for r in shifted])
    run[1] = traces([ModelFeed(wrong.handed, tuple(fed.items()))])[0]
    verdict = check_sequence_split(run, layout)
    assert verdict.status == "fail" and verdict.cause == MISPLACED.format(rank=1, pos=9), verdict.cause
    mixed = cp_run(layout)
    whole_labels = feed(0, 2, labels=rows(SEQUENCES))  # labels left whole while the tokens are sliced
    mixed[0] = traces([whole_labels])[0]
    verdict = check_sequence_split(mixed, layout)
    assert verdict.status == "fail" and verdict.cause == MIXED.format(
        rank=0, sliced="input_ids, position_ids", width=8, whole="labels", full=LENGTH
    )


def test_a_position_no_rank_holds_is_named_but_a_shift_before_the_split_is_not() -> None:
    layout = parse_mesh("dp=1,cp=2")
    run = cp_run(layout)
    short = feed(1, 2)
    fed = dict(short.fed)
    fed["input_ids"] = rows([r[:-1] for r in [sliced(s, "contiguous", 1, 2) for s in SEQUENCES]])
    fed["position_ids"] = rows([list(range(8, 15))] * 2)
    run[1] = traces([ModelFeed(short.handed, tuple(fed.items()))])[0]
    assert check_sequence_split(run, layout).status == "pass"  # inputs cut one short (the shift)
    fed["input_ids"] = rows([r[:-2] for r in [sliced(s, "contiguous", 1, 2) for s in SEQUENCES]])
    fed["position_ids"] = rows([list(range(8, 14))] * 2)
    run[1] = traces([ModelFeed(short.handed, tuple(fed.items()))])[0]
    verdict = check_sequence_split(run, layout)
    assert verdict.status == "fail" and verdict.cause == HELD_UNEVEN.format(
        what="positions 14-15 is held by no rank"
    )


def test_padding_chunks_that_look_alike_are_no_chunk_held_twice() -> None:
    """Without position_ids, two chunks of padding are equal: each goes to its own rank, not twice."""
    global SEQUENCES
    kept = SEQUENCES
    SEQUENCES = [s[:8] + [0] * 8 for s in kept]
    try:
        layout = parse_mesh("dp=1,cp=2")
        verdict = check_sequence_split(cp_run(layout, split="zigzag", positions="none"), layout)
        assert verdict.status == "pass", verdict
    finally:
        SEQUENCES = kept


def test_peers_fed_the_same_tokens_replicate_and_plain_layouts_do_not_apply() -> None:
    tp = parse_mesh("dp=2,tp=2")
    alike = traces([feed(0, 1)] * 4)
    verdict = check_sequence_split(alike, tp)
    assert verdict.status == "n/a" and "no rank fed its model a slice" in verdict.detail
    assert check_sequence_split(traces([feed(0, 1)] * 2), Layout.plain(2)).status == "n/a"
    assert check_sequence_split([*traces([feed(0, 2)]), None], parse_mesh("dp=1,cp=2")).status == "skip"
    unfed = check_sequence_split(traces([None, None]), parse_mesh("dp=1,cp=2"))
    assert unfed.status == "n/a"
    assert [ranks for _, ranks in lines(parse_mesh("dp=2,cp=2,tp=2"))] == [
        [0, 2], [1, 3], [4, 6], [5, 7], [0, 1], [2, 3], [4, 5], [6, 7]
    ]  # fmt: skip


def test_peers_handed_different_sequences_are_left_to_replica_consistency() -> None:
    """Tensor or cp peers handed other samples (a loader split by the global rank) feed other tokens, but
    no slice of one sequence is wrong: not this check's finding."""
    layout = parse_mesh("dp=1,cp=2")
    run = cp_run(layout)
    other = feed(1, 2)
    others = [[(x + 5) % 29 + 1 for x in s] for s in SEQUENCES]
    moved = ModelFeed((("input_ids", rows(others)),), other.fed)
    run[1] = traces([moved])[0]
    verdict = check_sequence_split(run, layout)
    assert verdict.status == "n/a" and "handed different sequences" in verdict.detail
