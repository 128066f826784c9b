"""The HTML report and its pictures: figure data from real traces, the SVG it draws, and the page as a
real browser (headless chromium) loads it: the DOM it builds, its console, a screenshot.

Results come from real runs (``check_loader`` on fixtures, real gloo process groups) or from
``tests/trace_builders.py`` where a test needs an exact shape or a million samples.
"""

from __future__ import annotations

import pickle
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from array import array
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpcheck.figures import NO_RANK, SEVERAL, FigureData, figure_data
from ddpcheck.layout import parse_mesh
from ddpcheck.options import CheckOptions
from ddpcheck.report import render_html, render_markdown, write_reports
from ddpcheck.report.svg import picture_files
from ddpcheck.report.view import build_view, count
from ddpcheck.restores import RankRestore, ResumeRow
from ddpcheck.result import CheckResult, MetricRow, WorldResult
from ddpcheck.session import check_loader
from ddpcheck.trace import EpochTrace, RankFailure, RankTrace, RunTrace
from ddpcheck.verdict import ALL_CHECKS, Verdict, allow, not_applicable
from tests.conftest import FIXTURES
from tests.trace_builders import ddp_run, per_rank, permutations, rebuild, reference, run

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SVG_NS = "{http://www.w3.org/2000/svg}"


# ------------------------------------------------------------------ figure data


@settings(max_examples=15, deadline=None)
@given(
    n=st.integers(1, 200),
    world=st.integers(1, 40),
    picks=st.lists(st.lists(st.integers(-3, 220), max_size=20), min_size=40, max_size=40),
    seed=st.integers(0, 9),
)
def test_figure_counts_and_owners_are_the_sets_they_picture(
    n: int, world: int, picks: list[list[int]], seed: int
) -> None:
    """Whatever the ranks yield (copies on one rank, on several, ids the reference never yields), the
    counts and owners the pictures keep in a byte and a narrow integer per sample equal set arithmetic."""
    orders = permutations(n, 1, seed=seed)
    ranks = [list(orders[0][r::world]) + picks[r] for r in range(world)]
    data = figure_data(reference(orders), run([[ids] for ids in ranks]), max_bins=10_000)
    epoch, axis = data.epochs[0], list(orders[0])
    held = [[x for x in ids if 0 <= x < n] for ids in ranks]
    yields = {x: 0 for x in axis}
    holders: dict[int, list[int]] = {x: [] for x in axis}
    for r, ids in enumerate(held):
        for x in ids:
            yields[x] += 1
        for x in sorted(set(ids)):
            holders[x].append(r)
    assert epoch.missing_count == sum(1 for x in axis if not yields[x])
    assert epoch.duplicated_count == sum(1 for x in axis if yields[x] > 1)
    assert epoch.extra_copies == sum(max(c - 1, 0) for c in yields.values())
    assert epoch.foreign == tuple(len(a) - len(b) for a, b in zip(ranks, held, strict=True))
    owners = [NO_RANK if not h else h[0] if len(h) == 1 else SEVERAL for h in (holders[x] for x in axis)]
    assert list(data.owners[0]) == owners


def test_correct_split_draws_each_sample_on_exactly_one_rank() -> None:
    orders = permutations(10, 2, seed=0)
    data = figure_data(reference(orders), ddp_run(orders, 3))  # 10 samples, 3 ranks: 2 padding copies
    assert data.ranks == (0, 1, 2) and data.shown_ranks == 3 and data.note == ""
    first = data.epochs[0]
    assert (first.samples, first.bins, first.binned) == (10, 10, False)
    # x = the single-process order, so DistributedSampler's stride shows as a regular pattern
    expected = [[255 if seen else 0 for seen in row] for row in _seen_matrix(orders[0], 3)]
    assert [list(share) for share in first.rank_share] == expected
    assert [list(share)[:4] for share in first.rank_share] == [
        [255, 0, 0, 255],
        [255, 255, 0, 0],
        [0, 255, 255, 0],
    ]
    assert first.missing == bytes(10) and first.missing_count == 0
    assert first.duplicated_count == 2 and first.extra_copies == 2  # DistributedSampler's padding
    assert list(first.duplicated) == [255, 255] + [0] * 8  # padding repeats the start of the order
    assert first.steps == (1, 1, 1) and first.yielded == (4, 4, 4) and first.reference_steps == 3
    assert data.owners[0][:2] == (SEVERAL, SEVERAL) and set(data.owners[0][2:]) == {0, 1, 2}
    assert data.changed[0] is not None and 0 < data.changed[0] <= 1


