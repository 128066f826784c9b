"""mixture: each source's share per rank, worker and over the ranks, the mixing order, exhausted sources.

The statistic's false-alarm rate is measured here on synthetic correct mixtures (and must stay under a
bound); the bug patterns it exists for must fail with their cause. The fixtures (fixtures/mixture/) are
real loaders whose truth was measured without ddpcheck under torchrun (truth.py, NOTES.md,
truth_results.jsonl): the verdicts must agree with it.
"""

from __future__ import annotations

import importlib.util
import json
import re
from array import array

import numpy as np
import pytest

from ddpcheck.checker.mixture import SourceReader, declared_weights
from ddpcheck.checks.mixture import (
    ALPHA,
    EXHAUSTED,
    RANK_SHARES,
    SAME_RNG,
    WORKER_SCALED,
    check_mixture,
    chi2_sf,
    goodness_of_fit,
    homogeneity,
)
from ddpcheck.options import CheckOptions
from ddpcheck.result import CheckResult
from ddpcheck.session import check_loader
from ddpcheck.trace import EpochTrace, LoaderFacts, RankTrace, RunTrace, SourceCodes
from ddpcheck.verdict import MIXTURE
from tests.conftest import FIXTURES

MIXTURES = FIXTURES / "mixture"
NAMES = ("a", "b", "c")


# --------------------------------------------------------------------------- synthetic traces


def _run(
    world_size: int,
    workers: int,
    samples: int,
    weights: tuple[float, ...],
    seed: int,
    *,
    declared: bool = True,
    epochs: int = 2,
    rank_weights: dict[int, tuple[float, ...]] | None = None,
    same_order: bool = False,
) -> RunTrace:
    """Every (rank, worker) stream draws its sources iid with ``weights`` (the correct mixture)."""
    rng = np.random.default_rng(seed)
    ranks = []
    for r in range(world_size):
        traces = []
        for e in range(epochs):
            per = samples // world_size // 10 * 10
            p = (rank_weights or {}).get(r, weights)
            draw = np.random.default_rng(e) if same_order else rng
            codes = draw.choice(len(p), size=per, p=np.asarray(p) / sum(p))
            ids = array("q", range(r * per + e * 10**7, (r + 1) * per + e * 10**7))
            batches = per // 10
            traces.append(
                EpochTrace(
                    e,
                    ids,
                    [10] * batches,
                    batches,
                    worker_ids=[b % workers for b in range(batches)] if workers > 1 else None,
                    sources=SourceCodes(
                        NAMES,
                        array("h", codes.tolist()),
                        tuple(zip(NAMES, weights, strict=True)) if declared else (),
                    ),
                )
            )
        ranks.append(RankTrace(r, tuple(traces), LoaderFacts(dataset_kind="iterable", num_workers=workers)))
    return RunTrace(world_size, "gloo", tuple(ranks))


def test_chi_square_tail_matches_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    for x, df in [(0.5, 1), (3.84, 1), (10.0, 2), (25.0, 4), (1.0, 7), (200.0, 3), (0.01, 2)]:
        assert chi2_sf(x, df) == pytest.approx(float(stats.chi2.sf(x, df)), rel=1e-6, abs=1e-300)


def test_tests_accept_their_own_distribution_and_reject_others() -> None:
    assert goodness_of_fit([500, 300, 200], [0.5, 0.3, 0.2]) == pytest.approx(1.0)
    assert goodness_of_fit([700, 200, 100], [0.5, 0.3, 0.2]) < 1e-10  # type: ignore[operator]
    assert goodness_of_fit([3, 0, 1], [0.5, 0.3, 0.2]) is None  # too few to test
    assert homogeneity([500, 300, 200], [1000, 600, 400]) == pytest.approx(1.0)
    assert homogeneity([200, 300, 500], [500, 300, 200]) < 1e-10  # type: ignore[operator]


