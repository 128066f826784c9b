"""Reports render a hand-built CheckResult; these tests parse what they render and check every field."""

from __future__ import annotations

import json
import math
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpcheck.evidence import MetricValues, PaddingCost
from ddpcheck.options import CheckOptions
from ddpcheck.report import (
    SCHEMA_VERSION,
    ReportWriteError,
    render,
    render_html,
    render_json,
    render_junit,
    render_markdown,
    render_table,
    to_json_dict,
    write_reports,
)
from ddpcheck.report.json_report import jsonable
from ddpcheck.report.junit import xml_text
from ddpcheck.report.view import build_view, evidence
from ddpcheck.restores import RankRestore, ResumeRow
from ddpcheck.result import CheckResult, MetricRow, RunRecord, WorldResult
from ddpcheck.session import check_loader
from ddpcheck.trace import RankFailure
from ddpcheck.verdict import (
    DATA_CHECKS,
    METRIC_EQUIVALENCE,
    MIXTURE,
    NO_OVERLAP,
    PACKING,
    PROMPT_GROUPS,
    RNG_INDEPENDENCE,
    SHORT_LABELS,
    SUPERVISION,
    TRAINING_EQUIVALENCE,
    WORK_BALANCE,
    Verdict,
    allow,
    not_applicable,
    passed,
    skipped,
)
from tests.conftest import FIXTURES, JUNIT_XSD

STACK = (
    "Traceback (most recent call last):\n"
    + "".join(f'  File "/src/mod{i}.py", line {i + 1}, in f{i}\n    g{i}()\n' for i in range(40))
    + "ZeroDivisionError: division by zero\n"
)
OVERLAP = Verdict(
    NO_OVERLAP,
    "fail",
    "rank 1 and rank 3 both yield 2 samples in epoch 0.",
    "sampler is not a DistributedSampler",
    ranks=(1, 3),
    epochs=(0,),
    examples=(17, 42, (3, 4), "img_7.jpg"),
)
COVERAGE = Verdict(
    "coverage",
    "fail",
    "2 samples are never yielded by any rank.",
    "drop_last=True drops the tail",
    epochs=(0, 1),
    examples=("a.jpg", b"raw"),
)
CRASH = RankFailure(1, "error", "ZeroDivisionError: division by zero", STACK, "epoch 0, batch 4")


TOKENLESS = {
    WORK_BALANCE: "no tokens",
    PACKING: "no position_ids",
    MIXTURE: "no sources",
    SUPERVISION: "no labels",
    RNG_INDEPENDENCE: "draws not watched",
    PROMPT_GROUPS: "no runs of copies",
}  # n/a, as for a loader without tokens, labels, watched draws or prompt groups


def _world(n: int, *special: Verdict, **kwargs: object) -> WorldResult:
    by_check = {v.check: v for v in special}
    default = {c: not_applicable(c, why) for c, why in TOKENLESS.items()}
    verdicts = tuple(by_check.get(check, default.get(check, passed(check))) for check in DATA_CHECKS)
    return WorldResult(n, "gloo", verdicts, **kwargs)  # type: ignore[arg-type]


def _all_pass() -> CheckResult:
    return CheckResult("loaders/ok.py", (_world(1, seconds=0.5), _world(2, seconds=1.0)))


def _mixed() -> CheckResult:
    rows = (
        MetricRow("accuracy", 0.9, 0.92, 0.9, duplicated=3),
        MetricRow("loss", math.nan, 1.0, math.inf, order_only=True),
    )
    return CheckResult(
        "loaders/bad.py",
        (
            _world(1, skipped(NO_OVERLAP, "one rank cannot overlap"), seconds=1.0),
            _world(2, divergence=rows, seconds=2.0),
            _world(4, OVERLAP, COVERAGE, failures=(CRASH,), seconds=3.0),
            WorldResult(8, "gloo", skipped="needs 8 processes; this machine allows 4"),
        ),
        notes=("ids are dataset indices",),
    )


# ------------------------------------------------------------------ parsing helpers


def _section(text: str, title: str) -> list[str]:
    """The lines of a titled terminal section (title, dashed rule, body up to the next blank line)."""
    lines = text.splitlines()
    start = lines.index(title)
    assert lines[start + 1] == "-" * len(title)
    body = []
    for line in lines[start + 2 :]:
        if not line:
            break
        body.append(line)
    return body


def _parse_table(text: str, first_header: str) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of a tabulate "simple" table, cut at its dashed rule; wrapped rows joined."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first_header))
    rule = next(i for i in range(start, len(lines)) if re.fullmatch(r"[- ]+", lines[i]))
    spans = [(m.start(), m.end()) for m in re.finditer(r"-+", lines[rule])]

    def cut(line: str) -> list[str]:
        return [line[a : (b if k < len(spans) - 1 else None)].strip() for k, (a, b) in enumerate(spans)]

    header_lines = [cut(line) for line in lines[start:rule]]
    headers = [" ".join(filter(None, parts)) for parts in zip(*header_lines, strict=True)]
    rows: list[list[str]] = []
    for line in lines[rule + 1 :]:
        if not line.strip():
            break
        cells = cut(line)
        if cells[0] or not rows:
            rows.append(cells)
        else:
            rows[-1] = [f"{old} {new}".strip() for old, new in zip(rows[-1], cells, strict=True)]
    return headers, rows


# ------------------------------------------------------------------ terminal table


def test_table_all_pass_grid_and_summary() -> None:
    text = render_table(_all_pass())
    headers, rows = _parse_table(text, "ws")
    shown = [c for c in DATA_CHECKS if c not in TOKENLESS]  # n/a everywhere: left out of the grid
    assert headers == ["ws", *(SHORT_LABELS[c] for c in shown), "ranks"]
    assert rows == [[ws, *["PASS"] * len(shown), "ok"] for ws in ("1", "2")]
    assert "Details" not in text.splitlines()
    assert text.splitlines()[0] == "ddpcheck: loaders/ok.py  (ids: index, epochs: 2, backend: gloo)"
    assert (
        text.splitlines()[-1]
        == "ddpcheck: 18 passed, 0 failed, 12 n/a, 0 skipped across world sizes 1,2 -> OK (exit 0)"
    )


def test_table_mixed_cells_per_world_size() -> None:
    text = render_table(_mixed(), layout="tall", width=100)
    headers, rows = _parse_table(text, "check")
    assert headers == ["check", "ws=1", "ws=2", "ws=4", "ws=8"]
    cells = {row[0]: row[1:] for row in rows}
    assert cells["coverage"] == ["PASS", "PASS", "FAIL", "-"]
    assert cells["no_overlap"] == ["skip", "PASS", "FAIL", "-"]
    assert cells["determinism"] == ["PASS", "PASS", "PASS", "-"]
    assert cells["ranks"] == [
        "ok",
        "ok",
        "rank 1 crashed",
        "skipped: needs 8 processes; this machine allows 4",
    ]
    assert max(len(line) for line in text.splitlines()[:-1]) <= 100  # the summary line is never cut


