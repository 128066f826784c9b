"""Every run ``ddpcheck run`` starts sees the working directory as the user left it, and leaves it so.

``fixtures/scripts/resumes_snapshot.py`` resumes from the ``snapshot.pt`` it saves in its working
directory, as minGPT-ddp's Trainer does. Its truth (truth.py: a real torchrun in a fresh directory)
is that it trains every epoch; run again in the same directory it trains nothing. Under ddpcheck every
run must train as in a fresh directory (the verdicts of a correct script, not "iterated no DataLoader"),
a snapshot the user already had must be seen by every run as it was, and the directory must be byte for
byte what it was afterwards. The overlay (a private mount namespace per run) and the view fallback are
each forced through ``DDPCHECK_WORKDIR``; ``off`` shows the hazard the fixture carries.

The guard tests below drive :class:`~ddpcheck.launch.workdir.WorkdirGuard` with real processes standing
in for ranks (a fresh interpreter that enters the view first thing, as a rank does), without torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from ddpcheck.launch.procs import Janitor
from ddpcheck.launch.workdir import WORKDIR_ENV, WorkdirGuard, compare, scan
from tests.conftest import ROOT
from tests.proc_utils import processes_with_env, wait_until_gone

SCRIPTS = ROOT / "fixtures" / "scripts"
TRUTH = {
    line["script"]: line["facts"]
    for line in map(json.loads, (SCRIPTS / "truth_results.jsonl").read_text().splitlines())
}
FAST = ["--world-sizes", "1,2", "--no-determinism", "--timeout", "120"]
TAG = "DDPCHECK_TEST_TAG"
LINUX = sys.platform == "linux"


def tree(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every path below ``root`` -> (mode, mtime_ns, sha256 of a file's bytes or a link's target)."""
    found = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        if stat.S_ISREG(info.st_mode):
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        elif stat.S_ISLNK(info.st_mode):
            digest = os.readlink(path)
        else:
            digest = ""
        found[str(path.relative_to(root))] = (info.st_mode, info.st_mtime_ns, digest)
    return found


def project(tmp_path: Path) -> Path:
    """A fresh directory holding the fixture and its truth logger, as a user's project would."""
    folder = tmp_path / "project"
    folder.mkdir()
    for name in ("resumes_snapshot.py", "_truth_log.py"):
        shutil.copy2(SCRIPTS / name, folder / name)
    return folder


