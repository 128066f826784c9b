"""Preloading a loader file's imports in the parent: real imports, real forked ranks, no mocks.

The packages under tests/data/preload/site stand in for site-packages; each does one thing at import
(sleeps, fails, hangs, starts a thread, reads RANK, prints, installs a signal handler).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpcheck.launch import GroupCall, run_ranks
from ddpcheck.launch.preload import preload_imports, refresh_rank_state
from ddpcheck.options import BadInput, CheckOptions
from ddpcheck.session import check_loader
from tests.conftest import DATA

SITE = DATA / "preload" / "site"
PACKAGES = (
    "ddpc_slowpkg",
    "ddpc_failpkg",
    "ddpc_hangpkg",
    "ddpc_threadpkg",
    "ddpc_rankzero",
    "ddpc_noisypkg",
    "ddpc_nativethread",
    "ddpc_sigpkg",
    "ddpc_envpkg",
)
QUICK = CheckOptions(world_sizes=(1, 2), epochs=1, determinism=False, timeout=60)

LOADER = """
import pathlib
import ddpc_slowpkg
from torch.utils.data import DataLoader, DistributedSampler

pathlib.Path({side_effect!r}).write_text("user module code ran")

def make_loader(rank, world_size):
    data = list(range(8))
    return DataLoader(data, batch_size=2, sampler=DistributedSampler(data, world_size, rank, shuffle=False))
