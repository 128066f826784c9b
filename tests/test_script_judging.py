"""Judging the shapes of copied training scripts (issue 36), on traces of real samplers and datasets.

Each trace here is what a rank's real ``DataLoader`` parts yield (a ``DistributedSampler`` told its
``num_replicas``/``rank``, a ``random_split`` with a per-rank generator), with the facts ``read_facts``
reads off that very loader: no processes, so every rule and its buggy neighbour run in milliseconds.
The end-to-end runs against the measured truth are in ``tests/test_copied_scripts.py``.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import torch
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    RandomSampler,
    Subset,
    TensorDataset,
    random_split,
)

from ddpcheck.checker.facts import read_facts, subset_of
from ddpcheck.checker.subsets import base_indices, to_base
from ddpcheck.checks.diagnose import RANK_SEED, REFERENCE_PART, SPLIT_DIFFERS, TOLD_REPLICAS
from ddpcheck.checks.mixture import NO_SOURCE
from ddpcheck.checks.registry import run_checks
from ddpcheck.checks.replicas import GLOBAL_RANK, TOLD, told_split
from ddpcheck.checks.scripts import ALONE, ALONE_FIX, alone, at_loader, in_script_words, launcher_note
from ddpcheck.checks.work import NO_WORK
from ddpcheck.evidence import PaddingCost
from ddpcheck.layout import Layout, parse_mesh
from ddpcheck.report import render_html, render_markdown, render_table
from ddpcheck.report.view import build_view
from ddpcheck.result import CheckResult, RunRecord, ScriptRun, WorldResult
from ddpcheck.trace import EpochTrace, RankTrace, RunTrace
from ddpcheck.verdict import COVERAGE, NO_OVERLAP, PADDING_BOUND, SINGLE_PROCESS_EQUIVALENCE, Verdict

DATA = TensorDataset(torch.arange(200))


def recorded(loaders: list[DataLoader], epochs: int = 2) -> RunTrace:
    """What each loader's sampler yields, as samples of the dataset below its Subsets, with its facts."""
    ranks = []
    for rank, loader in enumerate(loaders):
        base = base_indices(loader.dataset)
        traces = []
        for e in range(epochs):
            if isinstance(loader.sampler, DistributedSampler):
                loader.sampler.set_epoch(e)
            ids = to_base(list(loader.sampler), base)
            traces.append(EpochTrace(e, ids, [len(ids)], None))
        ranks.append(RankTrace(rank, tuple(traces), read_facts(loader)))
    return RunTrace(len(loaders), "gloo", tuple(ranks))


def split_loader(seed: int, rank: int, world: int, sampler_seed: int = 0) -> DataLoader:
    train, _ = random_split(DATA, [0.8, 0.2], generator=torch.Generator().manual_seed(seed))
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=sampler_seed)
    return DataLoader(train, batch_size=8, sampler=sampler)


def failing_causes(verdicts: list[Verdict]) -> dict[str, str]:
    return {v.check: v.cause for v in verdicts if v.failed}


def test_a_random_split_drawn_on_each_rank_is_one_cause_naming_the_split() -> None:
    reference = recorded([split_loader(seed=0, rank=0, world=1)])
    run = recorded([split_loader(seed=1, rank=0, world=2), split_loader(seed=2, rank=1, world=2)])
    assert len({r.facts.subset_digest for r in run.ranks}) == 2 and run.ranks[0].facts.subset == "Subset"
    causes = failing_causes(run_checks(reference, run))
    assert {COVERAGE, NO_OVERLAP, SINGLE_PROCESS_EQUIVALENCE} <= set(causes)
    (cause,) = set(causes.values())  # one cause, none of "seed depends on the rank" / "check num_replicas"
    assert cause.startswith(SPLIT_DIFFERS) and "a Subset/random_split drawn differently on each rank" in cause
    verdicts = run_checks(reference, run)
    assert all("manual_seed(0)" in v.fix for v in verdicts if v.failed)


def test_the_split_is_named_at_its_line_once_the_recorder_gives_it() -> None:
    reference = recorded([split_loader(seed=0, rank=0, world=1)])
    run = recorded([split_loader(seed=1, rank=0, world=2), split_loader(seed=2, rank=1, world=2)])
    at_line = [replace(r.facts, subset_call="random_split at train.py:17") for r in run.ranks]
    run = replace(run, ranks=tuple(replace(r, facts=f) for r, f in zip(run.ranks, at_line, strict=True)))
    causes = set(failing_causes(run_checks(reference, run)).values())
    assert causes == {
        f"{SPLIT_DIFFERS}the random_split at train.py:17, drawn differently on each rank (no seeded "
        "generator): they train on samples the others hold out and miss some of their own"
    }