def test_table_causes_come_first_and_details_refer_to_them() -> None:
    text = render_table(_mixed())
    assert _section(text, "Causes") == [
        "[1] drop_last=True drops the tail",
        "    -> coverage at ws=4",
        "[2] sampler is not a DistributedSampler",
        "    -> no_overlap at ws=4",
        "[3] crashed: ZeroDivisionError: division by zero",
        "    -> rank 1 at ws=4",
    ]
    assert text.index("Causes\n") < text.index("\nws ") < text.index("Details\n")


def test_table_details_carry_the_evidence() -> None:
    details = _section(render_table(_mixed()), "Details")
    at = details.index("[2] ws=4 no_overlap: rank 1 and rank 3 both yield 2 samples in epoch 0.")
    assert details[at + 1 : at + 4] == [  # the cause is listed once, at the top, not here
        "    ranks: 1, 3",
        "    epochs: 0",
        "    e.g.: 17, 42, (3, 4), 'img_7.jpg'",
    ]
    at = details.index("[1] ws=4 coverage: 2 samples are never yielded by any rank.")
    # no ranks on this verdict, so no "ranks:" line; bytes examples show as their repr
    assert details[at + 1 : at + 3] == ["    epochs: 0, 1", "    e.g.: 'a.jpg', b'raw'"]
    at = details.index("[3] ws=4 rank 1 error: ZeroDivisionError: division by zero")
    assert details[at + 1 : at + 3] == ["    progress: epoch 0, batch 4", "    stack:"]
    stack = details[at + 3 :]
    assert stack[0].startswith("        ... (") and "earlier lines omitted" in stack[0]
    assert stack[1] == '          File "/src/mod31.py", line 32, in f31'  # trimmed at a frame boundary
    assert stack[-2:] == ["            g39()", "        ZeroDivisionError: division by zero"]
    assert not any("mod0.py" in line for line in stack)
    assert len(stack) <= 22


def test_table_summary_counts_and_exit_codes() -> None:
    text = render_table(_mixed())
    assert text.splitlines()[-1] == (
        "ddpcheck: 24 passed, 2 failed, 18 n/a, 2 skipped, 1 rank failure across world sizes 1,2,4,8 "
        "-> FAIL (exit 3)"
    )
    only_checks = CheckResult("l.py", (_world(2, OVERLAP),))
    assert render_table(only_checks).splitlines()[-1] == (
        "ddpcheck: 8 passed, 1 failed, 6 n/a, 0 skipped across world size 2 -> FAIL (exit 1)"
    )
    nothing = render_table(CheckResult("l.py", ()))
    assert "(no world sizes were run)" in nothing
    assert (
        nothing.splitlines()[-1]
        == "ddpcheck: 0 passed, 0 failed, 0 skipped across no world sizes -> OK (exit 0)"
    )


def test_table_sections_skips_divergence_notes() -> None:
    text = render_table(_mixed())
    assert _section(text, "Skipped (could not be judged)") == ["[ws=1] no_overlap: one rank cannot overlap"]
    assert _section(text, "Notes") == ["- ids are dataset indices"]
    divergence = text[text.index("Divergence\n") :]
    assert divergence.splitlines()[2] == "ws=2:"
    headers, rows = _parse_table(divergence, "metric")
    assert headers == [
        "metric",
        "reference",
        "naive DDP",
        "corrected DDP",
        "naive diff",
        "corrected diff",
        "cause",
    ]
    assert rows == [
        ["accuracy", "0.9", "0.92", "0.9", "+0.02", "0", "duplicated 3"],
        ["loss", "nan", "1", "inf", "nan", "nan", "order only"],
    ]


def test_table_wide_layout_when_it_fits_and_tall_otherwise() -> None:
    few = CheckResult(
        "l.py",
        (
            WorldResult(1, "gloo", (passed("coverage"), passed(NO_OVERLAP))),
            WorldResult(2, "gloo", (passed("coverage"), OVERLAP), failures=(CRASH,)),
        ),
    )
    text = render_table(few)
    headers, rows = _parse_table(text, "ws")
    assert headers == ["ws", "cover", "overlap", "ranks"]
    assert rows == [["1", "PASS", "PASS", "ok"], ["2", "PASS", "FAIL", "rank 1 crashed"]]
    assert "columns: cover = coverage, overlap = no_overlap" in text
    # all eleven checks fit 100 columns side by side with short labels: one row per world size
    base = _world(2, OVERLAP)
    extra = (passed(METRIC_EQUIVALENCE), passed(TRAINING_EQUIVALENCE))
    many = CheckResult("l.py", (WorldResult(2, "gloo", (*base.verdicts, *extra)),))
    auto = render_table(many)
    assert max(len(line) for line in auto.splitlines()) <= 100
    wide_headers, wide_rows = _parse_table(auto, "ws")
    assert wide_headers[-3:] == ["metric", "train", "ranks"]
    assert len(wide_rows) == 1 and wide_rows[0][0] == "2"
    assert wide_rows[0][wide_headers.index("overlap")] == "FAIL"
    assert wide_rows[0].count("PASS") == 10
    # a narrow terminal turns the grid: one row per check
    narrow = render_table(many, width=60)
    tall_rows = _parse_table(narrow, "check")[1]
    shown = [c for c in DATA_CHECKS if c not in TOKENLESS]
    assert [row[0] for row in tall_rows] == [*shown, METRIC_EQUIVALENCE, TRAINING_EQUIVALENCE, "ranks"]


def test_table_color_and_backend_labels() -> None:
    result = CheckResult(
        "l.py",
        (
            WorldResult(2, "gloo", (passed("coverage"), OVERLAP)),
            WorldResult(2, "nccl", (skipped("coverage", "x"),)),
        ),
    )
    plain = render_table(result, layout="tall")
    assert "\x1b" not in plain
    assert _parse_table(plain, "check")[0] == ["check", "ws=2 gloo", "ws=2 nccl"]
    assert "backend:" not in plain.splitlines()[0]  # two backends: named per column instead
    colored = render_table(result, color=True, layout="tall")
    assert "\x1b[32mPASS\x1b[0m" in colored and "\x1b[1;31mFAIL\x1b[0m" in colored
    assert "\x1b[33mskip\x1b[0m" in colored
    assert colored.splitlines()[-1].endswith("-> \x1b[1;31mFAIL\x1b[0m (exit 1)")


