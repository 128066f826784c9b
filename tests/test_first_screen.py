"""The first screen of ``ddpcheck run`` (issue 44 item 7): loaders named as the script names them, a grid
that fits 100 columns whatever the number of loaders and layouts, the reasons checks do not apply folded
into one line on the terminal (every report file keeps them).

The naming runs a real script's DataLoaders under the recorder's watchers in this process; the grids are
rendered from plain results; the end-to-end tests run ``ddpcheck run`` on fixture scripts whose truth is
measured under torchrun (``fixtures/scripts/truth_results.jsonl``).
"""

from __future__ import annotations

import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from ddpcheck.checker.script import ScriptRecorder, ScriptRecordOptions
from ddpcheck.checker.watch import watching
from ddpcheck.checks.ids import ALL_CHECKS
from ddpcheck.checks.verdict import Verdict
from ddpcheck.launch.userfiles import show_paths_from
from ddpcheck.layout import Layout
from ddpcheck.report.table import render_table
from ddpcheck.report.view import loader_names
from ddpcheck.result import CheckResult, WorldResult
from tests.conftest import ROOT

SCRIPTS = ROOT / "fixtures" / "scripts"
TRUTH = {
    line["script"]: line["facts"]
    for line in map(json.loads, (SCRIPTS / "truth_results.jsonl").read_text().splitlines())
}

# --- naming: the variable the user's line assigns the loader to ---------------------------------------------

SCRIPT = """\
from torch.utils.data import DataLoader


def make_loader(data):
    return DataLoader(data, batch_size=4)


def pair(a, b):
    return DataLoader(a, batch_size=4), DataLoader(b, batch_size=4)


def train():
    loader = DataLoader(list(range(8)), batch_size=4)
    list(loader)


def evaluate():
    loader = DataLoader(list(range(6)), batch_size=4)
    list(loader)


class Holder:
    pass


train_loader = DataLoader(
    list(range(10)),
    batch_size=4,
)
val_loader = make_loader(list(range(12)))
first, second = pair(list(range(14)), list(range(16)))
holder = Holder()
holder.test_loader = DataLoader(list(range(18)), batch_size=4)
loaders = {}
loaders["extra"] = DataLoader(list(range(20)), batch_size=4)
print(len(DataLoader(list(range(22)), batch_size=4)))
train()
evaluate()
for each in (train_loader, val_loader, first, second, holder.test_loader, loaders["extra"]):
    list(each)
"""


def _line(text: str) -> int:
    return next(i for i, line in enumerate(SCRIPT.splitlines(), 1) if text in line)