"""


@pytest.fixture
def site(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """The fake site-packages on sys.path, a fresh import log, and no test package left imported after."""
    monkeypatch.syspath_prepend(str(SITE))
    log = tmp_path / "imports.log"
    monkeypatch.setenv("DDPC_PRELOAD_LOG", str(log))
    yield log
    for name in ("ddpc_threadpkg", "ddpc_nativethread"):
        if name in sys.modules:
            sys.modules[name].stop()
    for name in PACKAGES:
        sys.modules.pop(name, None)
    os.environ.pop("DDPC_ENVPKG_WAS_HERE", None)


def _write(path: Path, source: str) -> str:
    path.write_text(textwrap.dedent(source))
    return str(path)


def _importers(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split()] if log.exists() else []


def test_parent_imports_once_and_forked_ranks_do_not_import_again(site: Path, tmp_path: Path) -> None:
    side_effect = tmp_path / "side_effect.txt"
    loader = _write(tmp_path / "loader.py", LOADER.format(side_effect=str(side_effect)))

    report = preload_imports(loader, deadline_s=30)
    assert "ddpc_slowpkg" in report.imported
    assert report.imported["ddpc_slowpkg"] >= 0.45, "the 0.5 s import happened here"
    assert _importers(site) == [os.getpid()]
    assert not side_effect.exists(), "preloading must not run the loader file itself"

    result = check_loader(loader, QUICK)
    assert result.ok, result
    assert side_effect.exists(), "the ranks ran the loader file"
    assert _importers(site) == [os.getpid()], "no rank imported ddpc_slowpkg again"


def test_without_preload_every_rank_imports_it(site: Path, tmp_path: Path) -> None:
    """The control for the test above: the same run, nothing preloaded, shows one import per rank run."""
    loader = _write(tmp_path / "loader.py", LOADER.format(side_effect=str(tmp_path / "side_effect.txt")))
    assert check_loader(loader, dataclasses.replace(QUICK, preload=False)).ok
    importers = _importers(site)
    assert len(importers) == 3, importers  # the reference rank, then 2 ranks at ws=2 (ws=1 reuses it)
    assert os.getpid() not in importers


def test_a_failing_import_is_skipped_silently_and_the_rank_reports_it_as_before(
    site: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    loader = _write(
        tmp_path / "loader.py",
        """
        import ddpc_failpkg
        def make_loader():
            pass
        """,
    )
    with pytest.raises(BadInput) as plain:
        check_loader(loader, QUICK)
    capfd.readouterr()
    report = preload_imports(loader, deadline_s=30)
    assert capfd.readouterr() == ("", ""), "nothing printed"
    assert report.imported == {}
    assert report.skipped["ddpc_failpkg"].startswith("failed: RuntimeError: ddpc_failpkg cannot be imported")
    assert "ddpc_failpkg" not in sys.modules
    with pytest.raises(BadInput) as preloaded:
        check_loader(loader, QUICK)
    assert str(preloaded.value) == str(plain.value)
    assert "RuntimeError: ddpc_failpkg cannot be imported here" in str(plain.value)


def test_an_import_past_the_deadline_is_interrupted_and_skipped(site: Path, tmp_path: Path) -> None:
    loader = _write(tmp_path / "loader.py", "import ddpc_hangpkg\nimport ddpc_rankzero\n")
    started = time.monotonic()
    report = preload_imports(loader, deadline_s=1.0)
    assert time.monotonic() - started < 5, "the 30 s import was cut off at the deadline"
    assert "longer than" in report.skipped["ddpc_hangpkg"]
    assert report.skipped["ddpc_rankzero"] == "deadline passed before it started"
    assert "ddpc_hangpkg" not in sys.modules
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_thread_starting_module_is_detected(site: Path, tmp_path: Path) -> None:
    loader = _write(tmp_path / "loader.py", "import ddpc_threadpkg\nimport ddpc_rankzero\n")
    report = preload_imports(loader, deadline_s=30)
    assert "ddpc_threadpkg" in report.imported
    [note] = report.threads
    assert note.module == "ddpc_threadpkg"
    assert note.python == ("ddpc-threadpkg-worker",)
    assert not report.fork_safe
    assert any("ddpc_threadpkg" in line and "multi-threaded" in line for line in report.notes())


def test_a_native_thread_is_detected_too(site: Path, tmp_path: Path) -> None:
    loader = _write(tmp_path / "loader.py", "import ddpc_nativethread\n")
    report = preload_imports(loader, deadline_s=30)
    [note] = report.threads
    assert note.module == "ddpc_nativethread"
    assert note.python == () and len(note.native) == 1 and note.unknown == note.native
    assert not report.fork_safe
    assert any("ddpc_nativethread" in line for line in report.notes())


def test_user_code_is_never_imported(site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Siblings (module or package) resolve to the loader's directory: left alone, even on sys.path."""
    monkeypatch.syspath_prepend(str(tmp_path))
    marker = tmp_path / "ran.txt"
    for name in ("ddpc_sibling.py", "ddpc_sibpkg/__init__.py"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(f"open({str(marker)!r}, 'a').write({name!r})\n")
    loader = _write(
        tmp_path / "loader.py",
        """
        from typing import TYPE_CHECKING
        import ddpc_sibling
        from ddpc_sibpkg import thing
        from . import relative_thing
        if TYPE_CHECKING:
            import ddpc_threadpkg
        try:
            import ddpc_noisypkg
        except ImportError:
            pass
        def make_loader():
            import ddpc_hangpkg
        """,
    )
    report = preload_imports(loader, deadline_s=30)
    assert not marker.exists()
    assert "user code" in report.skipped["ddpc_sibling"]
    assert "user code" in report.skipped["ddpc_sibpkg"]
    assert "ddpc_sibpkg.thing" not in report.candidates
    assert report.candidates == ("ddpc_noisypkg",), "try: is followed; TYPE_CHECKING, functions are not"
    assert "ddpc_threadpkg" not in sys.modules and "ddpc_hangpkg" not in sys.modules


def test_nothing_reaches_stdout_and_the_output_is_kept(tmp_path: Path) -> None:
    """In a fresh interpreter, where sys.stdout is fd 1 as under the ddpcheck command (pytest swaps it)."""
    loader = _write(tmp_path / "loader.py", "import ddpc_noisypkg\n")
    result = tmp_path / "result.json"
    code = (
        "import json, sys; from ddpcheck.launch.preload import preload_imports; "
        f"r = preload_imports({loader!r}, deadline_s=30); "
        f"open({str(result)!r}, 'w').write(json.dumps([sorted(r.imported), r.output]))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SITE), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == ("", "")
    imported, output = json.loads(result.read_text())
    assert imported == ["ddpc_noisypkg"]
    for text in ("noisypkg says hello on stdout", "noisypkg raw fd 1", "noisypkg raw fd 2"):
        assert text in output


def test_a_signal_handler_installed_at_import_is_put_back(site: Path, tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    loader = _write(tmp_path / "loader.py", "import ddpc_sigpkg\n")
    report = preload_imports(loader, deadline_s=30)
    assert "ddpc_sigpkg" in report.imported
    assert signal.getsignal(signal.SIGTERM) is before
    assert report.signals_restored == {"ddpc_sigpkg": ("SIGTERM",)}


def test_imports_see_the_ranks_thread_default_and_keep_what_they_set(
    site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OMP_NUM_THREADS=1 as in a rank, only while importing; what a module sets itself stays."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    loader = _write(tmp_path / "loader.py", "import ddpc_envpkg\n")
    report = preload_imports(loader, deadline_s=30)
    assert sys.modules["ddpc_envpkg"].seen == "1"
    assert "OMP_NUM_THREADS" not in os.environ
    assert os.environ["DDPC_ENVPKG_WAS_HERE"] == "1"
    assert report.env_set == {"ddpc_envpkg": ("DDPC_ENVPKG_WAS_HERE",)}


def _rank_zero_value(refresh: bool) -> int:
    import ddpc_rankzero

    if refresh:
        refresh_rank_state()
    return int(ddpc_rankzero.rank_zero_only.rank)


@pytest.mark.parametrize("refresh", [False, True])
def test_rank_state_read_at_import_is_refreshed_in_each_rank(
    site: Path, tmp_path: Path, refresh: bool
) -> None:
    loader = _write(tmp_path / "loader.py", "import ddpc_rankzero\n")
    report = preload_imports(loader, deadline_s=30)
    assert report.rank_env == {"ddpc_rankzero": ("RANK",)}
    assert any("ddpc_rankzero reads RANK" in line for line in report.notes())
    result = run_ranks(GroupCall(_rank_zero_value, 3, kwargs={"refresh": refresh}, timeout=60))
    result.raise_for_failures()
    # the launch refreshes rank state in every rank itself; an explicit second refresh changes nothing
    assert result.values == [0, 1, 2]


def test_only_module_level_imports_are_preloaded(tmp_path: Path) -> None:
    """The walk over the file: module-level statements (inside if/else and try too), never a class
    or function body, relative imports, ``__main__`` or ``__future__``; ``from m import x`` names m."""
    source = """
        import ddpc_gone_a.b, ddpc_gone_c as d
        from ddpc_gone_e.f import g, h
        from . import rel
        from .x import y
        import __main__
        from __future__ import annotations
        if X:
            import ddpc_gone_i
        else:
            import ddpc_gone_j
        try:
            import ddpc_gone_k
        except ImportError:
            import ddpc_gone_m
        finally:
            import ddpc_gone_n
        class C:
            import ddpc_gone_not_this
        def f():
            import ddpc_gone_nor_this
        """
    report = preload_imports(_write(tmp_path / "walk.py", textwrap.dedent(source)), deadline_s=5)
    names = ["a.b", "c", "e.f", "i", "j", "k", "m", "n"]
    assert report.skipped == {f"ddpc_gone_{n}": "not found" for n in names}
    assert report.candidates == () and report.already == ()


def test_a_bad_file_gives_an_empty_report(tmp_path: Path) -> None:
    assert preload_imports(str(tmp_path / "missing.py"), deadline_s=5).candidates == ()
    broken = _write(tmp_path / "broken.py", "import os\ndef (:\n")
    assert preload_imports(broken, deadline_s=5).candidates == ()


LIGHTNING_SCRIPT = """
import json, os, sys, time
from ddpcheck.launch import GroupCall, run_ranks
from ddpcheck.launch.preload import preload_imports, refresh_rank_state

def rank_view():
    from lightning.pytorch.utilities import rank_zero_only
    before = rank_zero_only.rank
    refresh_rank_state()
    return [before, rank_zero_only.rank, "lightning" in sys.modules]

report = preload_imports(sys.argv[1], deadline_s=120)
result = run_ranks(GroupCall(rank_view, 2, timeout=60))
result.raise_for_failures()
print(json.dumps({"imported": sorted(report.imported), "rank_env": report.rank_env,
                  "fork_safe": report.fork_safe, "notes": report.notes(), "ranks": result.values,
                  "threads": [t.native for t in report.threads]}))
"""


@pytest.mark.slow
def test_real_lightning_preloads_and_its_rank_zero_state_is_refreshed(tmp_path: Path) -> None:
    """Lightning reads RANK at import; imported in the parent, every rank would be rank 0 until refreshed.

    In a subprocess: Lightning's ~2,600 modules and scipy's BLAS threads stay out of the test process.
    """
    pytest.importorskip("lightning", reason="lightning is not installed (pip install lightning)")
    loader = _write(tmp_path / "loader.py", "import lightning as L\nfrom lightning.pytorch import Trainer\n")
    script = _write(tmp_path / "script.py", LIGHTNING_SCRIPT)
    done = subprocess.run(
        [sys.executable, script, loader], capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("\n") == 1, "nothing but the result line on stdout"
    out = json.loads(done.stdout)
    assert out["imported"] == ["lightning", "lightning.pytorch"]
    assert set(out["rank_env"]["lightning"]) >= {"RANK", "LOCAL_RANK"}
    assert out["fork_safe"] and out["notes"] == [], out
    assert out["ranks"] == [[0, 0, True], [1, 1, True]], "every rank sees its own rank (the launch refreshes)"