def ddpcheck_run(
    cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 400
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ddpcheck", "run", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def epochs_trained(truth_dir: Path) -> dict[int, list[list[int]]]:
    """Rank -> the epochs each run's loop trained, one list per run in the order the runs came: the
    script logs one line per epoch when a run ends, so a run's lines are the ones up to its last epoch."""
    runs: dict[int, list[list[int]]] = {}
    for path in sorted(truth_dir.glob("rank*.jsonl")):
        epochs = [json.loads(line)["epoch"] for line in path.read_text().splitlines()]
        per_run: list[list[int]] = []
        for epoch in epochs:
            if not per_run or epoch <= per_run[-1][-1]:
                per_run.append([])
            per_run[-1].append(epoch)
        runs[int(path.stem[4:])] = per_run
    return runs


def failed_checks(report: dict) -> set[str]:  # type: ignore[type-arg]
    return {c for run in report["runs"] for c, v in run["checks"].items() if v["status"] == "fail"}


def old_snapshot(folder: Path, epochs_run: int) -> None:
    """A snapshot the user's own earlier run left: the script resumes from it at ``epochs_run``."""
    import torch

    model = torch.nn.Linear(1, 1)
    torch.save({"model": model.state_dict(), "epochs_run": epochs_run}, folder / "snapshot.pt")


# --- the script under ddpcheck ---------------------------------------------------------------------------


@pytest.mark.skipif(not LINUX, reason="the overlay needs Linux mount namespaces (the view is tested below)")
@pytest.mark.parametrize("mode", ["auto", "view"])
def test_every_run_trains_from_the_directory_as_the_user_left_it(tmp_path: Path, mode: str) -> None:
    """The first run's snapshot would make the next run train nothing: each run trains every epoch its
    truth says, the verdicts are a correct script's, and nothing is left in the directory."""
    folder, truth = project(tmp_path), tmp_path / "truth"
    truth.mkdir()
    before = tree(folder)
    proc = ddpcheck_run(
        folder, *FAST, "--report-dir", str(tmp_path / "reports"), "--", "resumes_snapshot.py",
        env={WORKDIR_ENV: mode, "TRUTH_DIR": str(truth)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "reports" / "ddpcheck.json").read_text())
    assert failed_checks(report) == set() and all(not run["failures"] for run in report["runs"])
    epochs = list(range(TRUTH["resumes_snapshot"]["train"]["epochs"]))
    # world size 1, then 2, then the step's replay at 1 (it too starts from the directory as it was)
    assert epochs_trained(truth) == {0: [epochs, epochs, epochs], 1: [epochs]}
    assert tree(folder) == before
    wrote = [note for note in report["notes"] if "snapshot.pt" in note]
    assert len(wrote) == 1 and "at world sizes 1 and 2" in wrote[0] and "unchanged" in wrote[0], wrote
    assert ("view" in wrote[0]) == (mode == "view")


@pytest.mark.skipif(not LINUX, reason="the overlay needs Linux mount namespaces (the view is tested below)")
@pytest.mark.parametrize("mode", ["auto", "view"])
def test_a_snapshot_the_user_had_is_what_every_run_resumes_from(tmp_path: Path, mode: str) -> None:
    """An old snapshot (1 of 2 epochs done) placed before ddpcheck runs: every run resumes from it the
    same way (trains epoch 1 only), and it is byte for byte the same afterwards."""
    folder, truth = project(tmp_path), tmp_path / "truth"
    truth.mkdir()
    old_snapshot(folder, 1)
    before = tree(folder)
    proc = ddpcheck_run(
        folder, *FAST, "--report-dir", str(tmp_path / "reports"), "--", "resumes_snapshot.py",
        env={WORKDIR_ENV: mode, "TRUTH_DIR": str(truth)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "reports" / "ddpcheck.json").read_text())
    assert failed_checks(report) == set()
    assert epochs_trained(truth) == {0: [[1], [1], [1]], 1: [[1]]}  # ws 1, ws 2, the step's replay
    assert tree(folder) == before


def test_without_a_view_the_next_run_resumes_and_its_output_says_so(tmp_path: Path) -> None:
    """``DDPCHECK_WORKDIR=off`` (the user's directory itself, as torchrun twice in a row): world size 2
    resumes from world size 1's snapshot and trains nothing; the failure shows what the rank printed."""
    folder = project(tmp_path)
    proc = ddpcheck_run(
        folder, *FAST, "--report-dir", str(tmp_path / "reports"), "--", "resumes_snapshot.py",
        env={WORKDIR_ENV: "off"},
    )  # fmt: skip
    assert proc.returncode == 3, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "reports" / "ddpcheck.json").read_text())
    failures = [f for run in report["runs"] for f in run["failures"]]
    assert [f["message"] for f in failures] == ["the script iterated no DataLoader"]
    assert "rank 0: resuming from snapshot.pt at epoch 2" in failures[0]["output"]
    assert "resuming from snapshot.pt at epoch 2" in proc.stdout  # the table shows it too
    assert (folder / "snapshot.pt").exists()  # off means off


