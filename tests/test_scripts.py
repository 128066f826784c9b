"""``ddpcheck run -- train.py``: the training script itself, checked against the truth its own loop saw.

The truth of each fixture script (fixtures/scripts/truth_results.jsonl) was measured without ddpcheck:
the script ran under a real ``torchrun`` and logged the ids its loop received (fixtures/scripts/truth.py).
A verdict is held to it: a sample no rank saw fails coverage, a sample two ranks saw fails no_overlap,
an epoch repeated by a sampler that declares shuffling fails reshuffle; a script with none passes.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from ddpcheck.tracefile import read_rank
from tests.conftest import ROOT

SCRIPTS = ROOT / "fixtures" / "scripts"
TRUTH = {
    line["script"]: line["facts"]
    for line in map(json.loads, (SCRIPTS / "truth_results.jsonl").read_text().splitlines())
}
FAST = ["--world-sizes", "1,2", "--no-determinism", "--timeout", "120"]
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


def ddpcheck_run(
    *args: str, cwd: Path = SCRIPTS, timeout: float = 240, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ddpcheck", "run", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def failing(report_dir: Path) -> dict[str, set[str]]:
    """Loader name -> the checks that failed at any layout, read from the JSON report."""
    data = json.loads((report_dir / "ddpcheck.json").read_text())
    out: dict[str, set[str]] = {}
    for run in data["runs"]:
        checks = run["checks"].items()
        out.setdefault(run["loader"], set()).update(c for c, v in checks if v["status"] == "fail")
    return out


def expected_failures(facts: dict[str, object], shuffles: bool) -> set[str]:
    expected = set()
    if facts["missed"]:
        expected.add("coverage")
    if facts["shared"]:
        expected.add("no_overlap")
    if (facts["repeats"] or facts.get("frozen")) and shuffles:
        expected.add("reshuffle")  # the same order again, or the same shards only reordered
    return expected


# script -> (its train loader's variable, as the reports name it; does its train sampler declare shuffling)
CASES = {
    "ddp_good": ("train", True),
    "bug_no_set_epoch": ("train", True),
    "bug_set_epoch_once": ("train", True),
    "bug_no_distributed_sampler": ("train", True),
    "bug_seed_rank": ("train", True),
    "bug_iterable_not_split": ("loader", False),
    "good_iterable_split": ("loader", False),
    "bug_hash_sharding": ("loader", False),
    "good_subset_shards": ("loader", True),  # fixed Subset shards: reshuffle fails by design, nothing else
    "bug_random_split_unseeded": ("loader", True),
    "bug_hf_split_unseeded": ("loader", True),
    "shared_names": ("loader (shared_names.py:39)", True),  # two loaders named loader: each with its line
}
EVAL_NAMES = {"shared_names": "loader (shared_names.py:29)"}  # the eval loader beside it, where not "valid"


@pytest.mark.parametrize("script", sorted(CASES))
def test_the_verdict_on_each_script_is_its_truth(script: str, tmp_path: Path) -> None:
    name, shuffles = CASES[script]
    proc = ddpcheck_run(*FAST, "--report-dir", str(tmp_path), "--", f"{script}.py")
    train = TRUTH[script]["train"]
    expected = expected_failures(train, shuffles)
    assert proc.returncode == (1 if expected else 0), proc.stdout + proc.stderr
    found = failing(tmp_path)
    assert expected <= found.get(name, set()), found
    if "valid" in TRUTH[script]:  # the eval loader beside it: unshuffled, every sample once -> passes
        assert found.get(EVAL_NAMES.get(script, "valid")) == set(), found


def test_identity_follows_a_subset_to_its_sample(tmp_path: Path) -> None:
    """Ranks sharding by Subsets count positions from 0 each: only the fixed shards fail (by design)."""
    proc = ddpcheck_run(*FAST, "--report-dir", str(tmp_path), "--", "good_subset_shards.py")
    assert failing(tmp_path) == {"loader": {"reshuffle"}}, proc.stdout


def test_a_loop_without_set_epoch_is_named_by_the_line_that_built_its_loader(tmp_path: Path) -> None:
    proc = ddpcheck_run(*FAST, "--report-dir", str(tmp_path), "--", "bug_no_set_epoch.py")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    causes = json.loads((tmp_path / "ddpcheck.json").read_text())["causes"]
    assert [c["cause"] for c in causes] == [
        "the loop never calls set_epoch on the sampler of the loader built at bug_no_set_epoch.py:34"
    ]
    assert "set_epoch(epoch)" in causes[0]["fix"]


def test_the_scripts_own_options_after_the_separator_are_its_own(tmp_path: Path) -> None:
    """``--epochs 1`` after ``--`` is the script's: it then runs one epoch, and reshuffle cannot be judged."""
    proc = ddpcheck_run(*FAST, "--report-dir", str(tmp_path), "--", "bug_no_set_epoch.py", "--epochs", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((tmp_path / "ddpcheck.json").read_text())
    assert data["options"]["script_args"] == ["--epochs", "1"]
    reshuffle = [run["checks"]["reshuffle"] for run in data["runs"] if "reshuffle" in run["checks"]]
    assert reshuffle and all(v["status"] == "skip" for v in reshuffle)


def test_a_module_runs_as_python_dash_m(tmp_path: Path) -> None:
    proc = ddpcheck_run(*FAST, "--report-dir", str(tmp_path), "-m", "trainpkg.train", "--epochs", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "loader" in failing(tmp_path)  # the variable of trainpkg/train.py's "loader = DataLoader(" line


@pytest.mark.skipif(GPUS >= 2, reason=f"with {GPUS} GPUs nccl runs on them at world sizes 1 and 2")
def test_nccl_runs_on_gloo_without_a_gpu_and_the_report_says_so(tmp_path: Path) -> None:
    proc = ddpcheck_run(*FAST, "--report-dir", str(tmp_path), "--", "nccl_on_cpu.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    notes = json.loads((tmp_path / "ddpcheck.json").read_text())["notes"]
    assert any("nccl" in note and "gloo" in note for note in notes), notes


@pytest.mark.skipif(GPUS > 0, reason=f"this machine has {GPUS} GPUs: the script runs on them")
def test_a_script_that_needs_cuda_gets_one_line_naming_the_call(tmp_path: Path) -> None:
    proc = ddpcheck_run(*FAST, "--report-dir", str(tmp_path), "--", "cuda_hardcoded.py")
    assert proc.returncode == 3
    assert "cuda_hardcoded.py:12 (torch.cuda.set_device(local_rank)): the script needs CUDA" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_ranks_see_cuda_only_where_every_rank_has_a_gpu() -> None:
    from ddpcheck.session.script import rank_environment

    assert rank_environment(2, gpus=2) == {} and rank_environment(1, gpus=1) == {}
    hidden = rank_environment(2, gpus=1)
    assert hidden["CUDA_VISIBLE_DEVICES"] == "" and hidden["DDPCHECK_GPUS_FOUND"] == "1"
    assert rank_environment(1, gpus=0)["ACCELERATE_USE_CPU"] == "true"


def test_check_scripts_keywords_are_laid_over_one_script_options() -> None:
    """``check_script(path, args, options, **fields)``: a field of ScriptOptions or of CheckOptions; without
    options, a test suite's world sizes and no resume; with them, only what is named changes."""
    from ddpcheck.options import TEST_WORLD_SIZES
    from ddpcheck.session.script import ScriptOptions, script_options

    made = script_options(world_sizes=[2], model_steps=None, epochs=3, batches="next_batch")
    assert made.check.world_sizes == (2,) and made.check.epochs == 3 and not made.check.resume
    assert made.model_steps is None and made.batches == "next_batch" and made.step
    assert script_options().check.world_sizes == TEST_WORLD_SIZES
    base = ScriptOptions(model_steps=5, hooks="h.py")
    over = script_options(base, steps=4, step=False)
    assert over.check == replace(base.check, steps=4) and (over.model_steps, over.hooks) == (5, "h.py")
    assert not over.step and script_options(base) == base
    with pytest.raises(TypeError):
        script_options(wrold_sizes=(2,))


@pytest.mark.skipif(GPUS == 0, reason=f"a CUDA script at world size 1 needs 1 GPU, found {GPUS}")
def test_a_cuda_script_runs_on_the_gpus_there_are_and_skips_larger_world_sizes(tmp_path: Path) -> None:
    proc = ddpcheck_run(*FAST, "--report-dir", str(tmp_path), "--", "cuda_hardcoded.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = {run["world_size"]: run for run in json.loads((tmp_path / "ddpcheck.json").read_text())["runs"]}
    assert not runs[1].get("skipped"), runs[1]
    if GPUS >= 2:
        assert not runs[2].get("skipped"), runs[2]
    else:
        assert runs[2]["skipped"].startswith(
            f"world size 2 needs 2 GPUs, found {GPUS}: cuda_hardcoded.py:12"
        ), runs


def test_a_missing_script_is_exit_2_in_one_line(tmp_path: Path) -> None:
    proc = ddpcheck_run("--report-dir", str(tmp_path), "--", "no_such_script.py")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "ddpcheck: error: no such script: no_such_script.py"
    proc = ddpcheck_run("--report-dir", str(tmp_path), "-m", "no_such_package.train")
    assert proc.returncode == 2 and "no module named 'no_such_package.train'" in proc.stderr


def test_a_script_that_is_no_python_is_exit_2_in_one_line_before_any_rank(tmp_path: Path) -> None:
    (tmp_path / "syntax.py").write_text("def f(:\n")
    (tmp_path / "binary.py").write_bytes(b"\x7fELF\x00\x01")
    (tmp_path / "folder").mkdir()
    expected = {
        "syntax.py": "syntax.py:1: not valid Python: invalid syntax",
        "binary.py": "binary.py:",  # the null bytes named in Python's own words, which vary by version
        "folder": "folder is a folder: give the script file, or -m PACKAGE for a package",
    }
    for name, message in expected.items():
        proc = ddpcheck_run("--report-dir", str(tmp_path / "r"), "--", name, cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith(f"ddpcheck: error: {message}"), proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").glob("*.trace"))


def test_a_script_that_raises_before_any_loader_is_exit_3_with_its_own_line(tmp_path: Path) -> None:
    proc = ddpcheck_run(*FAST, "--report-dir", str(tmp_path), "--", "faults/raises_before_loader.py")
    assert proc.returncode == 3
    assert "RuntimeError: config file missing: /nonexistent/config.yaml" in proc.stdout
    assert (tmp_path / "ddpcheck.json").is_file()  # reports are written for failures too


def test_a_script_that_iterates_no_loader_says_so(tmp_path: Path) -> None:
    """It ran to its end cleanly and nothing was checked: bad input (exit 2), one line, no report; its
    last printed line is in it, as nothing called a model."""
    proc = ddpcheck_run(*FAST, "--quiet", "--report-dir", str(tmp_path), "--", "faults/no_loader.py")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == (
        "ddpcheck: error: no DataLoader was iterated (nothing was checked) and no model was called; rank "
        "0's last line: nothing to train; pass --batches NAME to record the function that returns its "
        "batches (a name in the script, or module:qualname)"
    )
    assert not (tmp_path / "ddpcheck.json").exists()


def test_a_script_that_spawns_its_own_ranks_is_refused_at_once_naming_the_call(tmp_path: Path) -> None:
    proc = ddpcheck_run(*FAST, "--report-dir", str(tmp_path), "--", "faults/own_spawn.py")
    assert proc.returncode == 3
    assert "own_spawn.py:32: the script starts its own ranks with torch.multiprocessing.spawn" in (
        " ".join(proc.stdout.split())
    )
    assert "made no progress for" not in proc.stdout  # refused, not waited out


@pytest.mark.slow
def test_a_hung_rank_is_reported_with_its_line_and_nothing_outlives_the_run(tmp_path: Path) -> None:
    temp = _own_temp(tmp_path)
    proc = ddpcheck_run(
        *FAST[:3],
        "--timeout",
        "10",  # on progress: rank 0 waiting in its barrier has none either, and is not blamed
        "--report-dir",
        str(tmp_path),
        "--",
        "faults/hangs.py",
        env={"TMPDIR": temp},
    )
    assert proc.returncode == 3, proc.stdout
    failures = [
        f for run in json.loads((tmp_path / "ddpcheck.json").read_text())["runs"] for f in run["failures"]
    ]
    hung = [f for f in failures if f["kind"] == "hang"]
    assert [f["rank"] for f in hung] == [1], failures  # rank 0, waiting in its barrier, is not the cause
    assert "rank 1 made no progress for " in hung[0]["message"]  # --timeout: time without progress
    message = hung[0]["message"]
    assert "(--timeout 10), since " in message and "in faults/hangs.py line 16" in message
    assert "hangs.py" in hung[0]["stack"]
    assert _leftovers(temp) == set()


def test_the_scripts_finally_blocks_run_on_every_rank_when_it_is_stopped(tmp_path: Path) -> None:
    """A 100-epoch loop is stopped after the epochs recorded; its finally block still runs everywhere."""
    markers = tmp_path / "markers"
    markers.mkdir()
    proc = ddpcheck_run(
        "--world-sizes",
        "2",
        "--no-determinism",
        "--report-dir",
        str(tmp_path),
        "--",
        "faults/finally_marker.py",
        env={"MARKER_DIR": str(markers)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in markers.iterdir()) == ["rank0", "rank1"]


def test_an_endless_loader_is_judged_in_windows(tmp_path: Path) -> None:
    proc = ddpcheck_run(*FAST, "--steps", "8", "--report-dir", str(tmp_path), "--", "faults/endless.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((tmp_path / "ddpcheck.json").read_text())
    assert [(run["loader"], run["world_size"]) for run in data["runs"]] == [
        ("loader", 1),
        ("loader", 2),
    ]


@pytest.mark.slow
def test_an_endless_loader_without_windows_is_named_at_max_time(tmp_path: Path) -> None:
    """It keeps yielding, so --timeout (time without progress) never stops it; --max-time does."""
    proc = ddpcheck_run(
        # 30 s: time for torch to import on a loaded machine and the loader to be seen iterating
        "--world-sizes",
        "1",
        "--max-time",
        "30",
        "--report-dir",
        str(tmp_path),
        "--",
        "faults/endless.py",
    )
    assert proc.returncode == 3
    assert "judge it in windows with --steps N" in proc.stdout


@pytest.mark.slow
def test_ctrl_c_writes_the_reports_exits_130_and_leaves_nothing(tmp_path: Path) -> None:
    temp = _own_temp(tmp_path)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ddpcheck",
            "run",
            "--world-sizes",
            "1,2",
            "--timeout",
            "100",
            "--report-dir",
            str(tmp_path),
            "--",
            "faults/hangs.py",
        ],
        cwd=SCRIPTS,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "TMPDIR": temp},
    )
    said = _said_until(proc, b"ddpcheck: world size 2: running 2 ranks")
    deadline = time.monotonic() + 60
    while len(_ranks(temp)) < 2:  # the launch began; both ranks run the script when the signal comes
        assert time.monotonic() < deadline and proc.poll() is None, "the 2 ranks never started"
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (said + err).decode(errors="replace")
    assert (tmp_path / "ddpcheck.json").is_file()
    assert _leftovers(temp) == set()  # at once: nothing outlives the run


def _said_until(proc: subprocess.Popen[bytes], line: bytes, timeout: float = 120) -> bytes:
    """What the process said on stderr until it said ``line``; fails at the deadline, or if it exits
    first."""
    said = b""
    deadline = time.monotonic() + timeout
    assert proc.stderr is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stderr, selectors.EVENT_READ)
        while line not in said:
            left = deadline - time.monotonic()
            assert left > 0 and proc.poll() is None, f"never said {line!r}: {said[-2000:]!r}"
            if selector.select(min(left, 0.05)):
                said += os.read(proc.stderr.fileno(), 1 << 16)
    return said


@pytest.mark.slow
def test_a_launch_recorded_under_torchrun_is_judged_later(tmp_path: Path) -> None:
    """``torchrun -m ddpcheck.record`` writes plain traces; ``ddpcheck judge`` gives the run's verdict."""
    for n in (1, 2):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc-per-node={n}",
                "-m",
                "ddpcheck.record",
                "--out",
                str(tmp_path / f"ws{n}"),
                "--",
                "bug_seed_rank.py",
            ],
            cwd=SCRIPTS,
            check=True,
            capture_output=True,
            timeout=180,
        )
    traces = sorted(p.name for p in (tmp_path / "ws2").iterdir() if p.suffix == ".trace")
    assert traces == ["rank0.trace", "rank1.trace"]
    ids = sorted(p.name for p in (tmp_path / "ws2").iterdir() if p.suffix != ".trace")
    assert ids and all(re.fullmatch(r"rank[01]\.\d+\.\d+\.ids\.npy", name) for name in ids), ids
    report = tmp_path / "reports"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddpcheck",
            "judge",
            str(tmp_path / "ws2"),
            "--reference",
            str(tmp_path / "ws1"),
            "--report-dir",
            str(report),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert {"coverage", "no_overlap"} <= failing(report)["train"]
    alone = subprocess.run(
        [sys.executable, "-m", "ddpcheck", "judge", str(tmp_path / "ws2"), "--report-dir", str(report)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert alone.returncode == 1  # no_overlap needs no reference
    data = json.loads((report / "ddpcheck.json").read_text())
    coverage = [run["checks"]["coverage"] for run in data["runs"]]
    assert coverage and all(v["status"] == "skip" for v in coverage)  # and coverage says why it cannot


def test_judge_refuses_what_is_not_a_recorded_launch(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ddpcheck", "judge", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert "holds no trace files" in proc.stderr
    (tmp_path / "rank0.trace").write_bytes(pickle.dumps({"not": "a trace"}))
    proc = subprocess.run(
        [sys.executable, "-m", "ddpcheck", "judge", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "is not a ddpcheck trace" in proc.stderr


class _Hostile:
    """A pickle that runs a command as it loads: a trace file must never be able to do that."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_judge_refuses_a_hostile_or_garbled_trace_without_running_it(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    folder = tmp_path / "traces"
    folder.mkdir()
    for content in (pickle.dumps(_Hostile(marker)), b"garbage\n", os.urandom(64)):
        (folder / "rank0.trace").write_bytes(content)
        command = [sys.executable, "-m", "ddpcheck", "judge", str(folder)]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and "is not a ddpcheck trace" in proc.stderr, proc.stderr
        assert "internal error" not in proc.stderr and not marker.exists()


def test_the_python_api_checks_a_script(monkeypatch: pytest.MonkeyPatch) -> None:
    import ddpcheck

    monkeypatch.chdir(SCRIPTS)
    result = ddpcheck.check_script(
        "bug_no_set_epoch.py", ["--epochs", "3"], world_sizes=(2,), determinism=False
    )
    assert result.exit_code == 1
    assert [v.check for run in result.runs for v in run.verdicts if v.failed] == ["reshuffle", "reshuffle"]
    module = ddpcheck.check_script("trainpkg.train", world_sizes=(2,), determinism=False)
    assert module.ok


@pytest.mark.slow
def test_the_stored_truth_is_what_torchrun_shows_today() -> None:
    """Re-measure two fixtures' truth under a real torchrun: the stored facts still hold."""
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "truth.py"), "bug_no_set_epoch", "bug_seed_rank"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    for line in proc.stdout.splitlines():
        measured = json.loads(line)
        stored = TRUTH[measured["script"]]["train"]
        now = measured["facts"]["train"]
        assert bool(now["missed"]) == bool(stored["missed"]) and now["repeats"] == stored["repeats"]


def _own_temp(tmp_path: Path) -> str:
    """A temp dir for one ddpcheck run alone: its ranks and files are told apart from other tests'."""
    temp = tmp_path / "t"
    temp.mkdir()
    return str(temp)


def _ranks(temp: str) -> list[str]:
    """The script ranks of the run whose TMPDIR is ``temp`` (their --out lies below it)."""
    return subprocess.run(
        ["pgrep", "-f", f"ddpcheck.record --out {temp}"], capture_output=True, text=True
    ).stdout.split()


def _leftovers(temp: str) -> set[str]:
    """That run's ranks still running, and whatever it left in its temp dir."""
    return {f"pid {pid}" for pid in _ranks(temp)} | {p.name for p in Path(temp).iterdir()}


def test_the_pytest_fixture_checks_a_script(pytester: pytest.Pytester) -> None:
    """``ddpcheck.check_script`` in a test: passes on a correct script, fails with the table on a bug."""
    for name in ("ddp_good.py", "bug_no_set_epoch.py", "_truth_log.py"):
        (pytester.path / name).write_text((SCRIPTS / name).read_text())
    pytester.makepyfile(
        test_train="""
        def test_good(ddpcheck):
            result = ddpcheck.check_script("ddp_good.py", ["--epochs", "2"], world_sizes=2, determinism=False)
            assert {run.loader for run in result.runs} == {"ddp_good.py:35", "ddp_good.py:36"}

        def test_bug(ddpcheck):
            ddpcheck.check_script("bug_no_set_epoch.py", world_sizes=2, determinism=False)
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=300)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*bug_no_set_epoch.py* fails reshuffle*"])


@pytest.mark.parametrize("persistent", ["0", "1"])
def test_the_rest_of_a_map_style_epoch_is_read_from_the_sampler_without_loading(
    persistent: str, tmp_path: Path
) -> None:
    """2 model steps an epoch: the loaded samples are a few batches (prefetching workers included), not
    the 2,000-sample epochs; the verdict is still judged on whole epochs (coverage passes)."""
    counts = tmp_path / "counts"
    counts.mkdir()
    proc = ddpcheck_run(
        *FAST, "--report-dir", str(tmp_path), "--", "good_workers_loads_little.py",
        env={"COUNT_DIR": str(counts), "PERSISTENT": persistent},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    loaded = sum(len(p.read_text()) for p in counts.iterdir())
    epochs_recorded = 2 * 3  # 2 epochs at world size 1, and at world size 2 on each of 2 ranks
    assert loaded < 0.1 * 2000 * epochs_recorded, loaded  # 2 batches + what 2 workers prefetch
    data = json.loads((tmp_path / "ddpcheck.json").read_text())
    assert all(run["checks"]["coverage"]["status"] == "pass" for run in data["runs"])


def test_drained_batches_keep_the_worker_that_would_have_loaded_them(tmp_path: Path) -> None:
    """Recorded with whole epochs handed to the script, the workers are the truth the batches carry; with
    2 model steps (the rest read from the sampler), every batch keeps the same worker and the same ids."""
    traces = {}
    for steps in ("all", "2"):
        out = tmp_path / steps
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=1",
            "-m",
            "ddpcheck.record",
            "--out",
            str(out),
            "--model-steps",
            steps,
            "--",
            "worker_attribution.py",
        ]
        env = {**os.environ, "OUT": str(tmp_path / f"truth-{steps}.pkl")}
        subprocess.run(command, cwd=SCRIPTS, env=env, check=True, capture_output=True, timeout=180)
        recorded = read_rank(out / "rank0.trace")
        assert recorded is not None
        traces[steps] = recorded.loaders[0].trace
    truth = pickle.loads((tmp_path / "truth-all.pkl").read_bytes())  # the loop received every batch
    workers = {steps: [w for e in t.epochs for w in e.worker_ids] for steps, t in traces.items()}
    assert workers["all"] == truth
    assert workers["2"] == truth
    assert [list(e.ids) for e in traces["2"].epochs] == [list(e.ids) for e in traces["all"].epochs]


def test_an_accelerate_script_runs_distributed_and_its_cpu_fallback_is_named(tmp_path: Path) -> None:
    """``ddpcheck run`` makes a plain ``Accelerator()`` distributed on the CPU, as on GPUs (passes);
    recorded without that (Accelerate's own CPU fallback: every rank process 0 of 1), the judge names
    the fallback (exit 3) instead of reporting every rank seeing everything."""
    proc = ddpcheck_run(*FAST, "--report-dir", str(tmp_path / "run"), "--", "accelerate_plain.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    env = {k: v for k, v in os.environ.items() if k != "ACCELERATE_USE_CPU"}
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "-m", "ddpcheck.record", "--out", str(tmp_path / "ws2"), "--", "accelerate_plain.py"],
        cwd=SCRIPTS, env=env, capture_output=True, timeout=180, check=True,
    )  # fmt: skip
    judged = subprocess.run(
        [sys.executable, "-m", "ddpcheck", "judge", str(tmp_path / "ws2"),
         "--report-dir", str(tmp_path / "j")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert judged.returncode == 3
    assert "Accelerate ran non-distributed (process 0 of 1 on each of 2 ranks)" in judged.stdout
    assert "no_overlap" not in judged.stdout


def test_hooks_identify_a_scripts_samples(tmp_path: Path) -> None:
    """Without hooks the records are content hashes (equal values look alike); ``--hooks`` gives the keys."""
    plain = ddpcheck_run(*FAST, "--report-dir", str(tmp_path / "a"), "--", "keyed_stream.py")
    hooked = ddpcheck_run(
        *FAST, "--hooks", "keyed_hooks.py", "--report-dir", str(tmp_path / "b"), "--", "keyed_stream.py"
    )
    assert hooked.returncode == 0, hooked.stdout + hooked.stderr
    assert json.loads((tmp_path / "b" / "ddpcheck.json").read_text())["id_source"] == "hook"
    assert json.loads((tmp_path / "a" / "ddpcheck.json").read_text())["id_source"] == "content-hash"
    assert plain.returncode == 0  # every record differs in content too
    missing = ddpcheck_run("--hooks", "nope.py", "--", "keyed_stream.py")
    assert missing.returncode == 2 and "--hooks: no such file: nope.py" in missing.stderr


def test_tool_ddpcheck_defaults_apply_to_scripts_and_loader_only_keys_are_left_alone(tmp_path: Path) -> None:
    """``[tool.ddpcheck] world-sizes`` is read as for loader files; ``factory`` (loader files only) is
    no error."""
    (tmp_path / "pyproject.toml").write_text('[tool.ddpcheck]\nworld-sizes = [2]\nfactory = "make_loader"\n')
    for name in ("ddp_good.py", "_truth_log.py"):
        (tmp_path / name).write_text((SCRIPTS / name).read_text())
    proc = ddpcheck_run("--no-determinism", "--report-dir", "reports", "--", "ddp_good.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((tmp_path / "reports" / "ddpcheck.json").read_text())
    assert sorted({run["world_size"] for run in data["runs"]}) == [1, 2]  # the reference, then [2]


def test_a_killed_rank_is_named_and_the_others_are_let_go(tmp_path: Path) -> None:
    temp = _own_temp(tmp_path)
    proc = ddpcheck_run(
        "--world-sizes", "2", "--timeout", "200", "--report-dir", str(tmp_path),
        "--", "faults/killed_rank.py", env={"TMPDIR": temp},
    )  # fmt: skip
    assert proc.returncode == 3, proc.stdout
    assert "rank 1 killed by signal 9 before writing its trace" in proc.stdout
    failures = [
        f for run in json.loads((tmp_path / "ddpcheck.json").read_text())["runs"] for f in run["failures"]
    ]
    assert {f["rank"]: f["kind"] for f in failures}.get(0) != "hang", failures  # let go, not waited out
    assert _leftovers(temp) == set()
