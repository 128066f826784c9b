"""Every code block in README.md and docs/*.md runs as shown (so no example can go stale).

Each fenced block is one or more tests, chosen by what the block is:

- ```` ```python ```` whose first line starts with ``>>> ``: a doctest, run by ``python -m doctest`` (the
  lines below each ``>>>`` are what it must print);
- ```` ```python ```` whose first line is ``# fixtures/<path>``: an excerpt of that fixture file; every
  non-blank line must be a line of the file, verbatim (a line that is only ``...`` marks an elision);
- ```` ```python ```` that defines ``def test_...``: a pytest file, run by pytest in a fresh project
  (``pytest.ini`` at its root, the block under ``tests/``, the ``fixtures/...`` files it names copied in),
  started from ``tests/`` so a relative loader path must resolve against the rootdir, as the docs say;
- ```` ```python ```` that defines ``make_loader``: a loader file, checked with
  ``python -m ddpcheck FILE --world-sizes 1,2 --quiet``; exit 0 unless its first line says ``exits N``;
- any other ```` ```python ````: a snippet, run as a script (it must import and define what it shows);
- ```` ```bash ````: one test per command line; ``&&`` parts run in order from the repository root
  (``ddpcheck``/``python -m ddpcheck``: as shown, reports to a temporary directory; ``pytest``: in a
  project made of the page's own pytest blocks). The exit code is the one the command's comment states
  (``exit N``/``exits N``), else 0. Installs, launchers and tools that need the network, other hosts or
  a GPU are not run; a command with nothing left to run is skipped with the reason;
- ```` ```text ```` and untagged blocks that start with ``$ `` are transcripts: each ``$ `` line is a
  command, run in order as a bash command is (its ``# exits N`` comment says its exit code, else 0), and
  every non-blank line below it, up to the next ``$ ``, must be a line it printed (stdout or stderr, at
  100 columns, without colour): a line that is only ``...`` marks an elision, a line ending in ``...``
  matches a printed line that starts with the rest. Other ``text`` blocks are never run.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT

PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
EXCERPT = re.compile(r"# (fixtures/\S+?\.py)\b")
FIXTURE_PATH = re.compile(r"""["'](fixtures/[\w./-]+?\.py)["']""")
EXIT = re.compile(r"\bexits? (\d+)\b")
TIMEOUT = 240

# The first word of a command that is not run here, and why.
NOT_RUN = {
    "pip": "installs from a package index (network); this environment is already installed that way",
    "torchrun": "a multi-node launch: needs the other hosts of the rendezvous",
    "srun": "needs a SLURM allocation",
    "tox": "tox builds fresh virtualenvs from the package index (network) and runs the whole suite",
    "git": "changes the checkout",
    "apt": "installs system packages (root, network)",
    "apt-get": "installs system packages (root, network)",
}
# The project's own suite (README command 2): minutes long, and exactly what CI runs.
PROJECT_SUITE = "python -m pytest -n 2 -q"


@dataclass(frozen=True)
class Block:
    page: Path
    index: int  # among the page's fenced blocks
    line: int  # of the opening fence
    lang: str
    body: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}-block{self.index}"

    @property
    def first_line(self) -> str:
        return self.body.splitlines()[0] if self.body.strip() else ""

    @property
    def kind(self) -> str:
        if self.lang in ("text", "") and self.body.startswith("$ "):
            return "transcript"
        if self.lang == "text":
            return "sample"
        if self.lang == "python":
            if self.first_line.startswith(">>> "):
                return "doctest"
            if EXCERPT.match(self.first_line):
                return "excerpt"
            if re.search(r"^def test_", self.body, re.M):
                return "pytest"
            if re.search(r"^def make_loader\b", self.body, re.M):
                return "loader"
            return "snippet"
        if self.lang == "bash":
            return "bash"
        return "unknown"


def _blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    return [
        Block(page, i, text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2))
        for i, m in enumerate(FENCE.finditer(text))
    ]


BLOCKS = [block for page in PAGES for block in _blocks(page)]


