"""Every example loader in ``fixtures/`` behaves as its docstring and ``fixtures/README.md`` say.

Correct loaders pass every check at world sizes 1-4, with real gloo ranks and simulated; each buggy
loader fails exactly its documented checks, naming the documented cause; bad input files make the CLI
exit 2 with one line; faults make it exit 3 with a report that names the failed rank. Known ddpcheck
bugs would be strict xfails (there are none open).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ddpcheck.options import BadInput, CheckOptions
from ddpcheck.result import CheckResult
from ddpcheck.session import check_loader
from ddpcheck.verdict import (
    BATCH_INTEGRITY,
    COVERAGE,
    DATA_CHECKS,
    DETERMINISM,
    EQUAL_STEPS,
    NO_OVERLAP,
    PADDING_BOUND,
    REPLICA_CONSISTENCY,
    RESHUFFLE,
    RESUME,
    SINGLE_PROCESS_EQUIVALENCE,
    WORKER_SHARDING,
)
from tests.conftest import FIXTURES, ROOT

WORLD_SIZES = (1, 2, 3, 4)

IGNORES_RANK = "the sampler ignores the rank"
RANK_SEED = "seed (or random state) depends on the rank"
SPLIT_PER_RANK = "drawn differently on each rank (no seeded generator)"
LENGTH_BY_RANK = "length depends on the rank"


@dataclass(frozen=True)
class Case:
    """One fixture run: which checks fail (beyond world size 1 and at it) and what their causes say."""

    file: str
    fails: frozenset[str] = frozenset()  # failed check ids at every world size > 1
    fails_at_1: frozenset[str] = frozenset()  # failed check ids at world size 1
    causes: dict[str, str] = field(default_factory=dict)  # check id -> substring of its cause
    options: dict[str, Any] = field(default_factory=dict)  # extra CheckOptions
    simulate: str = ""  # non-empty: why this case is not also run under --simulate
    xfail: str = ""  # a known ddpcheck bug that makes this case fail
    name: str = ""

    @property
    def id(self) -> str:
        return self.name or self.file.removesuffix(".py")


def _case(file: str, *fails: str, **kwargs: Any) -> Case:
    return Case(file, frozenset(fails), **kwargs)


WORKER_SLOW = "2 DataLoader workers per rank make the simulated run slow; the real-rank run covers it"

CASES = [
    # Correct loaders: every check passes at every world size.
    _case("good_distributed_sampler.py"),
    _case("good_patched_batch_sampler.py"),
    _case("good_plain_for_patch.py", options={"patch": True}),
    _case("good_iterable_sharded.py"),
    _case("good_eval_no_shuffle.py"),
    _case("good_drop_last.py"),
    _case("good_pad_then_drop_last.py"),  # padding moves an index the single process dropped: no stranger
    _case("good_explicit_batch_sampler.py"),  # the same, with BatchSampler(..., drop_last=True) by hand
    _case("good_repeat_augmentation.py"),  # the reference repeats each sample 3 times, by design
    _case("good_multi_epochs_loader.py"),  # one iterator kept across epochs, started in __init__
    _case("good_self_batching_loader.py"),  # no torch iterator: ids from the batches' id field
    _case("good_grouped_batch_sampler.py"),  # batches grouped within each rank's share, by design
    _case("good_subset_shards.py"),  # positions in each rank's own Subset: identity is the sample
    # The same plain loader without --patch: every rank sees everything.
    _case(
        "good_plain_for_patch.py",
        NO_OVERLAP,
        PADDING_BOUND,
        causes={NO_OVERLAP: IGNORES_RANK, PADDING_BOUND: IGNORES_RANK},
        name="good_plain_for_patch-unpatched",
    ),
    # Buggy loaders.
    _case(
        "bug_ignores_rank.py",
        NO_OVERLAP,
        PADDING_BOUND,
        causes={NO_OVERLAP: IGNORES_RANK, PADDING_BOUND: IGNORES_RANK},
    ),
    _case(
        "bug_seed_depends_on_rank.py",
        COVERAGE,
        NO_OVERLAP,
        PADDING_BOUND,
        SINGLE_PROCESS_EQUIVALENCE,
        causes={
            COVERAGE: RANK_SEED,
            NO_OVERLAP: RANK_SEED,
            PADDING_BOUND: RANK_SEED,
            SINGLE_PROCESS_EQUIVALENCE: RANK_SEED,
        },
    ),
    _case("bug_uneven_steps.py", EQUAL_STEPS, causes={EQUAL_STEPS: "different numbers of batches"}),
    _case(
        "bug_random_split_per_rank.py",
        COVERAGE,
        NO_OVERLAP,
        PADDING_BOUND,
        SINGLE_PROCESS_EQUIVALENCE,
        DETERMINISM,
        fails_at_1=frozenset({DETERMINISM}),
        causes={COVERAGE: SPLIT_PER_RANK, NO_OVERLAP: SPLIT_PER_RANK},
    ),
    _case(
        "bug_iterable_not_split_ranks.py",
        NO_OVERLAP,
        PADDING_BOUND,
        causes={
            NO_OVERLAP: "every rank sees the same stream",
            PADDING_BOUND: "every rank sees the same stream",
        },
    ),
    _case(
        "bug_iterable_not_split_workers.py",
        WORKER_SHARDING,
        fails_at_1=frozenset({WORKER_SHARDING}),
        causes={WORKER_SHARDING: "not split across DataLoader workers"},
        simulate=WORKER_SLOW,
    ),
    _case("bug_reseeded_generator.py", RESHUFFLE, causes={RESHUFFLE: "re-seeded every epoch"}),
    _case(
        "bug_multi_epochs_workers.py",
        RESHUFFLE,
        fails_at_1=frozenset({RESHUFFLE}),
        causes={RESHUFFLE: "drawn before set_epoch reaches the sampler"},
        simulate=WORKER_SLOW,
    ),
    _case("bug_fixed_assignment.py", RESHUFFLE, causes={RESHUFFLE: "assignment never changes"}),
    _case(
        "bug_rank_dependent_length.py",
        SINGLE_PROCESS_EQUIVALENCE,
        causes={SINGLE_PROCESS_EQUIVALENCE: "the dataset depends on the rank"},
    ),
    _case(
        "bug_rank_dependent_length.py",
        COVERAGE,
        NO_OVERLAP,
        PADDING_BOUND,
        SINGLE_PROCESS_EQUIVALENCE,
        causes={
            COVERAGE: LENGTH_BY_RANK,
            NO_OVERLAP: LENGTH_BY_RANK,
            PADDING_BOUND: LENGTH_BY_RANK,
            SINGLE_PROCESS_EQUIVALENCE: "depends on the rank",
        },
        options={"factory": "make_shuffled_loader"},
        name="bug_rank_dependent_length-shuffled",
    ),
    _case(
        "bug_nondeterministic.py",
        DETERMINISM,
        fails_at_1=frozenset({DETERMINISM}),
        causes={DETERMINISM: "changes from run to run"},
        simulate="broadcasts its seed, a real collective; see test_simulate_refuses_collectives",
    ),
    _case(
        "bug_batches_reformed.py",
        BATCH_INTEGRITY,
        causes={BATCH_INTEGRITY: "re-formed across ranks"},
    ),
    _case(
        "bug_padding_excess.py",
        NO_OVERLAP,
        PADDING_BOUND,
        causes={NO_OVERLAP: "pads more than world_size - 1", PADDING_BOUND: "pads more than world_size - 1"},
    ),
]


def _params(cases: list[Case]) -> list[Any]:
    return [
        pytest.param(c, id=c.id, marks=[pytest.mark.xfail(reason=c.xfail, strict=True)] if c.xfail else [])
        for c in cases
    ]


def _run(case: Case, **options: Any) -> CheckResult:
    settings: dict[str, Any] = {"world_sizes": WORLD_SIZES, "epochs": 2, "timeout": 60.0}
    opts = CheckOptions(**{**settings, **case.options, **options})
    return check_loader(str(FIXTURES / case.file), opts)


def _assert_matches(case: Case, result: CheckResult) -> None:
    assert [run.world_size for run in result.runs] == list(WORLD_SIZES)
    for run in result.runs:
        assert not run.failures, f"world size {run.world_size}: rank failures {run.failures}"
        statuses = {v.check: v.status for v in run.verdicts}
        assert set(statuses) - {RESUME} == {
            *DATA_CHECKS,
            REPLICA_CONSISTENCY,
        }  # resume: n/a or pass (--patch)
        assert statuses[REPLICA_CONSISTENCY] == "n/a"  # plain world sizes have no replicas
        failed = {check for check, status in statuses.items() if status == "fail"}
        expected = case.fails_at_1 if run.world_size == 1 else case.fails
        assert failed == expected, (
            f"world size {run.world_size}: failed {sorted(failed)}, expected {sorted(expected)}\n"
            + "\n".join(f"  {v.check}: {v.detail} / {v.cause}" for v in run.verdicts if v.failed)
        )
        assert "skip" not in statuses.values(), f"world size {run.world_size}: {statuses}"
        for verdict in (v for v in run.verdicts if v.failed):
            assert verdict.detail and verdict.cause, f"{verdict.check} failed without a detail or cause"
            wanted = case.causes.get(verdict.check, "")
            assert wanted in verdict.cause, f"world size {run.world_size}, {verdict.check}: {verdict.cause!r}"
    assert result.exit_code == (1 if case.fails or case.fails_at_1 else 0)


@pytest.mark.parametrize("case", _params(CASES))
def test_fixture_with_real_ranks(case: Case) -> None:
    _assert_matches(case, _run(case))


@pytest.mark.parametrize("case", _params(CASES))
def test_fixture_simulated(case: Case) -> None:
    if case.simulate:
        pytest.skip(case.simulate)
    # --simulate checks the data; resume needs real ranks and is checked by test_fixture_with_real_ranks
    _assert_matches(case, _run(case, simulate=True, resume=False))


def test_simulate_refuses_collectives(tmp_path: Path) -> None:
    """A loader that broadcasts cannot be simulated truthfully: exit 2, asking for real ranks."""
    with pytest.raises(BadInput, match="real gloo ranks"):
        _run(Case("bug_nondeterministic.py"), simulate=True)
    proc = _cli(FIXTURES / "bug_nondeterministic.py", tmp_path, "--simulate")
    assert proc.returncode == 2, proc.stderr
    _assert_one_line_error(proc, "broadcast_object_list")


# --- --no-set-epoch: the reference is the correct loop, so a forgotten set_epoch shows ---


def test_no_set_epoch_is_caught() -> None:
    result = _run(Case("good_distributed_sampler.py"), world_sizes=(1, 2), set_epoch=False)
    for run in result.runs:  # world size 1 too: it runs the user's loop, not the reference
        verdict = next(v for v in run.verdicts if v.check == RESHUFFLE)
        assert verdict.failed, verdict.detail
        assert "set_epoch" in verdict.cause
        assert [v.check for v in run.verdicts if v.failed] == [RESHUFFLE]


def test_a_sampler_that_advances_its_own_epoch_passes_without_set_epoch() -> None:
    """DDPSamplerWrapper starts a fresh epoch on every __iter__, so a loop that forgets set_epoch is fine."""
    result = _run(Case("good_patched_batch_sampler.py"), world_sizes=(1, 2), set_epoch=False)
    assert all(not v.failed for run in result.runs for v in run.verdicts)


# --- the docs: every fixture file is documented and tested ---


def _docstring(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    assert doc, f"{path.name} has no module docstring"
    return doc


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_docstring_names_the_failing_checks(case: Case) -> None:
    doc = _docstring(FIXTURES / case.file)
    for check in case.fails | case.fails_at_1:
        assert f"``{check}``" in doc, f"{case.file}'s docstring does not name ``{check}``"
    expected_prefix = "Bug:" if case.file.startswith("bug_") else "Correct"
    assert doc.startswith(expected_prefix), doc.splitlines()[0]


def _example_files() -> set[str]:
    """The files this module owns: ``good_*``/``bug_*`` loaders, ``bad/`` and ``faults/``."""
    top = {p.name for p in FIXTURES.glob("*.py") if p.name.startswith(("good_", "bug_"))}
    nested = {f"{d}/{p.name}" for d in ("bad", "faults") for p in (FIXTURES / d).iterdir() if p.is_file()}
    return top | nested


def test_every_fixture_is_tested_and_in_the_readme() -> None:
    readme = (FIXTURES / "README.md").read_text(encoding="utf-8")
    files = _example_files()
    tested = (
        {c.file for c in CASES}
        | {f"bad/{name}" for name in BAD_INPUTS}
        | {f"faults/{name}" for name in FAULTS}
    )
    assert files == tested, f"untested: {sorted(files - tested)}; missing: {sorted(tested - files)}"
    for name in sorted(files):
        assert f"`{name}`" in readme, f"fixtures/README.md does not list {name}"
    for name in sorted(f for f in files if f.endswith(".py") and f != "bad/syntax_error.py"):
        _docstring(FIXTURES / name)


# --- the CLI on bad input (exit 2) and on faults (exit 3) ---


def _cli(path: Path, report_dir: Path, *args: str, timeout: float = 10) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "ddpcheck", str(path), "--report-dir", str(report_dir)]
    command += ["--timeout", str(timeout), "--quiet", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)


def _assert_one_line_error(proc: subprocess.CompletedProcess[str], expected: str) -> None:
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("ddpcheck: error: "), lines[0]
    assert expected in lines[0], lines[0]


BAD_INPUTS = {
    "syntax_error.py": "line 7",
    "import_error.py": "No module named 'ddpcheck_fixture_module_that_does_not_exist'",
    "no_factory.py": "defines no factory named 'make_loader'; it defines build(): use --factory build",
    "required_param.py": "required parameter 'data_dir'",
    "factory_raises.py": "FileNotFoundError: /data/train.csv does not exist",
    "not_a_loader.py": "returned list, not a torch DataLoader or a loader",
    "empty_dataset.py": "yields no samples",
    "unhashable_ids.py": "sample ids must be hashable",
    "not_python.txt": "must be a Python file",
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_bad_input_exits_2(name: str, tmp_path: Path) -> None:
    proc = _cli(FIXTURES / "bad" / name, tmp_path, "--world-sizes", "1,2")
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    _assert_one_line_error(proc, BAD_INPUTS[name])


@dataclass(frozen=True)
class Fault:
    world_size: int  # where the failure happens
    rank: int
    kind: str
    message: str  # substring of the failure's message
    stack: str = ""  # substring of its traceback or dumped stack
    args: tuple[str, ...] = ("--world-sizes", "1,2")
    timeout: float = 10  # short where the fault is a hang: the test waits it out
    stops: bool = False  # the reference failed: nothing after it may run


FAULTS = {
    "crash_in_iter.py": Fault(2, 1, "error", "shard index for rank 1 is corrupt", "in __iter__"),
    "crash_in_worker.py": Fault(2, 1, "error", "DataLoader worker", "record 11 is truncated"),
    "factory_raises_on_rank1.py": Fault(2, 1, "error", "shard-1.bin does not exist"),
    "hang_uneven_collective.py": Fault(
        2, 0, "hang", "never reached the same collective", "all_reduce", timeout=5
    ),
    # it keeps yielding: never hung (--timeout is time without progress), stopped by --max-time
    "infinite_iterable.py": Fault(
        1,
        0,
        "overtime",
        "--max-time (3 s) ran out",
        args=("--world-sizes", "1", "--max-time", "3"),
        stops=True,
    ),
    "killed_rank.py": Fault(2, 1, "killed", "SIGKILL"),
    # no reference, nothing to judge: the run stops there, the killed reference reported as world size 1
    "killed_reference.py": Fault(
        1, 0, "killed", "SIGKILL", args=("--world-sizes", "1,2", "--load-data"), stops=True
    ),
    # the helper inherits the rank's pipes: the kill is still seen at once, from the rank's own pid
    "killed_rank_with_helper.py": Fault(2, 1, "killed", "SIGKILL"),
    "stopped_rank.py": Fault(2, 1, "hang", "stopped", timeout=3),
    # a bounded tail of the 1 GiB is kept; the crash itself is the headline
    "gigabyte_stdout.py": Fault(2, 1, "error", "after a gigabyte of output"),
}


def _fault_params() -> list[Any]:
    """Hangs cost their whole timeout (plus a stack dump), so they are marked slow."""
    return [
        pytest.param(name, marks=[pytest.mark.slow] if FAULTS[name].kind in ("hang", "overtime") else [])
        for name in sorted(FAULTS)
    ]


@pytest.mark.parametrize("name", _fault_params())
def test_fault_exits_3_with_report(name: str, tmp_path: Path) -> None:
    fault = FAULTS[name]
    proc = _cli(FIXTURES / "faults" / name, tmp_path, *fault.args, timeout=fault.timeout)
    assert proc.returncode == 3, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    report = json.loads((tmp_path / "ddpcheck.json").read_text(encoding="utf-8"))
    assert report["exit_code"] == 3 and report["ok"] is False
    runs = {run["world_size"]: run for run in report["runs"]}
    for ws, run in runs.items():
        if ws < fault.world_size:
            assert run["ok"] and not run["failures"], f"world size {ws} should be clean: {run['failures']}"
    failures = runs[fault.world_size]["failures"]
    assert failures, f"world size {fault.world_size} reports no failed rank"
    first = failures[0]
    assert (first["rank"], first["kind"]) == (fault.rank, fault.kind), failures
    assert fault.message in first["message"], first["message"]
    assert fault.stack in first["stack"], first["stack"][-2000:]
    assert first["progress"], "the failed rank's last position is missing"
    checks = runs[fault.world_size]["checks"]
    if fault.stops:  # the reference's own failure: no check ran, no world size after it was started
        assert list(runs) == [1] and checks == {}, list(runs)
        assert any("could not be recorded" in note for note in report["notes"])
    else:
        assert {c["status"] for c in checks.values()} == {"skip"}, "a broken run has no trace to judge"


def test_repeated_sampling_passes_with_words_that_stay_true() -> None:
    """At W=3 every selected sample reaches all three ranks: no pass text may claim otherwise."""
    result = _run(Case("good_repeat_augmentation.py"), world_sizes=(1, 3))
    assert result.exit_code == 0
    at3 = {v.check: v for v in result.runs[1].verdicts}
    assert "seen by two ranks" not in at3[NO_OVERLAP].detail
    assert "up to 3 times per epoch" in at3[NO_OVERLAP].detail and "up to 3 ranks" in at3[NO_OVERLAP].detail
    assert "yields a sample twice" not in at3[WORKER_SHARDING].detail
    assert "16 distinct" in at3[COVERAGE].detail and "16 distinct" in at3[SINGLE_PROCESS_EQUIVALENCE].detail


# Rank 0 iterates a torch DataLoader iterator (indices); the others form batches themselves, as a
# framework whose rank 0 loads for everyone would.
ASYMMETRIC = """
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, default_collate

