"""Options are parsed once: one mesh parser (``ddpcheck.layout.parse_mesh``) with one message per rule for
the command line, ``[tool.ddpcheck]``, the API and the pytest marker; Layouts travel from there on."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from ddpcheck.cli import check_combination, main, parse
from ddpcheck.config import ConfigError
from ddpcheck.layout import MAX_REAL_RANKS, Layout, LayoutError, file_safe, parse_mesh, parse_meshes
from ddpcheck.options import TEST_WORLD_SIZES, WORLD_SIZES, BadInput, CheckOptions
from ddpcheck.pytest_plugin.check import check_options
from ddpcheck.pytest_plugin.marker import MarkerError, MeshSpec, Overrides, mesh_id, spec_from_marker
from tests.conftest import ROOT

PLAIN_DP = ROOT / "fixtures" / "mesh" / "plain_dp.py"


def _cli_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code = main([str(PLAIN_DP), "--report-dir", "/nonexistent/never-written", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    return err[0]


# --- one parser, one message per rule, everywhere ---


@pytest.mark.parametrize(
    ("spec", "mapping", "rule"),
    [
        ("dp=2.5", {"dp": 2.5}, "size of dp must be an integer"),
        ("dp=0,tp=2", {"dp": 0, "tp": 2}, "size of dp must be at least 1"),
        ("dp=2,1x=2", {"dp": 2, "1x": 2}, "is not a plain name"),
    ],
)
def test_the_marker_and_the_command_line_refuse_a_mesh_by_the_same_rule(
    capsys: pytest.CaptureFixture[str], spec: str, mapping: dict[str, object], rule: str
) -> None:
    assert rule in _cli_error(capsys, "--mesh", spec)
    with pytest.raises(MarkerError, match=rule):
        spec_from_marker((), {"mesh": mapping}, Overrides())
    with pytest.raises(MarkerError, match=rule):
        spec_from_marker((), {"mesh": spec}, Overrides())
    with pytest.raises(TypeError, match=rule):  # ddpcheck.check / assert_ddp_safe
        check_options(None, 2, None, {"meshes": mapping})


def test_a_boolean_size_is_no_size() -> None:
    with pytest.raises(LayoutError, match="size of dp must be an integer, got True"):
        parse_mesh({"dp": True})


def test_the_marker_forks_no_more_real_ranks_than_the_command_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert "a mesh of 4096 ranks exceeds 256 real ranks" in _cli_error(capsys, "--mesh", "dp=64,tp=64")
    with pytest.raises(MarkerError, match="a mesh of 4096 ranks exceeds 256 real ranks"):
        spec_from_marker((), {"mesh": {"dp": 64, "tp": 64}}, Overrides())
    with pytest.raises(MarkerError, match=f"world size {MAX_REAL_RANKS + 1} exceeds"):
        spec_from_marker((MAX_REAL_RANKS + 1,), {}, Overrides())
    assert spec_from_marker((), {"mesh": {"dp": 16, "tp": 16}}, Overrides()).world_sizes == (256,)


def test_a_single_table_is_one_mesh_everywhere(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        "[tool.ddpcheck]\nmeshes = {dp_replicate = 2, dp_shard = 2}\n", encoding="utf-8"
    )
    args = parse([str(PLAIN_DP)], cwd=tmp_path)
    check_combination(args)
    one = parse_mesh("dp_replicate=2,dp_shard=2")
    assert args.check_options.meshes == (one,)
    assert args.check_options.world_sizes == ()  # meshes alone, as --mesh alone
    assert check_options(None, 2, None, {"meshes": {"dp_replicate": 2, "dp_shard": 2}}).layouts == (one,)
    assert check_options(None, 2, None, {"meshes": [{"dp_replicate": 2, "dp_shard": 2}]}).layouts == (one,)


def test_a_list_of_tables_or_specs_is_several_meshes(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.ddpcheck]\nmeshes = [{dp = 2, tp = 2}, "dp=4"]\n', encoding="utf-8"
    )
    args = parse([str(PLAIN_DP)], cwd=tmp_path)
    check_combination(args)
    assert [m.spec for m in args.check_options.meshes] == ["dp=2,tp=2", "dp=4"]


def test_a_bad_table_names_the_file_and_key(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.ddpcheck]\nmeshes = {dp = 2.5}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"\[tool.ddpcheck\] meshes: mesh \{'dp': 2.5\}: size of dp"):
        parse([str(PLAIN_DP)], cwd=tmp_path)


def test_a_world_size_refused_in_pyproject_names_the_file_and_key(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.ddpcheck]\nworld-sizes = [0]\n", encoding="utf-8")
    args = parse([str(PLAIN_DP)], cwd=tmp_path)
    with pytest.raises(
        ValueError, match=r"pyproject.toml: \[tool.ddpcheck\] world-sizes: world sizes must be"
    ):
        check_combination(args)


def test_layouts_travel_from_the_command_line() -> None:
    args = parse([str(PLAIN_DP), "--mesh", "tp=2,pp=2", "--data-dims", "pp"])
    check_combination(args)
    (mesh,) = args.check_options.meshes
    assert isinstance(mesh, Layout) and mesh.data_dims == ("pp",)
    assert args.check_options.layouts[0] is mesh  # parsed once: passed straight through


def test_options_hold_layouts_for_every_form_of_mesh_from_when_they_are_made() -> None:
    layout = parse_mesh("dp=2,tp=2")
    for given in ("dp=2,tp=2", {"dp": 2, "tp": 2}, layout):
        options = CheckOptions(world_sizes=(), meshes=(given,))
        assert options.meshes == (layout,) and options.layouts == (layout,)
    with pytest.raises(BadInput, match="has no data-parallel dimension") as caught:
        CheckOptions(world_sizes=(), meshes=("tp=2",))
    assert caught.value.option == "meshes"
    # remade (dataclasses.replace) with other data dimensions: the layouts follow them
    again = replace(CheckOptions(world_sizes=(), meshes=("dp=2,tp=2",)), data_dims=("tp",))
    assert again.layouts[0].data_dims == ("tp",)
    with pytest.raises(BadInput, match="max idle must be a fraction") as idle:
        replace(again, max_idle=5.0)  # every rule holds for options remade too
    assert idle.value.option == "max_idle"


def test_every_front_end_takes_its_default_world_sizes_from_the_options() -> None:
    """The command's default is CheckOptions'; a check from a test suite (the pytest plugin's
    ``ddpcheck.check``) runs the quick one; each is one constant in ``ddpcheck.options``."""
    assert CheckOptions().world_sizes == WORLD_SIZES == (1, 2, 3, 4)
    assert parse([str(PLAIN_DP)]).world_sizes == WORLD_SIZES
    assert check_options(None, 2, None, {}).world_sizes == TEST_WORLD_SIZES == (1, 2)


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--allow", "typo", "unknown check id for --allow: typo; choose from coverage"),
        ("--max-idle", "5", "max idle must be a fraction at least 0 and below 1 (e.g. 0.2), got 5.0"),
    ],
)
def test_judge_refuses_bad_options_as_the_loader_command_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str, message: str
) -> None:
    """``ddpcheck judge`` checks its options by the same rules, with the same one line and exit 2, before
    it reads the directory (which here holds no launch: that would be another message)."""
    line = _cli_error(capsys, option, value)
    assert message in line
    judged = subprocess.run(
        [sys.executable, "-m", "ddpcheck", "judge", str(tmp_path), option, value],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert judged.returncode == 2 and "Traceback" not in judged.stderr, judged.stderr
    assert judged.stderr.strip().splitlines() == [line]  # the loader command's own line


def test_a_ten_thousand_dimension_spec_is_parsed_once_when_the_options_are_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ddpcheck.layout as layouts

    spec = ",".join(f"dp{i}=1" for i in range(10_000))
    parsed: list[object] = []
    real = layouts.parse_mesh
    monkeypatch.setattr(layouts, "parse_mesh", lambda *a, **k: parsed.append(a[0]) or real(*a, **k))
    options = CheckOptions(world_sizes=(), meshes=(spec,))
    assert parsed == [spec]
    for _ in range(5):  # plan, metric, training, resume and the CLI each ask for the meshes
        assert len(options.layouts[0].dims) == 10_000
    assert parsed == [spec]  # read, never parsed again
    layout = real(spec)
    assert len(layout.dims) == 10_000
    duplicated = spec + ",dp9999=1"
    with pytest.raises(LayoutError, match="dimension dp9999 is named twice"):
        parse_mesh(duplicated)


def test_an_error_about_a_huge_spec_is_one_short_line() -> None:
    with pytest.raises(LayoutError) as caught:
        parse_mesh(",".join(f"tp{i}=1" for i in range(10_000)))
    assert len(str(caught.value)) < 250 and "\n" not in str(caught.value)


# --- one name for a layout, one short form for files ---


def test_layout_name_is_the_wording_of_reports() -> None:
    assert Layout.plain(4).name == "world size 4"
    assert parse_mesh("dp=2,tp=2").name == "mesh dp=2,tp=2"


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("dp=12", "dp1=2"),  # digits' grouping
        ("dp=2,tpé=2", "dp=2,tpè=2"),  # non-ASCII characters
        ("dp=2,tp_=2", "dp=2,tp=2"),
        ("ws=4", "dp=4"),  # a mesh named like a world size's file name
    ],
)
def test_file_names_of_different_layouts_differ(a: str, b: str) -> None:
    first = parse_mesh(a, data_dims=(a.split("=")[0],))
    second = parse_mesh(b, data_dims=(b.split("=")[0],))
    assert first.file_name != second.file_name
    assert first.file_name != Layout.plain(4).file_name


def test_file_names_are_short_readable_and_filesystem_safe() -> None:
    assert Layout.plain(2).file_name == "ws2" and parse_mesh("dp=2,tp=2").file_name == "dp2-tp2"
    long = parse_mesh(",".join(f"dp_dimension_{i}=1" for i in range(50)))
    assert len(long.label) > 200
    name = long.file_name
    assert len(name) <= 40 and re.fullmatch(r"[A-Za-z0-9_-]+", name) and name.startswith("dp_dimension_0")
    assert file_safe("train.py:42") != file_safe("train.py-42") and "/" not in file_safe("a/b")


def test_marker_ids_use_the_short_file_name() -> None:
    assert mesh_id(parse_mesh("dp=2,tp=2")) == "mesh-dp2-tp2"
    assert mesh_id("dp=12") != mesh_id("dp1=2")
    assert MeshSpec(parse_mesh("dp=2,tp=2")) == MeshSpec("dp=2,tp=2")
    assert MeshSpec("dp=2,tp=2").spec == "dp=2,tp=2" and MeshSpec("tp=2").world_size == 2


def test_parse_meshes_drops_duplicates_and_keeps_order() -> None:
    assert [m.spec for m in parse_meshes(["dp=4", {"dp": 2, "tp": 2}, "dp=4"])] == ["dp=4", "dp=2,tp=2"]


# --- the command line and the options do not repeat each other's messages ---


def _messages(path: Path) -> set[str]:
    """The literal text of every message raised in ``path`` (f-string pieces included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) > 24:
            found.add(node.value)
    return found


def test_the_command_line_does_not_repeat_the_options_rules() -> None:
    package = ROOT / "ddpcheck"
    command_line = _messages(package / "cli.py") | _messages(package / "cli_values.py")
    assert any("got" in message for message in _messages(package / "cli_values.py"))  # the values' syntax
    shared = command_line & _messages(package / "options.py")
    assert shared == set()


def test_results_and_errors_are_importable_from_the_package_without_torch() -> None:
    code = (
        "import sys, ddpcheck\n"
        "assert 'torch' not in sys.modules\n"
        "from ddpcheck import BadInput, CheckResult, Interrupted, Verdict, WorldResult, check_loader\n"
        "from ddpcheck.result import CheckResult as C\n"
        "assert CheckResult is C and issubclass(BadInput, ValueError) and Verdict.__name__ == 'Verdict'\n"
        "assert set(dir(ddpcheck)) >= {'BadInput', 'CheckResult', 'Interrupted', 'Verdict', 'WorldResult'}\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
