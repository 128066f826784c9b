"""The pytest plugin end to end: marked tests in real process groups, the checker fixture, reports, xdist.

Runs that fork ranks go through a pytest subprocess (forking inside the in-process pytester would
copy this test session into every rank). The big scenario file runs once per module and several
tests read its JUnit XML, report files and output. Every subprocess carries a unique environment
tag, so any process it leaves behind (rank, DataLoader worker, xdist worker) can be found in /proc.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from tests.conftest import GOOD, JUNIT_XSD

TAG = "DDPCHECK_PLUGIN_TEST_TAG"

SUITE = """
import os
import signal

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddpcheck.pytest_plugin import assert_ddp_safe

GOOD = {good!r}


@pytest.mark.ddp(world_size=[1, 2, 3, 4])
def test_all_reduce(ddp_rank, ddp_world_size):
    total = torch.tensor([float(ddp_rank + 1)])
    dist.all_reduce(total)
    assert (dist.get_rank(), dist.get_world_size()) == (ddp_rank, ddp_world_size)
    assert total.item() == ddp_world_size * (ddp_world_size + 1) / 2


@pytest.mark.ddp(world_size=[2, 4])
def test_rank_fails(ddp_rank):
    print(f"output of rank {{ddp_rank}}")
    assert ddp_rank != 1
    dist.barrier()


@pytest.mark.ddp(world_size=2, timeout=3)
def test_hang(ddp_rank):
    if ddp_rank == 0:
        dist.recv(torch.zeros(1), src=1)  # rank 1 never sends


@pytest.mark.ddp(world_size=2)
def test_after_hang(ddp_rank):
    dist.barrier()


@pytest.mark.ddp(world_size=[1, 3])
def test_skips(ddp_rank):
    pytest.skip("skipped inside the rank")


@pytest.mark.ddp(world_size=3)
def test_exit(ddp_rank):
    if ddp_rank == 2:
        os._exit(7)
    dist.barrier()


@pytest.mark.ddp(world_size=2)
def test_sigkill(ddp_rank):
    if ddp_rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


@pytest.mark.ddp(world_size=2, backend="nccl")
def test_nccl(ddp_rank):
    pass


class TestInClass:
    @pytest.mark.ddp(world_size=2)
    def test_method(self, ddp_rank, tmp_path):
        (tmp_path / f"rank{{ddp_rank}}").write_text("here")
        dist.barrier()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0", "rank1"]


@pytest.fixture
def rank_plus_one(ddp_rank):
    return ddp_rank + 1


@pytest.mark.ddp(world_size=2)
def test_rank_in_another_fixture(rank_plus_one):
    pass


def test_rank_fixture_unmarked(ddp_rank):
    pass


def make_good(rank, world_size):
    dataset = TensorDataset(torch.arange(30, dtype=torch.float32))
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=3)
    return DataLoader(dataset, batch_size=4, sampler=sampler)


def make_seeded_by_rank(rank, world_size):
    dataset = TensorDataset(torch.arange(30, dtype=torch.float32))
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=rank)
    return DataLoader(dataset, batch_size=4, sampler=sampler)


def make_crashing(rank, world_size):
    if rank == 1:
        os._exit(3)
    return make_good(rank, world_size)


def test_check_good_file(ddpcheck):
    ddpcheck.check(GOOD)


def test_assert_good_factory():
    result = assert_ddp_safe(make_good, world_sizes=[1, 2])
    assert result.ok and [run.world_size for run in result.runs] == [1, 2]


def test_check_buggy_factory(ddpcheck):
    ddpcheck.check(make_seeded_by_rank)


def test_assert_crashing_factory():
    assert_ddp_safe(make_crashing, world_sizes=[2])


def test_zz_no_descendants_left():
    children = {{}}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{{entry}}/stat") as handle:
                    ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [os.getpid()]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    assert found == []
"""

PASSING = """
import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddpcheck.pytest_plugin import assert_ddp_safe


@pytest.mark.ddp(world_size=[1, 2, 3])
def test_all_reduce(ddp_rank, ddp_world_size):
    total = torch.tensor([1.0])
    dist.all_reduce(total)
    assert total.item() == ddp_world_size