def test_the_split_cause_stays_off_manual_shards_and_a_seed_that_depends_on_the_rank() -> None:
    """Manual Subset shards differ by rank by design; the same seeded split with seed=rank samplers is
    the sampler's bug, not the split's."""
    reference = recorded([DataLoader(Subset(DATA, range(0, 200, 1)), sampler=RandomSampler(range(200)))])
    shards = [Subset(DATA, range(r, 200, 2)) for r in range(2)]
    run = recorded([DataLoader(s, sampler=RandomSampler(s)) for s in shards])
    assert not failing_causes(run_checks(reference, run)).get(COVERAGE)
    assert all(SPLIT_DIFFERS not in c for c in failing_causes(run_checks(reference, run)).values())
    reference = recorded([split_loader(seed=0, rank=0, world=1)])
    run = recorded([split_loader(0, 0, 2, sampler_seed=0), split_loader(0, 1, 2, sampler_seed=1)])
    assert failing_causes(run_checks(reference, run))[NO_OVERLAP] == RANK_SEED


def test_a_single_process_told_two_replicas_is_named_at_world_size_1() -> None:
    def told(replicas: int, rank: int) -> DataLoader:
        return DataLoader(DATA, sampler=DistributedSampler(DATA, num_replicas=replicas, rank=rank, seed=0))

    reference = recorded([told(2, 0)])
    verdicts = {v.check: v for v in run_checks(reference, reference)}
    cover = verdicts[COVERAGE]
    assert cover.failed and cover.cause.startswith(f"{REFERENCE_PART}100 of 200 samples")
    assert "one of 2 processes" in cover.cause and "num_replicas=2" in cover.cause
    assert "one process receives 100 of its dataset's 200 samples" in cover.detail
    honest = recorded([told(1, 0)])
    assert not any(v.failed for v in run_checks(honest, honest))
    wrong = recorded([told(4, r) for r in range(2)])  # 2 ranks told 4: half the epoch reaches no rank
    assert failing_causes(run_checks(honest, wrong))[COVERAGE].startswith(f"{TOLD_REPLICAS}4 ranks")


def test_a_mesh_sampler_given_the_global_rank_is_named_with_the_rank_it_needs() -> None:
    layout = parse_mesh("dp=2,tp=2")

    def ranks(given: list[tuple[int, int]]) -> RunTrace:
        loaders = [
            DataLoader(DATA, sampler=DistributedSampler(DATA, num_replicas=n, rank=k)) for n, k in given
        ]
        return recorded(loaders, epochs=1)

    global_rank = told_split(ranks([(4, r) for r in range(4)]), layout)
    assert global_rank.startswith(f"{TOLD}the global rank: it is given dist.get_rank() (0..3)")
    assert 'mesh["dp"].get_local_rank(), 0..1 of mesh["dp"].size() = 2' in global_rank
    modulo = told_split(ranks([(2, r % 2) for r in range(4)]), layout)
    assert "on rank 1 (dist.get_rank()) it is given rank=1 of num_replicas=2" in modulo and modulo.endswith(
        ": 0 there"
    )
    assert told_split(ranks([(2, layout.dp_rank(r)) for r in range(4)]), layout) == ""


def test_script_words_never_name_loader_file_hooks_or_check_options() -> None:
    mixture = in_script_words(Verdict("mixture", "n/a", "only some batches carry a source: " + NO_SOURCE))
    assert "CheckOptions" not in mixture.detail and "--hooks" in mixture.detail
    work = in_script_words(Verdict("work_balance", "n/a", NO_WORK))
    assert "the file defines" not in work.detail and "no --hooks file defines batch_work" in work.detail
    plain = Verdict("coverage", "pass", "every epoch's samples reach some rank")
    assert in_script_words(plain) is plain


def test_ranks_without_a_group_are_told_the_launcher_and_causes_name_the_loader_line() -> None:
    reference = recorded([DataLoader(DATA, shuffle=False)])
    run = recorded([DataLoader(DATA, shuffle=False) for _ in range(2)])
    failed = next(v for v in run_checks(reference, run) if v.check == NO_OVERLAP)
    assert failed.failed and "DistributedSampler" in failed.fix
    fixed = alone(failed, False, ("lightning",))
    assert fixed.cause.startswith(ALONE) and "Lightning ran one device per process" in fixed.cause
    assert fixed.fix == ALONE_FIX and "fabric run --devices N" in fixed.fix
    assert alone(failed, True, ("lightning",)) is failed  # in a group: the sampler's bug, as it was
    placed = at_loader(Verdict("coverage", "fail", "x", GLOBAL_RANK), "train.py:42")
    assert placed.cause.startswith("the sampler of the loader built at train.py:42 uses the global rank")
    other = Verdict("coverage", "fail", "x", RANK_SEED)
    assert at_loader(other, "train.py:42") is other


def test_launcher_variables_in_the_environment_are_named() -> None:
    assert launcher_note({"PATH": "/bin"}) == ""
    note = launcher_note({"LT_DEVICES": "2", "LT_STRATEGY": "ddp"})
    assert note.startswith("the environment sets LT_DEVICES=2, LT_STRATEGY=ddp")


