"""``ddpcheck run`` on the shapes of the training scripts people copy (issue 36), held to measured truth.

Each fixture script (fixtures/scripts/, fixtures/scripts/frameworks/) reproduces one pattern; its truth
was measured without ddpcheck under a real ``torchrun`` at 1 and 2 processes (4 for the mesh) and is
stored in ``truth_results.jsonl`` (see the folders' NOTES.md). The verdict, its one cause and its fix are
held to that truth: a peek before ``set_epoch`` beside a loop that leaves every epoch early, and batches
from a ``get_batch`` function, a generator or a ``next_batch`` method (exit 2 naming them, and judged with
``--batches``) included.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ddpcheck.checks.scripts import ALONE, ALONE_FIX
from tests.conftest import ROOT

SCRIPTS = ROOT / "fixtures" / "scripts"
FRAMEWORKS = SCRIPTS / "frameworks"
FAST = ["--world-sizes", "1,2", "--no-determinism", "--timeout", "200"]


def _truth(folder: Path) -> dict[tuple[str, int], dict[str, Any]]:
    lines = map(json.loads, (folder / "truth_results.jsonl").read_text().splitlines())
    return {(line["script"], line["nproc"]): line for line in lines}


TRUTH = _truth(SCRIPTS)
FRAMEWORK_TRUTH = _truth(FRAMEWORKS)


def ddpcheck_run(
    *args: str, cwd: Path = SCRIPTS, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ddpcheck", "run", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


def report(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "ddpcheck.json").read_text())


def failing(data: dict[str, Any]) -> dict[tuple[str, int], set[str]]:
    """(loader, world size) -> the checks that failed there."""
    out: dict[tuple[str, int], set[str]] = {}
    for run in data["runs"]:
        failed = {c for c, v in run["checks"].items() if v["status"] == "fail"}
        out.setdefault((run["loader"], run["world_size"]), set()).update(failed)
    return out


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_a_per_rank_random_split_is_one_cause_and_the_evaluation_order_no_failure(tmp_path: Path) -> None:
    """Issue 36 item 3: one cause naming the split; the eval loader without set_epoch is no failure."""
    truth = TRUTH[("bug_random_split_eval", 2)]["facts"]
    proc = ddpcheck_run(*FAST, "--report-dir", str(tmp_path), "--", "bug_random_split_eval.py")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    data = report(tmp_path)
    (cause,) = data["causes"]
    split = line_of(SCRIPTS / "bug_random_split_eval.py", "= random_split(")
    assert cause["cause"].startswith(
        "the ranks' datasets differ: the random_split(data, [train_len, len(data) - train_len]) at "
        f"bug_random_split_eval.py:{split}, drawn differently on each rank"
    ), cause
    assert "generator=torch.Generator().manual_seed(0)" in cause["fix"]
    found = failing(data)
    # the split is unseeded, so each run draws its own: held to what every draw shows (train: about a
    # fifth of the samples on both ranks; test: about a third never seen; the test loader's overlap,
    # 2 samples an epoch in the measured run, may stay within the padding allowance)
    for loader, name, must in (  # one helper returns both: each named by its caller's variable
        ("train_loader", "train", {"coverage", "no_overlap"}),
        ("test_loader", "test", {"coverage"}),
    ):
        assert truth[name]["missed"] and truth[name]["shared"]  # the truth this verdict is held to
        assert must <= found[(loader, 2)], found
        assert "reshuffle" not in found[(loader, 1)] | found[(loader, 2)], found
    assert truth["test"]["repeats"]  # the evaluation's order repeats: no result depends on it
    evaluation = [
        run["checks"]["reshuffle"]["detail"]
        for run in data["runs"]
        if run["loader"] == "test_loader" and run["world_size"] == 1
    ]
    assert evaluation and "without gradients" in evaluation[0], evaluation


def test_a_single_process_that_believes_it_is_one_of_two_is_said_so(tmp_path: Path) -> None:
    """Issue 36 item 5: the reference saw 48 of 96 samples; world size 2 is right, as its truth."""
    line = TRUTH[("bug_world_size_from_config", 2)]
    assert line["ids_per_epoch_one_process"]["train"] == [48] and line["ids_per_rank_epoch"]["train"] == [48]
    assert line["facts"]["train"]["missed"] == line["facts"]["train"]["shared"] == 0
    proc = ddpcheck_run(*FAST, "--report-dir", str(tmp_path), "--", "bug_world_size_from_config.py")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    data = report(tmp_path)
    (cause,) = data["causes"]
    assert cause["cause"].startswith("the single-process run saw 48 of 96 samples: the script believes it is "
                                     "one of 2 processes"), cause  # fmt: skip
    loader = "loader"  # the variable of its "loader = DataLoader(" line
    assert failing(data) == {(loader, 1): {"coverage"}, (loader, 2): set()}


def test_fabric_without_its_launcher_is_told_the_launcher(tmp_path: Path) -> None:
    """Issue 36 item 5: no process group under plain torchrun; the fix is Fabric's launcher."""
    truth = TRUTH[("fabric_no_launcher", 2)]["facts"]["train"]
    assert truth["shared"] == 288  # all 96 samples on both ranks, 3 epochs
    proc = ddpcheck_run(*FAST, "--report-dir", str(tmp_path), "--", "fabric_no_launcher.py")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    data = report(tmp_path)
    assert "no_overlap" in failing(data)[("loader", 2)]  # loader = fabric.setup_dataloaders(DataLoader(...))
    (cause,) = data["causes"]
    assert cause["cause"].startswith(ALONE) and cause["fix"] == ALONE_FIX, cause
    assert any("never joined a process group" in note for note in data["notes"])