def test_table_keeps_the_head_of_a_most_recent_first_dump() -> None:
    dump = "Thread 0x01 (most recent call first):\n" + "".join(
        f'  File "/src/w{i}.py", line {i} in f{i}\n' for i in range(50)
    )
    result = CheckResult(
        "l.py", (WorldResult(2, "gloo", failures=(RankFailure(0, "hang", "no progress", dump),)),)
    )
    details = _section(render_table(result), "Details")
    assert details[0] == "[1] ws=2 rank 0 hang: no progress"
    assert details[3] == '          File "/src/w0.py", line 0 in f0'
    assert details[-1] == "        ... (31 later lines omitted)"


def test_table_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="layout must be"):
        render_table(_all_pass(), layout="sideways")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="width must be at least 40"):
        render_table(_all_pass(), width=10)


# ------------------------------------------------------------------ JSON


def _known() -> CheckResult:
    verdict = Verdict(
        NO_OVERLAP,
        "fail",
        "2 samples on two ranks",
        "set_epoch missing",
        ranks=(0, 1),
        epochs=(1,),
        examples=(5, (6, (7, 8)), "x", b"\x00"),
        # a NaN on purpose: the report stays strict JSON whatever a check measured
        evidence=MetricValues({"acc": math.nan}, {"acc": 0.5}, {"acc": math.inf}, 2, 0, 0, False, "exact", 8),
    )
    failure = RankFailure(1, "hang", "timed out after 30 s", "Thread 0x1:\n  f()", "epoch 1, in all_reduce")
    return CheckResult(
        loader="pkg/loader.py",
        runs=(
            WorldResult(
                2,
                "gloo",
                verdicts=(verdict, passed("coverage")),
                failures=(failure,),
                divergence=(MetricRow("acc", 0.5, math.inf, 0.5, duplicated=1, cause="padding"),),
                seconds=1.5,
                resume=(
                    ResumeRow(
                        2,
                        2,
                        0,
                        3,
                        "fail",
                        4,
                        0,
                        3,
                        "state_dict lost the position",
                        outcome="failed",
                        before=6,
                        after=10,
                        ranks=(RankRestore(0, 3, 3), RankRestore(1, 3, 7, lost=4)),
                    ),
                ),
            ),
            WorldResult(4, "gloo", skipped="only 2 CPUs"),
        ),
        id_source="field:id",
        epochs=3,
        options=RunRecord(judged="/tmp/launch", fingerprint=True),
        notes=("ids come from field 'id'",),
    )


KNOWN_JSON = {
    "schema": 3,
    "ok": False,
    "exit_code": 3,
    "interrupted": False,
    "loader": "pkg/loader.py",
    "id_source": "field:id",
    "epochs": 3,
    "options": {"judged": "/tmp/launch", "fingerprint": True},
    "notes": ["ids come from field 'id'"],
    "summary": {
        "passed": 1,
        "failed": 1,
        "not_applicable": 0,
        "allowed": 0,
        "skipped": 1,
        "rank_failures": 1,
        "world_sizes": [2, 4],
        "meshes": [],
    },
    "causes": [
        {
            "number": 1,
            "kind": "fail",
            "cause": "set_epoch missing",
            "explains": "no_overlap at ws=2",
            "fix": "",
            "where": [{"world_size": 2, "label": "2", "backend": "gloo", "what": "no_overlap"}],
        },
        {
            "number": 2,
            "kind": "rank",
            "cause": "hung: timed out after 30 s",
            "explains": "rank 1 at ws=2",
            "fix": "",
            "where": [{"world_size": 2, "label": "2", "backend": "gloo", "what": "rank 1"}],
        },
    ],
    "runs": [
        {
            "world_size": 2,
            "label": "ws=2",
            "loader": "",
            "mesh": None,
            "backend": "gloo",
            "ok": False,
            "skipped": "",
            "seconds": 1.5,
            "padding": "",
            "idle": "",
            "checks": {
                "coverage": {
                    "status": "pass",
                    "detail": "",
                    "cause": "",
                    "fix": "",
                    "ranks": [],
                    "epochs": [],
                    "examples": [],
                    "data": {},
                },
                "no_overlap": {
                    "status": "fail",
                    "detail": "2 samples on two ranks",
                    "cause": "set_epoch missing",
                    "fix": "",
                    "ranks": [0, 1],
                    "epochs": [1],
                    "examples": [5, [6, [7, 8]], "x", "b'\\x00'"],
                    "data": {
                        "reference": {"acc": "NaN"},
                        "naive": {"acc": 0.5},
                        "corrected": {"acc": "Infinity"},
                        "duplicated": 2,
                        "dropped": 0,
                        "extra": 0,
                        "order_differs": False,
                        "tolerance": "exact",
                        "samples": 8,
                    },
                },
            },
            "failures": [
                {
                    "rank": 1,
                    "kind": "hang",
                    "message": "timed out after 30 s",
                    "stack": "Thread 0x1:\n  f()",
                    "progress": "epoch 1, in all_reduce",
                    "output": "",
                }
            ],
            "divergence": [
                {
                    "metric": "acc",
                    "reference": 0.5,
                    "naive": "Infinity",
                    "corrected": 0.5,
                    "naive_diff": "Infinity",
                    "corrected_diff": 0.0,
                    "duplicated": 1,
                    "dropped": 0,
                    "order_only": False,
                    "cause": "padding",
                }
            ],
            "resume": [
                {
                    "world_size_from": 2,
                    "world_size_to": 2,
                    "change": "2 -> 2",
                    "outcome": "failed",
                    "epoch": 0,
                    "step": 3,
                    "status": "fail",
                    "before": 6,
                    "after": 10,
                    "skipped": 4,
                    "repeated": 0,
                    "first_divergence": 3,
                    "note": "state_dict lost the position",
                    "ranks": [
                        {"rank": 0, "before": 3, "after": 3, "lost": 0, "repeated": 0},
                        {"rank": 1, "before": 3, "after": 7, "lost": 4, "repeated": 0},
                    ],
                }
            ],
        },
        {
            "world_size": 4,
            "label": "ws=4",
            "loader": "",
            "mesh": None,
            "backend": "gloo",
            "ok": True,
            "skipped": "only 2 CPUs",
            "seconds": 0.0,
            "padding": "",
            "idle": "",
            "checks": {},
            "failures": [],
            "divergence": [],
            "resume": [],
        },
    ],
    "mixture": [],
}


def _strict_loads(text: str) -> object:
    def refuse(name: str) -> object:
        raise AssertionError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def test_json_matches_documented_schema_exactly() -> None:
    assert SCHEMA_VERSION == 3
    assert to_json_dict(_known()) == KNOWN_JSON
    assert _strict_loads(render_json(_known())) == KNOWN_JSON
    assert list(KNOWN_JSON["runs"][0]["checks"]) == ["coverage", "no_overlap"]  # type: ignore[index]
    assert list(to_json_dict(_known())["runs"][0]["checks"]) == ["coverage", "no_overlap"]