def test_a_crash_and_a_hang_show_the_ranks_last_output_lines(tmp_path: Path) -> None:
    """What the script printed before it raised, or before it stopped answering, is in the report."""
    (tmp_path / "crashes.py").write_text(
        'print("loading the config", flush=True)\nraise RuntimeError("no config.yaml")\n'
    )
    (tmp_path / "hangs.py").write_text(
        "import time\nprint('waiting for the data server', flush=True)\ntime.sleep(600)\n"
    )
    for script, kind, timeout in (("crashes.py", "error", "60"), ("hangs.py", "hang", "30")):
        reports = tmp_path / f"reports-{script}"
        proc = ddpcheck_run(
            tmp_path, "--world-sizes", "1", "--timeout", timeout, "--report-dir", str(reports), "--", script
        )
        assert proc.returncode == 3, proc.stdout + proc.stderr
        failure = json.loads((reports / "ddpcheck.json").read_text())["runs"][0]["failures"][0]
        assert failure["kind"] == kind
        printed = "loading the config" if kind == "error" else "waiting for the data server"
        assert failure["output"] == printed, failure
        assert "ddpcheck.record" not in failure["output"]


@pytest.mark.skipif(not LINUX, reason="process and mount inspection through /proc")
def test_nothing_outlives_a_killed_ddpcheck(tmp_path: Path) -> None:
    """SIGKILL while ranks run in a run's namespace: its holder, its ranks and its upper folders go."""
    folder = project(tmp_path)
    (folder / "waits.py").write_text(
        "import time\nimport torch.distributed as dist\ndist.init_process_group('gloo')\ntime.sleep(600)\n"
    )
    temp = tmp_path / "tmp"
    temp.mkdir()
    tag = f"workdir-{os.getpid()}-{time.monotonic_ns()}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddpcheck", "run", "--world-sizes", "1", "--timeout", "300",
         "--report-dir", str(tmp_path / "reports"), "--", "waits.py"],
        cwd=folder, env={**os.environ, "TMPDIR": str(temp), TAG: tag, WORKDIR_ENV: "overlay"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (_holders(tag) and _in_namespace(tag)):
            time.sleep(0.2)
        assert _holders(tag), "no namespace holder started"
        assert _in_namespace(tag), "no rank entered the run's mount namespace"
        assert any(p.name.startswith("ddpchk-ov-") for p in temp.iterdir())
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert not wait_until_gone(lambda: processes_with_env(TAG, tag), timeout=15)
    assert not wait_until_gone(lambda: set(temp.iterdir()), timeout=10)  # type: ignore[arg-type]


def _holders(tag: str) -> set[int]:
    return {pid for pid in processes_with_env(TAG, tag) if b"mountns.py" in _cmdline(pid)}


def _in_namespace(tag: str) -> set[int]:
    """The tagged processes whose mount namespace is not ours (a rank that joined its run's)."""
    ours = os.readlink("/proc/self/ns/mnt")
    found = set()
    for pid in processes_with_env(TAG, tag) - _holders(tag):
        try:
            if os.readlink(f"/proc/{pid}/ns/mnt") != ours:
                found.add(pid)
        except OSError:
            continue
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_a_bad_workdir_mode_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    proc = ddpcheck_run(tmp_path, "--", "train.py", env={WORKDIR_ENV: "tmpfs"})
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "ddpcheck: error: DDPCHECK_WORKDIR='tmpfs': use one of auto, overlay, view, off"
    ], proc.stderr