def test_fabric_launcher_variables_fail_the_single_process_as_under_torchrun(tmp_path: Path) -> None:
    """LT_DEVICES=2 left set: lightning 2.6.6 refuses one process (truth), and the note names the variable."""
    refused = TRUTH[("fabric_lt_devices", 2)]["failed"]["1"].removeprefix("exit 1: ")
    env = {"LT_DEVICES": "2", "LT_STRATEGY": "ddp"}
    proc = ddpcheck_run(*FAST, "--report-dir", str(tmp_path), "--", "fabric_no_launcher.py", env=env)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    notes = report(tmp_path)["notes"]
    assert any(note.startswith("the environment sets LT_DEVICES=2, LT_STRATEGY=ddp") for note in notes), notes
    assert any(refused in note for note in notes), notes


def test_a_mesh_sampler_given_dist_get_rank_is_named_at_its_line(tmp_path: Path) -> None:
    """Issue 36 item 6: the cause names dist.get_rank() and the data-parallel rank, at the loader's line."""
    truth = FRAMEWORK_TRUTH[("mesh_dist_get_rank", 4)]["facts"]["train"]
    assert truth["replicas_differ"] and truth["missed"]
    args = ["--mesh", "dp=2,tp=2", "--world-sizes", "1", "--no-determinism", "--timeout", "300"]
    proc = ddpcheck_run(*args, "--report-dir", str(tmp_path), "--", "mesh_dist_get_rank.py", "--tp", "2",
                        cwd=FRAMEWORKS)  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = line_of(FRAMEWORKS / "mesh_dist_get_rank.py", "loader = DataLoader(")
    causes = report(tmp_path)["causes"]
    (cause,) = [c for c in causes if c["cause"].startswith("the sampler of the loader")]
    text = cause["cause"]
    assert text.startswith(
        f"the sampler of the loader built at mesh_dist_get_rank.py:{line} splits by the global"
    )
    # its model is a bare Linear, never wrapped in DDP: the step checks say so too, and nothing else
    others = [c["cause"] for c in causes if c is not cause]
    assert len(others) == 1 and "the gradient was not averaged over the data-parallel group" in others[0]
    assert "dist.get_rank()" in text and 'mesh["dp"].get_local_rank()' in text, text