class Asymmetric(DataLoader):
    def __iter__(self):
        if dist.get_rank() == 0:
            yield from super().__iter__()
            return
        for indices in self.batch_sampler:
            yield default_collate([self.dataset[i] for i in indices])
"""


def test_samples_are_identified_by_data_where_a_rank_sees_no_indices(tmp_path: Path) -> None:
    """Rank 0 iterates a torch DataLoader iterator (indices), the others form batches themselves (as
    a framework whose rank 0 loads for everyone would): the run is redone identifying every sample by
    the batches' id field, in the reference too, and the correct loader passes."""
    path = tmp_path / "asymmetric.py"
    path.write_text(
        ASYMMETRIC
        + """
def make_loader(rank, world_size):
    ds = [{"id": i + 1000, "x": torch.tensor(float(i))} for i in range(40)]
    return Asymmetric(ds, batch_size=4, sampler=DistributedSampler(ds, world_size, rank, seed=1))
""",
        encoding="utf-8",
    )
    result = check_loader(str(path), CheckOptions(world_sizes=(1, 2), epochs=2))
    failed = {v.check for run in result.runs for v in run.verdicts if v.failed}
    assert failed == set() and not any(run.failures for run in result.runs)
    assert any(
        "indices not seen on every rank; samples identified by the batches' field:id" in n
        for n in result.notes
    )