@pytest.mark.ddp(world_size=[2, 4])
def test_broadcast(ddp_rank):
    value = torch.tensor([float(ddp_rank)])
    dist.broadcast(value, src=0)
    assert value.item() == 0.0


def make_good(rank, world_size):
    dataset = TensorDataset(torch.arange(20, dtype=torch.float32))
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=1)
    return DataLoader(dataset, batch_size=3, sampler=sampler)


def test_check(ddpcheck):
    ddpcheck.check(make_good)


def test_assert():
    assert_ddp_safe(make_good, world_sizes=2)
"""


@dataclass
class Case:
    outcome: str  # passed | failed | error | skipped
    message: str = ""
    text: str = ""
    properties: dict[str, str] = field(default_factory=dict)


def junit_cases(path: Path) -> dict[str, Case]:
    """JUnit XML -> {"Class.test[id]" or "test[id]": Case}; properties per test (xunit1) or from the
    suite's ``<nodeid>::<name>`` properties (xunit2)."""
    cases: dict[str, Case] = {}
    for node in ET.parse(path).getroot().iter("testcase"):
        classname = node.get("classname", "").rsplit(".", 1)[-1]
        name = node.get("name", "")
        key = f"{classname}.{name}" if classname.startswith("Test") else name
        case = Case("passed")
        for kind in ("failure", "error", "skipped"):
            found = node.find(kind)
            if found is not None:
                case = Case({"failure": "failed"}.get(kind, kind), found.get("message", ""), found.text or "")
        case.properties = {p.get("name", ""): p.get("value", "") for p in node.iter("property")}
        cases[key] = case
    for name, props in suite_properties(path).items():
        if name in cases:
            cases[name].properties.update(props)
    return cases


def suite_properties(path: Path) -> dict[str, dict[str, str]]:
    """The suite-level ``<nodeid>::<name>`` properties (xunit2) as {"test[id]": {name: value}}."""
    found: dict[str, dict[str, str]] = {}
    for suite in ET.parse(path).getroot().iter("testsuite"):
        for props in suite.findall("properties"):
            for prop in props.iter("property"):
                nodeid, _, name = prop.get("name", "").rpartition("::")
                test = nodeid.split("::", 1)[1].replace("::", ".") if "::" in nodeid else nodeid
                found.setdefault(test, {})[name] = prop.get("value", "")
    return found


def assert_valid_junit(path: Path) -> None:
    """Validates against Jenkins' junit-10.xsd, the strictest schema CI servers apply (in the repository:
    ``tests/data/junit-10.xsd``; ``xmlschema`` is in the ``test`` extra), so it never skips."""
    import xmlschema

    xmlschema.XMLSchema(str(JUNIT_XSD)).validate(str(path))


def tagged_processes(tag: str) -> list[int]:
    """Live processes whose environment carries ``TAG=tag`` (ranks, workers, their children)."""
    needle = f"{TAG}={tag}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                if needle in handle.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def leftovers(tag: str, wait: float = 10.0) -> list[int]:
    """Tagged processes still alive after ``wait`` seconds (a killed orphan takes a moment to go)."""
    deadline = time.monotonic() + wait
    while True:
        found = tagged_processes(tag)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def test_process_scan_sees_a_tagged_child() -> None:
    """The leftover check below is only worth something if it can see a live tagged process."""
    tag = uuid.uuid4().hex
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"], env={**os.environ, TAG: tag}
    )
    try:
        # until the child has exec'd, /proc shows the parent's environment: poll briefly
        deadline = time.monotonic() + 10
        while child.pid not in tagged_processes(tag) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert child.pid in tagged_processes(tag)
    finally:
        child.kill()
        child.wait()
    assert leftovers(tag, wait=2.0) == []


