"""Rank-side robustness from a first day with ddpcheck (issue 31: items 2, 3, 4, 5, 7, 8).

Each fixture in ``fixtures/rank/`` carries its truth measured without ddpcheck (``fixtures/rank/truth.py``
under torchrun); where the verdict depends on how a rank was started (its hash seed, its exit), a test
runs the real ``torchrun`` next to ddpcheck and compares. Real gloo ranks, real processes, nothing mocked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ddpcheck.checker.identity import sampler_item_id
from ddpcheck.checker.loaderfile import BadLoaderFile
from ddpcheck.checker.work import WorkMeter
from ddpcheck.figures import FigureData
from ddpcheck.launch import GroupCall, run_ranks
from ddpcheck.launch.group import FRESH_NOTE
from ddpcheck.launch.procs import SOCKET_PATH_MAX, SOCKET_ROOM, short_tempdir
from ddpcheck.report.svg import work_svg
from tests.conftest import FIXTURES, ROOT

RANK_FIXTURES = FIXTURES / "rank"
SHM = Path("/dev/shm")
SHM_PREFIX = "ddpchk_fx_"  # fixtures/rank/good_shared_memory_atexit.py's segments


def _cli(fixture: str, tmp: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 240) -> Any:
    command = [sys.executable, "-m", "ddpcheck", str(RANK_FIXTURES / fixture), "--report-dir", str(tmp)]
    command += ["--quiet", "--format", "json", *args]
    return subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )


def _one_line_error(proc: Any) -> str:
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return str(lines[0])


def _torchrun(case: str, tmp: Path, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """fixtures/rank/truth.py under a real ``torchrun --standalone --nproc-per-node 2``: one dict a rank."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += [str(RANK_FIXTURES / "truth.py"), case]
    run_env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"} | {"OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        command, cwd=tmp, capture_output=True, text=True, timeout=180, env={**run_env, **(env or {})}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    decoder, text, ranks = json.JSONDecoder(), proc.stdout, []
    at = text.find('{"rank"')
    while at >= 0:  # two ranks' lines may interleave on the one stdout
        value, end = decoder.raw_decode(text, at)
        ranks.append(value)
        at = text.find('{"rank"', end)
    return sorted(ranks, key=lambda r: int(r["rank"]))


# 3. float indices are bad input, objects stay samples -------------------------------------------------


@pytest.mark.parametrize("mode", [(), ("--load-data",)], ids=["indices", "load-data"])
def test_a_sampler_of_float_indices_is_bad_input(tmp_path: Path, mode: tuple[str, ...]) -> None:
    line = _one_line_error(_cli("bug_float_indices.py", tmp_path, "--world-sizes", "1,2", *mode))
    assert "the sampler yielded 0.0 (float) as a sample index" in line, line


@pytest.mark.parametrize(
    "item", [1.0, np.float32(2.0), np.float64(3.0), torch.tensor(4.0), True, np.bool_(False), 1 + 0j]
)
def test_numbers_that_are_not_integers_are_refused_as_sampler_items(item: Any) -> None:
    with pytest.raises(BadLoaderFile, match="as a sample index"):
        sampler_item_id(item)


class _Cut:  # what lhotse's samplers yield inside CutSets: objects with a plain id
    def __init__(self, ident: str, duration: float) -> None:
        self.id, self.duration = ident, duration


def test_integers_strings_and_objects_stay_sampler_items() -> None:
    assert sampler_item_id(3) == 3
    assert sampler_item_id(np.int64(4)) == 4
    assert sampler_item_id(torch.tensor(5)) == 5
    assert sampler_item_id("utt-1") == "utt-1"
    assert sampler_item_id(_Cut("cut-7", 1.5)) == "cut-7"  # a float attribute is no float index


# 7. len() that raises anything means "no length" ----------------------------------------------------


def test_a_len_raising_attribute_error_means_no_length(tmp_path: Path) -> None:
    proc = _cli("good_len_disabled.py", tmp_path, "--world-sizes", "1,2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "ddpcheck.json").read_text())
    assert [run["world_size"] for run in report["runs"]] == [1, 2]


def test_read_facts_takes_a_raising_len_for_no_length() -> None:
    from ddpcheck.checker.facts import read_facts

    sys.path.insert(0, str(RANK_FIXTURES))
    try:
        import good_len_disabled  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(RANK_FIXTURES))
    facts = read_facts(good_len_disabled.make_loader(0, 2))
    assert facts.dataset_len is None and facts.dataset_kind == "iterable"


# 4. batch_work values that are not work ---------------------------------------------------------------