def test_json_round_trips_the_mixed_result() -> None:
    result = _mixed()
    data = _strict_loads(render_json(result))
    assert data == to_json_dict(result)
    assert isinstance(data, dict)
    assert data["exit_code"] == 3 and data["ok"] is False
    assert [run["world_size"] for run in data["runs"]] == [1, 2, 4, 8]
    ws4 = data["runs"][2]
    assert ws4["checks"]["no_overlap"]["examples"] == [17, 42, [3, 4], "img_7.jpg"]
    assert ws4["checks"]["coverage"]["examples"] == ["a.jpg", "b'raw'"]
    assert ws4["failures"][0]["stack"] == STACK
    loss = data["runs"][1]["divergence"][1]
    assert loss["reference"] == "NaN" and math.isnan(float(loss["reference"]))
    assert loss["corrected"] == "Infinity" and float(loss["corrected"]) == math.inf
    for run in data["runs"]:
        assert set(run) == {
            "world_size",
            "label",
            "loader",
            "mesh",
            "padding",
            "idle",
            "backend",
            "ok",
            "skipped",
            "seconds",
            "checks",
            "failures",
            "divergence",
            "resume",
        }
        for check in run["checks"].values():
            assert set(check) == {"status", "detail", "cause", "fix", "ranks", "epochs", "examples", "data"}


def test_jsonable_never_produces_invalid_json() -> None:
    cyclic: list[object] = [1]
    cyclic.append(cyclic)

    class Odd:
        def __repr__(self) -> str:
            return "<Odd>"

    value = {
        "set": frozenset({"b", "a"}),
        "inf": [math.inf, -math.inf, math.nan],
        "odd": Odd(),
        "bytes": b"\xff",
        "cyclic": cyclic,
        1: "int key",
        "nested": ((1, 2), [3]),
    }
    out = jsonable(value)
    text = json.dumps(out, allow_nan=False)
    back = json.loads(text)
    assert back["set"] == ["a", "b"]
    assert back["inf"] == ["Infinity", "-Infinity", "NaN"]
    assert back["odd"] == "<Odd>"
    assert back["bytes"] == "b'\\xff'"
    assert back["1"] == "int key"
    assert back["nested"] == [[1, 2], [3]]
    assert back["cyclic"][0] == 1  # cut off by depth, not a RecursionError


_HASHABLE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.binary(),
    lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=60)
@given(examples=st.lists(_HASHABLE, max_size=5), data=st.dictionaries(_HASHABLE, _HASHABLE, max_size=4))
def test_any_examples_and_data_give_strict_json(examples: list[object], data: dict[object, object]) -> None:
    verdict = Verdict("coverage", "fail", "d", examples=tuple(examples))
    text = render_json(CheckResult("l.py", (WorldResult(2, "gloo", (verdict,)),)))
    check = _strict_loads(text)["runs"][0]["checks"]["coverage"]  # type: ignore[index]
    assert len(check["examples"]) == len(examples)
    plain = _strict_loads(json.dumps(jsonable(data), allow_nan=False))
    assert len(plain) <= len(data)  # distinct keys may share a repr, never more keys


def test_json_keeps_repeated_check_ids_apart() -> None:
    result = CheckResult(
        "l.py", (WorldResult(2, "gloo", (passed("custom"), OVERLAP, skipped("custom", "why"))),)
    )
    checks = to_json_dict(result)["runs"][0]["checks"]
    assert list(checks) == [NO_OVERLAP, "custom", "custom#2"]
    assert checks["custom#2"]["status"] == "skip"


# ------------------------------------------------------------------ Markdown


def _md_table(text: str, first_header: str) -> list[list[str]]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header}"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]])
    return rows


def test_markdown_headline_table_and_details() -> None:
    text = render_markdown(_mixed())
    assert text.startswith("## ❌ ddpcheck failed\n")
    table = _md_table(text, "world size")
    assert table[0][0] == "world size" and table[0][-1] == "ranks"
    assert table[0][1:3] == ["`coverage`", "`no_overlap`"]
    assert set("".join(table[1])) <= set("-|")
    body = {row[0]: row for row in table[2:]}
    assert list(body) == ["ws=1", "ws=2", "ws=4", "ws=8"]
    assert body["ws=4"][1:3] == ["❌ **FAIL**", "❌ **FAIL**"]
    assert body["ws=1"][2] == "⏭️ skip"
    assert body["ws=4"][-1] == "rank 1 crashed"
    assert all(len(row) == len(table[0]) for row in table)
    causes = text[text.index("### Causes") : text.index("| world size")]
    assert "- **[2]** sampler is not a DistributedSampler  \n  explains: no\\_overlap at ws=4" in causes
    assert "- **[3]** crashed: ZeroDivisionError: division by zero  \n  explains: rank 1 at ws=4" in causes
    line = "- **[2]** **ws=4** `no_overlap`: rank 1 and rank 3 both yield 2 samples in epoch 0."
    assert line in text
    assert "cause: sampler" not in text  # the cause is named once, in the list at the top
    assert "  - e.g.: `17, 42, (3, 4), 'img_7.jpg'`" in text
    assert "  - ranks: `1, 3`" in text
    assert text.count("<details>") == text.count("</details>") == 1
    block = text[text.index("<details>") : text.index("</details>")]
    assert "```text\n" in block and block.rstrip().endswith("```")
    assert "ZeroDivisionError: division by zero\n```" in block
    divergence = _md_table(text, "metric")
    assert divergence[2] == ["accuracy", "0.9", "0.92", "0.9", "+0.02", "0", "duplicated 3"]
    assert divergence[3][1] == "nan"
    assert text.rstrip().endswith("- ids are dataset indices")


def test_markdown_escapes_user_text() -> None:
    nasty = Verdict("coverage", "fail", "bad <module> | a*b", "x_y", examples=("`tick`",))
    stack = "line\n```\nmore"
    result = CheckResult(
        "l.py",
        (
            WorldResult(
                2, "gloo", (nasty,), skipped="a | b", failures=(RankFailure(0, "error", "<boom>", stack),)
            ),
        ),
    )
    text = render_markdown(result)
    assert text.startswith("## ❌ ddpcheck failed")
    assert "bad \\<module\\> \\| a\\*b" in text
    assert "- **[1]** x\\_y  \n  explains: coverage at ws=2" in text
    assert "  - e.g.: ``'`tick`'``" in text  # a code span fence longer than the backticks inside
    table = _md_table(text, "world size")
    assert all(len(row) == len(table[0]) for row in table)  # the escaped "|" did not add a column
    assert "````text\nline\n```\nmore\n````" in text  # a longer fence than any inside the stack
    assert render_markdown(_all_pass()).startswith("## ✅ ddpcheck passed")


# ------------------------------------------------------------------ JUnit