def _seen_matrix(order: list[int], world_size: int) -> list[list[bool]]:
    """Which rank sees each position of ``order`` under DistributedSampler's padded stride."""
    padded = order + order[: (-len(order)) % world_size]
    return [[x in set(padded[r::world_size]) for x in order] for r in range(world_size)]


def test_bugs_light_up_missing_and_duplicated_rows() -> None:
    orders = permutations(12, 2, seed=1)
    ref = reference(orders)
    same = run([list(orders), list(orders)])  # the sampler ignores the rank: both ranks see everything
    data = figure_data(ref, same)
    assert data.epochs[0].duplicated_count == 12 and data.epochs[0].missing_count == 0
    assert set(data.owners[0]) == {SEVERAL}
    shards = per_rank(ddp_run(orders, 2))
    shards[1][0] = shards[1][0][:3]  # rank 1 loses half of epoch 0
    lost = figure_data(ref, rebuild(ddp_run(orders, 2), shards))
    assert lost.epochs[0].missing_count == 3 and lost.epochs[1].missing_count == 0
    assert NO_RANK in lost.owners[0] and lost.epochs[0].steps == (2, 1)


def test_fixed_assignment_shows_as_identical_rows_with_nothing_moved() -> None:
    order = list(range(16))
    data = figure_data(reference([order, order]), ddp_run([order, order], 4))
    assert data.owners[0] == data.owners[1] and data.changed == (0.0,)