def test_batch_work_returning_nan_is_bad_input_naming_hook_value_and_batch(tmp_path: Path) -> None:
    line = _one_line_error(_cli("bug_work_nan.py", tmp_path, "--world-sizes", "1,2"))
    assert "batch_work(batch) returned nan" in line and "batch 5 of rank 0" in line, line


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (float("inf"), "returned inf"),
        (-2.0, "returned -2.0"),
        ("12", "returned '12' (str, not a number)"),
        (None, "returned None"),
        (torch.tensor([1.0, 2.0]), "not a number"),
        (torch.tensor(float("nan")), "returned nan"),
    ],
)
def test_batch_work_values_that_are_not_a_finite_amount_are_refused(value: Any, says: str) -> None:
    meter = WorkMeter(hook=lambda batch: 1.0)
    assert meter.measure({}) is not None  # batch 1 is fine
    meter.hook = lambda batch: value
    with pytest.raises(BadLoaderFile, match="batch 2 of rank 0") as info:
        meter.measure({})
    assert says in str(info.value)


def test_batch_work_accepts_numbers_and_scalar_tensors() -> None:
    values: list[tuple[Any, float]] = [(3, 3.0), (2.5, 2.5), (torch.tensor(4.0), 4.0), (np.float32(0.0), 0.0)]
    for value, expected in values:
        measured = WorkMeter(hook=_constant(value)).measure({})
        assert measured is not None and measured.units == (expected,)


def _constant(value: Any) -> Any:
    return lambda batch: value


def test_the_work_picture_draws_non_finite_values_without_raising() -> None:
    nan, inf = float("nan"), float("inf")
    data = FigureData(
        world_size=2, ranks=(0, 1), shown_ranks=2, max_bins=100,
        work=((1.0, nan, 3.0), (inf, 2.0, -1.0)), work_source="batch_work(batch)", work_totals=(nan, inf),
    )  # fmt: skip
    svg = work_svg(data)
    assert "nan" not in svg.lower() and "inf" not in svg.lower(), svg


# 5. a long TMPDIR ------------------------------------------------------------------------------------


def _long_tmpdir(length: int) -> Path:
    base = Path(tempfile.mkdtemp(prefix="ddpcheck-long-", dir="/tmp"))
    path = base / ("x" * (length - len(str(base)) - 1))
    path.mkdir()
    assert len(str(path)) == length
    return path


def test_workers_and_a_manager_work_under_a_ci_length_tmpdir(tmp_path: Path) -> None:
    tmpdir = _long_tmpdir(55)
    try:
        args = ("--world-sizes", "1,2", "--load-data", "--timeout", "30", "--epochs", "1")
        proc = _cli("good_workers_manager.py", tmp_path, *args, env={"TMPDIR": str(tmpdir)})
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert not list(tmpdir.iterdir()), f"left in TMPDIR: {sorted(p.name for p in tmpdir.iterdir())}"
    finally:
        tmpdir.rmdir()
        tmpdir.parent.rmdir()


def test_rank_temp_dirs_leave_room_for_sockets_and_fall_back_to_tmp(monkeypatch: pytest.MonkeyPatch) -> None:
    for length, under_it in ((40, True), (55, True), (90, False)):
        tmpdir = _long_tmpdir(length)
        monkeypatch.setattr(tempfile, "tempdir", str(tmpdir))
        made = short_tempdir("ddpc-")
        try:
            assert len(made) + SOCKET_ROOM <= SOCKET_PATH_MAX, made
            assert (Path(made).parent == tmpdir) is under_it, made
        finally:
            os.rmdir(made)
            tmpdir.rmdir()
            tmpdir.parent.rmdir()


# 8. exit handlers and the resource tracker run; nothing left in /dev/shm -------------------------------


def _segments() -> set[str]:
    return {p.name for p in SHM.iterdir() if p.name.startswith(SHM_PREFIX)} if SHM.is_dir() else set()


@pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm on this system")
@pytest.mark.parametrize("mode", ["ranks", "simulate"])
def test_shared_memory_freed_at_exit_leaves_nothing_behind(tmp_path: Path, mode: str) -> None:
    before = _segments()
    args = ("--world-sizes", "1,2", *(("--simulate",) if mode == "simulate" else ()))
    proc = _cli("good_shared_memory_atexit.py", tmp_path, *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert _segments() - before == set(), "a rank's shared memory outlived the run"


@pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm on this system")
def test_torchrun_frees_the_same_segments(tmp_path: Path) -> None:
    """The truth the test above holds ddpcheck to: a real launch runs atexit and the resource tracker."""
    before = _segments()
    ranks = _torchrun("shared_memory", tmp_path)
    assert [r["rank"] for r in ranks] == [0, 1] and all("error" not in r for r in ranks)
    assert _segments() - before == set()


_MARK = "DDPCHECK_TEST_ATEXIT_MARK"


def _parent_handler() -> None:
    path = os.environ.get(_MARK)
    if path:
        Path(path, f"parent-handler-{os.getpid()}").touch()


def _registers_its_own_handler(marks: str) -> int:
    import atexit

    atexit.register(lambda: Path(marks, f"rank-handler-{os.getpid()}").touch())
    return os.getpid()


def test_a_rank_runs_its_own_exit_handlers_and_never_the_parents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import atexit

    monkeypatch.setenv(_MARK, str(tmp_path))
    atexit.register(_parent_handler)  # registered before the fork: inherited by every forked rank
    try:
        result = run_ranks(
            GroupCall(_registers_its_own_handler, 2, kwargs={"marks": str(tmp_path)}, timeout=60)
        )
    finally:
        atexit.unregister(_parent_handler)
    result.raise_for_failures()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(f"rank-handler-{pid}" for pid in result.values), names


# 2. hash()-based sharding: ranks as fresh interpreters have their own hash seeds ----------------------


def test_torchrun_ranks_disagree_on_hash_sharded_files(tmp_path: Path) -> None:
    """The truth: under torchrun each rank hashes with its own seed, so the files are no partition
    (the chance that two random seeds happen to split 16 files exactly is 2**-16)."""
    ranks = _torchrun("hash_files", tmp_path)
    files = [set(r["files"]) for r in ranks]
    assert files[0] & files[1] or files[0] | files[1] != set(range(16)), files


def test_ddpcheck_fails_hash_sharded_files_as_torchrun_does(tmp_path: Path) -> None:
    proc = _cli("bug_hash_file_sharding.py", tmp_path, "--world-sizes", "1,2")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "ddpcheck.json").read_text())
    (ws2,) = [run for run in report["runs"] if run["world_size"] == 2]
    failed = {name for name, check in ws2["checks"].items() if check["status"] == "fail"}
    # each rank keeps each of the 16 files with probability 1/2 under its own hash seed: a file on both
    # ranks and a file on neither are each missing in about 1% of launches, never both (0.0015%)
    assert failed & {"coverage", "no_overlap"}, failed


def test_a_fixed_hash_seed_makes_hash_sharding_agree_in_both(tmp_path: Path) -> None:
    ranks = _torchrun("hash_files", tmp_path, env={"PYTHONHASHSEED": "0"})
    files = [set(r["files"]) for r in ranks]
    assert not files[0] & files[1] and files[0] | files[1] == set(range(16)), files
    proc = _cli("bug_hash_file_sharding.py", tmp_path, "--world-sizes", "1,2", env={"PYTHONHASHSEED": "0"})
    report = json.loads((tmp_path / "ddpcheck.json").read_text())
    (ws2,) = [run for run in report["runs"] if run["world_size"] == 2]
    assert ws2["checks"]["coverage"]["status"] == "pass" and ws2["checks"]["no_overlap"]["status"] == "pass"
    assert proc.returncode in (0, 1)  # equal_steps follows the split seed 0 gives (8/8 or not)


def test_crc32_sharded_files_pass_and_stay_forked(tmp_path: Path) -> None:
    truth = _torchrun("crc32_files", tmp_path)
    files = [set(r["files"]) for r in truth]
    assert not files[0] & files[1] and files[0] | files[1] == set(range(16)), files
    proc = _cli("good_crc32_file_sharding.py", tmp_path, "--world-sizes", "1,2,4")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _hash_of_a_name() -> int:
    return hash("data/part-0000.parquet")


def _sum_of_numbers() -> int:
    return hash((1, 2.5)) + len(str(uuid.uuid4()))


def test_ranks_that_hash_strings_run_again_as_fresh_interpreters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    result = run_ranks(GroupCall(_hash_of_a_name, 2, timeout=120))
    result.raise_for_failures()
    assert result.fresh_interpreters == FRESH_NOTE
    assert result.values[0] != result.values[1], "fresh ranks hash with their own seeds"
    plain = run_ranks(GroupCall(_sum_of_numbers, 2, timeout=60))
    plain.raise_for_failures()
    assert plain.fresh_interpreters == "", "no string hashed: the forked ranks stand"


def test_a_fixed_hash_seed_keeps_forked_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    result = run_ranks(GroupCall(_hash_of_a_name, 2, timeout=60))
    result.raise_for_failures()
    assert result.fresh_interpreters == "" and result.values[0] == result.values[1]