@dataclass
class SuiteRun:
    returncode: int
    output: str
    cases: dict[str, Case]
    report_dir: Path
    leftover: list[int]
    junit: Path


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> SuiteRun:
    """Run the scenario file once, in a pytest subprocess, with JUnit XML and report files."""
    root = tmp_path_factory.mktemp("suite")
    (root / "test_suite.py").write_text(textwrap.dedent(SUITE.format(good=str(GOOD))))
    tag = uuid.uuid4().hex
    assert tagged_processes(tag) == []
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "test_suite.py",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rA",
            "--junitxml=junit.xml",
            "--ddpcheck-report=reports",
            f"--basetemp={root / 'basetemp'}",
        ],
        cwd=root,
        env={**os.environ, TAG: tag, "COLUMNS": "250"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    return SuiteRun(
        proc.returncode,
        proc.stdout + proc.stderr,
        junit_cases(root / "junit.xml"),
        root / "reports",
        leftovers(tag),
        root / "junit.xml",
    )


def test_passing_test_runs_in_every_rank_once_per_world_size(suite: SuiteRun) -> None:
    for ws in (1, 2, 3, 4):
        case = suite.cases[f"test_all_reduce[ddp{ws}]"]
        assert case.outcome == "passed", case.text
        assert case.properties["ddp.world_size"] == str(ws)
        assert case.properties["ddp.failed_ranks"] == "none"
    assert suite.cases["TestInClass.test_method[ddp2]"].outcome == "passed"


def test_failure_names_the_rank_its_traceback_and_output(suite: SuiteRun) -> None:
    case = suite.cases["test_rank_fails[ddp2]"]
    assert case.outcome == "failed"
    assert case.message.startswith("DdpTestFailed: rank 1 of 2 failed: AssertionError: assert 1 != 1")
    assert 'test_suite.py", line' in case.text and "assert ddp_rank != 1" in case.text
    assert "captured output of rank 1:\noutput of rank 1" in case.text
    assert "ddpcheck/launch/rank.py" not in case.text  # the launcher's own frames are cut
    four = suite.cases["test_rank_fails[ddp4]"].text
    primary = four.index("rank 1 (error)")
    assert all(four.index(f"rank {r} (secondary)") > primary for r in (0, 2, 3))
    assert "3 more ranks stopped as a consequence" in four


def test_hang_fails_only_that_test_and_shows_the_stack(suite: SuiteRun) -> None:
    case = suite.cases["test_hang[ddp2]"]
    assert case.outcome == "failed"
    assert "hang: rank 0 of 2 made no progress for the 3 s timeout" in case.text
    assert "stack when stopped:" in case.text
    assert " in test_hang" in case.text  # the hung rank's own frame, from its dumped stack
    assert "ranks 1 finished and wait for ranks 0" in case.text
    assert suite.cases["test_after_hang[ddp2]"].outcome == "passed"


def test_skip_inside_a_rank_skips_the_item(suite: SuiteRun) -> None:
    for ws in (1, 3):
        case = suite.cases[f"test_skips[ddp{ws}]"]
        assert case.outcome == "skipped"
        assert "skipped inside the rank" in case.message


def test_crashed_ranks_are_reported(suite: SuiteRun) -> None:
    exited = suite.cases["test_exit[ddp3]"]
    assert exited.outcome == "failed"
    assert "rank 2 exited: exited with code 7" in exited.text
    killed = suite.cases["test_sigkill[ddp2]"]
    assert killed.outcome == "failed"
    assert "rank 1 killed: killed by SIGKILL" in killed.text


def test_nccl_without_gpus_skips_with_a_reason(suite: SuiteRun) -> None:
    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if found >= 2:
        pytest.skip(f"this machine has {found} GPUs, so the NCCL test runs instead of skipping")
    case = suite.cases["test_nccl[ddp2]"]
    assert case.outcome == "skipped"
    assert f"NCCL world size 2 needs 2 GPUs, found {found}" in case.message


def test_rank_fixture_misuse_is_a_clear_error(suite: SuiteRun) -> None:
    derived = suite.cases["test_rank_in_another_fixture[ddp2]"]
    assert derived.outcome == "error"
    assert "ddp_rank is only known inside a rank" in derived.text
    unmarked = suite.cases["test_rank_fixture_unmarked"]
    assert unmarked.outcome == "error"
    assert "needs a test marked @pytest.mark.ddp" in unmarked.text


def test_checker_fixture_and_assert(suite: SuiteRun) -> None:
    assert suite.cases["test_check_good_file"].outcome == "passed"
    assert suite.cases["test_assert_good_factory"].outcome == "passed"
    buggy = suite.cases["test_check_buggy_factory"]
    assert buggy.outcome == "failed"
    assert "test_suite.py::make_seeded_by_rank fails" in buggy.text
    assert "no_overlap" in buggy.text and "FAIL" in buggy.text
    crashed = suite.cases["test_assert_crashing_factory"]
    assert crashed.outcome == "failed"
    assert "rank 1 crashed or hung at world size 2" in crashed.text


def test_junit_carries_check_results(suite: SuiteRun) -> None:
    good = suite.cases["test_check_good_file"].properties
    assert good["ddpcheck.result"] == "pass"
    assert good["ddpcheck.loader"] == str(GOOD)
    assert good["ddpcheck.ws2.no_overlap"] == "pass"
    buggy = suite.cases["test_check_buggy_factory"].properties
    assert buggy["ddpcheck.result"] == "fail"
    assert buggy["ddpcheck.ws1.no_overlap"] == "pass"
    assert buggy["ddpcheck.ws2.no_overlap"] == "fail"
    crashed = suite.cases["test_assert_crashing_factory"].properties
    assert "rank 1" in crashed["ddpcheck.ws2.rank_failures"]


def test_xunit2_results_live_in_the_suite_properties(suite: SuiteRun) -> None:
    """xunit2 (the default) has no per-test <properties>: the results are the suite's, named by test id."""
    for case in ET.parse(suite.junit).getroot().iter("testcase"):
        assert case.find("properties") is None
    assert suite_properties(suite.junit)["test_check_good_file"]["ddpcheck.result"] == "pass"
    assert suite_properties(suite.junit)["test_all_reduce[ddp2]"]["ddp.world_size"] == "2"


def test_short_summary_names_the_loader_and_the_failing_checks(suite: SuiteRun) -> None:
    line = next(
        x for x in suite.output.splitlines() if x.startswith("FAILED test_suite.py::test_check_buggy")
    )
    assert " - DdpCheckFailed: test_suite.py::make_seeded_by_rank fails " in line
    assert "no_overlap" in line and line.endswith("at world size 2"), line


def test_report_files_per_test(suite: SuiteRun) -> None:
    names = sorted(p.name for p in suite.report_dir.iterdir())
    stems = ["test_check_buggy_factory", "test_check_good_file", "test_assert_good_factory"]
    for stem in stems:
        assert f"test_suite.py__{stem}.json" in names
        assert f"test_suite.py__{stem}.md" in names
    report = json.loads((suite.report_dir / "test_suite.py__test_check_buggy_factory.json").read_text())
    assert "make_seeded_by_rank" in json.dumps(report)
    assert "no_overlap" in (suite.report_dir / "test_suite.py__test_check_buggy_factory.md").read_text()


def test_no_process_outlives_the_run(suite: SuiteRun) -> None:
    assert suite.cases["test_zz_no_descendants_left"].outcome == "passed"
    assert suite.leftover == []
    assert suite.returncode == 1, suite.output[-3000:]


# --- options and usage errors (nothing forks here, so pytester runs in process) ------------------


def test_bad_marker_is_a_collection_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.ddp(world_size=0)
        def test_zero(ddp_rank):
            pass

        @pytest.mark.ddp(world_size=2, ranks=3)
        def test_unknown(ddp_rank):
            pass
        """
    )
    result = pytester.runpytest("--continue-on-collection-errors")
    result.stdout.fnmatch_lines(["*world sizes must be positive integers, got 0*"])
    assert result.ret != 0


def test_a_missing_loader_file_is_a_one_line_failure(pytester: pytest.Pytester) -> None:
    """README's example copied into a project without the file: one line naming the path, no traceback
    through ddpcheck and no ``CheckOptions(...)`` repr, from the fixture and from ``assert_ddp_safe``."""
    pytester.makepyfile(
        """
        from ddpcheck.pytest_plugin import assert_ddp_safe

        def test_fixture(ddpcheck):
            ddpcheck.check("fixtures/good_distributed_sampler.py", world_sizes=(1, 2))

        def test_assert():
            assert_ddp_safe("fixtures/good_distributed_sampler.py")
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=2)
    missing = pytester.path / "fixtures" / "good_distributed_sampler.py"
    line = f"ddpcheck: loader file not found: {missing}"
    output = result.stdout.str()
    for test in ("test_fixture", "test_assert"):  # the whole failure section: its title, then one line
        section = output.split(f" {test} ")[1].split("\n")[1:3]
        assert section[0] == line and section[1].startswith(("___", "===")), section
    assert "CheckOptions(" not in output and "Traceback" not in output and "BadInput" not in output
    assert "ddpcheck/session" not in output and "check_loader" not in output  # no frame of ddpcheck's