def test_a_loop_that_breaks_early_on_purpose_counts_every_epoch(tmp_path: Path) -> None:
    """Every iterator abandoned after one batch is still an epoch when no iteration goes further: the
    neighbour a peek rule must not catch (truth: nothing shared, a new order every epoch)."""
    truth = TRUTH[("tutorial_break_early_1", 2)]["facts"]["train"]
    assert not truth["shared"] and not truth["repeats"]
    args = [*FAST, "--model-steps", "all", "--report-dir", str(tmp_path)]
    proc = ddpcheck_run(*args, "--", "tutorial_break_early.py", "--steps-per-epoch", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    reshuffle = [run["checks"]["reshuffle"] for run in report(tmp_path)["runs"]]
    assert all(v["status"] == "pass" for v in reshuffle) and any(
        "order changes" in v["detail"] for v in reshuffle
    )


def test_the_tutorials_peek_before_set_epoch_is_no_epoch(tmp_path: Path) -> None:
    """Issue 36 item 1: the one-batch peek before set_epoch is left out of the epochs and said in a note;
    the loop's epochs cover the data once and change order (truth), so nothing fails."""
    truth = TRUTH[("tutorial_peek", 2)]
    assert truth["ids_per_rank_epoch"]["peek"] == [8] and not truth["facts"]["train"]["repeats"]
    proc = ddpcheck_run(*FAST, "--report-dir", str(tmp_path), "--", "tutorial_peek.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = report(tmp_path)
    script = SCRIPTS / "tutorial_peek.py"
    loader = f"tutorial_peek.py:{line_of(script, 'loader = DataLoader(')}"
    peek, loop = line_of(script, "next(iter(self.train_data))"), line_of(script, "in self.train_data:")
    assert (
        f"loader {loader}: a one-batch peek at tutorial_peek.py:{peek} is not counted as an epoch (the "
        f"iterator is left there while the loop at tutorial_peek.py:{loop} iterates the loader)"
    ) in data["notes"]
    runs = [run for run in data["runs"] if run["loader"] == "loader"]  # the reports call it by its variable
    assert sorted(run["world_size"] for run in runs) == [1, 2]
    for run in runs:
        assert run["checks"]["coverage"]["status"] == "pass"
        assert run["checks"]["reshuffle"]["status"] == "pass" and "order changes" in run["checks"][
            "reshuffle"]["detail"]  # fmt: skip


# (script args, --batches name, the exit the truth demands, its truth case)
BATCH_CASES = [
    (["nanogpt_get_batch.py"], "get_batch", 0, "nanogpt_get_batch"),
    (["nanogpt_get_batch.py", "--same-seed"], "get_batch", 1, "nanogpt_get_batch_same_seed"),
    (["stream_generator.py"], "distributed_data_generator", 0, "stream_generator"),
    (["stream_generator.py", "--bug", "same"], "distributed_data_generator", 1, "stream_generator_same"),
    (["stream_generator.py", "--bug", "stride"], "distributed_data_generator", 1, "stream_generator_stride"),
    (["dataloader_lite.py"], "DataLoaderLite.next_batch", 0, "dataloader_lite"),
    (["dataloader_lite.py", "--bug"], "DataLoaderLite.next_batch", 1, "dataloader_lite_bug"),
]
# what each case's truth (truth_results.jsonl "spans") demands at world size 2: the checks that fail, and
# the one cause's first words
BATCH_VERDICTS = {
    "nanogpt_get_batch": (set(), ""),
    "nanogpt_get_batch_same_seed": (
        {"no_overlap"},
        "every rank draws the same batches: the random generator",
    ),
    "stream_generator": (set(), ""),
    "stream_generator_same": ({"coverage", "no_overlap"}, "every rank reads the same slice of the stream"),
    "stream_generator_stride": ({"coverage", "no_overlap"}, "the ranks' slices of the stream overlap"),
    "dataloader_lite": (set(), ""),
    "dataloader_lite_bug": ({"coverage", "no_overlap"}, "the ranks' slices of the stream overlap"),
}


@pytest.mark.parametrize(
    ("script", "name", "exit_code", "case"), BATCH_CASES, ids=[c[3] for c in BATCH_CASES]
)
def test_batches_from_no_dataloader_are_judged(
    script: list[str], name: str, exit_code: int, case: str, tmp_path: Path
) -> None:
    """Issue 36 item 4: --batches NAME records the calls of a batch function and judges them as the truth
    says: sampling has no coverage to prove but ranks must draw apart; a stream's slices must tile it.
    Three windows of 8 calls a rank cover the scripts' 24 steps, so DataLoaderLite's shard change (rank 1
    skips shard 0's last round: 64 tokens, the measured truth) is inside what is judged."""
    truth = TRUTH[(case, 2)]["spans"]["train"]
    fails, cause = BATCH_VERDICTS[case]
    args = [*FAST, "--epochs", "3", "--batches", name, "--report-dir", str(tmp_path)]
    proc = ddpcheck_run(*args, "--", *script)
    assert proc.returncode == exit_code, proc.stdout + proc.stderr
    data = report(tmp_path)
    assert failing(data) == {(name, 1): set(), (name, 2): fails}
    assert [c["cause"].startswith(cause) for c in data["causes"]] == ([True] if cause else [])
    checks = next(run["checks"] for run in data["runs"] if run["world_size"] == 2)
    if case.startswith("nanogpt"):  # sampling with replacement: truth never reads rows in order
        assert truth["contiguous_steps"] == 0 and checks["coverage"]["status"] == "n/a"
        assert "samples with replacement" in checks["coverage"]["detail"]
        assert (truth["identical_steps"] > 0) == ("no_overlap" in fails)
    else:  # a stream read in order: what truth misses and shares is what the verdict says
        assert truth["contiguous_steps"] == truth["steps"][0]
        assert (truth["shared"] > 0) == ("no_overlap" in fails)
    if case == "dataloader_lite":
        assert truth["missed"] == 64 and "4 units of 16 tokens missed in a window at most" in checks[
            "coverage"]["detail"]  # fmt: skip


def test_the_token_stream_truth_tells_sampling_from_slicing_and_the_bugs_apart() -> None:
    """What a batch recorder has to see, in the measured truth: sampling with replacement draws scattered,
    overlapping rows and never the same batch on two ranks (unless seeded alike: every step the same);
    slicing reads back-to-back rows that tile the stream, disjoint across ranks (up to a shard's tail)."""
    for _, _, exit_code, case in BATCH_CASES:
        spans = TRUTH[(case, 2)]["spans"]["train"]
        steps = spans["steps"][0]
        sampling = case.startswith("nanogpt")
        assert (spans["contiguous_steps"] == 0) == sampling, case
        if sampling:
            assert spans["identical_steps"] == (steps if exit_code else 0), case
            assert exit_code or spans["shared_rows"] <= 1, case  # a row drawn twice: chance, at most once
        else:
            assert (spans["shared"] > 0 or spans["identical_steps"] > 0) == bool(exit_code), case
            assert exit_code or spans["missed"] <= 64, case  # DataLoaderLite drops a shard's last round
    assert TRUTH[("stream_generator", 2)]["spans"]["train"]["equivalent_steps"] == 24


# (script, what the model's first call shows, the line of that call)
NO_LOADER_CASES = [
    ("nanogpt_get_batch.py", "get_batch", "losses = [model(*get_batch(split))"),
    ("stream_generator.py", "distributed_data_generator", "loss = (model(inputs)"),
    ("dataloader_lite.py", "DataLoaderLite.next_batch", "loss = (model(x)"),
]


@pytest.mark.parametrize(("script", "name", "call"), NO_LOADER_CASES, ids=[c[0] for c in NO_LOADER_CASES])
def test_a_script_that_iterates_no_dataloader_says_how_to_name_its_batches(
    script: str, name: str, call: str, tmp_path: Path
) -> None:
    """Issue 36 item 4 without --batches: exit 2 (bad input: nothing was checked) in one line that names
    the function the model's first inputs came from, at the line that called the model."""
    proc = ddpcheck_run(*FAST, "--quiet", "--report-dir", str(tmp_path), "--", script)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    at = f"{script}:{line_of(SCRIPTS / script, call)}"
    assert line.startswith(
        f"ddpcheck: error: no DataLoader was iterated (nothing was checked): the model's first inputs came "
        f"from {name}, at {at} ("
    ), line
    assert line.endswith(f"; pass --batches {name} to record the batches it returns"), line
    assert "Traceback" not in proc.stdout + proc.stderr and not (tmp_path / "ddpcheck.json").exists()


def test_a_batches_name_the_script_never_calls_is_exit_2_naming_what_fed_the_model(tmp_path: Path) -> None:
    proc = ddpcheck_run(*FAST, "--quiet", "--batches", "get_btch", "--report-dir", str(tmp_path), "--",
                        "nanogpt_get_batch.py")  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == (
        "ddpcheck: error: --batches get_btch: the script never called a function of that name defined in its "
        "own files with gradients on; the model's first inputs came from get_batch (nothing was checked)"
    )