def _of_kind(kind: str) -> list[pytest.param]:
    return [pytest.param(b, id=f"{b.id}-{kind}") for b in BLOCKS if b.kind == kind]


@dataclass(frozen=True)
class Command:
    block: Block
    number: int  # among the block's commands
    text: str  # the command line, comment removed
    comment: str  # the comment lines above it and its trailing comment

    @property
    def expected_exit(self) -> int:
        found = EXIT.search(self.comment)
        return int(found.group(1)) if found else 0


def _commands(block: Block) -> list[Command]:
    commands: list[Command] = []
    comments: list[str] = []
    pending = ""
    for raw in block.body.splitlines():
        line = raw.strip()
        if not line:
            comments = []
            continue
        if line.startswith("#") and not pending:
            comments.append(line)
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        code, _, trailing = (pending + line).partition(" #")
        pending = ""
        commands.append(Command(block, len(commands), code.strip(), " ".join([*comments, trailing])))
        comments = []
    return commands


COMMANDS = [c for b in BLOCKS if b.kind == "bash" for c in _commands(b)]


def _page_tests(page: Path) -> list[Block]:
    return [b for b in BLOCKS if b.page == page and b.kind == "pytest"]


# the suite's own hypothesis profile (tests/conftest.py) in the fresh project: a slow example on a loaded CI
# machine is load, not a failure of the documented block
LOAD_TOLERANT = """from hypothesis import HealthCheck, settings

settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")
"""


def _test_project(root: Path, blocks: list[Block]) -> Path:
    """A project of the given pytest blocks: ``pytest.ini``, ``tests/test_*.py`` and the fixture files
    they name, copied to the same relative paths. Returns its ``tests`` directory."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "pytest.ini").write_text("[pytest]\n")
    tests = root / "tests"
    tests.mkdir(exist_ok=True)
    (tests / "conftest.py").write_text(LOAD_TOLERANT)
    for block in blocks:
        for rel in FIXTURE_PATH.findall(block.body):
            source = ROOT / rel
            assert source.is_file(), f"{block.where} names {rel}, which does not exist"
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, root / rel)
        stem = re.sub(r"\W", "_", block.page.stem)
        (tests / f"test_{stem}_{block.index}.py").write_text(block.body)
    return tests


def _output(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}"


# --- every block is one of the kinds above ----------------------------------------------------------


@pytest.mark.parametrize("block", [pytest.param(b, id=b.id) for b in BLOCKS])
def test_every_block_says_what_it_is(block: Block) -> None:
    """An untagged or unknown fence would escape every test below: tag it python, bash or text."""
    assert block.kind != "unknown", f"{block.where}: tag the block python, bash or text (got {block.lang!r})"


def test_the_pages_have_blocks_of_every_kind() -> None:
    """The parser really sees the blocks (a broken fence pattern would make every test vanish)."""
    kinds = {b.kind for b in BLOCKS}
    assert {"sample", "transcript", "doctest", "excerpt", "pytest", "loader", "snippet", "bash"} <= kinds, (
        kinds
    )
    assert len(COMMANDS) >= 5


# --- python blocks ------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", _of_kind("excerpt"))
def test_python_excerpt_is_in_its_fixture(block: Block) -> None:
    match = EXCERPT.match(block.first_line)
    assert match
    path = ROOT / match.group(1)
    assert path.is_file(), f"{block.where}: {match.group(1)} does not exist"
    lines = {line.rstrip() for line in path.read_text(encoding="utf-8").splitlines()}
    missing = [
        line
        for line in block.body.splitlines()[1:]
        if line.strip() and line.strip() != "..." and line.rstrip() not in lines
    ]
    assert missing == [], f"{block.where}: not verbatim in {match.group(1)}:\n" + "\n".join(missing)


@pytest.mark.parametrize("block", _of_kind("pytest"))
def test_python_pytest_block_passes(
    block: Block, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ranks are forked, so pytest runs in a subprocess (forking the in-process pytester would copy this
    session into every rank)."""
    monkeypatch.chdir(_test_project(pytester.path, [block]))  # from tests/: paths resolve to the rootdir
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", timeout=TIMEOUT)
    outcomes = result.parseoutcomes()
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == 0, f"{block.where}:\n{text[-8000:]}"
    defined = len(re.findall(r"^def test_", block.body, re.M))
    assert outcomes.get("passed", 0) >= defined, outcomes
    assert not {"failed", "error", "errors", "skipped", "xfailed"} & set(outcomes), outcomes