def test_a_loader_is_named_by_the_variable_its_line_assigns(tmp_path: Path) -> None:
    """Real DataLoaders built by a real script under the recorder's watchers: a statement over several
    lines, a helper's return followed to its caller's variable, a returned pair, an attribute, a dict key;
    two ``loader`` variables in two functions; a line that assigns none. Sites are relative to the folder
    paths are shown from (the script's, in a rank)."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    recorder = ScriptRecorder(ScriptRecordOptions(epochs=5, model_steps=None))
    show_paths_from(str(tmp_path))
    try:
        with watching(recorder):
            runpy.run_path(str(script), run_name="__main__")
        recorder.finish()
    finally:
        show_paths_from("")
    named = {loader.name: loader.variable for loader in recorder.traces()}
    helper, returned = _line("return DataLoader(data"), _line("return DataLoader(a, ")
    assert named == {
        f"train.py:{_line('loader = DataLoader(list(range(8))')}": "loader",
        f"train.py:{_line('loader = DataLoader(list(range(6))')}": "loader",
        f"train.py:{_line('train_loader = DataLoader(')}": "train_loader",
        f"train.py:{helper}": "val_loader",
        f"train.py:{returned}": "first",
        f"train.py:{returned}#2": "second",
        f"train.py:{_line('holder.test_loader =')}": "test_loader",
        f"train.py:{_line('loaders[')}": "extra",
    }
    unnamed = f"train.py:{_line('print(len(DataLoader(')}"
    assert recorder.variables[unnamed] == ""  # built, never iterated: no trace, and no name to give


def test_the_reports_name_a_loader_by_its_variable_and_by_its_line_where_two_share_it() -> None:
    runs = [
        WorldResult(1, "gloo", loader="train.py:40", loader_variable="train_loader"),
        WorldResult(1, "gloo", loader="train.py:12", loader_variable="loader"),
        WorldResult(1, "gloo", loader="train.py:20", loader_variable="loader"),
        WorldResult(1, "gloo", loader="train.py:90"),  # the Trainer's own loader: its line alone
        WorldResult(2, "gloo", loader="train.py:40", loader_variable="train_loader"),
    ]
    assert loader_names(runs) == {
        "train.py:40": "train_loader",
        "train.py:12": "loader (train.py:12)",
        "train.py:20": "loader (train.py:20)",
        "train.py:90": "train.py:90",
    }


# --- the grid fits the width ------------------------------------------------------------------------------

SCRIPT_CHECKS = (
    "coverage", "no_overlap", "padding_bound", "equal_steps", "reshuffle", "determinism",
    "single_process_equivalence", "supervision", "rng_independence", "step_equivalence", "equal_microsteps",
)  # fmt: skip
NOT_APPLICABLE = ("replica_consistency", "batch_integrity", "worker_sharding", "work_balance", "packing")


def _script_result(loaders: dict[str, str], layouts: list[Layout]) -> CheckResult:
    """Every loader passing every check a script's run judges, at every layout; five checks n/a."""
    verdicts = (
        *(Verdict(check, "pass") for check in SCRIPT_CHECKS),
        *(Verdict(check, "n/a", f"{check} does not apply: a reason") for check in NOT_APPLICABLE),
    )  # fmt: skip
    runs = tuple(
        WorldResult(layout.world_size, "gloo", verdicts, layout=layout, loader=site, loader_variable=variable)
        for layout in layouts
        for site, variable in loaders.items()
    )
    return CheckResult("train.py", runs, options={"script": "train.py"})


def _widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


def _widest_above_the_summary(text: str) -> int:
    """The summary line stays one line, whatever its width (what a CI log is searched for); with ten
    world sizes it lists them all."""
    return _widest(text.rsplit("\n", 1)[0])


def test_two_loaders_get_a_column_and_the_reasons_one_line() -> None:
    result = _script_result(
        {"train.py:35": "train", "train.py:36": "valid"}, [Layout.plain(1), Layout.plain(2)]
    )
    text = render_table(result, width=100, not_applicable_in="reports/ddpcheck.md")
    assert _widest(text) <= 100, text
    grid = [line for line in text.splitlines() if re.match(r"(train|valid|\s+)\s+[12]\s+PASS", line)]
    rows = [line.split()[:2] for line in grid]
    assert rows == [["train", "1"], ["2", "PASS"], ["valid", "1"], ["2", "PASS"]], text  # each loader once
    assert "Not applicable\n" not in text and "does not apply: a reason" not in text
    assert "the 5 reasons are in reports/ddpcheck.md (-v prints them)" in " ".join(text.split())
    verbose = render_table(result, width=100)  # -v: every reason, as the report files
    assert verbose.count("does not apply: a reason") == len(NOT_APPLICABLE)


def test_long_loader_names_go_above_their_rows_and_many_layouts_fit() -> None:
    """Names too long for a column of their own head their rows; ten layouts of four loaders still fit 100
    columns; at 60 columns the grid turns, a table per loader, cut where its layouts do not fit."""
    loaders = {f"very/long/path/to/the/training/module_{n}.py:{n}": "loader" for n in range(4)}
    layouts = [Layout.plain(n) for n in (1, 2, 3, 4, 5, 6, 7, 8, 16, 32)]
    result = _script_result(loaders, layouts)
    text = render_table(result, width=100, not_applicable_in="reports/ddpcheck.md")
    assert _widest_above_the_summary(text) <= 100, text
    for site in loaders:
        assert f"loader ({site})" in text.splitlines(), text  # a line of its own
    assert text.count("PASS") >= len(loaders) * len(layouts) * 9
    narrow = render_table(result, width=60, not_applicable_in="reports/ddpcheck.md")
    assert _widest_above_the_summary(narrow) <= 60, narrow
    for site in loaders:
        assert f"loader ({site})" in narrow.splitlines(), narrow
    assert all(f"ws={n}" in narrow for n in (1, 8, 32))


