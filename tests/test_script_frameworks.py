"""``ddpcheck run`` on unmodified training scripts written with the frameworks, asserting the truth.

Each case is a script in ``fixtures/scripts/frameworks/`` (the HF Trainer, Accelerate, Lightning, a
DeviceMesh dp x tp script, a script whose own options collide with ddpcheck's) and the verdict its truth
implies. The truth was measured without ddpcheck by ``fixtures/scripts/frameworks/truth.py``: each script
run under a real ``python -m torch.distributed.run --standalone`` at 1 and 2 processes (4 for the mesh),
logging the ids its own loop or model received; the facts are in ``truth_results.jsonl`` and explained in
``NOTES.md``. :func:`test_expectations_follow_the_truth` holds every case's expected failures to those
facts, so an expectation cannot drift from what the scripts really do.

Every run starts fresh interpreters per rank that import the framework (seconds each on a CPU): the runs
are marked slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ddpcheck.cli import main
from ddpcheck.tracefile import read_rank
from ddpcheck.verdict import (
    COVERAGE,
    DETERMINISM,
    NO_OVERLAP,
    PACKING,
    PADDING_BOUND,
    REPLICA_CONSISTENCY,
    RESHUFFLE,
    SINGLE_PROCESS_EQUIVALENCE,
    STEP_EQUIVALENCE,
)
from tests.conftest import FIXTURES

SCRIPTS = FIXTURES / "scripts" / "frameworks"
TRUTH = SCRIPTS / "truth_results.jsonl"
EXTRA = "the 'integrations' extra (pip install -c constraints.txt -e '.[integrations]')"
FAST = ("--epochs", "2", "--timeout", "120")
DP2_TP2 = "dp=2,tp=2"


@dataclass(frozen=True)
class Case:
    """One ``ddpcheck run`` and its truth.

    ``loaders`` maps the truth's loader names to the source text of the line that built the loader
    (ddpcheck knows a loader as ``script.py:LINE``; for the HF Trainer, which builds its loader inside
    ``train()``, that is the ``trainer.train()`` line); ``named`` to the variable the reports call it by
    (issue 44: what that line assigns the loader to, or the function that returns it), where there is
    one. ``must_fail`` maps a layout label ("2",
    "dp=2,tp=2") to {truth loader name: checks that fail}; every other check passes, is skipped or does
    not apply. ``may_fail`` holds direct consequences of the same bug (the same missing samples counted
    by single_process_equivalence; padding_bound where every sample is shared)."""

    name: str  # the truth's script name (truth_results.jsonl)
    script: str
    loaders: dict[str, str]
    named: dict[str, str] = field(default_factory=dict)
    options: tuple[str, ...] = ("--world-sizes", "1,2")
    script_args: tuple[str, ...] = ()
    module: str = ""
    exit_code: int = 0
    must_fail: dict[str, dict[str, frozenset[str]]] = field(default_factory=dict)
    may_fail: frozenset[str] = frozenset()
    cause: str = ""  # a phrase of the failing checks' cause
    one_process_shuffles: bool = True  # False: at one process the script's sampler does not shuffle
    shuffles: bool = True  # False: the stream never shuffles, at any number of processes
    batch_size: int = 8  # per rank: padding copies stay under one batch per rank

    @property
    def layouts(self) -> tuple[str, ...]:
        if "--mesh" in self.options:
            return ("1", self.options[self.options.index("--mesh") + 1])
        sizes = self.options[self.options.index("--world-sizes") + 1].split(",")
        return ("1", *(size for size in sizes if size != "1"))


CASES = [
    Case("hf_trainer", "hf_trainer.py", {"train": "trainer.train()"}, module="transformers", batch_size=4),
    Case(
        "hf_trainer_workers",
        "hf_trainer.py",
        {"train": "trainer.train()"},
        script_args=("--workers", "2"),
        module="transformers",
        batch_size=4,
    ),
    Case(
        "accelerate_good",
        "accelerate_good.py",
        {"train": "return DataLoader("},
        {"train": "loader"},  # loader = build_loader(...): the caller's variable
        module="accelerate",
    ),
    Case(
        "accelerate_uneven",  # 100 samples: Accelerate's even_batches pads by wrapping around
        "accelerate_good.py",
        {"train": "return DataLoader("},
        {"train": "loader"},
        script_args=("--samples", "100"),
        module="accelerate",
    ),
    Case(
        "accelerate_sharded_twice",
        "accelerate_sharded_twice.py",
        {"train": "loader = DataLoader("},
        {"train": "loader"},
        module="accelerate",
        exit_code=1,
        must_fail={"2": {"train": frozenset({COVERAGE})}},
        may_fail=frozenset({SINGLE_PROCESS_EQUIVALENCE}),
        cause="sharded twice",
    ),
    Case(
        "accelerate_dispatch",  # an IterableDataset: rank 0 reads, every rank gets a slice of each batch
        "accelerate_dispatch.py",
        {"train": "loader = DataLoader("},
        {"train": "loader"},
        module="accelerate",
        shuffles=False,
        batch_size=4,
    ),
    Case(
        "accelerate_dispatch_split",
        "accelerate_dispatch.py",
        {"train": "loader = DataLoader("},
        {"train": "loader"},
        script_args=("--split",),
        module="accelerate",
        exit_code=1,
        must_fail={"2": {"train": frozenset({COVERAGE})}},
        may_fail=frozenset({SINGLE_PROCESS_EQUIVALENCE}),
        shuffles=False,
        batch_size=4,
    ),
    Case(
        "lightning_good",
        "lightning_good.py",
        {"train": "sampler=EvensThenOdds(96)", "valid": "return DataLoader(Numbers(40)"},
        {"train": "train_dataloader", "valid": "val_dataloader"},  # Lightning calls them: the hooks' names
        module="lightning",
        one_process_shuffles=False,  # Lightning shuffles the custom sampler only when distributed
    ),
    Case(
        "lightning_no_distributed_sampler",
        "lightning_no_distributed_sampler.py",
        {"train": "return DataLoader(Numbers(96)", "valid": "return DataLoader(Numbers(40)"},
        {"train": "train_dataloader", "valid": "val_dataloader"},
        module="lightning",
        exit_code=1,
        must_fail={"2": {"train": frozenset({NO_OVERLAP}), "valid": frozenset({NO_OVERLAP})}},
        may_fail=frozenset({PADDING_BOUND}),
        cause="every rank sees the same stream",
    ),
    Case(
        "mesh_dp_tp",
        "mesh_dp_tp.py",
        {"train": "loader = DataLoader("},
        {"train": "loader"},
        options=("--mesh", DP2_TP2, "--world-sizes", "1"),
        script_args=("--tp", "2"),
    ),
    Case(
        "mesh_global_rank",
        "mesh_global_rank.py",
        {"train": "loader = DataLoader("},
        {"train": "loader"},
        options=("--mesh", DP2_TP2, "--world-sizes", "1"),
        script_args=("--tp", "2"),
        exit_code=1,
        must_fail={DP2_TP2: {"train": frozenset({COVERAGE, REPLICA_CONSISTENCY})}},
        # tensor peers fed different batches: the step that follows may differ from one process's fed one
        # rank per data-parallel coordinate, a consequence of the same bug
        may_fail=frozenset({SINGLE_PROCESS_EQUIVALENCE, STEP_EQUIVALENCE}),
        cause="global rank",
    ),
    Case(
        "mesh_split_by_node",  # split_dataset_by_node given the global rank, documents packed per rank
        "mesh_split_by_node.py",
        {"train": "loader = DataLoader("},
        options=("--mesh", DP2_TP2, "--world-sizes", "1"),
        script_args=("--tp", "2"),
        exit_code=1,
        must_fail={DP2_TP2: {"train": frozenset({COVERAGE, REPLICA_CONSISTENCY})}},
        may_fail=frozenset({SINGLE_PROCESS_EQUIVALENCE, PACKING, STEP_EQUIVALENCE}),
        cause="splits by the global rank",
        module="datasets",
        shuffles=False,
    ),
    Case(
        "mesh_split_by_node_dp",
        "mesh_split_by_node.py",
        {"train": "loader = DataLoader("},
        options=("--mesh", DP2_TP2, "--world-sizes", "1"),
        script_args=("--tp", "2", "--split", "dp"),
        module="datasets",
        shuffles=False,
    ),
    Case(
        "own_options",
        "own_options.py",
        {"train": "train = DataLoader(", "eval": "evaluate = DataLoader("},
        {"train": "train", "eval": "evaluate"},
        script_args=("--epochs", "5", "--steps", "2", "--timeout", "60"),
    ),
    Case(
        "stale_iterator",
        "stale_iterator.py",
        {"train": "loader = KeptIteratorLoader("},
        {"train": "loader"},
        exit_code=1,
        must_fail={"1": {"train": frozenset({RESHUFFLE})}, "2": {"train": frozenset({RESHUFFLE})}},
        cause="drawn before set_epoch",
    ),
]


def loader_name(script: str, text: str) -> str:
    """``script.py:LINE`` of the one line of the fixture that holds ``text``."""
    lines = [n for n, line in enumerate((SCRIPTS / script).read_text().splitlines(), 1) if text in line]
    assert len(lines) == 1, f"{script}: {text!r} must be on exactly one line, found {lines}"
    return f"{script}:{lines[0]}"


def shown_names(case: Case) -> dict[str, str]:
    """Truth loader -> the name the reports give it: its variable, with its line where two share one;
    its line alone where it has none (the HF Trainer builds its loader inside ``train()``)."""
    sites = {truth: loader_name(case.script, text) for truth, text in case.loaders.items()}
    variables = list(case.named.values())
    shown = {}
    for truth, site in sites.items():
        variable = case.named.get(truth, "")
        shown[truth] = (
            site if not variable else variable if variables.count(variable) == 1 else f"{variable} ({site})"
        )
    return shown


def truth_lines(name: str) -> list[dict[str, Any]]:
    found = [line for line in map(json.loads, TRUTH.read_text().splitlines()) if line["script"] == name]
    assert found, f"no truth for {name}: run fixtures/scripts/frameworks/truth.py {name}"
    return found


def layout_label(run: dict[str, Any]) -> str:
    return run["label"].rsplit(" ", 1)[1].removeprefix("ws=")


# --- the expectations are the truth's ------------------------------------------------------------------


def implied_failures(case: Case) -> dict[str, dict[str, set[str]]]:
    """The checks the measured facts say must fail, per layout and truth loader."""
    out: dict[str, dict[str, set[str]]] = {}
    for line in truth_lines(case.name):
        label = case.layouts[-1] if line["nproc"] > 1 else "1"
        for loader, facts in line["facts"].items():
            failing: set[str] = set()
            if facts["missed"]:
                failing.add(COVERAGE)
            # shared beyond padding: padding copies (Accelerate's even_batches wrapping around,
            # DistributedSampler's) stay under one batch per rank
            if facts["shared"] and facts["max_duplicates"] >= line["nproc"] * case.batch_size:
                failing.add(NO_OVERLAP)
            if facts.get("replicas_differ"):
                failing.add(REPLICA_CONSISTENCY)
            if not facts["deterministic"]:
                failing.add(DETERMINISM)
            # a train loader that repeats an epoch although its sampler shuffles and set_epoch is
            # called; the sequential eval loaders repeat by design
            shuffles = case.shuffles and (line["nproc"] > 1 or case.one_process_shuffles)
            if loader == "train" and facts["repeats"] and shuffles:
                failing.add(RESHUFFLE)
            if failing:
                out.setdefault(label, {})[loader] = failing
    return out


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_expectations_follow_the_truth(case: Case) -> None:
    expected = {label: {lo: set(checks) for lo, checks in by.items()} for label, by in case.must_fail.items()}
    assert implied_failures(case) == expected
    assert case.exit_code == (1 if case.must_fail else 0)
    for line in truth_lines(case.name):
        for facts in line["facts"].values():
            assert not facts["uneven"], "no fixture has uneven steps: equal_steps passes everywhere"


def test_truth_confirms_the_framework_facts() -> None:
    """What the HF Trainer does before a forward, measured from inside the run (NOTES.md): at every
    epoch the prepared loader's sampler was set to that epoch, and without workers 12 samples (3
    batches of 4) were fetched before the epoch's first forward: the gradient-accumulation window of 2
    plus the batch Accelerate prefetches."""
    for line in truth_lines("hf_trainer") + truth_lines("hf_trainer_workers"):
        loaders = [n for n in line["notes"] if n["kind"] == "loader"]
        assert [(n["epoch"], n["sampler_epoch"], n["type"]) for n in loaders] == [
            (e, e, "DataLoaderShard") for e in range(3)
        ]
    for line in truth_lines("hf_trainer"):
        fetched = [n["fetched"] for n in line["notes"] if n["kind"] == "first_forward"]
        assert fetched == [12, 12, 12]


# --- ddpcheck's verdicts -------------------------------------------------------------------------------


def run_ddpcheck(case: Case, report_dir: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, dict[str, Any]]:
    if case.module:
        pytest.importorskip(case.module, reason=f"needs {case.module}: {EXTRA}")
    monkeypatch.chdir(SCRIPTS)  # as a user runs it
    argv = ["run", *case.options, *FAST, "--quiet", "--format", "json", "--report-dir", str(report_dir)]
    code = main([*argv, "--", case.script, *case.script_args])
    return code, json.loads((report_dir / "ddpcheck.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_verdict(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, report = run_ddpcheck(case, tmp_path, monkeypatch)
    names = shown_names(case)
    truth_of = {name: truth for truth, name in names.items()}
    failures = [f for run in report["runs"] for f in run.get("failures", [])]
    assert not failures, failures
    seen = {(layout_label(run), run["loader"]) for run in report["runs"]}
    assert seen == {(label, name) for label in case.layouts for name in names.values()}
    for run in report["runs"]:
        label, loader = layout_label(run), run["loader"]
        must = case.must_fail.get(label, {}).get(truth_of[loader], frozenset())
        failing = {check for check, verdict in run["checks"].items() if verdict["status"] == "fail"}
        assert must <= failing, f"{run['label']}: {sorted(must - failing)} should fail"
        assert failing <= must | case.may_fail, f"{run['label']}: {sorted(failing - must)} should not fail"
        if must and case.cause:
            assert any(case.cause in run["checks"][check]["cause"] for check in must), run["checks"]
    assert code == case.exit_code == report["exit_code"]
    assert report["options"]["epochs"] == 2 and report["options"]["steps"] is None
    assert report["options"]["script_args"] == list(case.script_args)


@pytest.mark.slow
def test_a_split_by_the_global_rank_on_a_mesh_is_one_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``split_dataset_by_node(rank=dist.get_rank(), world_size=dist.get_world_size())`` on a dp x tp mesh,
    documents packed per rank: one cause explains the samples that reach no data-parallel rank and the
    replicas that differ, naming the global rank, the rank that took it and the data-parallel rank that
    belongs there, at the loader's line (as the sampler case does)."""
    case = next(c for c in CASES if c.name == "mesh_split_by_node")
    code, report = run_ddpcheck(case, tmp_path, monkeypatch)
    assert code == 1
    name = loader_name(case.script, case.loaders["train"])
    split = [c for c in report["causes"] if "global rank" in c["cause"]]
    assert len(split) == 1, [c["cause"] for c in report["causes"]]
    cause = split[0]["cause"]
    assert cause.startswith(f"the loader built at {name} splits by the global rank"), cause
    assert "dist.get_rank() (0..3)" in cause and "rank 1 (dp=0,tp=1) reads shard 1 of 4" in cause
    assert "data-parallel rank 0 of 2 belongs" in cause and "split_dataset_by_node" in split[0]["fix"]
    explained = split[0]["explains"]
    assert COVERAGE in explained and REPLICA_CONSISTENCY in explained
    assert not [c for c in report["causes"] if "documents reach no data-parallel rank" in c["cause"]]
    assert not [c for c in report["causes"] if "depends on a non-data coordinate" in c["cause"]]


