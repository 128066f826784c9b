"""The command line behaves like the tools users live in: --version, --help, -v, colour, config files,
environment variables, GitHub annotations, one-line errors for every bad input, and signals.

Usage and configuration errors are checked in-process (``cli.main(argv)``); the tests that need a real
process (exit codes, signals, closed streams, a loader that runs) start one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import pytest

from ddpcheck.cli import MAX_REAL_RANKS, build_parser, main, parse, use_color
from ddpcheck.report.github import escape_data, escape_property, factory_line
from tests.conftest import GOOD, ROOT

BUG = ROOT / "fixtures" / "bug_ignores_rank.py"
FAST = ("--no-determinism", "--no-resume", "--train-steps", "0", "--no-metrics")


def _cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    dropped = ("DDPCHECK_", "NO_COLOR", "FORCE_COLOR", "COLUMNS")
    base = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    return subprocess.run(
        [sys.executable, "-m", "ddpcheck", *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
        env={**base, **(env or {})},
    )


def _one_line_error(proc: subprocess.CompletedProcess[str], needle: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert needle in lines[0]


@pytest.fixture
def here(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """In-process runs as ``_cli`` starts them: no DDPCHECK_* or colour variables, cwd ``tmp_path``."""
    for name in [k for k in os.environ if k.startswith(("DDPCHECK_", "NO_COLOR", "FORCE_COLOR", "COLUMNS"))]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _main_error(capsys: pytest.CaptureFixture[str], needle: str, *argv: str) -> str:
    """``main(argv)`` in this process: exit 2, one line on stderr holding ``needle``, no traceback."""
    code = main(list(argv))
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert needle in lines[0], lines[0]
    return lines[0]


# --- 1. conventions ---


def test_version_comes_from_the_package_metadata() -> None:
    proc = _cli("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"ddpcheck {version('ddpcheck')}"


def test_help_shows_every_option_with_help_and_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    assert "(default: 1,2,3,4)" in text and "(default: 120.0)" in text and "(default: make_loader)" in text
    for action in build_parser()._actions:
        assert action.help, f"{action.option_strings} has no help"


def test_verbose_shows_the_traceback_of_bad_input(tmp_path: Path) -> None:
    bad = ROOT / "fixtures" / "bad" / "syntax_error.py"
    quiet = _cli(str(bad), "--report-dir", str(tmp_path))
    loud = _cli(str(bad), "--report-dir", str(tmp_path), "-v")
    assert quiet.returncode == loud.returncode == 2
    assert "Traceback" not in quiet.stderr and "Traceback" in loud.stderr
    assert loud.stderr.strip().splitlines()[-1] == quiet.stderr.strip()


def test_verbose_shows_crashed_ranks_tracebacks(tmp_path: Path) -> None:
    crash = ROOT / "fixtures" / "faults" / "factory_raises_on_rank1.py"
    args = (str(crash), "--world-sizes", "2", "--report-dir", str(tmp_path), "--quiet", *FAST)
    quiet, loud = _cli(*args), _cli(*args, "-v")
    assert quiet.returncode == loud.returncode == 3, loud.stderr
    assert "Traceback" not in quiet.stderr
    assert "--- world size 2, rank 1" in loud.stderr and "Traceback" in loud.stderr


@pytest.mark.parametrize(
    "choice,env,tty,expected",
    [
        ("auto", {}, True, True),
        ("auto", {}, False, False),
        ("auto", {"NO_COLOR": "1"}, True, False),
        ("auto", {"FORCE_COLOR": "1"}, False, True),
        ("auto", {"FORCE_COLOR": "0"}, False, False),
        ("auto", {"NO_COLOR": "1", "FORCE_COLOR": "1"}, True, False),
        ("always", {"NO_COLOR": "1"}, False, True),
        ("never", {"FORCE_COLOR": "1"}, True, False),
    ],
)
def test_colour_choice(choice: str, env: dict[str, str], tty: bool, expected: bool) -> None:
    class Stream:
        def isatty(self) -> bool:
            return tty

    assert use_color(choice, Stream(), env) is expected  # type: ignore[arg-type]


def test_colour_and_width_reach_the_table(tmp_path: Path) -> None:
    args = (str(GOOD), "--world-sizes", "1", "--report-dir", str(tmp_path), "--quiet", *FAST)
    plain = _cli(*args, env={"COLUMNS": "60"})
    forced = _cli(*args, env={"FORCE_COLOR": "1", "COLUMNS": "60"})
    never = _cli(*args, "--color", "never", env={"FORCE_COLOR": "1"})
    assert "\x1b[" not in plain.stdout and "\x1b[" in forced.stdout and "\x1b[" not in never.stdout
    body = plain.stdout.strip().splitlines()[1:-1]  # the title and summary lines are not wrapped (yet)
    assert max(len(line) for line in body) <= 60, plain.stdout
    wide = _cli(*args, env={"COLUMNS": "200"})
    assert wide.returncode == plain.returncode == 0
    assert max(len(line) for line in wide.stdout.strip().splitlines()[1:-1]) > 60  # the grid turned


# --- 2. configuration ---


def test_pyproject_then_environment_then_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[tool.ddpcheck]\nworld-sizes = [1, 3]\nepochs = 4\nallow = ["reshuffle"]\n'
        'report-dir = "out"\nload-data = true\n'
    )
    sub = tmp_path / "deep" / "er"
    sub.mkdir(parents=True)
    for name in [k for k in os.environ if k.startswith("DDPCHECK_")]:
        monkeypatch.delenv(name)
    args = parse(["x.py"], cwd=sub)
    assert (args.world_sizes, args.epochs, args.allow, args.load_data) == ((1, 3), 4, ["reshuffle"], True)
    assert args.report_dir == tmp_path / "out"  # relative to the file, not the working directory
    assert args.option_sources["epochs"] == "pyproject.toml"
    assert args.option_sources["timeout"] == "default"
    assert args.config_file == str(tmp_path / "pyproject.toml")
    monkeypatch.setenv("DDPCHECK_EPOCHS", "5")
    monkeypatch.setenv("DDPCHECK_WORLD_SIZES", "2,4")
    args = parse(["x.py", "--world-sizes", "1", "--allow", "coverage"], cwd=sub)
    assert (args.epochs, args.world_sizes, args.allow) == (5, (1,), ["coverage"])
    assert args.option_sources["epochs"] == "env DDPCHECK_EPOCHS"
    assert args.option_sources["world_sizes"] == "command line"


def test_a_nearer_pyproject_without_the_table_is_passed_over(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.ddpcheck]\nepochs = 3\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "pyproject.toml").write_text('[project]\nname = "pkg"\n')
    args = parse(["x.py"], cwd=tmp_path / "pkg")
    assert args.epochs == 3 and args.config_file == str(tmp_path / "pyproject.toml")


def test_option_sources_land_in_the_json_report(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.ddpcheck]\nworld-sizes = [1]\nquiet = true\n")
    proc = _cli(str(GOOD), "--format", "json", *FAST, cwd=tmp_path, env={"DDPCHECK_EPOCHS": "1"})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    sources = report["options"]["option_sources"]
    assert sources["world_sizes"] == "pyproject.toml" and sources["epochs"] == "env DDPCHECK_EPOCHS"
    assert sources["no_determinism"] == "command line"
    assert report["epochs"] == 1 and [r["world_size"] for r in report["runs"]] == [1]


@pytest.mark.parametrize(
    "table,env,needle",
    [
        ("wrld-sizes = [1]", {}, "[tool.ddpcheck] wrld-sizes: unknown key"),
        ("epochs = 0", {}, "[tool.ddpcheck] epochs: epochs must be from 1 to"),
        ('epochs = "two"', {}, "[tool.ddpcheck] epochs: expected an integer"),
        ("world-sizes = [1, true]", {}, "[tool.ddpcheck] world-sizes: expected a string or number"),
        ("load-data = 1", {}, "[tool.ddpcheck] load-data: expected true or false"),
        ('backend = "mpi"', {}, "[tool.ddpcheck] backend: invalid choice 'mpi'"),
        ("epochs = [", {}, "cannot read"),
        ("", {"DDPCHECK_TIMEOUT": "inf"}, "DDPCHECK_TIMEOUT: timeout must be positive and at most"),
        ("", {"DDPCHECK_LOAD_DATA": "maybe"}, "DDPCHECK_LOAD_DATA: expected 1/0"),
    ],
)
def test_bad_configuration_is_one_line_naming_file_and_key(
    here: Path,
    table: str,
    env: dict[str, str],
    needle: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (here / "pyproject.toml").write_text(f"[tool.ddpcheck]\n{table}\n")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    line = _main_error(capsys, needle, str(GOOD))
    if table and "cannot read" not in needle:
        assert str(here / "pyproject.toml") in line


def test_other_ddpcheck_variables_are_not_options(tmp_path: Path) -> None:
    """DDPCHECK_START_METHOD and test tags are read elsewhere: unknown variables are not errors."""
    args = parse(["x.py"], cwd=tmp_path)
    assert "start_method" not in args.option_sources


# --- 3. factory arguments ---


def test_factory_args_are_literals_or_strings() -> None:
    args = build_parser().parse_args(
        ["x.py", "--factory-arg", "n=3", "--factory-arg", "shape=(1, 2)", "--factory-arg", "name=imagenet"]
    )
    assert args.factory_args == [("n", 3), ("shape", (1, 2)), ("name", "imagenet")]


@pytest.mark.parametrize("bad", ["novalue", "1x=2", "class=1", "rank=1", "batch_size=4"])
def test_bad_factory_args_are_usage_errors(here: Path, bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    _main_error(capsys, "--factory-arg", str(GOOD), "--report-dir", str(here), "--factory-arg", bad)


def test_factory_args_reach_the_factory_and_the_report_options(tmp_path: Path) -> None:
    loader = tmp_path / "loader.py"
    loader.write_text(
        "from torch.utils.data import DataLoader, DistributedSampler\n"
        "def make_loader(rank, world_size, n=8, seed=0):\n"
        "    assert (n, seed) == (12, 7), (n, seed)\n"
        "    data = list(range(n))\n"
        "    sampler = DistributedSampler(data, world_size, rank, seed=seed)\n"
        "    return DataLoader(data, batch_size=2, sampler=sampler)\n"
    )
    proc = _cli(str(loader), "--world-sizes", "1,2", "--report-dir", str(tmp_path), "--quiet", "--format",
                "json", "--factory-arg", "seed=7", "--factory-arg", "n=12", *FAST)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["options"]["factory_args"] == {"seed": 7, "n": 12}
    refused = _cli(str(GOOD), "--world-sizes", "1", "--report-dir", str(tmp_path), "--quiet",
                   "--factory-arg", "nope=1", *FAST)  # fmt: skip
    assert refused.returncode == 2 and "takes no parameter 'nope'" in refused.stderr, refused.stderr


# --- 4. GitHub annotations ---


def test_escaping_follows_the_workflow_command_rules() -> None:
    assert escape_data("50% a\r\nb: c, d") == "50%25 a%0D%0Ab: c, d"
    assert escape_property("50% a\nb: c, d") == "50%25 a%0Ab%3A c%2C d"


def test_factory_line_is_the_def_line(tmp_path: Path) -> None:
    path = tmp_path / "l.py"
    path.write_text("import os\n\n\nasync def other(): ...\n\ndef make_loader():\n    pass\n")
    assert factory_line(str(path), "make_loader") == 6
    assert factory_line(str(path), "missing") == 1
    assert factory_line(str(tmp_path / "absent.py"), "make_loader") == 1


def test_github_format_annotates_each_failing_check(tmp_path: Path) -> None:
    args = ("--world-sizes", "2", "--report-dir", str(tmp_path), "--quiet", "--format", "github", *FAST)
    proc = _cli(str(BUG), *args)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.strip().splitlines()
    line = factory_line(str(BUG), "make_loader")
    assert line > 1
    assert lines and all(x.startswith(f"::error file={BUG},line={line},title=ddpcheck ") for x in lines)
    assert any("title=ddpcheck no_overlap (W=2)::" in x for x in lines)
    assert all("\n" not in x.split("::", 2)[2] for x in lines)
    assert (tmp_path / "ddpcheck.json").exists()  # reports are still written


# --- 5. every bad input is one line, exit 2 ---


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--world-sizes", "99999"], "at most 65536"),
        (["--world-sizes", str(MAX_REAL_RANKS + 1)], "use --simulate"),
        (["--world-sizes", "9" * 5000], "comma-separated integers"),
        (["--timeout", "inf"], "at most 604800"),
        (["--timeout", "nan"], "must be positive"),
        (["--timeout", "1e300"], "at most 604800"),
        (["--epochs", "99999999999"], "must be from 1 to"),
        (["--rank", "-1", "--world-size", "2"], "--rank: must be from 0"),
        (["--rank", "2", "--world-size", "2"], "--rank must be below --world-size"),
        (["--world-size", "0", "--rank", "0"], "--world-size: must be from 1"),
        (
            ["--master-port", "70000", "--rank", "0", "--world-size", "1"],
            "--master-port: must be from 1 to 65535",
        ),
        (
            ["--master-port", "0", "--rank", "0", "--world-size", "1"],
            "--master-port: must be from 1 to 65535",
        ),
    ],
)
def test_absurd_numbers_are_one_line(
    here: Path, args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _main_error(capsys, needle, str(GOOD), "--report-dir", str(here), *args)


def test_simulate_allows_many_ranks(tmp_path: Path) -> None:
    args = ("--world-sizes", "300", "--simulate", "--epochs", "1", "--report-dir", str(tmp_path), "--quiet")
    proc = _cli(str(GOOD), *args, *FAST)
    assert proc.returncode == 0, proc.stderr


def test_loader_path_too_long_for_the_os(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _main_error(capsys, "path too long", "x" * 5000 + ".py", "--report-dir", str(here))


def test_deeply_nested_loader_file(tmp_path: Path) -> None:
    deep = tmp_path / "deep.py"
    deep.write_text("x = " + "-" * 200_000 + "1\n")
    _one_line_error(_cli(str(deep), "--report-dir", str(tmp_path)), "nests too deeply")


def test_pep263_latin1_loader_file_is_read_as_python_reads_it(tmp_path: Path) -> None:
    loader = tmp_path / "latin.py"
    body = GOOD.read_bytes()
    loader.write_bytes(b"# -*- coding: latin-1 -*-\nLABEL = '\xe9t\xe9'\n" + body)
    proc = _cli(str(loader), "--world-sizes", "1", "--report-dir", str(tmp_path), "--quiet", *FAST)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name", ["ddpcheck.json", "ddpcheck.md", "ddpcheck.html"])
def test_junit_may_not_overwrite_our_own_reports(
    here: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _main_error(
        capsys, "would overwrite", str(GOOD), "--report-dir", str(here), "--junit", str(here / "." / name)
    )


# --- 6. signals at every moment ---


def _caught(pid: int, signum: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    mask = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
    return bool(mask & (1 << (signum - 1)))


def _interrupt(tmp_path: Path, signum: int, at: str | None, storm: bool) -> tuple[int, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddpcheck", str(GOOD), "--world-sizes", "1,2", "--report-dir", str(tmp_path),
         "--format", "json", "--no-resume"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    if at is None:  # the first instant ddpcheck's code runs: __main__ has installed the SIGTERM handler
        # (Python's own start-up catches SIGINT earlier, before ddpcheck can do anything about it)
        while not _caught(proc.pid, signal.SIGTERM) and time.monotonic() < deadline:
            time.sleep(0.0005)
    else:
        for line in proc.stderr:
            if at in line or time.monotonic() > deadline:
                break
    proc.send_signal(signum)
    sent = 0
    while storm and proc.poll() is None and sent < 3000:  # keep interrupting: cleanup, report writing, exit
        try:
            proc.send_signal(signal.SIGINT if sent % 2 else signal.SIGTERM)
        except ProcessLookupError:
            break
        sent += 1
        time.sleep(0.003)
    _, stderr = proc.communicate(timeout=60)
    return proc.returncode, stderr


@pytest.mark.parametrize(
    "signum,at,storm",
    [
        (signal.SIGINT, None, False),
        (signal.SIGTERM, None, True),
        (signal.SIGTERM, "reference run", False),
        (signal.SIGINT, "reference run", True),
        (signal.SIGINT, "world size 1: running", False),
        (signal.SIGTERM, "world size 2: running", True),
    ],
)
def test_an_interrupt_at_any_moment_is_130_without_traceback(
    tmp_path: Path, signum: int, at: str | None, storm: bool
) -> None:
    code, stderr = _interrupt(tmp_path, signum, at, storm)
    assert code == 130, stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    assert "interrupted" in stderr
    if at is not None:  # a result existed: its reports are complete files
        report = json.loads((tmp_path / "ddpcheck.json").read_text())
        assert any("interrupted" in note for note in report["notes"]) or report["runs"]


def test_the_entry_points_import_no_torch_before_the_handlers_are_in_place() -> None:
    """The console script imports ddpcheck.cli and calls main(), which installs the handlers first:
    importing the module must stay cheap (no torch, no checker), or a signal during it is a traceback."""
    heavy = "('torch', 'ddpcheck.session')"
    code = f"import sys, ddpcheck.cli; print(sorted(m for m in {heavy} if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "[]", proc.stderr
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "ddpcheck"]
    assert script.value == "ddpcheck.cli:main"


def test_the_command_skips_interpreter_teardown_but_not_exit_handlers(tmp_path: Path) -> None:
    """``exit_now`` ends the process with its code after running atexit handlers and flushing output."""
    script = (
        "import atexit, sys\n"
        "from ddpcheck.hygiene import exit_now\n"
        "atexit.register(lambda: print('handler ran', flush=False))\n"
        "sys.stdout.write('unflushed output')\n"
        "exit_now(3)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert proc.stdout == "unflushed outputhandler ran\n"


def test_the_exit_code_survives_a_closed_stdout(tmp_path: Path) -> None:
    """``ddpcheck ... | head -1``: the reader is gone before the table is written; the code still stands."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ddpcheck",
            str(BUG),
            "--world-sizes",
            "2",
            *FAST,
            "--report-dir",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=180) == 1, err
    assert "Traceback" not in err
    assert (tmp_path / "ddpcheck.json").exists()