def test_a_loader_files_tall_grid_is_cut_where_its_layouts_do_not_fit() -> None:
    verdicts = tuple(Verdict(check, "pass") for check in ALL_CHECKS)
    runs = tuple(WorldResult(n, "gloo", verdicts, layout=Layout.plain(n)) for n in range(1, 13))
    text = render_table(CheckResult("loader.py", runs), width=100, layout="tall")
    assert _widest_above_the_summary(text) <= 100, text
    assert all(f"ws={n}" in text for n in range(1, 13))


# --- end to end ---------------------------------------------------------------------------------------------


def _run(args: list[str], cwd: Path, report: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "100", "NO_COLOR": "1"}
    command = [sys.executable, "-m", "ddpcheck", "run", "--world-sizes", "1,2", "--no-determinism",
               "--report-dir", str(report), *args]  # fmt: skip
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_a_passing_two_loader_script_fits_100_columns_with_no_reason_lines(tmp_path: Path) -> None:
    """fixtures/scripts/ddp_good.py (truth: nothing missed or shared, a train and an eval loader): named
    ``train`` and ``valid`` as the script names them, nothing wider than 100 columns, one line for what
    does not apply; the Markdown and JSON reports keep every reason."""
    assert not TRUTH["ddp_good"]["train"]["missed"] and not TRUTH["ddp_good"]["train"]["shared"]
    proc = _run(["--", "fixtures/scripts/ddp_good.py", "--epochs", "2"], ROOT, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _widest(proc.stdout) <= 100, proc.stdout
    assert "Not applicable\n" not in proc.stdout and "DataLoader workers" not in proc.stdout, proc.stdout
    assert re.search(r"^Not applicable: .*\(-v prints them\)$", " ".join(proc.stdout.split("\n    ")), re.M)
    data = json.loads((tmp_path / "ddpcheck.json").read_text())
    assert {run["loader"] for run in data["runs"]} == {"train", "valid"}
    reasons = [v["detail"] for run in data["runs"] for v in run["checks"].values() if v["status"] == "n/a"]
    assert any("DataLoader workers" in reason for reason in reasons), reasons
    markdown = (tmp_path / "ddpcheck.md").read_text()
    assert "Not applicable" in markdown and "DataLoader workers" in markdown


@pytest.mark.slow
def test_two_loaders_sharing_a_variable_get_their_lines_relative_to_the_scripts_folder(
    tmp_path: Path,
) -> None:
    """fixtures/scripts/shared_names.py, run from another folder by its absolute path: both loaders are
    ``loader``, so each is followed by the line that built it, named from the script's folder in every
    report (never ``../..`` up from where ddpcheck ran, nor the whole path)."""
    truth = TRUTH["shared_names"]
    assert not any(truth[name]["missed"] or truth[name]["shared"] for name in ("train", "valid"))
    script = SCRIPTS / "shared_names.py"
    train = next(i for i, line in enumerate(script.read_text().splitlines(), 1) if "sampler=sampler)" in line)
    valid = next(i for i, line in enumerate(script.read_text().splitlines(), 1) if "shuffle=False))" in line)
    names = {f"loader (shared_names.py:{train})", f"loader (shared_names.py:{valid})"}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = _run(["--", str(script)], elsewhere, tmp_path / "reports")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _widest(proc.stdout) <= 100, proc.stdout
    assert names <= set(proc.stdout.splitlines()), proc.stdout  # each heads its rows
    data = json.loads((tmp_path / "reports" / "ddpcheck.json").read_text())
    assert {run["loader"] for run in data["runs"]} == names
    html = (tmp_path / "reports" / "ddpcheck.html").read_text()
    assert all(name in html for name in names)
    assert "../" not in html and str(SCRIPTS) + "/shared_names.py:" not in html