def test_junit_counts_and_cases() -> None:
    root = ET.fromstring(render_junit(_mixed()))
    assert root.tag == "testsuites"
    suite = root.find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    assert len(cases) == 3 * 15 + 1 + 1  # 3 world sizes ran 15 checks, ws=8 skipped, one "ranks" case
    assert {k: suite.get(k) for k in ("tests", "failures", "errors", "skipped", "time")} == {
        "tests": "47",
        "failures": "3",  # two checks and the crashed ranks (the schema has no <error> element)
        "errors": "0",
        # ws=8 not run, ws=1's no_overlap, work_balance/packing/mixture/supervision/rng n/a at 3 world sizes
        "skipped": "20",
        "time": "6.000",
    }
    assert root.get("tests") == "47" and root.get("failures") == "3" and root.get("skipped") is None
    assert sum(len(case.findall("failure")) for case in cases) == 3
    by_id = {(case.get("classname"), case.get("name")): case for case in cases}
    failure = by_id[("ddpcheck.ws4", "no_overlap")].find("failure")
    assert failure is not None
    assert failure.get("message") == OVERLAP.detail
    assert failure.text is not None and "ranks: 1, 3" in failure.text and "e.g.: 17, 42" in failure.text
    error = by_id[("ddpcheck.ws4", "ranks")].find("failure")
    assert error is not None and error.get("message") == "rank 1 crashed"
    assert error.get("type") == "rank-failure"
    assert error.text is not None and error.text.rstrip().endswith("ZeroDivisionError: division by zero")
    world = by_id[("ddpcheck.ws8", "world_size")].find("skipped")
    assert world is not None and world.get("message") == "needs 8 processes; this machine allows 4"
    skip = by_id[("ddpcheck.ws1", "no_overlap")].find("skipped")
    assert skip is not None and skip.get("message") == "one rank cannot overlap"
    assert by_id[("ddpcheck.ws2", "coverage")].find("*") is None  # a pass has no child element
    times = [float(case.get("time", "nan")) for case in cases]
    assert math.isclose(sum(times), 6.0, abs_tol=0.01)


def test_junit_escapes_and_strips_what_xml_cannot_hold() -> None:
    detail = 'a < b && c > "d"\nsecond line'
    stack = "Traceback:\n\x1b[31mred\x1b[0m \x00 end"
    result = CheckResult(
        "l<&>.py",
        (
            WorldResult(
                2,
                "gloo",
                (Verdict("coverage", "fail", detail, cause="<cause>"),),
                failures=(RankFailure(0, "error", 'msg "<&>"', stack),),
            ),
        ),
    )
    text = render_junit(result, suite_name="my suite")
    root = ET.fromstring(text)
    suite = root.find("testsuite")
    assert suite is not None and suite.get("name") == "my suite"
    failure = root.find(".//failure")
    assert failure is not None and failure.get("message") == detail
    assert failure.text == "cause: <cause>"
    error = root.find(".//failure[@type='rank-failure']")
    assert error is not None and error.text is not None
    assert "\\x1b[31mred\\x1b[0m \\x00 end" in error.text
    assert 'msg "<&>"' in error.text
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["loader"] == "l<&>.py" and props["exit_code"] == "3"
    assert root.find(".//testcase").get("classname") == "my suite.ws2"  # type: ignore[union-attr]


@settings(max_examples=60)
@given(detail=st.text(), message=st.text(), stack=st.text())
def test_junit_parses_whatever_the_text(detail: str, message: str, stack: str) -> None:
    failure = RankFailure(0, "error", message, stack)
    result = CheckResult(
        "l.py", (WorldResult(2, "gloo", (Verdict("coverage", "fail", detail),), failures=(failure,)),)
    )
    root = ET.fromstring(render_junit(result))
    failed = root.find(".//failure")
    assert failed is not None and failed.get("message") == xml_text(detail or "coverage failed")
    error = root.find(".//failure[@type='rank-failure']")
    assert error is not None and _lf(xml_text(message)) in _lf(error.text or "")