def test_a_full_stdout_is_one_line_and_the_exit_code_stands(tmp_path: Path) -> None:
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "ddpcheck",
                str(GOOD),
                "--world-sizes",
                "2",
                *FAST,
                "--report-dir",
                str(tmp_path),
            ],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=180,
        )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "ddpcheck: could not print the result: No space left on device" in proc.stderr
    assert (tmp_path / "ddpcheck.json").exists()


# --- standard streams a shell may hand over closed, full or already finished ---


def _popen_ddpcheck(tmp_path: Path, loader: Path, **kw: object) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "ddpcheck", str(loader), "--world-sizes", "2", *FAST]
    return subprocess.Popen([*command, "--report-dir", str(tmp_path)], **kw)  # type: ignore[call-overload]


@pytest.mark.parametrize(("loader", "code"), [(GOOD, 0), (BUG, 1)])
def test_both_streams_into_a_pipe_closed_early_keep_the_exit_code(
    tmp_path: Path, loader: Path, code: int
) -> None:
    """``ddpcheck ... 2>&1 | head -1``: progress, the table and the report line all meet a closed pipe."""
    proc = _popen_ddpcheck(tmp_path, loader, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    proc.stdout.read(1)
    proc.stdout.close()
    assert proc.wait(timeout=180) == code
    assert json.loads((tmp_path / "ddpcheck.json").read_text())["exit_code"] == code


@pytest.mark.parametrize("fd", [1, 2])
def test_a_stream_closed_at_start_changes_nothing(tmp_path: Path, fd: int) -> None:
    """``ddpcheck ... >&-`` or ``2>&-``: a good loader still passes, no rank reports a failure."""
    proc = _popen_ddpcheck(tmp_path, GOOD, preexec_fn=lambda: os.close(fd))
    assert proc.wait(timeout=180) == 0
    report = json.loads((tmp_path / "ddpcheck.json").read_text())
    assert report["exit_code"] == 0 and report["summary"]["rank_failures"] == 0


def test_a_full_stderr_keeps_the_exit_code(tmp_path: Path) -> None:
    with open("/dev/full", "w") as full:
        proc = _popen_ddpcheck(tmp_path, BUG, stdout=subprocess.DEVNULL, stderr=full)
        assert proc.wait(timeout=180) == 1


def test_bad_input_errors_are_cut_to_one_readable_line(tmp_path: Path) -> None:
    loader = tmp_path / "loud.py"
    loader.write_text("def make_loader():\n    raise ValueError('x' * 100_000)\n", encoding="utf-8")
    proc = _cli(str(loader), "--report-dir", str(tmp_path), "--quiet")
    _one_line_error(proc, "raised ValueError: xxx")
    assert len(proc.stderr) < 1000 and "more characters" in proc.stderr


def test_junit_naming_a_directory_is_refused_before_any_rank_runs(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _main_error(capsys, "is a directory", str(GOOD), "--junit", str(here), "--report-dir", str(here))


def test_master_addr_alone_is_a_usage_error(tmp_path: Path) -> None:
    proc = _cli(str(GOOD), "--master-addr", "127.0.0.1", "--report-dir", str(tmp_path))
    _one_line_error(proc, "need --rank and --world-size")


def test_a_deeply_nested_pyproject_is_one_line(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (here / "pyproject.toml").write_text("[tool.ddpcheck]\nepochs = " + "[" * 5000 + "]" * 5000 + "\n")
    _main_error(capsys, "pyproject.toml", str(GOOD), "--report-dir", str(here))


def test_exit_handlers_get_seconds_not_forever() -> None:
    """A library imported by the loader may register an exit handler that blocks; the exit code stands."""
    script = (
        "import atexit, time\n"
        "import ddpcheck.hygiene as hygiene\n"
        "hygiene.EXIT_HANDLERS_S = 0.5\n"
        "atexit.register(time.sleep, 600)\n"
        "hygiene.exit_now(1)\n"
    )
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert proc.returncode == 1 and time.monotonic() - started < 30