def test_subset_facts_tell_which_samples_a_subset_holds() -> None:
    one, _ = random_split(DATA, [0.5, 0.5], generator=torch.Generator().manual_seed(1))
    same, _ = random_split(DATA, [0.5, 0.5], generator=torch.Generator().manual_seed(1))
    other, _ = random_split(DATA, [0.5, 0.5], generator=torch.Generator().manual_seed(2))
    assert subset_of(one) == subset_of(same) and subset_of(one)[0] == "Subset"
    assert subset_of(one)[1] != subset_of(other)[1]
    assert subset_of(DATA) == ("", "")


def test_a_scripts_report_gives_loaders_a_column_relative_names_and_counts_named(tmp_path: Path) -> None:
    """Issue 36, readability: loaders in their own column, named by their variable (issue 44: as the
    rank named them, never climbed to from the working directory, ``../examples/train.py:42``);
    "Script" in the headers; padding and overlap told apart in the padding column."""
    script = tmp_path / "examples" / "train.py"
    padded = Verdict(PADDING_BOUND, "pass", "", evidence=PaddingCost(copies=1, samples=96, noun="samples"))
    cost = PaddingCost(bound=1, copies=23, samples=96, noun="samples")
    overlap = Verdict(PADDING_BOUND, "fail", "", "x", evidence=cost)
    runs = tuple(
        WorldResult(
            ws, "gloo", (verdict,), layout=Layout.plain(ws), loader=f"{script}:42", loader_variable="train"
        )
        for ws, verdict in ((1, padded), (2, overlap))
    )
    cwd = str(tmp_path / "work")
    result = CheckResult(
        loader="train.py", runs=runs, options=RunRecord(script=ScriptRun("train.py", cwd=cwd))
    )
    view = build_view(result)
    assert view.loader_column and view.subject == "Script"
    assert [row.loader for row in view.rows] == ["train"] * 2
    assert [row.short for row in view.rows] == ["1", "2"]
    assert view.rows[0].padding == "1 padding copy of 96 samples (1%)"  # what the sampler adds by design
    assert view.rows[1].padding == (
        "23 extra copies of 96 samples (24%): overlap between ranks (at most 1 can be padding)"
    )
    table = render_table(view, width=120)
    header = next(line for line in table.splitlines() if line.startswith("loader"))
    assert header.split()[:3] == ["loader", "ws", "pad"] and str(script) not in table
    page = render_html(view)
    assert '<p class="meta">Script <code>train.py</code></p>' in page and "<th>loader</th>" in page
    grid = next(line for line in render_markdown(view).splitlines() if line.startswith("| loader"))
    assert re.split(r"\s*\|\s*", grid)[1:3] == ["loader", "world size"], grid
    plain = build_view(replace(result, runs=tuple(replace(r, loader="") for r in runs), options=RunRecord()))
    assert not plain.loader_column and plain.subject == "Loader" and plain.rows[0].short == "1"


def test_rows_packed_per_rank_split_by_the_global_rank_are_named_once_without_a_sampler() -> None:
    """Rows packed on each rank are not one process's rows (their ids are their content): four disjoint
    streams that together hold as many rows as one process are the epoch split over the global world, even
    though no row id matches. Without a sampler to say what it was given (split_dataset_by_node), the cause
    names the global rank and the data-parallel rank from the layout, at the loader's line; the neighbour
    that holds half the rows is sharded twice, and overlapping streams stay a non-data split."""
    from ddpcheck.checks.replicas import (
        LOADER_GLOBAL,
        REPLICA_IDS,
        SHARDED_TWICE_MESH,
        check_replica_consistency,
    )
    from ddpcheck.checks.scripts import told_cause

    layout = parse_mesh("dp=2,tp=2")

    def run_of(streams: list[list[int]]) -> RunTrace:
        ranks = [
            RankTrace(r, (EpochTrace(0, ids, [2] * (len(ids) // 2), None),)) for r, ids in enumerate(streams)
        ]
        return RunTrace(len(streams), "gloo", tuple(ranks))

    reference = run_of([list(range(1000, 1048))])  # one process's 48 rows
    global_rank = run_of([list(range(2000 + 100 * r, 2012 + 100 * r)) for r in range(4)])  # 4 x 12 rows
    verdict = check_replica_consistency(reference, global_rank, layout)
    assert verdict.failed and verdict.cause == GLOBAL_RANK
    said = at_loader(told_cause(verdict, global_rank, layout), "train.py:42").cause
    assert said.startswith("the loader built at train.py:42 splits by the global rank: each of the 4 ranks")
    assert "rank 1 (dp=0,tp=1) reads shard 1 of 4 where data-parallel rank 0 of 2 belongs" in said
    assert LOADER_GLOBAL in told_cause(verdict, global_rank, layout).cause
    twice = run_of([list(range(2000 + 100 * r, 2006 + 100 * r)) for r in range(4)])  # 4 x 6: half
    assert check_replica_consistency(reference, twice, layout).cause == SHARDED_TWICE_MESH
    overlapping = run_of([list(range(2000 + 6 * r, 2012 + 6 * r)) for r in range(4)])  # each shares 6
    assert check_replica_consistency(reference, overlapping, layout).cause == REPLICA_IDS
