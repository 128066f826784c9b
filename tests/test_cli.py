"""The command line: bad usage is one line and exit 2; reports land where asked, in every format.

Usage errors are checked in-process (``cli.main(argv)``, as argparse and the options' validation run
before any rank starts); a few tests start the real command to see its exit codes end to end.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ddpcheck.cli import build_parser, main, parse
from ddpcheck.progress import PlainDisplay
from ddpcheck.verdict import DATA_CHECKS
from tests.conftest import GOOD, ROOT


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ddpcheck", *args], capture_output=True, text=True, timeout=180, cwd=cwd
    )


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No DDPCHECK_* variable and no pyproject.toml of the caller's: the built-in defaults."""
    import os

    for name in [k for k in os.environ if k.startswith("DDPCHECK_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """``main(argv)`` in this process: exit 2 and exactly one line on stderr, which is returned."""
    code = main(list(argv))
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--world-sizes", "0"], "world sizes must be positive integers"),
        (["--world-sizes", "1,two"], "world sizes must be comma-separated integers"),
        (["--epochs", "0"], "must be from 1 to"),
        (["--timeout", "-1"], "must be positive"),
        (["--backend", "mpi"], "invalid choice: 'mpi'"),
        (["--backend", "nccl"], "backend nccl needs CUDA"),
        (["--format", "html"], "invalid choice: 'html'"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(
    clean_env: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert message in usage_error(capsys, str(GOOD), "--report-dir", str(clean_env), *args)


def test_the_real_command_exits_2_on_bad_usage(tmp_path: Path) -> None:
    """End to end, in a process of its own: the exit code and the one line reach the shell."""
    proc = _cli(str(GOOD), "--report-dir", str(tmp_path), "--world-sizes", "0")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "ddpcheck: error: world sizes must be positive integers, got 0"
    ]


def test_missing_loader_file_is_exit_2(clean_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = usage_error(capsys, str(clean_env / "nope.py"), "--report-dir", str(clean_env))
    assert line == f"ddpcheck: error: loader file not found: {clean_env / 'nope.py'}"


def test_unwritable_report_dir_is_exit_2_before_any_rank_runs(
    clean_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = clean_env / "file.txt"
    blocker.write_text("not a directory")
    line = usage_error(capsys, str(GOOD), "--report-dir", str(blocker / "reports"))
    assert "cannot write reports to" in line  # failed fast, nothing was launched (one line only)


def test_json_on_stdout_matches_the_report_file_and_junit_is_written(tmp_path: Path) -> None:
    junit = tmp_path / "junit" / "ddpcheck.xml"
    proc = _cli(str(GOOD), "--world-sizes", "1,2", "--report-dir", str(tmp_path), "--format", "json",
                "--junit", str(junit), "--quiet")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    assert printed == json.loads((tmp_path / "ddpcheck.json").read_text())
    assert printed["ok"] is True and [r["world_size"] for r in printed["runs"]] == [1, 2]
    assert (tmp_path / "ddpcheck.md").read_text().startswith("#")
    suite = ET.parse(junit).getroot()
    cases = suite.findall(".//testcase")
    assert len(cases) == 2 * (len(DATA_CHECKS) + 2)  # the data checks, replica consistency and resume, per ws
    assert not suite.findall(".//failure")
    skipped = [c.get("name") or "" for c in cases if c.find("skipped") is not None]
    assert any("resume" in name for name in skipped), skipped  # n/a (no state to resume) is <skipped>


def test_default_report_dir_is_reports_in_the_working_directory(tmp_path: Path) -> None:
    proc = _cli(str(GOOD), "--world-sizes", "1", "--quiet", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "reports" / "ddpcheck.json").exists()
    assert "ws" in proc.stdout and "PASS" in proc.stdout


# --- --help: grouped, every default once, aliases ---


def _help() -> str:
    return build_parser().format_help()


def test_help_shows_no_empty_or_doubled_default() -> None:
    text = " ".join(_help().split())
    assert "(default: )" not in text
    for action in build_parser()._actions:
        if action.help:
            shown = build_parser().formatter_class("ddpcheck")._get_help_string(action) or ""  # type: ignore[attr-defined]
            shown = shown.replace("%(default)s", str(action.default))
            assert shown.count("(default") + shown.count("; default") <= 1, (action.option_strings, shown)
    assert "(default: 1,2,3,4)" in text and "(default: make_loader)" in text and "(default: 120.0)" in text


def test_help_groups_the_options() -> None:
    titles = [group.title for group in build_parser()._action_groups]
    for title in ("layout", "loader", "resume", "work balance and packing", "reports"):
        assert title in titles
    by_title = {
        g.title: {o for a in g._group_actions for o in a.option_strings}
        for g in build_parser()._action_groups
    }
    assert {"--world-sizes", "--mesh", "--data-dims"} <= by_title["layout"]
    assert {"--factory", "--factory-arg", "--epochs"} <= by_title["loader"]
    assert {"--elastic", "--resume-workers", "--no-resume"} <= by_title["resume"]
    assert {"--report-dir", "--format", "--quiet", "--allow"} <= by_title["reports"]


def test_q_is_quiet_and_allow_takes_a_comma_list(clean_env: Path) -> None:
    args = parse(["x.py", "-q", "--allow", "reshuffle,determinism", "--allow", "coverage"])
    assert args.quiet is True
    assert args.allow == ["reshuffle", "determinism", "coverage"]
    assert parse(["x.py", "--quiet"]).quiet is True and parse(["x.py"]).allow == []


def test_allow_refuses_an_unknown_id_in_its_list(clean_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = usage_error(capsys, str(GOOD), "--allow", "reshuffle,reshufle", "--report-dir", str(clean_env))
    assert "unknown check id for --allow: reshufle" in line


def test_pyproject_allow_takes_a_comma_list_too(clean_env: Path) -> None:
    (clean_env / "pyproject.toml").write_text(
        '[tool.ddpcheck]\nallow = ["reshuffle,coverage", "determinism"]\n'
    )
    assert parse(["x.py"]).allow == ["reshuffle", "coverage", "determinism"]


def test_the_docs_synopsis_lists_every_option() -> None:
    page = (ROOT / "docs" / "command-line.md").read_text(encoding="utf-8")
    section = page[page.index("## Synopsis") :]
    synopsis = section[section.index("```text") : section.index("```", section.index("```text") + 7)]
    listed = set(re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", synopsis)) - {"-m"}  # python -m ddpcheck
    options = {o for a in build_parser()._actions for o in a.option_strings}
    assert options - listed == set()
    assert listed - options == set()


def test_the_docs_name_only_json_fields_that_exist() -> None:
    """README once pointed at a ``recorded`` field that the JSON report never had (the README and every
    docs page)."""
    from ddpcheck.report import json_report

    for page in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))):
        text = " ".join(page.read_text(encoding="utf-8").split())
        named = re.findall(r"JSON report's `(\w+)`", text)
        for field in named:
            assert f'"{field}"' in (json_report.__doc__ or ""), f"{page.name}: {field}"
        assert "`recorded`" not in text, page.name


# --- progress: never past the end, and the rerun named as one ---


def _plain(epochs: int = 1) -> tuple[PlainDisplay, io.StringIO]:
    """Plain progress lines into a string; a clock that moves with every line (no line is held back)."""
    stream = io.StringIO()
    display = PlainDisplay(stream, epochs=epochs)
    display.clock = lambda: 1000.0 + 100 * len(stream.getvalue())  # type: ignore[method-assign]
    return display, stream


def test_progress_never_says_a_batch_past_the_total() -> None:
    from ddpcheck.progress import parse_position

    assert parse_position("epoch 0, batch 16/16").label == "epoch 0 batch 16/16"
    past = parse_position("epoch 0, batch 17/16")
    assert past.label == "epoch 0 batch 17" and "17/16" not in past.batch_text
    display, stream = _plain()
    display.update(["epoch 0, batch 17/16", "epoch 0, batch 3/16"], 2.0, False)
    assert "17/16" not in stream.getvalue() and "batch 17" in stream.getvalue()


def test_the_recorder_announces_no_batch_beyond_the_loaders_length() -> None:
    """``batch 17/16`` came from announcing the fetch that ends the epoch: the total goes once past it."""
    import inspect

    from ddpcheck.checker.running import Stream

    source = inspect.getsource(Stream.record)
    (line,) = [line for line in source.splitlines() if "report_progress(" in line]
    assert "count < n" in line


def test_a_determinism_rerun_is_labelled_as_one() -> None:
    display, stream = _plain()
    ranks = ["epoch 0, batch 2/4", "epoch 0, batch 2/4"]
    display.message("ddpcheck: world size 2: running 2 ranks")
    display.update(ranks, 2.0, False)
    display.update(ranks, 3.0, True)
    display.update(ranks, 2.0, False)  # the same size again: the rerun
    lines = stream.getvalue().splitlines()
    assert lines[1].startswith("ddpcheck: world size 2: epoch 0") and "rerun" not in lines[1]
    assert lines[-1].startswith("ddpcheck: world size 2 (determinism rerun): epoch 0")
    display.update(ranks, 3.0, True)
    display.message("ddpcheck: mesh dp=1,tp=2: running 2 ranks")
    display.update(ranks, 2.0, False)  # another layout's first run
    assert "rerun" not in stream.getvalue().splitlines()[-1]


def test_the_terminal_says_in_one_line_what_does_not_apply_and_v_lists_why(
    clean_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fast = ["--no-determinism", "--no-resume", "--train-steps", "0", "--no-metrics", "-q"]
    args = [str(GOOD), "--world-sizes", "1", "--report-dir", str(clean_env / "r"), *fast]
    assert main(args) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("Not applicable")]
    assert lines == [next(line for line in out.splitlines() if line.startswith("Not applicable: "))]
    assert "-v prints them" in out and "r/ddpcheck.md" in out
    assert "### Not applicable" in (clean_env / "r" / "ddpcheck.md").read_text()  # the file lists them
    assert main([*args, "-v"]) == 0
    assert "Not applicable\n--------------" in capsys.readouterr().out


@pytest.mark.parametrize("where", ["below-a-file", "in-proc"])
def test_record_out_that_cannot_hold_traces_is_one_line_and_exit_2(tmp_path: Path, where: str) -> None:
    """``python -m ddpcheck.record --out DIR`` where DIR cannot be made (a file in the way) or written
    (/proc, which refuses a new folder even to root) is one line and exit 2 before the
    script runs, never a traceback."""
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a directory")
    out = str(blocker / "traces") if where == "below-a-file" else "/proc/ddpcheck-traces"
    script = ROOT / "fixtures" / "scripts" / "ddp_good.py"
    proc = subprocess.run(
        [sys.executable, "-m", "ddpcheck.record", "--out", out, "--", str(script)],
        capture_output=True, text=True, timeout=180, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ddpcheck.record: --out {out}: "), lines