def test_plugin_state_lives_on_each_sessions_config(
    pytester: pytest.Pytester, request: pytest.FixtureRequest
) -> None:
    """A session's state (report dir, rootdir, running test) is an object on its own config's stash, named
    while a test runs only: a pytest session inside this test has its own and leaves this one as it was."""
    from ddpcheck.pytest_plugin import current_session
    from ddpcheck.pytest_plugin.plugin import _session_key

    outer = current_session()
    assert outer is request.config.stash[_session_key] and outer.item is request.node
    pytester.makepyfile(
        """
        from ddpcheck.pytest_plugin import current_session
        from ddpcheck.pytest_plugin.plugin import _session_key

        def test_inner(request):
            session = current_session()
            assert session is request.config.stash[_session_key] and session.item is request.node
            assert session.rootdir == request.config.rootpath and session.report_dir.name == "inner-reports"
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--ddpcheck-report", "inner-reports")
    result.assert_outcomes(passed=1)
    assert current_session() is outer and outer.item is request.node
    assert outer.rootdir == request.config.rootpath and outer.report_dir != pytester.path / "inner-reports"


def test_bad_option_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--ddp-world-sizes", "2,x")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*world sizes must be comma-separated positive integers*"])


def test_world_sizes_option_overrides_every_marker(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.ddp(world_size=2)
        def test_a(ddp_rank):
            pass

        @pytest.mark.ddp
        def test_b():
            pass
        """
    )
    result = pytester.runpytest("--ddp-world-sizes", "1,3", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["*test_a[[]ddp1]", "*test_a[[]ddp3]", "*test_b[[]ddp1]", "*test_b[[]ddp3]"])
    default = pytester.runpytest("--collect-only", "-q")
    default.stdout.fnmatch_lines(["*test_a[[]ddp2]", "*test_b[[]ddp2]"])