@pytest.mark.skipif(not LINUX, reason="the overlay is Linux's")
def test_an_overlay_asked_for_where_none_can_be_had_is_one_line(tmp_path: Path) -> None:
    """Run from ``/``: every temp folder lies inside the working directory, so no upper layer can."""
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    proc = ddpcheck_run(Path("/"), "--", str(script), env={WORKDIR_ENV: "overlay"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "DDPCHECK_WORKDIR=overlay: no private view of /" in lines[0], lines


# --- the guard, with a plain process standing in for a rank ------------------------------------------------


class _Janitor:
    """A real janitor for the test's lifetime (it would clean up if the test process died)."""

    def __init__(self, tmp_path: Path) -> None:
        self.janitor = Janitor(str(tmp_path / "janitor-workdir"))

    def __enter__(self) -> Janitor:
        return self.janitor

    def __exit__(self, *exc: object) -> None:
        self.janitor.close()


def rank(cwd: str, env: dict[str, str], body: str, python: str = sys.executable) -> str:
    """Run ``body`` in a fresh interpreter that enters the run's view first thing, as a rank does."""
    code = "from ddpcheck.launch.workdir import enter_workdir\nproblem = enter_workdir()\n"
    code += "assert not problem, problem\n" + textwrap.dedent(body)
    proc = subprocess.run(
        [python, "-c", code],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def user_directory(tmp_path: Path) -> Path:
    folder = tmp_path / "user"
    (folder / "data").mkdir(parents=True)
    (folder / "old").mkdir()
    (folder / "keep").mkdir()  # stands for ddpcheck's own temp folder inside the directory
    (folder / "config.txt").write_text("lr=0.1\n")
    (folder / "gone.txt").write_text("delete me\n")
    (folder / "data" / "log.txt").write_text("first line\n")
    (folder / "old" / "a.txt").write_text("a\n")
    return folder


def changes(folder: Path) -> str:
    """What the stand-in rank does: ddpcheck's own folder is written by its absolute path, as a rank
    writes its trace."""
    return f"""
    import os, pathlib, shutil
    open("snapshot.pt", "wb").write(b"x" * 12000)            # new
    open("config.txt", "a").write("lr=0.2\\n")                 # changed in place
    os.remove("gone.txt")                                      # deleted
    os.makedirs("runs/exp", exist_ok=True)                     # a new folder, 2 files
    pathlib.Path("runs/exp/events").write_text("e" * 10)
    pathlib.Path("runs/exp/more").write_text("m")
    with open("data/log.txt", "a") as handle:                 # changed below an existing folder
        handle.write("second line\\n")
    shutil.rmtree("old")                                       # a folder deleted
    open({str(folder / "keep" / "trace")!r}, "w").write("for ddpcheck")
    print(open("config.txt").read().count("lr="), open("data/log.txt").read().count("line"))
    """


EXPECTED = {
    ("wrote", "snapshot.pt", 12000, 0),
    ("wrote", "config.txt", 14, 0),
    ("deleted", "gone.txt", 0, 0),
    ("wrote", "runs/", 11, 2),
    ("wrote", "data/log.txt", 23, 0),
    ("deleted", "old", 0, 0),
}


def written(guard: WorkdirGuard, how: str) -> set[tuple[str, str, int, int]]:
    return {(c.kind, c.path, c.size, c.files) for _, h, found in guard.written if h == how for c in found}


def take_back_keep(folder: Path, before: dict[str, tuple[int, int, str]]) -> str:
    """ddpcheck's own file, read and removed as ddpcheck does, its folder's time put back."""
    text = (folder / "keep" / "trace").read_text()
    (folder / "keep" / "trace").unlink()
    os.utime(folder / "keep", ns=(before["keep"][1], before["keep"][1]))
    return text


@pytest.mark.skipif(not LINUX, reason="the overlay needs Linux mount namespaces")
def test_the_overlay_keeps_a_runs_writes_apart_and_lists_them(tmp_path: Path) -> None:
    folder = user_directory(tmp_path)
    guard = WorkdirGuard(str(folder), own=[str(folder / "keep")], mode="overlay")
    with _Janitor(tmp_path) as janitor:
        before = tree(folder)
        run = guard.start("world size 2", janitor)
        assert run.mode == "overlay" and run.holder is not None
        assert rank(run.cwd, run.env, changes(folder)).split() == ["2", "2"]  # it reads back its writes
        again = rank(run.cwd, run.env, "print(open('config.txt').read().count('lr='))")
        assert again.strip() == "2"  # a second rank of the same run sees the first one's writes
        guard.finish(run)
        assert run.holder.returncode is not None and not os.path.exists(run.temp)
        assert take_back_keep(folder, before) == "for ddpcheck"  # reached ddpcheck through the overlay
        assert tree(folder) == before
        fresh = guard.start("world size 1", janitor)  # the next run starts from the user's directory
        assert rank(fresh.cwd, fresh.env, "print(open('config.txt').read())") == "lr=0.1\n\n"
        guard.finish(fresh)
    assert written(guard, "overlay") == EXPECTED
    assert guard.notes() == [
        "the script wrote config.txt (14 bytes), data/log.txt (23 bytes), runs/ (2 files, 11 bytes) and "
        "snapshot.pt (12 kB) (and 2 more paths) in its working directory at world size 2; every run started "
        "from your directory as you left it, and your directory is unchanged"
    ]


def test_the_view_keeps_pythons_writes_apart_and_reports_what_got_past(tmp_path: Path) -> None:
    folder = user_directory(tmp_path)
    (folder / "data" / "shell.txt").write_text("kept?\n")
    guard = WorkdirGuard(str(folder), own=[str(folder / "keep")], mode="view")
    with _Janitor(tmp_path) as janitor:
        before = tree(folder)
        run = guard.start("world size 1", janitor)
        assert run.mode == "view" and run.cwd != str(folder)
        past = "import subprocess\nsubprocess.run(['sh', '-c', 'echo past >> data/shell.txt'], check=True)\n"
        assert rank(run.cwd, run.env, textwrap.dedent(changes(folder)) + past).split() == ["2", "2"]
        guard.finish(run)
        assert not os.path.exists(run.temp)
    assert take_back_keep(folder, before) == "for ddpcheck"
    after = tree(folder)
    assert (folder / "data" / "shell.txt").read_text() == "kept?\npast\n"  # a shell's write got past
    (folder / "data" / "shell.txt").write_text("kept?\n")
    mtime = before["data/shell.txt"][1]
    os.utime(folder / "data" / "shell.txt", ns=(mtime, mtime))
    assert tree(folder) == before and after != before  # nothing else reached the directory
    assert written(guard, "view") == EXPECTED
    assert written(guard, "leaked") == {("wrote", "data/shell.txt", 11, 0)}
    kept, got_past = guard.notes()
    assert "every run started from a view of your directory (DDPCHECK_WORKDIR=view)" in kept
    assert "unchanged" not in kept
    assert got_past.startswith("the script wrote data/shell.txt (11 bytes) in your directory itself at world")


def test_a_scan_sees_new_changed_and_deleted_paths(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("1")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x").write_text("x")
    before = scan(str(tmp_path))
    assert before is not None
    (tmp_path / "a").write_text("22")
    shutil.rmtree(tmp_path / "d")
    (tmp_path / "n").mkdir()
    (tmp_path / "n" / "y").write_text("yy")
    after = scan(str(tmp_path))
    assert after is not None
    found = [(c.kind, c.path, c.size, c.files) for c in compare(before, after)]
    assert found == [("wrote", "a", 2, 0), ("wrote", "n/", 2, 1), ("deleted", "d", 0, 0)]


def _root_with(*tools: str) -> str:
    if not LINUX or os.geteuid() != 0:
        return "needs root to set the scene (a mount, another user)"
    missing = [tool for tool in tools if not shutil.which(tool)]
    return f"needs {', '.join(missing)}" if missing else ""


@pytest.mark.skipif(bool(_root_with("unshare", "mount")), reason=_root_with("unshare", "mount"))
def test_a_filesystem_mounted_below_the_directory_gets_its_own_overlay(tmp_path: Path) -> None:
    """An overlay does not reach into mounts below it: each gets one (a data volume in the project)."""
    folder = user_directory(tmp_path)
    volume = tmp_path / "volume"
    volume.mkdir()
    (volume / "shard.txt").write_text("shard 0\n")
    (folder / "volume").mkdir()
    scene = tmp_path / "scene.py"
    scene.write_text(
        textwrap.dedent(f"""
        import subprocess, sys
        subprocess.run(["mount", "--bind", {str(volume)!r}, {str(folder / "volume")!r}], check=True)
        sys.path.insert(0, {str(ROOT)!r})
        from ddpcheck.launch.procs import Janitor
        from ddpcheck.launch.workdir import WorkdirGuard
        guard = WorkdirGuard({str(folder)!r}, mode="overlay")
        janitor = Janitor({str(tmp_path / "j")!r})
        run = guard.start("world size 1", janitor)
        code = (
            "from ddpcheck.launch.workdir import enter_workdir; assert not enter_workdir();"
            "print(open('volume/shard.txt').read().strip());"
            "open('volume/shard.txt', 'a').write('more'); open('volume/new.txt', 'w').write('n')"
        )
        env = {{**run.env, "PYTHONPATH": {str(ROOT)!r}}}
        out = subprocess.run([sys.executable, "-c", code], cwd=run.cwd, env=env, capture_output=True,
                             text=True)
        guard.finish(run)
        janitor.close()
        print(out.stdout.strip(), out.returncode, guard.notes()[0])
        """)
    )
    out = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable, str(scene)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(
        "shard 0 0 the script wrote volume/new.txt (1 byte) and volume/shard.txt ("
    ), out
    assert (volume / "shard.txt").read_text() == "shard 0\n" and not (volume / "new.txt").exists()


@pytest.mark.skipif(
    bool(_root_with("setpriv")) or not os.path.exists("/usr/bin/python3"),
    reason=_root_with("setpriv") or "needs a Python any user may run (/usr/bin/python3)",
)
def test_an_unprivileged_user_gets_the_overlay_through_a_user_namespace() -> None:
    """Not root: the holder takes a user namespace of its own that maps the user to itself. (A folder
    under /tmp, as pytest's own temp folders are root's alone.)"""
    base = Path(tempfile.mkdtemp(prefix="ddpcheck-test-userns-", dir="/tmp"))
    try:
        folder = user_directory(base)
        temp = base / "t"
        temp.mkdir()
        scene = base / "scene.py"
        scene.write_text(
            textwrap.dedent(f"""
            import os, subprocess, sys, tempfile
            from ddpcheck.launch.procs import Janitor
            from ddpcheck.launch.workdir import WorkdirGuard
            guard = WorkdirGuard({str(folder)!r}, mode="overlay")
            janitor = Janitor({str(base / "j")!r})
            run = guard.start("world size 1", janitor)
            code = (
                "import os; from ddpcheck.launch.workdir import enter_workdir; assert not enter_workdir();"
                "open('config.txt', 'w').write('mine'); print(os.getuid(), open('config.txt').read())"
            )
            out = subprocess.run([sys.executable, "-c", code], cwd=run.cwd, env={{**os.environ, **run.env}},
                                 capture_output=True, text=True)
            guard.finish(run)
            janitor.close()
            print(out.stdout.strip(), out.stderr.strip(), guard.notes(), os.listdir(tempfile.gettempdir()))
            """)
        )
        for path in [base, *base.rglob("*")]:
            os.chown(path, 65534, 65534)
        out = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", str(scene)],
            capture_output=True,
            text=True,
            timeout=120,
            env={"PATH": os.environ["PATH"], "TMPDIR": str(temp), "HOME": str(base), "PYTHONPATH": str(ROOT)},
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("65534 mine  ['the script wrote config.txt (4 bytes) in its work"), (
            out.stdout
        )
        assert out.stdout.rstrip().endswith("[]"), out.stdout  # its upper folder is gone
        assert (folder / "config.txt").read_text() == "lr=0.1\n"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_mode_comes_from_the_environment_and_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(WORKDIR_ENV, " View ")
    assert WorkdirGuard("/").mode == "view"
    monkeypatch.delenv(WORKDIR_ENV)
    assert WorkdirGuard("/").mode == "auto"
    with pytest.raises(ValueError, match="DDPCHECK_WORKDIR='x': use one of auto, overlay, view, off"):
        WorkdirGuard("/", mode="x")