def test_returning_several_loaders_is_bad_input_with_a_way_forward(tmp_path: Path) -> None:
    path = tmp_path / "two.py"
    path.write_text(
        "from torch.utils.data import DataLoader\n"
        "def make_loader():\n"
        "    return [DataLoader(range(8), batch_size=2), DataLoader(range(4), batch_size=2)]\n",
        encoding="utf-8",
    )
    with pytest.raises(
        BadInput, match=r"returned list, not a torch DataLoader or a loader; .*factory of its own"
    ):
        check_loader(str(path), CheckOptions(world_sizes=(1,), epochs=1))


def test_a_one_pass_generator_is_bad_input_with_a_way_forward(tmp_path: Path) -> None:
    path = tmp_path / "gen.py"
    path.write_text("def make_loader():\n    return (b for b in [[0, 1], [2, 3]])\n", encoding="utf-8")
    with pytest.raises(BadInput, match=r"returned generator, .*runs once"):
        check_loader(str(path), CheckOptions(world_sizes=(1,), epochs=1))


def test_a_loader_of_its_own_without_a_dataloader_is_checked_by_its_data(tmp_path: Path) -> None:
    """Any object whose iter() is an epoch of batches is a loader (torchdata.nodes' Loader is one);
    with no indices to read, its samples are identified by the batches' id field."""
    path = tmp_path / "own.py"
    path.write_text(
        """
import torch
from torch.utils.data import DistributedSampler

class Own:
    def __init__(self, rank, world_size):
        self.sampler = DistributedSampler(range(30), world_size, rank, seed=2)
    def set_epoch(self, epoch):
        self.sampler.set_epoch(epoch)
    def __iter__(self):
        order = list(self.sampler)
        for i in range(0, len(order), 4):
            yield {"id": torch.tensor(order[i : i + 4])}

def make_loader(rank, world_size):
    return Own(rank, world_size)
""",
        encoding="utf-8",
    )
    result = check_loader(str(path), CheckOptions(world_sizes=(1, 2, 3), epochs=2))
    failed = {v.check for run in result.runs for v in run.verdicts if v.failed}
    assert failed == set() and not any(run.failures for run in result.runs)
    assert result.id_source == "field:id"
    reshuffle = next(v for v in result.runs[1].verdicts if v.check == RESHUFFLE)
    assert reshuffle.status == "pass" and "order changes" in reshuffle.detail