@pytest.mark.parametrize("block", _of_kind("loader"))
def test_python_loader_block_passes_ddpcheck(block: Block, tmp_path: Path) -> None:
    named = re.match(r"# (\w+\.py)\b", block.first_line)
    path = tmp_path / (named.group(1) if named else "loader.py")
    path.write_text(block.body)
    found = EXIT.search(block.first_line)
    expected = int(found.group(1)) if found else 0
    command = [sys.executable, "-m", "ddpcheck", path.name, "--world-sizes", "1,2", "--quiet"]
    proc = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == expected, f"{block.where}: {_output(proc)}"


@pytest.mark.parametrize("block", _of_kind("snippet"))
def test_python_snippet_runs(block: Block, tmp_path: Path) -> None:
    (tmp_path / "snippet.py").write_text(block.body)
    proc = subprocess.run(
        [sys.executable, "snippet.py"], cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert proc.returncode == 0, f"{block.where}: {_output(proc)}"


@pytest.mark.parametrize("block", _of_kind("doctest"))
def test_python_doctest_prints_what_it_shows(block: Block, tmp_path: Path) -> None:
    (tmp_path / "example.txt").write_text(block.body)
    proc = subprocess.run(
        [sys.executable, "-m", "doctest", "example.txt"], cwd=tmp_path, capture_output=True, text=True,
        timeout=TIMEOUT,
    )  # fmt: skip
    assert proc.returncode == 0, f"{block.where}: {_output(proc)}"


# --- bash blocks --------------------------------------------------------------------------------------


def _plan(part: str, command: Command) -> tuple[list[str] | None, str, Path | None]:
    """(argv to run, reason not to, page whose pytest blocks form the project) for one ``&&`` part."""
    words = shlex.split(part)
    if words[0] in NOT_RUN:
        return None, f"{words[0]}: {NOT_RUN[words[0]]}", None
    if words[0] == "ddpcheck" or words[:3] == ["python", "-m", "ddpcheck"]:
        args = words[1:] if words[0] == "ddpcheck" else words[3:]
        if any(a.startswith(("--master-addr", "--rank")) for a in args):
            return None, "ddpcheck --rank/--master-addr joins a launch whose other ranks run elsewhere", None
        return [sys.executable, "-m", "ddpcheck", *args], "", None
    if words[:3] == ["python", "-m", "torch.distributed.run"] and "--standalone" in words:
        return [sys.executable, *words[1:]], "", None  # one machine: torchrun's own rendezvous, as shown
    if words[0] == "pytest" or words[:3] == ["python", "-m", "pytest"]:
        if part.strip() == PROJECT_SUITE:
            return None, "the project's whole suite (minutes): CI runs this command (.ci/run)", None
        args = words[1:] if words[0] == "pytest" else words[3:]
        assert _page_tests(command.block.page), (
            f"{command.block.where}: a pytest command on a page with no tests"
        )
        return [sys.executable, "-m", "pytest", *args], "", command.block.page
    pytest.fail(
        f"{command.block.where}: test_docs does not know how to run {part!r}: run it or give a reason"
    )


@pytest.mark.parametrize("command", [pytest.param(c, id=f"{c.block.id}-cmd{c.number}") for c in COMMANDS])
def test_bash_command_exits_as_documented(command: Command, tmp_path: Path) -> None:
    parts = [part.strip() for part in re.split(r"\s&&\s", command.text)]
    plans = [_plan(part, command) for part in parts]
    runnable = [(part, argv, page) for part, (argv, _, page) in zip(parts, plans, strict=True) if argv]
    if not runnable:
        pytest.skip(f"{command.block.where}: not run: " + "; ".join(dict.fromkeys(p[1] for p in plans)))
    env = {**os.environ, "DDPCHECK_REPORT_DIR": str(tmp_path / "reports"), "COLUMNS": "120"}
    for i, (part, argv, page) in enumerate(runnable):
        cwd = ROOT if page is None else _test_project(tmp_path / "project", _page_tests(page)).parent
        proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
        # `a && b`: every part before the last must succeed; the last exits as the comment says
        expected = command.expected_exit if i == len(runnable) - 1 else 0
        assert proc.returncode == expected, f"{command.block.where}: {part}\n{_output(proc)}"


# --- transcripts: commands and what they print ----------------------------------------------------------


def _transcript(block: Block) -> list[tuple[Command, list[str]]]:
    """Each ``$ `` line of a transcript as a command, with the lines shown below it."""
    steps: list[tuple[Command, list[str]]] = []
    for line in block.body.splitlines():
        if line.startswith("$ "):
            code, _, comment = line[2:].partition(" #")
            steps.append((Command(block, len(steps), code.strip(), comment), []))
        elif steps and line.strip():
            steps[-1][1].append(line.rstrip())
    return steps


def _shown_in(shown: str, printed: list[str]) -> bool:
    if shown.strip() == "...":
        return True
    if shown.endswith("..."):
        return any(line.startswith(shown[:-3]) for line in printed)
    return shown in printed


@pytest.mark.parametrize("block", _of_kind("transcript"))
def test_transcript_prints_what_it_shows(block: Block, tmp_path: Path) -> None:
    """A sample output is what the tool prints today (so it cannot go stale)."""
    env = {**os.environ, "DDPCHECK_REPORT_DIR": str(tmp_path / "reports"), "COLUMNS": "100", "NO_COLOR": "1"}
    for command, shown in _transcript(block):
        parts = [part.strip() for part in re.split(r"\s&&\s", command.text)]
        printed: list[str] = []
        for i, part in enumerate(parts):
            argv, why, page = _plan(part, command)
            assert argv, (
                f"{block.where}: a transcript shows what a command prints, and {part!r} is not run: {why}"
            )
            cwd = ROOT if page is None else _test_project(tmp_path / "project", _page_tests(page)).parent
            proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
            expected = command.expected_exit if i == len(parts) - 1 else 0
            assert proc.returncode == expected, f"{block.where}: {part}\n{_output(proc)}"
            printed = [line.rstrip() for line in (proc.stdout + proc.stderr).splitlines()]
        missing = [line for line in shown if not _shown_in(line, printed)]
        assert missing == [], (
            f"{block.where}: {command.text} did not print:\n"
            + "\n".join(missing)
            + ("\n--- it printed\n" + "\n".join(printed))
        )


# --- what the README promises about its commands ------------------------------------------------------


def _quick_start() -> list[Command]:
    readme = ROOT / "README.md"
    text = readme.read_text(encoding="utf-8")
    section = text[text.index("## Quick start") :]
    first = next(b for b in BLOCKS if b.page == readme and b.kind == "bash" and b.body in section)
    return _commands(first)


def test_the_quick_start_is_two_commands_that_pin_torch() -> None:
    commands = _quick_start()
    assert len(commands) == 2, [c.text for c in commands]
    check, tests = commands
    assert "ddpcheck fixtures/" in check.text and tests.text.endswith(PROJECT_SUITE)
    installs = [p for c in (check, tests) for p in c.text.split(" && ") if p.startswith("pip install")]
    assert installs and all("-c constraints.txt" in p for p in installs), installs


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    tests = _quick_start()[-1]
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if not line.startswith("#")]
    assert tests.text in ci, f".ci/run must run the README's test command:\n{tests.text}"


def test_the_cpu_wheel_command_pins_the_constrained_torch() -> None:
    pin = next(
        line.strip()
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if line.startswith("torch")
    )
    cpu = [c for c in COMMANDS if "download.pytorch.org/whl/cpu" in c.text]
    assert cpu, "the docs give CPU-only users no command for torch's CPU wheel (docs/install.md)"
    for command in cpu:
        assert f"--index-url https://download.pytorch.org/whl/cpu {pin}" in command.text
        assert "pip install -c constraints.txt" in command.text  # the project itself: same constraint