FALSE_ALARM_RUNS = 200
FALSE_ALARM_BOUND = 0.02  # the design rate is ALPHA = 1% per layout; measured 0 of 200 (3 of 1000)


def test_false_alarm_rate_on_correct_mixtures_stays_under_the_bound() -> None:
    """200 correct runs: world sizes 1, 2, 4; workers 0 and 2; 600 to 20,000 samples; declared weights
    and single-process expectations; a balanced and a skewed mixture. Measured: 0 of 200 fail."""
    alarms = []
    for i in range(FALSE_ALARM_RUNS):
        ws, workers = (1, 2, 4)[i % 3], (0, 2)[(i // 3) % 2]
        samples = (600, 3000, 20000)[(i // 6) % 3]
        declared = (i // 18) % 2 == 0
        weights = ((0.5, 0.3, 0.2), (0.9, 0.08, 0.02))[(i // 36) % 2]
        reference = _run(1, workers, samples, weights, 10**6 + i, declared=declared)
        run = reference if ws == 1 else _run(ws, workers, samples, weights, i, declared=declared)
        verdict = check_mixture(reference, run)
        assert verdict.status in ("pass", "fail"), verdict
        if verdict.failed:
            alarms.append((i, verdict.detail))
    assert len(alarms) / FALSE_ALARM_RUNS <= FALSE_ALARM_BOUND, alarms
    assert ALPHA <= FALSE_ALARM_BOUND


def test_the_bug_patterns_fail_with_their_cause() -> None:
    weights = (0.5, 0.3, 0.2)
    reference = _run(1, 0, 4000, weights, 1)
    same = check_mixture(reference, _run(2, 0, 4000, weights, 2, same_order=True))
    assert same.failed and same.cause == SAME_RNG, same
    per_rank = check_mixture(reference, _run(2, 0, 4000, weights, 3, rank_weights={1: (0.2, 0.3, 0.5)}))
    assert per_rank.failed and per_rank.cause == RANK_SHARES, per_rank
    scaled = _run(2, 2, 4000, weights, 4, rank_weights={0: (1.0, 0.3, 0.2), 1: (1.0, 0.3, 0.2)})
    verdict = check_mixture(reference, scaled)
    assert verdict.failed and verdict.cause == WORKER_SCALED, verdict
    codes = array("h", [0, 1, 2] * 300 + [0, 1] * 300)  # c vanishes for the last 600 samples
    thirds = (("a", 1.0), ("b", 1.0), ("c", 1.0))  # declared 1:1:1, drawn 0.4/0.4/0.2: c drifts
    tail = check_mixture(*[_one_stream(codes, thirds)] * 2)
    assert tail.failed and tail.cause == EXHAUSTED, tail


def _one_stream(codes: array, declared: tuple[tuple[str, float], ...]) -> RunTrace:  # type: ignore[type-arg]
    ids = array("q", range(len(codes)))
    trace = EpochTrace(0, ids, [10] * (len(codes) // 10), None, sources=SourceCodes(NAMES, codes, declared))
    return RunTrace(1, "gloo", (RankTrace(0, (trace,)),))


def test_a_source_that_runs_out_while_every_share_holds_passes() -> None:
    """Sampling without replacement ends with one source alone: no drift, so no cause may claim one. The
    neighbour with the same stream and other declared weights still fails (above and below)."""
    rng = np.random.default_rng(0)
    head = [0] * 1000 + [1] * 1000 + [2] * 1000
    rng.shuffle(head)
    codes = array("h", head + [0, 1] * 500)  # c absent from the last 1000 of a 3:3:2 epoch
    shares = (("a", 3.0), ("b", 3.0), ("c", 2.0))
    verdict = check_mixture(*[_one_stream(codes, shares)] * 2)
    assert verdict.status == "pass", verdict
    assert re.search(
        r"c runs out 10\d\d samples before the end of rank 0's 4000, every share holds", verdict.detail
    )
    undeclared = check_mixture(*[_one_stream(codes, ())] * 2)  # against the single process: itself
    assert undeclared.status == "pass", undeclared
    drift = check_mixture(*[_one_stream(codes, (("a", 1.0), ("b", 1.0), ("c", 1.0)))] * 2)
    assert drift.failed and drift.cause == EXHAUSTED, drift


def test_batches_without_a_source_are_not_applicable() -> None:
    trace = EpochTrace(0, array("q", range(20)), [10, 10], 2)
    run = RunTrace(1, "gloo", (RankTrace(0, (trace,)),))
    assert check_mixture(run, run).status == "n/a"


def test_reader_codes_sources_by_name_and_refuses_a_wrong_count() -> None:
    reader = SourceReader(None, (("web", 1.0), ("code", 1.0)))
    reader.read({"source": ["code", "web", "books"]}, 3)
    reader.read({"source": ["books"]}, 1)
    taken = reader.take()
    assert taken is not None and taken.names == ("web", "code", "books") and list(taken.codes) == [1, 0, 2, 2]
    with pytest.raises(Exception, match="gave 1 sources for a batch of 2"):
        reader.read({"source": ["web"]}, 2)
    none = SourceReader(None, ())
    none.read({"x": [1]}, 1)
    assert none.take() is None

    class File:
        @staticmethod
        def source_weights() -> dict[str, float]:
            return {"web": 2, "code": 1}

    assert declared_weights(File) == (("web", 2.0), ("code", 1.0))


# --------------------------------------------------------------------------- fixtures with truth


def _check(fixture: str, world_sizes: tuple[int, ...], workers: int | None) -> CheckResult:
    args = (("num_workers", workers),) if workers is not None else ()
    options = CheckOptions(
        world_sizes=world_sizes, epochs=2, timeout=240, determinism=False, resume=False, factory_args=args
    )
    return check_loader(str(MIXTURES / fixture), options)


def _verdicts(result: CheckResult) -> dict[int, object]:
    assert not any(run.failures for run in result.runs), [f.message for r in result.runs for f in r.failures]
    return {run.world_size: next(v for v in run.verdicts if v.check == MIXTURE) for run in result.runs}


CORRECT = [
    ("plain_mix_seeded_per_stream.py", "torch"),
    ("plain_weighted_concat.py", "torch"),
    ("wds_randommix_rank_seed.py", "webdataset"),
]


def test_a_correct_mixture_passes_quickly() -> None:
    verdicts = _verdicts(_check("plain_mix_seeded_per_stream.py", (1, 2), 0))
    assert all(v.status == "pass" for v in verdicts.values()), verdicts  # type: ignore[attr-defined]


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize(("fixture", "needs"), CORRECT, ids=[c[0].removesuffix(".py") for c in CORRECT])
def test_correct_mixtures_pass_at_world_sizes_1_2_4(fixture: str, needs: str, workers: int) -> None:
    if importlib.util.find_spec(needs) is None:
        pytest.skip(f"{needs} is not installed")
    verdicts = _verdicts(_check(fixture, (1, 2, 4), workers))
    assert all(v.status == "pass" for v in verdicts.values()), verdicts  # type: ignore[attr-defined]


NO_WORKERS = [  # loaders without DataLoader workers to set: torchdata nodes, lhotse's sampler
    ("torchdata_weighted_sampler.py", "torchdata"),
    ("lhotse_mux_stop_early.py", "lhotse"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("fixture", "needs"), NO_WORKERS, ids=[c[0].removesuffix(".py") for c in NO_WORKERS])
def test_correct_mixtures_without_workers_pass_at_world_sizes_1_2_4(fixture: str, needs: str) -> None:
    if importlib.util.find_spec(needs) is None:
        pytest.skip(f"{needs} is not installed")
    verdicts = _verdicts(_check(fixture, (1, 2, 4), None))
    assert all(v.status == "pass" for v in verdicts.values()), verdicts  # type: ignore[attr-defined]


BUGGY = [  # fixture, needs, workers, world sizes, the failing ones, cause
    ("bug_same_rng_every_worker.py", "torch", 2, (1, 2), (1, 2), SAME_RNG),
    ("bug_weights_times_workers.py", "torch", 2, (1, 2), (1, 2), WORKER_SCALED),
    ("bug_exhausted_refilled.py", "torch", 0, (1, 2), (1, 2), EXHAUSTED),
    ("bug_weights_per_rank.py", "torch", 0, (1, 2), (2,), RANK_SHARES),
    ("wds_randommix_same_seed.py", "webdataset", 0, (1, 2), (2,), SAME_RNG),
    ("hf_interleave_probabilities.py", "datasets", 0, (1, 2), (2,), SAME_RNG),
    ("lhotse_mux.py", "lhotse", None, (1, 2), (1, 2), EXHAUSTED),
    ("litdata_combined_weights.py", "litdata", 0, (1, 2), (2,), SAME_RNG),
    ("litdata_combined_weights.py", "litdata", 2, (1, 2), (1, 2), SAME_RNG),
    # sampling without replacement, 1:1 declared, 2:1 drawn: code runs out, web refills (the neighbour of
    # the correct hf_interleave_without_replacement.py below)
    ("bug_hf_interleave_exhausted.py", "datasets", 0, (1,), (1,), EXHAUSTED),
    # correct at one process (every sample once, 2:1 as the single process; code runs out near the end);
    # from epoch 1 HF datasets 5.2 replaces the mix's generator by default_rng(epoch) on every rank, so
    # the ranks draw one source order (measured: truth_results.jsonl)
    ("hf_interleave_without_replacement.py", "datasets", 0, (1, 2), (2,), SAME_RNG),
    ("hf_interleave_without_replacement.py", "datasets", 2, (1,), (), SAME_RNG),
]


@pytest.mark.parametrize(
    ("fixture", "needs", "workers", "sizes", "failing", "cause"),
    BUGGY,
    ids=[f"{b[0].removesuffix('.py')}-w{b[2] or 0}" for b in BUGGY],
)
def test_buggy_mixtures_fail_as_measured_without_ddpcheck(
    fixture: str,
    needs: str,
    workers: int | None,
    sizes: tuple[int, ...],
    failing: tuple[int, ...],
    cause: str,
) -> None:
    if importlib.util.find_spec(needs) is None:
        pytest.skip(f"{needs} is not installed")
    verdicts = _verdicts(_check(fixture, sizes, workers))
    for ws, verdict in verdicts.items():
        if ws in failing:
            assert verdict.failed and verdict.cause == cause and verdict.fix, (ws, verdict)  # type: ignore[attr-defined]
        else:
            assert verdict.status == "pass", (ws, verdict)  # type: ignore[attr-defined]


def _truth() -> list[dict[str, object]]:
    return [json.loads(line) for line in (MIXTURES / "truth_results.jsonl").read_text().splitlines() if line]


def test_the_truth_shows_each_mechanism() -> None:
    """What truth.py measured under torchrun (2 ranks), read back: the verdicts above rest on it."""
    truth = _truth()

    def rows(name: str, workers: int) -> list[dict]:  # type: ignore[type-arg]
        found = [t for t in truth if t["file"] == name and t["workers"] == workers]
        assert found, (name, workers)
        return found  # type: ignore[return-value]

    def top_pair(row: dict) -> float:  # type: ignore[type-arg]
        return max(p["same_source"] for p in row["same_order_pairs"].values())

    for row in rows("plain_mix_seeded_per_stream.py", 2) + rows("wds_randommix_rank_seed.py", 0):
        assert top_pair(row) < 0.5 and row["ids_in_several_streams"] == 0
    for row in rows("hf_interleave_probabilities.py", 0) + rows("wds_randommix_same_seed.py", 0):
        assert top_pair(row) == 1.0 and row["ids_in_several_streams"] == 0  # same order, other samples
    for row in rows("bug_same_rng_every_worker.py", 2):
        assert top_pair(row) == 1.0 and row["ids_in_several_streams"] > 0  # same order, same samples
    for row in rows("bug_weights_per_rank.py", 0):
        counts = row["counts"]
        assert counts["r0"]["web"] > 2 * counts["r1"]["web"]
    for row in rows("bug_weights_times_workers.py", 2):
        assert row["union_shares"]["web"] > 0.6  # 1.0 / 1.5 declared 0.5
    for row in rows("bug_exhausted_refilled.py", 0):
        last = row["last_position"]["r0"]
        assert last["n"] - last["books"] > 500  # books gone long before the end
    for row in rows("lhotse_mux.py", 0):
        for stream in ("r0", "r1"):
            last = row["last_position"][stream]
            assert last["n"] - last["web"] > 500  # web runs out, code and books fill the last third
    for row in rows("lhotse_mux_stop_early.py", 0):
        for last in row["last_position"].values():  # every source lasts to the end: it stops early
            assert last["n"] - min(v for k, v in last.items() if k != "n") < 50
    for row in rows("litdata_combined_weights.py", 0) + rows("litdata_combined_weights.py", 2):
        assert top_pair(row) == 1.0 and row["ids_in_several_streams"] == 0  # one seed everywhere
    for name in ("hf_interleave_without_replacement.py", "bug_hf_interleave_exhausted.py"):
        for row in rows(name, 0) + rows(name, 2):  # every sample once: 2:1 exactly, code runs out early
            assert (
                row["union_shares"] == {"code": 0.3333, "web": 0.6667} and row["ids_in_several_streams"] == 0
            )
            assert all(last["n"] - last["code"] > 200 for last in row["last_position"].values())
            # seeded per rank at epoch 0; from epoch 1 HF replaces the mix's generator by default_rng(epoch)
            assert (top_pair(row) == 1.0) == (row["epoch"] == 1)


# --------------------------------------------------------------------------- reports


def test_the_shares_reach_every_report() -> None:
    from ddpcheck.report.html import render_html
    from ddpcheck.report.json_report import to_json_dict
    from ddpcheck.report.markdown import render_markdown
    from ddpcheck.report.table import render_table

    result = _check("bug_weights_per_rank.py", (2,), 0)
    table = render_table(result, width=120)
    assert "Mixture" in table and "rank 1" in table and "48.9%" in table
    assert re.search(r"\| rank 1 +\| 3,000 +\| 20\.4%", render_markdown(result))
    mixture = to_json_dict(result)["mixture"]
    assert mixture[0]["sources"] == ["web", "code", "books"] and mixture[0]["status"] == "fail"
    assert [g["who"] for g in mixture[0]["groups"]][:3] == ["expected", "single process", "all ranks"]
    page = render_html(result)
    assert 'class="ddp-figure mixture"' in page and page.count('class="mixture-share"') >= 9


def test_no_mixture_flag_reads_no_sources_and_the_rerun_never_reads_them(tmp_path) -> None:
    from ddpcheck import cli
    from ddpcheck.session.plan import plan_run

    fixture = str(FIXTURES / "mixture" / "bug_weights_per_rank.py")
    report = tmp_path / "r"
    code = cli.main([fixture, "--world-sizes", "1,2", "--no-mixture", "-q", "--report-dir", str(report)])
    assert code == 1  # single-process equivalence still sees ranks drawing another mix
    runs = json.loads((report / "ddpcheck.json").read_text())["runs"]
    statuses = {name: check["status"] for run in runs[1:] for name, check in run["checks"].items()}
    assert statuses[MIXTURE] == "n/a" and statuses["single_process_equivalence"] == "fail"
    plan = plan_run(CheckOptions(world_sizes=(1, 2)))
    reruns = [layout.rerun for layout in plan.layouts if layout.rerun is not None]
    assert reruns and all(not job.options.mixture for job in reruns)  # judged on ids: no sources read