def test_equal_samples_without_indices_or_ids_are_bad_input_not_a_false_overlap(tmp_path: Path) -> None:
    """Rank 1 sees no indices and every sample has the same content: content hashes would call the
    whole epoch one sample seen everywhere. ddpcheck says how to identify samples instead."""
    path = tmp_path / "same.py"
    path.write_text(
        ASYMMETRIC
        + """
def make_loader(rank, world_size):
    data = [torch.zeros(2) for _ in range(24)]
    return Asymmetric(data, batch_size=4, sampler=DistributedSampler(data, world_size, rank, seed=1))
""",
        encoding="utf-8",
    )
    with pytest.raises(BadInput, match=r"cannot be told apart .*sample_ids"):
        check_loader(str(path), CheckOptions(world_sizes=(1, 2), epochs=1))


def test_padding_into_a_dropped_batch_is_no_stranger_but_ids_beyond_the_dataset_are() -> None:
    """DistributedSampler's padding moves an index the single process dropped with its partial batch into
    a full batch (good_pad_then_drop_last.py passes, above); the same drop_last rule must not hide a
    dataset that grows on some ranks: at world size 2 rank 1 yields its local sample 97."""
    options = CheckOptions(world_sizes=(1, 2), epochs=2, timeout=60.0, factory="make_drop_last_loader")
    result = check_loader(str(FIXTURES / "bug_rank_dependent_length.py"), options)
    ws2 = next(r for r in result.runs if r.world_size == 2)
    verdict = next(v for v in ws2.verdicts if v.check == SINGLE_PROCESS_EQUIVALENCE)
    assert verdict.status == "fail" and "the dataset depends on the rank" in verdict.cause
    assert 97 in verdict.examples