def test_backend_option_skips_nccl_without_gpus(pytester: pytest.Pytester) -> None:
    if torch.cuda.is_available() and torch.cuda.device_count() >= 1:
        pytest.skip("this machine has a GPU; the NCCL group would run instead of skipping")
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.ddp(world_size=[1, 3])
        def test_a(ddp_rank):
            raise AssertionError("must not run")
        """
    )
    result = pytester.runpytest("--ddp-backend", "nccl", "-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(
        ["*NCCL world size 1 needs 1 GPUs, found 0*", "*NCCL world size 3 needs 3 GPUs, found 0*"]
    )


def test_ini_options_apply_and_the_command_line_wins(pytester: pytest.Pytester) -> None:
    from ddpcheck.pytest_plugin.plugin import _overrides_key

    pytester.makepyprojecttoml(
        '[tool.pytest.ini_options]\nddp_world_sizes = "1,3"\nddp_backend = "gloo"\nddp_timeout = "7.5"\n'
    )
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.ddp(world_size=2)
        def test_a(ddp_rank):
            pass
        """
    )
    from_ini = pytester.runpytest("--collect-only", "-q")
    from_ini.stdout.fnmatch_lines(["*test_a[[]ddp1]", "*test_a[[]ddp3]"])
    assert "ddp2" not in from_ini.stdout.str()
    given = pytester.runpytest("--collect-only", "-q", "--ddp-world-sizes", "4")
    given.stdout.fnmatch_lines(["*test_a[[]ddp4]"])
    assert "ddp1" not in given.stdout.str()
    config = pytester.parseconfigure()
    assert config.stash[_overrides_key].timeout == 7.5 and config.stash[_overrides_key].backend == "gloo"
    config = pytester.parseconfigure("--ddp-timeout", "3")
    assert config.stash[_overrides_key].timeout == 3.0