def test_binning_keeps_exact_counts_and_shows_a_single_missing_sample() -> None:
    orders = permutations(1000, 1, seed=2)
    shards = per_rank(ddp_run(orders, 4))
    gone = shards[2][0].pop(17)
    data = figure_data(reference(orders), rebuild(ddp_run(orders, 4), shards), max_bins=50)
    epoch = data.epochs[0]
    assert (epoch.samples, epoch.bins, epoch.binned, data.binned) == (1000, 50, True, True)
    assert epoch.missing_count == 1 and sum(1 for b in epoch.missing if b) == 1  # one sample still shows
    assert epoch.missing[orders[0].index(gone) // 20] > 0
    assert all(40 <= b <= 90 for share in epoch.rank_share for b in share)  # ~1/4 of each column
    assert len(data.owners[0]) == 50 and set(data.owners[0]) == {0, 1, 2, 3}  # a rank's colour per column


def test_string_ids_and_integer_ids_give_the_same_picture() -> None:
    orders = permutations(30, 2, seed=3)
    as_int = figure_data(reference(orders), ddp_run(orders, 4), max_bins=7)
    named = [[f"img_{i}.jpg" for i in order] for order in orders]
    as_str = figure_data(reference(named), ddp_run(named, 4), max_bins=7)
    assert as_int == as_str


def test_sparse_integer_ids_and_foreign_ids() -> None:
    orders = [[i * 1_000_003 for i in range(40)]]  # far apart: the binary-search path
    shards = per_rank(ddp_run(orders, 2))
    shards[1][0] = [*shards[1][0], -5, 7]  # two ids the reference never yields
    data = figure_data(reference(orders), rebuild(ddp_run(orders, 2), shards))
    assert data.epochs[0].foreign == (0, 2) and data.epochs[0].missing_count == 0


@settings(max_examples=150, deadline=None)
@given(
    ref_ids=st.lists(st.integers(0, 60), min_size=1, max_size=60),
    ranks=st.lists(st.lists(st.integers(-3, 70), max_size=40), min_size=1, max_size=6),
    max_bins=st.integers(1, 70),
)
def test_counting_a_rank_from_its_own_samples_draws_the_same_picture(
    ref_ids: list[int], ranks: list[list[int]], max_bins: int
) -> None:
    """Ranks of large worlds are counted from their own samples (O(samples), not O(world x samples))."""
    import ddpcheck.figures as figures

    ref, ddp = reference([ref_ids, ref_ids[::-1]]), run([[ids, ids[::-1]] for ids in ranks])
    saved = figures._SPARSE
    try:
        figures._SPARSE = 0  # every rank through the full-length arrays
        dense = figure_data(ref, ddp, max_bins=max_bins)
        figures._SPARSE = 10**9  # every rank through its own samples only
        sparse = figure_data(ref, ddp, max_bins=max_bins)
    finally:
        figures._SPARSE = saved
    assert sparse == dense


def test_broken_and_skipped_runs_give_empty_figures_with_a_note() -> None:
    orders = permutations(8, 1, seed=4)
    ref = reference(orders)
    skipped = RunTrace(4, "nccl", (), skipped="needs 4 GPUs")
    assert figure_data(ref, skipped).epochs == () and "needs 4 GPUs" in figure_data(ref, skipped).note
    crashed = replace(ddp_run(orders, 2), failures=(RankFailure(1, "error", "boom"),))
    partial = replace(crashed, ranks=crashed.ranks[:1])
    data = figure_data(ref, partial)
    assert data.note == "only 1 of 2 ranks returned a trace" and data.epochs[0].missing_count == 4
    assert figure_data(RunTrace(1, "gloo", ()), partial).note == "no reference trace to compare with"
    with pytest.raises(ValueError, match="max_bins must be at least 1"):
        figure_data(ref, partial, max_bins=0)


def _big(n: int, world_size: int, epochs: int = 2) -> tuple[RunTrace, RunTrace]:
    """A correct DistributedSampler-style run over ``n`` samples, built with numpy (no processes)."""
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(0)
    perms = [rng.permutation(n).astype(np.int64) for _ in range(epochs)]

    def epoch(e: int, ids: object) -> EpochTrace:
        count = len(ids)  # type: ignore[arg-type]
        sizes = [32] * (count // 32) + ([count % 32] if count % 32 else [])
        return EpochTrace(e, array("q", ids.tobytes()), tuple(sizes), len(sizes))  # type: ignore[attr-defined]

    ref = RunTrace(1, "gloo", (RankTrace(0, tuple(epoch(e, p) for e, p in enumerate(perms))),))
    ranks = tuple(
        RankTrace(r, tuple(epoch(e, p[r::world_size]) for e, p in enumerate(perms)))
        for r in range(world_size)
    )
    return ref, RunTrace(world_size, "gloo", ranks)


def test_a_million_samples_on_eight_ranks_stays_small() -> None:
    """Binned: the data and the page stay small (speed is measured by benchmarks, not asserted)."""
    ref, big = _big(1_000_000, 8)
    data = figure_data(ref, big)
    assert data.epochs[0].bins == 2000 and data.epochs[0].missing_count == 0
    assert len(pickle.dumps(data)) < 100_000
    page = render_html(CheckResult("big.py", (WorldResult(8, "gloo", figures=data),)))
    assert len(page.encode()) < 200_000
    assert "1,000,000 samples in 2,000 columns of ~500" in page


# ------------------------------------------------------------------ real runs, with pictures


def _with_figures(result: CheckResult, path: Path, options: CheckOptions) -> CheckResult:
    """The runner attaches pictures to every world size it ran."""
    missing = [r.world_size for r in result.runs if r.figures is None and not r.skipped]
    assert not missing, f"no figure data for world sizes {missing}"
    return result


def _real(name: str) -> CheckResult:
    path = FIXTURES / name
    options = CheckOptions(world_sizes=(1, 2), epochs=2, timeout=60.0, determinism=False)
    return _with_figures(check_loader(str(path), options), path, options)


@pytest.fixture(scope="module")
def buggy() -> CheckResult:
    """bug_seed_depends_on_rank at world sizes 1,2, plus an allowed failure, n/a, divergence, resume."""
    result = _real("bug_seed_depends_on_rank.py")
    ws1, ws2 = result.runs
    extra = (
        allow(Verdict("reshuffle", "fail", "same samples every epoch", "set_epoch is never called")),
        not_applicable("resume", "the loader has no state_dict"),
    )
    ws2 = replace(
        ws2,
        verdicts=(*(v for v in ws2.verdicts if v.check != "reshuffle"), *extra),
        divergence=(MetricRow("accuracy", 0.9, 0.92, 0.9, duplicated=3),),
        resume=(
            ResumeRow(2, 2, 0, 4, "pass"),
            ResumeRow(2, 3, 1, 2, "fail", skipped=8, repeated=0, first_divergence=2, note="position lost"),
        ),
    )
    return replace(result, runs=(ws1, ws2), loader="fixtures/<bug> & co.py")


@pytest.fixture(scope="module")
def good() -> CheckResult:
    return _real("good_distributed_sampler.py")


class _Dom(HTMLParser):
    """Start tags with their attributes, in document order (what --dump-dom or our text holds)."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))

    def find(self, tag: str, css: str = "", **attrs: str) -> list[dict[str, str]]:
        out = []
        for name, found in self.tags:
            if name != tag or (css and css not in found.get("class", "").split()):
                continue
            if all(found.get(k.replace("_", "-")) == v for k, v in attrs.items()):
                out.append(found)
        return out


def _dom(text: str) -> _Dom:
    parser = _Dom()
    parser.feed(text)
    return parser


def test_html_is_self_contained_and_escapes_user_text(buggy: CheckResult) -> None:
    page = render_html(buggy)
    lowered = page.lower()
    for banned in ("<script", "<link", "<img", "<iframe", "@import", "url(", "src=", "https://"):
        assert banned not in lowered, banned
    assert re.findall(r"https?://[^\s\"'<>]+", page) == ["http://www.w3.org/2000/svg"] * page.count("<svg ")
    assert "fixtures/&lt;bug&gt; &amp; co.py" in page and "<bug>" not in page
    dom = _dom(page)
    assert [t["id"] for t in dom.find("li", "fail")] == ["cause-1"]
    assert len(dom.find("li", "allowed")) == 1 and len(dom.find("li", "rank")) == 0


def test_html_shows_every_status_causes_divergence_and_resume(buggy: CheckResult) -> None:
    page = render_html(buggy)
    dom = _dom(page)
    counts = count(buggy)
    assert (counts.failed, counts.allowed) == (4, 1) and counts.not_applicable >= 1
    line = f"ddpcheck: {counts.passed} passed, 4 failed, {counts.not_applicable} n/a, 1 allowed"
    assert f'<p class="summary" id="summary">{line}, {counts.skipped} skipped across world sizes 1,2' in page
    cells = {c.get("class", "") for c in dom.find("td", "status")}
    assert {"status pass", "status fail", "status na", "status allowed", "status skip"} <= cells
    seed = "ranks draw different permutations: the sampler&#x27;s seed (or random state) depends on the rank"
    assert page.count(seed) == 1  # listed once, referred to by number
    assert page.count('href="#cause-1"') == 4
    assert "coverage, no_overlap, padding_bound, single_process_equivalence at ws=2" in page
    assert len(dom.find("table", "divergence")) == 1 and "+0.02" in page
    assert len(dom.find("table", "resume")) == 1 and "position lost" in page and "2 -&gt; 3" in page


def test_pictures_have_a_strip_per_rank_and_epoch(buggy: CheckResult) -> None:
    dom = _dom(render_html(buggy))
    assert [s["data-world-size"] for s in dom.find("section", "world")] == ["2", "1"]  # failing first
    strips = dom.find("g", "strip")
    assert sorted((s["data-rank"], s["data-epoch"]) for s in strips) == sorted(
        [("0", "0"), ("0", "1")] + [(r, e) for r in "01" for e in "01"]
    )
    assert len(dom.find("g", "missing")) == len(dom.find("g", "duplicated")) == 4
    assert len(dom.find("g", "steps-bar")) == 2 + 4
    assert len(dom.find("g", "owners")) == 2  # the assignment picture: ws=2 only, one row per epoch
    assert len(dom.find("svg")) == 5 + 1  # and the failed restore's


def test_markdown_links_svg_files_written_next_to_it(tmp_path: Path, buggy: CheckResult) -> None:
    paths = write_reports(buggy, tmp_path)
    assert paths == [tmp_path / "ddpcheck.json", tmp_path / "ddpcheck.md", tmp_path / "ddpcheck.html"]
    markdown = (tmp_path / "ddpcheck.md").read_text("utf-8")
    assert markdown == render_markdown(buggy, figure_stem="ddpcheck") + "\n"
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)
    assert links == [
        "ddpcheck-ws1-samples.svg",
        "ddpcheck-ws1-steps.svg",
        "ddpcheck-ws2-samples.svg",
        "ddpcheck-ws2-steps.svg",
        "ddpcheck-ws2-assignment.svg",
        "ddpcheck-ws2-resume.svg",  # its failed restore, in the Resume section
    ]
    page = (tmp_path / "ddpcheck.html").read_text("utf-8")
    for link in links:
        svg = (tmp_path / link).read_text("utf-8")
        root = ET.fromstring(svg)  # a standalone, well-formed SVG file
        assert root.tag == f"{SVG_NS}svg"
        assert svg.strip() in page  # the same picture the HTML inlines
    ws2 = ET.parse(tmp_path / "ddpcheck-ws2-samples.svg").getroot()
    strips = [g for g in ws2.iter(f"{SVG_NS}g") if g.get("class") == "strip"]
    assert [(g.get("data-rank"), g.get("data-epoch")) for g in strips] == [
        ("0", "0"),
        ("1", "0"),
        ("0", "1"),
        ("1", "1"),
    ]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temp files


def test_a_passing_run_reads_as_passed(good: CheckResult) -> None:
    page = render_html(good)
    assert good.exit_code == 0
    assert '<span class="badge ok">PASSED</span>' in page and "<h2>Causes</h2>" not in page
    figure = good.runs[1].figures
    assert isinstance(figure, FigureData)
    # 103 samples on 2 ranks: DistributedSampler pads one copy, nothing is missing
    assert [(e.missing_count, e.duplicated_count, e.yielded) for e in figure.epochs] == [(0, 1, (52, 52))] * 2


def test_reports_are_written_even_when_ranks_crash(tmp_path: Path) -> None:
    crashed = CheckResult(
        "l.py",
        (WorldResult(2, "gloo", failures=(RankFailure(1, "error", "ValueError: bad", "Traceback\n  x\n"),)),),
    )
    write_reports(crashed, tmp_path, formats=("html",))
    page = (tmp_path / "ddpcheck.html").read_text("utf-8")
    assert "crashed: ValueError: bad" in page and "<pre>Traceback" in page and "FAILED" in page


# ------------------------------------------------------------------ in a real browser

CONSOLE = re.compile(r":CONSOLE[:(]\d*\)?\]|Uncaught|net::ERR_")


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (CI installs Debian's chromium in .ci/run)")
    command = [
        CHROMIUM,
        "--headless",
        "--disable-gpu",
        "--no-sandbox",
        "--no-first-run",
        "--disable-extensions",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--enable-logging=stderr",
        "--v=0",
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=90, check=False)


def _console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if CONSOLE.search(line)]


def test_console_error_detection_has_teeth(tmp_path: Path) -> None:
    """The console check below would see an error: a page that logs one is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><p>x</p><script>console.error("broken page")</script>', "utf-8")
    proc = _chromium(tmp_path, "--dump-dom", bad.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert any("broken page" in line for line in _console_errors(proc.stderr))


def test_page_loads_in_chromium_with_the_expected_dom_and_no_console_errors(
    tmp_path: Path, buggy: CheckResult
) -> None:
    write_reports(buggy, tmp_path / "reports", formats=("html",))
    page = tmp_path / "reports" / "ddpcheck.html"
    proc = _chromium(tmp_path, "--dump-dom", page.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _console_errors(proc.stderr) == []
    dom = _dom(proc.stdout)  # the DOM as the browser built it, not our text
    assert len(dom.find("main")) == 1 and "ddpcheck FAILED" in re.sub(r"<[^>]+>", "", proc.stdout)
    for world, ranks in (("1", 1), ("2", 2)):
        section = proc.stdout.split(f'data-world-size="{world}">', 2)[-1].split("</section>")[0]
        found = _dom(section).find("g", "strip")
        assert len(found) == ranks * 2, world  # one strip per rank per epoch
    assert len(dom.find("svg")) == 5 + 1 and len(dom.find("table", "grid")) == 1


def test_screenshot_renders(tmp_path: Path, buggy: CheckResult) -> None:
    write_reports(buggy, tmp_path, formats=("html",))
    shot = tmp_path / "report.png"
    proc = _chromium(
        tmp_path, f"--screenshot={shot}", "--window-size=1100,2400", (tmp_path / "ddpcheck.html").as_uri()
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _console_errors(proc.stderr) == []
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1100, 2400)
    assert len(data) > 50_000  # a blank page compresses to a few kilobytes; this one has text and pictures


# ------------------------------------------------------------------ layout of the page (issue 31, item 14)


def _wide() -> CheckResult:
    """Every check at four world sizes, failures everywhere, crashed ranks: the widest grid there is."""
    runs = []
    for ws in (1, 2, 4, 8):
        verdicts = tuple(
            Verdict(c, "fail" if (i + ws) % 3 == 0 else "pass", "d", f"cause {c}")
            for i, c in enumerate(ALL_CHECKS)
        )
        failures = tuple(
            RankFailure(r, "error" if r == 1 else "secondary", "ValueError: boom") for r in range(ws)
        )
        runs.append(WorldResult(ws, "gloo", verdicts=verdicts, failures=failures))
    return CheckResult("loader.py", tuple(runs))


MEASURE = """<script>
const view = document.documentElement.clientWidth, out = [];
const box = document.querySelector("div.grid").getBoundingClientRect();
for (const el of document.querySelectorAll("table.grid, table.grid th, table.grid td")) {
  const r = el.getBoundingClientRect();
  if (r.right > Math.min(view, box.right) + 0.5 || r.left < -0.5) out.push(el.textContent.trim());
}
document.body.setAttribute("data-cut", out.join("|"));
document.body.setAttribute("data-scroll", String(document.documentElement.scrollWidth - view));
</script>"""


@pytest.mark.parametrize("width", [1400, 1000])
def test_the_checks_table_fits_the_page(tmp_path: Path, width: int) -> None:
    """Measured in the browser: no cell of the grid (the ranks column included) reaches past the page.
    The report has no scripts; only this copy of it gets one, to measure."""
    page = tmp_path / "measured.html"
    page.write_text(render_html(_wide()).replace("</body>", MEASURE + "</body>"), "utf-8")
    proc = _chromium(tmp_path, f"--window-size={width},900", "--dump-dom", page.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    body = _dom(proc.stdout).find("body")[0]
    assert body["data-cut"] == "" and body["data-scroll"] == "0", body


def _with_restores(buggy: CheckResult) -> CheckResult:
    ws1, ws2 = buggy.runs
    restores = (
        ResumeRow(2, 2, 0, 4, "pass", outcome="exact", before=8, after=8),
        ResumeRow(2, 1, 0, 2, "pass", note="IndexError: cannot reshard", outcome="refused", before=4),
        ResumeRow(2, 3, 1, 2, "fail", skipped=8, repeated=3, note="position lost", outcome="failed",
                  before=4, after=12),
    )  # fmt: skip
    return replace(buggy, runs=(ws1, replace(ws2, resume=restores)))


def test_failed_and_refused_restores_get_a_picture_before_the_details(buggy: CheckResult) -> None:
    page = render_html(_with_restores(buggy))
    dom = _dom(page)
    drawn = dom.find("g", "restore")
    assert [(g["data-topology"], g["class"]) for g in drawn] == [
        ("2 -> 3", "restore failed"),
        ("2 -> 1", "restore refused"),
    ]
    assert len(dom.find("rect", "lost")) == 1 and len(dom.find("rect", "repeated")) == 1
    headings = re.findall(r"<h2>([^<]+)</h2>", page)
    assert headings.index("Resume") < headings.index("Details") and headings[-1] != "Resume"
    assert "2 -&gt; 3: 1 failed, 0 refused, worst loses 8 and repeats 3" in page


def _per_rank(buggy: CheckResult) -> CheckResult:
    """A failed restore at world size 3 whose rows carry every rank's counts: rank 1 lost 8."""
    ws1, ws2 = buggy.runs
    ranks = (RankRestore(0, 4, 4), RankRestore(1, 4, 0, lost=8), RankRestore(2, 4, 7, repeated=3))
    failed_ = ResumeRow(3, 3, 0, 2, "fail", skipped=8, repeated=3, note="position lost", outcome="failed",
                        before=12, after=11, ranks=ranks)  # fmt: skip
    exact = ResumeRow(3, 3, 0, 1, "pass", outcome="exact", before=6, after=18, ranks=ranks[:1])
    return replace(buggy, runs=(ws1, replace(ws2, resume=(exact, failed_))))


def test_the_resume_picture_draws_a_bar_per_rank_in_html_and_markdown(
    tmp_path: Path, buggy: CheckResult
) -> None:
    result = _per_rank(buggy)
    dom = _dom(render_html(result))
    restore = dom.find("g", "restore")
    assert [g["class"] for g in restore] == ["restore failed"]  # the exact one is not drawn
    page = render_html(result)
    drawn = page.split('<g class="restore failed"', 1)[1].split("</g>", 1)[0]
    assert [m for m in re.findall(r">(rank \d+)</text>", drawn)] == ["rank 0", "rank 1", "rank 2"]
    assert drawn.count('class="lost"') == 1 and drawn.count('class="repeated"') == 1
    assert "3 -&gt; 3 e0 s2: lost 8, repeated 3" in drawn
    write_reports(result, tmp_path, formats=("markdown",))
    markdown = (tmp_path / "ddpcheck.md").read_text()
    resume = markdown.split("### Resume", 1)[1]
    linked = re.findall(r"!\[[^\]]*\]\(([^)]+-resume\.svg)\)", resume)
    assert len(linked) == 1 and (tmp_path / linked[0]).is_file()
    assert resume.index(linked[0]) < resume.index("| topology")  # the picture heads its table
    assert "worst loses 8 and repeats 3" in resume
    svg = (tmp_path / linked[0]).read_text()
    inlined = render_html(result).split('<figure class="resume">', 1)[1].split("<figcaption>", 1)[0]
    assert svg.strip() == inlined  # the same picture the HTML inlines
    assert "-resume.svg" not in markdown.split("### Resume", 1)[0]  # not among the layout's figures


def test_a_refused_restore_is_not_green(buggy: CheckResult) -> None:
    page = render_html(_with_restores(buggy))
    table = page.split('<table class="resume">', 1)[1].split("</table>", 1)[0]
    outcome = {word: css for css, word in re.findall(r'<td class="status ([^"]+)">([^<]+)</td>', table)}
    assert outcome == {"exact": "pass", "refused": "refused", "failed": "fail"}
    assert "td.refused {" in page and "refused (grey) = the restore raised a clear error" in page


def test_mesh_labels_give_short_distinct_picture_names(tmp_path: Path, buggy: CheckResult) -> None:
    """Long, non-ASCII or digit-regrouped mesh labels: each layout's pictures keep their own short names."""
    ws1, _ = buggy.runs
    labels = (
        "dp=12",
        "dp1=2",
        "dp=2,tp=3",
        "dp=2,tp\u00e9=3",
        "dp=2," + ",".join(f"d{i}x=1" for i in range(60)),
    )
    runs = tuple(replace(ws1, layout=parse_mesh(label)) for label in labels)
    files = picture_files(replace(buggy, runs=runs), "ddpcheck")
    names = [f.name for f in files]
    assert len(names) == len(set(names)) and all(len(n) < 80 for n in names), names
    anchors = [row.anchor for row in build_view(replace(buggy, runs=runs)).rows]
    assert len(set(anchors)) == len(labels)
    write_reports(replace(buggy, runs=runs), tmp_path, formats=("markdown",))
    assert len(list(tmp_path.glob("*.svg"))) == len(names)