def _lf(text: str) -> str:
    """XML parsers turn CR LF and lone CR in element text into LF."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


# ------------------------------------------------------------------ dispatch and files


def test_render_dispatches_and_rejects_unknown_formats() -> None:
    result = _mixed()
    assert render(result, "table") == render_table(result)
    assert render(result, "json") == render_json(result)
    assert render(result, "markdown") == render_markdown(result)
    assert render(result, "junit") == render_junit(result)
    assert render(result, "html") == render_html(result)
    with pytest.raises(ValueError, match="unknown report format 'pdf'; expected one of: table, json"):
        render(result, "pdf")  # type: ignore[arg-type]


def test_write_reports_creates_dir_and_writes_complete_files(tmp_path: Path) -> None:
    result = _mixed()
    out = tmp_path / "a" / "b"
    paths = write_reports(result, out)
    assert paths == [out / "ddpcheck.json", out / "ddpcheck.md", out / "ddpcheck.html"]
    assert sorted(os.listdir(out)) == ["ddpcheck.html", "ddpcheck.json", "ddpcheck.md"]  # no temp files
    assert _strict_loads((out / "ddpcheck.json").read_text("utf-8")) == to_json_dict(result)
    assert (out / "ddpcheck.md").read_text("utf-8") == render_markdown(result) + "\n"
    assert (out / "ddpcheck.html").read_text("utf-8") == render_html(result) + "\n"

    junit = tmp_path / "ci" / "junit.xml"
    paths = write_reports(result, out, stem="run2", junit_path=junit, formats=("table", "junit"))
    assert paths == [out / "run2.txt", junit]
    assert (out / "run2.txt").read_text("utf-8") == render_table(result) + "\n"
    ET.parse(junit)
    assert sorted(os.listdir(out)) == ["ddpcheck.html", "ddpcheck.json", "ddpcheck.md", "run2.txt"]
    assert write_reports(result, out, formats="junit") == [out / "ddpcheck.xml"]


def test_write_reports_replaces_rather_than_truncates(tmp_path: Path) -> None:
    target = tmp_path / "ddpcheck.json"
    target.write_text("old report, much longer than nothing " * 1000)
    before = os.stat(target).st_ino
    with open(target, encoding="utf-8") as reader:  # a reader mid-way keeps seeing the old, whole file
        write_reports(_all_pass(), tmp_path, formats=("json",))
        assert reader.read() == "old report, much longer than nothing " * 1000
    assert os.stat(target).st_ino != before
    assert _strict_loads(target.read_text("utf-8")) == to_json_dict(_all_pass())


def test_write_reports_unwritable_places_raise_report_write_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file.txt"
    blocker.write_text("i am a file")
    with pytest.raises(ReportWriteError, match=r"^cannot write reports to .*file\.txt[/\\]sub: ") as info:
        write_reports(_all_pass(), blocker / "sub")
    assert isinstance(info.value, OSError) and info.value.errno is not None
    assert blocker.read_text() == "i am a file"

    taken = tmp_path / "out"
    (taken / "ddpcheck.json").mkdir(parents=True)  # a directory where the report file should go
    (taken / "ddpcheck.json" / "keep").write_text("x")
    with pytest.raises(ReportWriteError, match=r"cannot write reports to .*out: ddpcheck\.json: "):
        write_reports(_all_pass(), taken, formats=("json",))
    assert os.listdir(taken) == ["ddpcheck.json"]  # the temp file was removed


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores directory permissions")
def test_write_reports_read_only_dir(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(ReportWriteError, match=r"cannot write reports to .*locked: "):
            write_reports(_all_pass(), locked)
        assert os.listdir(locked) == []
    finally:
        locked.chmod(0o700)


def test_write_reports_rejects_bad_arguments_before_writing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown report format 'pdf'"):
        write_reports(_all_pass(), tmp_path / "x", formats=("json", "pdf"))
    with pytest.raises(ValueError, match="stem must be a plain file name"):
        write_reports(_all_pass(), tmp_path / "x", stem="../evil")
    assert not (tmp_path / "x").exists()


# ------------------------------------------------------------------ statuses: n/a and allowed


RESHUFFLE_FAIL = Verdict(
    "reshuffle",
    "fail",
    "every rank sees the same samples in epoch 1 as in epoch 0",
    "set_epoch is never called",
    epochs=(0, 1),
    examples=(3, 5),
)


def _statuses() -> CheckResult:
    """Every status once: pass, fail, skip, n/a and allowed (the failure a user declared a choice)."""
    na = not_applicable("worker_sharding", "the loader has no workers")
    ws2 = _world(2, allow(RESHUFFLE_FAIL), na, skipped("determinism", "no second run"), seconds=1.0)
    return CheckResult("l.py", (_world(1, seconds=1.0), ws2))  # n/a at ws=2 only: its column is shown


def test_allow_turns_only_failures_into_allowed() -> None:
    allowed = allow(RESHUFFLE_FAIL)
    assert allowed.status == "allowed" and not allowed.failed
    assert (allowed.detail, allowed.cause, allowed.examples) == (
        RESHUFFLE_FAIL.detail,
        RESHUFFLE_FAIL.cause,
        RESHUFFLE_FAIL.examples,
    )
    for other in (passed("coverage"), skipped("coverage", "x"), not_applicable("coverage", "y")):
        assert allow(other) is other


def test_allowed_and_na_are_counted_apart_and_never_fail_the_run() -> None:
    result = _statuses()
    assert result.ok and result.exit_code == 0
    text = render_table(result, layout="tall")
    assert text.splitlines()[-1] == (
        "ddpcheck: 15 passed, 0 failed, 13 n/a, 1 allowed, 1 skipped across world sizes 1,2 -> OK (exit 0)"
    )
    cells = {row[0]: row[1:] for row in _parse_table(text, "check")[1]}
    assert cells["worker_sharding"] == ["PASS", "n/a"]
    assert "work_balance" not in cells  # n/a at every layout: listed under Not applicable only
    assert cells["reshuffle"] == ["PASS", "allowed"]
    assert cells["determinism"] == ["PASS", "skip"]
    assert _section(text, "Causes") == ["[1] (allowed) set_epoch is never called", "    -> reshuffle at ws=2"]
    details = _section(text, "Details")
    assert (
        details[0]
        == "[1] ws=2 reshuffle (allowed): every rank sees the same samples in epoch 1 as in epoch 0"
    )
    assert _section(text, "Not applicable") == [
        "[ws=1,2] work_balance: no tokens",
        "[ws=1,2] packing: no position_ids",
        "[ws=1,2] mixture: no sources",
        "[ws=1,2] supervision: no labels",
        "[ws=1,2] rng_independence: draws not watched",
        "[ws=1,2] prompt_groups: no runs of copies",
        "[ws=2] worker_sharding: the loader has no workers",
    ]
    assert _section(text, "Skipped (could not be judged)") == ["[ws=2] determinism: no second run"]
    colored = render_table(result, color=True, layout="tall")
    assert "\x1b[35mallowed\x1b[0m" in colored and "\x1b[2mn/a\x1b[0m" in colored


def test_statuses_in_json_and_markdown() -> None:
    result = _statuses()
    data = to_json_dict(result)
    assert data["ok"] is True and data["exit_code"] == 0
    assert data["summary"] == {
        "passed": 15,
        "failed": 0,
        "not_applicable": 13,
        "allowed": 1,
        "skipped": 1,
        "rank_failures": 0,
        "world_sizes": [1, 2],
        "meshes": [],
    }
    ws2 = data["runs"][1]["checks"]
    assert ws2["reshuffle"]["status"] == "allowed" and ws2["reshuffle"]["detail"] == RESHUFFLE_FAIL.detail
    assert ws2["worker_sharding"]["status"] == "n/a"
    assert [(c["kind"], c["cause"], c["explains"]) for c in data["causes"]] == [
        ("allowed", "set_epoch is never called", "reshuffle at ws=2")
    ]
    text = render_markdown(result)
    assert text.startswith("## ✅ ddpcheck passed")
    body = {row[0]: row for row in _md_table(text, "world size")[2:]}
    header = _md_table(text, "world size")[0]
    assert body["ws=2"][header.index("`reshuffle`")] == "⚠️ allowed"
    assert body["ws=2"][header.index("`worker_sharding`")] == "⚪ n/a"
    assert "- **[1]** **ws=2** `reshuffle` (allowed): every rank sees" in text
    assert "- **ws=2** `worker_sharding`: the loader has no workers" in text.split("### Not applicable")[1]


def test_junit_renders_na_skip_and_allowed_as_skipped_with_the_failure_text() -> None:
    root = ET.fromstring(render_junit(_statuses()))
    suite = root.find("testsuite")
    assert suite is not None
    assert (suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("0", "0", "15")
    cases = {(c.get("classname"), c.get("name")): c for c in suite.findall("testcase")}
    allowed = cases[("ddpcheck.ws2", "reshuffle")].find("skipped")
    assert allowed is not None and allowed.get("type") == "allowed"
    assert allowed.get("message") == f"allowed by --allow reshuffle: {RESHUFFLE_FAIL.detail}"
    assert allowed.text is not None and "cause: set_epoch is never called" in allowed.text
    na = cases[("ddpcheck.ws2", "worker_sharding")].find("skipped")
    assert na is not None and na.get("type") == "n/a"
    assert na.get("message") == "not applicable: the loader has no workers"
    skip = cases[("ddpcheck.ws2", "determinism")].find("skipped")
    assert skip is not None and (skip.get("type"), skip.get("message")) == ("skip", "no second run")
    out = suite.find("system-out")
    assert out is not None and out.text is not None
    assert out.text.splitlines()[:3] == [
        "Causes:",
        "[1] (allowed) set_epoch is never called",
        "    explains: reshuffle at ws=2",
    ]


# ------------------------------------------------------------------ JUnit schema


def _junit_schema() -> object:
    xmlschema = pytest.importorskip("xmlschema", reason="xmlschema is needed to validate JUnit XML")
    if not JUNIT_XSD.exists():
        pytest.skip(f"the JUnit schema is not at {JUNIT_XSD}")
    return xmlschema.XMLSchema(str(JUNIT_XSD))


def test_junit_validates_against_the_junit_10_schema() -> None:
    schema = _junit_schema()
    nasty = Verdict("coverage", "fail", "bad \x00 <x> & \x1b[31m", cause="c", examples=("\ud800",))
    weird = CheckResult(
        "l<&>.py",
        (
            WorldResult(
                2, "gloo", (nasty,), failures=(RankFailure(0, "hang", "\x07", "\x1b[0m"),), seconds=1e9
            ),
        ),
    )
    for result in (_mixed(), _known(), _statuses(), _all_pass(), CheckResult("l.py", ()), weird):
        text = render_junit(result)
        errors = list(schema.iter_errors(text))  # type: ignore[attr-defined]
        assert errors == [], f"{errors[0]}"


def test_junit_schema_rejects_what_ddpcheck_used_to_write() -> None:
    """The schema check has teeth: the old <testsuites skipped=...> and <error> are refused."""
    schema = _junit_schema()
    text = render_junit(_mixed())
    assert schema.is_valid(text)  # type: ignore[attr-defined]
    assert not schema.is_valid(text.replace("<testsuites ", '<testsuites skipped="2" ', 1))  # type: ignore[attr-defined]
    old_error = text.replace('<failure message="rank 1 crashed"', '<error message="rank 1 crashed"')
    old_error = old_error.replace("division by zero</failure>", "division by zero</error>")
    assert old_error != text and not schema.is_valid(old_error)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def seed_bug() -> CheckResult:
    """A real run of a buggy loader at world sizes 1,2,3 (three real process groups, gloo)."""
    options = CheckOptions(world_sizes=(1, 2, 3), epochs=2, timeout=60.0, determinism=False)
    return check_loader(str(FIXTURES / "bug_seed_depends_on_rank.py"), options)


def test_real_junit_file_from_the_cli_validates(tmp_path: Path, seed_bug: CheckResult) -> None:
    schema = _junit_schema()
    junit = tmp_path / "junit.xml"
    write_reports(seed_bug, tmp_path, junit_path=junit, formats=("json",))
    schema.validate(str(junit))  # type: ignore[attr-defined]
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and int(suite.get("failures", "0")) == 8


# ------------------------------------------------------------------ failures grouped by cause


def test_one_cause_listed_once_for_every_check_and_world_size_it_explains(seed_bug: CheckResult) -> None:
    """A real rank-dependent seed fails four checks at two world sizes: one cause line says so."""
    assert seed_bug.exit_code == 1
    text = render_table(seed_bug)
    seed_cause = "ranks draw different permutations: the sampler's seed (or random state) depends on the rank"
    assert text.count(seed_cause) == 1
    causes = _section(text, "Causes")
    assert causes[0] == f"[1] {seed_cause}"
    fix = next(i for i, line in enumerate(causes) if line.strip().startswith("fix:"))
    explained = " ".join(line.strip() for line in causes[1:fix])  # wrapped at 100 columns
    assert explained == "-> coverage, no_overlap, padding_bound, single_process_equivalence at ws=2,3"
    assert causes[fix].strip() == "fix: seed the sampler the same on every rank (seed=0, not seed=rank)"
    details = _section(text, "Details")
    heads = [line for line in details if line.startswith("[1] ws=")]
    # grouped by cause: each failing check once, at the first world size, the other one named
    assert len(heads) == 4 and all(line.startswith("[1] ws=2 ") and "(also ws=3):" in line for line in heads)
    assert not any(line.strip().startswith("cause:") for line in details)
    assert render_markdown(seed_bug).count(seed_cause) == 1
    # JUnit testcases stand alone in CI views, so each failure keeps its cause; the suite lists it once
    assert render_junit(seed_bug).count(seed_cause) == 8 + 1
    assert [c["cause"] for c in to_json_dict(seed_bug)["causes"]] == [seed_cause]


def test_examples_quoted_by_the_detail_are_not_printed_again(seed_bug: CheckResult) -> None:
    details = _section(render_table(seed_bug, width=400), "Details")
    for at, line in enumerate(details):
        if not line.startswith("[1] ws="):
            continue
        block = [line]
        for more in details[at + 1 :]:
            if more.startswith("[1] ws="):
                break
            block.append(more)
        examples = [b.split("e.g.: ", 1)[1] for b in block if b.strip().startswith("e.g.:")]
        for shown in examples:
            assert shown not in line, f"examples repeated in {block}"
    overlap = next(line for line in details if " no_overlap " in line)
    assert "both see samples" in overlap  # the detail quotes the examples itself
    block = details[details.index(overlap) + 1 : details.index(overlap) + 4]
    assert not any(b.strip().startswith("e.g.:") for b in block)


def test_examples_are_dropped_only_when_the_detail_really_quotes_them() -> None:
    def shown(detail: str, examples: tuple[object, ...]) -> list[str]:
        return [
            text
            for name, text in evidence(Verdict("coverage", "fail", detail, examples=examples))
            if name == "e.g."
        ]

    assert shown("missing: 1, 5, 7", (1, 5, 7)) == []
    assert shown("missing: 1, 5, 7.", (1, 5, 7)) == []
    assert shown("10 samples are missing", (1,)) == ["1"]  # "1" inside "10" is not a quote
    assert shown("missing: 1, 5, 7.5", (1, 5, 7)) == ["1, 5, 7"]


# ------------------------------------------------------------------ picture file names


def _pictured(layout: object, world_size: int = 2) -> WorldResult:
    from ddpcheck.figures import figure_data
    from tests.trace_builders import ddp_run, permutations, reference

    orders = permutations(16, 1, seed=0)
    figures = figure_data(reference(orders), ddp_run(orders, world_size))
    return WorldResult(world_size, "gloo", (passed("coverage"),), figures=figures, layout=layout)  # type: ignore[arg-type]


def test_picture_files_have_short_distinct_names_whatever_the_mesh_label(tmp_path: Path) -> None:
    """A label over 200 characters once failed the write (exit 2, half the reports); ``dp=12`` and
    ``dp1=2``, or labels differing in a non-ASCII letter, once shared a picture and overwrote it."""
    from ddpcheck.layout import parse_mesh
    from ddpcheck.report.markdown import picture_names

    meshes = [
        parse_mesh(",".join(f"dp_{'x' * 20}_{i}=1" for i in range(12)) + ",dp=2"),
        parse_mesh("dp=2", data_dims=("dp",)),
        parse_mesh("dp12=1,dp=2"),
        parse_mesh("dp1=2,dp2=1"),
        parse_mesh("dp=2,tpé=1"),
        parse_mesh("dp=2,tpè=1"),
    ]
    assert len(meshes[0].label) > 200
    result = CheckResult("loaders/x.py", tuple(_pictured(m) for m in meshes))
    write_reports(result, tmp_path)  # no OSError: File name too long
    names = [item.name for item in picture_names(build_view(result), "ddpcheck")]
    per_layout = {name.rsplit("-", 1)[0] for name in names}
    assert len(per_layout) == len(meshes)  # one distinct name part per layout
    assert all((tmp_path / name).exists() and len(name) < 80 for name in names)
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+", name) for name in names)
    markdown = (tmp_path / "ddpcheck.md").read_text("utf-8")
    assert all(name in markdown for name in names)  # the report links the files that were written


# ------------------------------------------------------------------ the terminal stays short


def test_not_applicable_reasons_are_one_line_on_the_terminal_and_all_in_the_files() -> None:
    result = _all_pass()  # work_balance, packing, mixture ... do not apply (no tokens)
    full = render_table(result)
    assert len(_section(full, "Not applicable")) >= 3
    short = render_table(result, not_applicable_in="reports/ddpcheck.md")
    assert "Not applicable\n" not in short
    lines = short.splitlines()
    (at,) = [k for k, line in enumerate(lines) if line.startswith("Not applicable")]
    line = " ".join([lines[at], *(x.strip() for x in lines[at + 1 :] if x.startswith("    "))][:2])  # wrapped
    assert "reports/ddpcheck.md" in line and "-v" in line and WORK_BALANCE in line
    assert "no tokens" not in short  # the reasons themselves are in the files
    assert "`work_balance`: no tokens" in render_markdown(result)


def test_a_failure_repeated_by_many_ranks_is_one_line_with_its_count() -> None:
    failures = tuple(
        RankFailure(r, "error", "AssertionError: batch 3 differs", stack="Traceback\n  x\nAssertionError")
        for r in range(24)
    )
    result = CheckResult("l.py", (_world(24, failures=failures),))
    details = _section(render_table(result, width=100), "Details")
    text = "\n".join(details)
    assert text.count("AssertionError: batch 3 differs") == 1
    assert "ws=24 ranks 0-23 error: AssertionError: batch 3 differs (x24)" in text
    many = CheckResult("l.py", tuple(_world(n, failures=(RankFailure(1, "error", "boom"),)) for n in (2, 3)))
    assert "ws=2, ws=3 rank 1 error: boom (x2)" in render_table(many)


def test_different_failures_stay_apart() -> None:
    failures = (RankFailure(0, "error", "ValueError: a"), RankFailure(1, "error", "ValueError: b"))
    details = "\n".join(
        _section(render_table(CheckResult("l.py", (_world(2, failures=failures),))), "Details")
    )
    assert "rank 0 error: ValueError: a" in details and "rank 1 error: ValueError: b" in details
    assert "(x" not in details


def test_free_text_never_wraps_a_word_per_line_on_a_narrow_terminal() -> None:
    runs = tuple(_world(n, failures=(RankFailure(1, "error", "boom"),)) for n in range(2, 9))
    text = render_table(CheckResult("l.py", runs), width=60, layout="tall")
    grid = text.splitlines()
    start = next(i for i, line in enumerate(grid) if line.startswith("check"))
    body = grid[start + 2 : grid.index("", start)]
    assert all(line.split()[0] != "" and not line.startswith(" ") for line in body), body  # no wrapped rows
    assert "ranks at ws=2: rank 1 crashed" in text  # the long texts go below the grid, whole
    rows_ = (MetricRow("accuracy with a long metric name", 0.9, 0.92, 0.9, duplicated=3),)
    narrow = render_table(CheckResult("l.py", (_world(2, divergence=rows_),)), width=60)
    divergence = "\n".join(_section(narrow, "Divergence"))
    assert "cause (accuracy with a long metric name):" in divergence


# ------------------------------------------------------------------ wording


HASHES = "1087362260100484431, 2879755579529241734"


def test_content_hash_ids_read_short_in_the_table_and_markdown_and_stay_whole_in_json() -> None:
    from ddpcheck.messages import short_id

    overlap = Verdict(NO_OVERLAP, "fail", f"2 samples reach more than one rank: {HASHES}", "sharded twice")
    result = CheckResult("l.py", (_world(2, overlap),), id_source="content-hash")
    short = f"{short_id(1087362260100484431)}, {short_id(2879755579529241734)}"
    assert re.fullmatch(r"#[0-9a-f]{7}", short_id(1087362260100484431))
    table, markdown = render_table(result), render_markdown(result)
    assert short in table and short in markdown
    assert "1087362260100484431" not in table and "1087362260100484431" not in markdown
    assert "1087362260100484431" in render_json(result)  # machine-readable: whole
    by_index = CheckResult("l.py", (_world(2, overlap),), id_source="index")
    assert HASHES in render_table(by_index)  # other ids are shown as they are


def test_overlap_repeats_are_not_listed_as_padding() -> None:
    from ddpcheck.verdict import PADDING_BOUND

    pad = Verdict(PADDING_BOUND, "pass", "within bounds", evidence=PaddingCost(copies=4, samples=64, noun=""))
    overlap = Verdict(NO_OVERLAP, "fail", "240 samples reach more than one rank", "sharded twice")
    result = CheckResult("l.py", (_world(2, pad), _world(4, pad, overlap)))
    table = render_table(result)
    padding = _section(table, "Padding (samples repeated to even out the ranks)")
    assert padding == [
        "[ws=2] 4 padding copies of 64 samples (6%)"
    ]  # not ws=4: its repeats are the overlap's
    assert "ws=4" not in render_markdown(result).split("### Padding")[1].split("###")[0]


def test_examples_are_named_for_what_they_are() -> None:
    from ddpcheck.messages import listed

    assert listed("never seen", [0, 1, 4]) == "never seen: 0, 1, 4"
    assert listed("never seen", list(range(20)), limit=3) == "never seen: 0, 1, 2 ... (20 in all)"


def test_padding_names_what_was_counted_in_singular_and_plural() -> None:
    from ddpcheck.report.view import padding_text
    from ddpcheck.verdict import PADDING_BOUND

    def text(copies: int, samples: int, noun: str | None) -> str:
        cost = PaddingCost(copies=copies, samples=samples, noun=noun or "")
        return padding_text(_world(2, Verdict(PADDING_BOUND, "pass", "ok", evidence=cost)))

    assert text(1, 64, "samples") == "1 padding copy of 64 samples (2%)"
    assert text(3, 12, "batches") == "3 padding copies of 12 batches (25%)"
    assert text(1, 1, "rows") == "1 padding copy of 1 row (100%)"
    assert text(2, 10, None) == "2 padding copies of 10 samples (20%)"