@pytest.mark.parametrize(
    "line,needle",
    [
        ('ddp_world_sizes = "1,x"', "ddp_world_sizes in *pyproject.toml: world sizes must be*"),
        ('ddp_backend = "mpi"', "ddp_backend in *pyproject.toml: backend must be one of gloo, nccl*"),
        ('ddp_timeout = "inf"', "ddp_timeout in *pyproject.toml: timeout must be a positive number*"),
    ],
)
def test_bad_ini_value_is_a_usage_error_naming_the_key(
    pytester: pytest.Pytester, line: str, needle: str
) -> None:
    pytester.makepyprojecttoml(f"[tool.pytest.ini_options]\n{line}\n")
    result = pytester.runpytest("--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{needle}"])
    assert "Traceback" not in result.stderr.str()


def _run_pytest(cwd: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_loader_paths_resolve_against_the_rootdir(tmp_path: Path) -> None:
    """`cd tests && pytest` must find "fixtures/loader.py" as a run from the project root does."""
    (tmp_path / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    (tmp_path / "fixtures").mkdir()
    (tmp_path / "fixtures" / "loader.py").write_text(GOOD.read_text())
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_rel.py").write_text(
        textwrap.dedent(
            """
            from ddpcheck.pytest_plugin import assert_ddp_safe

            FAST = dict(world_sizes=[1], epochs=1, determinism=False, resume=False, train_steps=0)

            def test_fixture(ddpcheck):
                ddpcheck.check("fixtures/loader.py", **FAST)

            def test_assert():
                assert_ddp_safe("fixtures/loader.py", **FAST)
            """
        )
    )
    for cwd in (tmp_path / "tests", tmp_path):
        proc = _run_pytest(cwd, "-q", "-rA")
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        assert "2 passed" in proc.stdout


JUNIT_SUITE = """
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddpcheck.pytest_plugin import assert_ddp_safe

FAST = dict(epochs=1, determinism=False, resume=False, train_steps=0)


def make_seeded_by_rank(rank, world_size):
    dataset = TensorDataset(torch.arange(12))
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=rank)
    return DataLoader(dataset, sampler=sampler)


@pytest.mark.ddp(world_size=[1, 2])
def test_ranks(ddp_rank):
    assert ddp_rank == 0


def test_check(ddpcheck):
    ddpcheck.check({good!r}, world_sizes=[1], **FAST)


def test_buggy():
    assert_ddp_safe(make_seeded_by_rank, world_sizes=[2], **FAST)
"""


@pytest.mark.parametrize("family", ["xunit2", "xunit1"])
def test_junit_families(tmp_path: Path, family: str) -> None:
    """The default xunit2 file validates against junit-10.xsd (the schema pytest's own suite uses; it has
    no <error>, so this run has failures only); xunit1 keeps per-test properties."""
    (tmp_path / "test_one.py").write_text(JUNIT_SUITE.format(good=str(GOOD)))
    proc = _run_pytest(tmp_path, "-q", "--junitxml=junit.xml", "-o", f"junit_family={family}")
    assert proc.returncode == 1, proc.stdout[-3000:]
    cases = junit_cases(tmp_path / "junit.xml")
    assert [
        cases[k].outcome for k in ("test_ranks[ddp1]", "test_ranks[ddp2]", "test_check", "test_buggy")
    ] == [
        "passed",
        "failed",
        "passed",
        "failed",
    ]
    if family == "xunit2":
        assert_valid_junit(tmp_path / "junit.xml")
        for case in ET.parse(tmp_path / "junit.xml").getroot().iter("testcase"):
            assert case.find("properties") is None
        props = suite_properties(tmp_path / "junit.xml")
        assert props["test_check"]["ddpcheck.result"] == "pass"
        assert props["test_buggy"]["ddpcheck.ws2.no_overlap"] == "fail"
        assert props["test_ranks[ddp2]"]["ddp.failed_ranks"] == "1"
    else:
        assert cases["test_check"].properties["ddpcheck.result"] == "pass"
        assert cases["test_ranks[ddp2]"].properties["ddp.failed_ranks"] == "1"
        assert suite_properties(tmp_path / "junit.xml") == {}


# --- import modes, spawn, xdist (subprocess runs) -------------------------------------------------


def test_importlib_mode_and_timeout_override(pytester: pytest.Pytester) -> None:
    same = """
        import pytest

        @pytest.mark.ddp(world_size=2)
        def test_same(ddp_rank):
            assert ddp_rank == 0
        """
    stuck = """
        import torch
        import torch.distributed as dist

        @pytest.mark.ddp(world_size=2, timeout=60)
        def test_stuck(ddp_rank):
            if ddp_rank == 1:
                dist.recv(torch.zeros(1), src=0)  # rank 0 never sends
        """
    for folder, body in (("one", same), ("two", same + stuck)):  # one basename twice: importlib mode only
        (pytester.path / folder).mkdir()
        (pytester.path / folder / "test_same.py").write_text(textwrap.dedent(body))
    result = pytester.runpytest_subprocess("--import-mode=importlib", "--ddp-timeout", "2", timeout=240)
    result.assert_outcomes(failed=3)
    text = result.stdout.str()
    # count in the failure sections only: under CI=true pytest repeats full messages in its summary
    sections = text.split("short test summary info")[0]
    assert sections.count("rank 1 of 2 failed: AssertionError: assert 1 == 0") == 2
    assert "hang: rank 1 of 2 made no progress for the 2 s timeout" in text


def test_spawned_ranks_find_the_test_by_name(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(
        test_spawned="""
        import threading

        import pytest

        class TestSpawned:
            @pytest.mark.ddp(world_size=2)
            def test_method(self, ddp_rank, tmp_path):
                assert tmp_path.exists()
                assert ddp_rank == 0

        @pytest.fixture
        def lock():
            return threading.Lock()

        @pytest.mark.ddp(world_size=2)
        def test_unpicklable(ddp_rank, lock):
            pass
        """
    )
    monkeypatch.setenv("DDPCHECK_START_METHOD", "spawn")
    result = pytester.runpytest_subprocess("--import-mode=importlib", timeout=300)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        [
            "*rank 1 of 2 failed: AssertionError: assert 1 == 0",  # rewritten in the spawned rank too
            "*these do not pickle: lock (lock)*",
        ]
    )
    assert "rank 0 error" not in result.stdout.str()


def test_xdist_three_runs_in_a_row(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_passing=textwrap.dedent(PASSING))
    tag = uuid.uuid4().hex
    monkeypatch.setenv(TAG, tag)
    for attempt in range(3):
        before = tagged_processes(tag)
        reports = pytester.path / f"reports{attempt}"
        junit = pytester.path / f"junit{attempt}.xml"
        result = pytester.runpytest_subprocess(
            "-p", "xdist", "-n", "2", f"--junitxml={junit}", f"--ddpcheck-report={reports}", timeout=300
        )
        result.assert_outcomes(passed=7)
        assert before == [] and leftovers(tag) == []
        written = sorted(p.name for p in reports.iterdir())
        assert [name for name in written if not name.endswith(".svg")] == [
            "test_passing.py__test_assert.json",
            "test_passing.py__test_assert.md",
            "test_passing.py__test_check.json",
            "test_passing.py__test_check.md",
        ]
        # the Markdown reports' pictures, one set per test and world size, named after the test
        svgs = [name for name in written if name.endswith(".svg")]
        assert svgs and all(
            name.startswith(("test_passing.py__test_assert", "test_passing.py__test_check")) for name in svgs
        )
        assert_valid_junit(junit)  # xdist's controller writes the file: our properties are the suite's
        cases = junit_cases(junit)
        assert cases["test_check"].properties["ddpcheck.result"] == "pass"
        assert cases["test_broadcast[ddp4]"].properties["ddp.world_size"] == "4"