@pytest.mark.slow
def test_recorded_ids_are_what_the_model_received(tmp_path: Path) -> None:
    """Under a real torchrun, ``-m ddpcheck.record --model-steps all`` records for each rank and epoch
    exactly the ids the HF Trainer's model received as forward keyword arguments (two DataLoader workers,
    Accelerate's prefetch, the gradient-accumulation window), in their order: the truth log and the trace
    come from the same run."""
    pytest.importorskip("transformers", reason=f"needs transformers: {EXTRA}")
    out, truth = tmp_path / "traces", tmp_path / "truth"
    truth.mkdir()
    env = {**os.environ, "TRUTH_DIR": str(truth), "ACCELERATE_USE_CPU": "true"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               "-m", "ddpcheck.record", "--out", str(out), "--model-steps", "all", "--epochs", "3",
               "--", "hf_trainer.py", "--workers", "2", "--samples", "32"]  # fmt: skip
    subprocess.run(command, cwd=SCRIPTS, env=env, check=True, timeout=300, capture_output=True)
    for rank in (0, 1):
        trace = read_rank(out / f"rank{rank}.trace")
        assert trace is not None
        lines = [json.loads(line) for line in (truth / f"rank{rank}.jsonl").read_text().splitlines()]
        received = {line["epoch"]: line["ids"] for line in lines if "loader" in line}
        assert trace.status == "ok"
        (loader,) = trace.loaders
        assert loader.name == loader_name("hf_trainer.py", "trainer.train()")
        assert {e.epoch: list(e.ids) for e in loader.trace.epochs} == received
        assert sorted(received) == [0, 1, 2] and all(len(ids) == 16 for ids in received.values())
