"""The training step in the reports (issue 35): the compared steps of a real verdict (the step checks run
on StepTraces built from a fixture's torchrun truth logs) as one view, formatted in Markdown, HTML (a bar
per step against the tolerance, read back from the DOM a headless chromium builds) and JSON."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ddpcheck.checks.step import check_step_equivalence
from ddpcheck.layout import Layout
from ddpcheck.report import render_html, render_markdown, write_reports
from ddpcheck.report.view import build_view
from ddpcheck.result import CheckResult, RunRecord, ScriptRun, WorldResult
from ddpcheck.verdict import STEP_EQUIVALENCE
from tests.step_builders import load, step_trace

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _result(name: str) -> CheckResult:
    log = load(name, 2)
    runs = [step_trace(r) for r in log["ranks"]]
    verdict = check_step_equivalence(runs, step_trace(log["replay"], loss_scale="mean"), Layout.plain(2))
    world = WorldResult(2, "gloo", (verdict,), loader="train.py:23")
    return CheckResult(loader=f"{name}.py", runs=(world,), options=RunRecord(script=ScriptRun(f"{name}.py")))


def test_the_compared_steps_are_one_view_in_every_format(tmp_path: Path) -> None:
    result = _result("bug_rank_mean_ce")
    verdict = result.runs[0].verdicts[0]
    assert verdict.check == STEP_EQUIVALENCE and verdict.status == "fail"
    (table,) = build_view(result).step_tables
    truth = json.loads(
        next(line for line in (Path(__file__).parent.parent / "fixtures/steps/truth_results.jsonl").open()
             if '"bug_rank_mean_ce", "nproc": 2' in line)
    )["facts"]  # fmt: skip
    assert [round(s.rel or 0, 4) for s in table.steps] == [round(p["rel_diff"], 4) for p in truth["per_step"]]
    assert [list(s.supervised) for s in table.steps] == [
        [a, b] for a, b in zip(*truth["supervised_per_step"].values(), strict=True)
    ]
    markdown = render_markdown(result)
    assert "### Training step" in markdown
    lines = [re.sub(r"\s+", " ", line) for line in markdown.splitlines()]
    assert f"| {' | '.join(table.cells()[0])} |" in lines  # the first compared step's row, as the view says
    html = render_html(result)
    bars = re.findall(r'<rect class="step-diff"[^>]*fill="(#[0-9a-f]+)"', html)
    assert bars == ["#d62728"] * len(table.steps)  # every step past the tolerance: red
    good = render_html(_result("good_global_token_mean"))
    assert set(re.findall(r'<rect class="step-diff"[^>]*fill="(#[0-9a-f]+)"', good)) == {"#4e79a7"}
    write_reports(result, tmp_path, formats=("json",))
    saved = json.loads((tmp_path / "ddpcheck.json").read_text())["runs"][0]["checks"][STEP_EQUIVALENCE]
    assert [s["index"] for s in saved["data"]["steps"]] == [s.index for s in table.steps]
    # the typed evidence is written in the shape the JSON schema documents
    assert list(saved["data"]) == ["tolerance", "dtype", "loss_scale", "steps"]
    assert list(saved["data"]["steps"][0]) == ["index", "rel", "micro", "samples", "supervised"]
    assert saved["data"]["steps"][0]["supervised"] == list(table.steps[0].supervised or ())


def test_the_step_picture_loads_in_chromium(tmp_path: Path) -> None:
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (CI installs Debian's chromium in .ci/run)")
    write_reports(_result("bug_rank_mean_ce"), tmp_path, formats=("html",))
    command = [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run"]
    command += [
        f"--user-data-dir={tmp_path / 'profile'}",
        "--dump-dom",
        (tmp_path / "ddpcheck.html").as_uri(),
    ]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=90, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    section = proc.stdout.split('<section class="step"', 1)[1].split("</section>", 1)[0]
    assert len(re.findall(r'<rect class="step-diff"', section)) == 4  # the four compared steps, as built
    assert "<h2>Training step</h2>" in proc.stdout
