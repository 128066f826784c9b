"""The step watcher under real ranks (issue 35): a two-tower DDP script on 2 gloo ranks, held to what the
script itself logs (its gradient before the first ``optimizer.step``, its backward and tower calls, its
noise and its workers' draws), and the replay at 1 process held to the DDP gradient.

Each launch starts fresh interpreters as torchrun does (``ddpcheck.launch.script``), running
``tests/data/step/entry.py``, a minimal stand-in for the script recorder (it hands every batch through
``watcher.handed``); the last test runs the real entry point, ``python -m ddpcheck.record --step``.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from ddpcheck.launch.script import launch_script
from ddpcheck.launch.watchdog import Limits
from ddpcheck.trace import ScriptRankTrace, StepTrace
from tests.conftest import DATA, ROOT

STEP = DATA / "step"
ENTRY = STEP / "entry.py"
SCRIPT = STEP / "two_tower.py"
TIMEOUT = 240.0  # generous: a launch takes ~3 s on an idle machine


@dataclass
class Run:
    out: Path
    steps: list[StepTrace]  # per rank
    fetches: list[dict[str, Any]]  # per rank: loader -> per epoch, its FetchDraws
    truth: list[dict[str, Any]]  # per rank: what the script logged itself


def _launch(out: Path, world: int, script_args: list[str], *, replay: Path | None = None) -> Run:
    ours = ["--out", str(out), *(["--replay", str(replay)] if replay else [])]
    command = [str(ENTRY), *ours, "--", str(SCRIPT), *script_args]
    env = {"STEP_TRUTH": str(out)}
    launch = launch_script(command, world, str(out), cwd=str(ROOT), limits=Limits(TIMEOUT), env=env)
    failed = [r for r in launch.ranks if r.returncode != 0]
    assert not failed and not launch.timed_out, failed[0].output if failed else "timed out"
    saved = [pickle.loads((out / f"rank{r}.steps").read_bytes()) for r in range(world)]
    truth = [torch.load(out / f"truth{r}.pt") for r in range(world)]
    return Run(out, [s["steps"] for s in saved], [s["fetches"] for s in saved], truth)


ALIKE = ["--loss", "global", "--seed", "same", "--worker-init", "blind"]
BY_RANK = ["--loss", "mean", "--seed", "rank", "--worker-init", "default"]


@pytest.fixture(scope="module")
def alike(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """A correct loss; every rank seeded alike, workers seeded from their id alone."""
    return _launch(tmp_path_factory.mktemp("alike"), 2, ALIKE)


@pytest.fixture(scope="module")
def by_rank(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """A per-rank mean loss over variable-length sequences; ranks seeded by rank, torch's worker seeds."""
    return _launch(tmp_path_factory.mktemp("by_rank"), 2, BY_RANK)


def _grad(step: Any) -> torch.Tensor:
    return torch.tensor(list(step.grad), dtype=torch.float32)


def test_counts_and_gradient_are_the_scripts_own(alike: Run) -> None:
    images = []
    for steps, truth in zip(alike.steps, alike.truth, strict=True):
        assert [len(s.micro) for s in steps.steps] == [t["backward"] for t in truth["steps"]] == [2, 2]
        for step, logged in zip(steps.steps, truth["steps"], strict=True):
            for micro, calls in zip(step.micro, logged["micro"], strict=True):
                assert dict(micro.forwards) == {k: v for k, v in calls.items() if v}
        images.append([dict(m.forwards).get("image", 0) for s in steps.steps for m in s.micro])
        assert torch.equal(_grad(steps.steps[0]), truth["grad"].float())  # after DDP's average, pre-clip
        assert all(s.not_comparable == "" for s in steps.steps) and not steps.notes
        assert steps.parameters == steps.kept == len(truth["grad"])
    assert images == [[1, 0, 1, 0], [0, 0, 0, 0]]  # the image tower ran on rank 0's even micro-batches only
    first = alike.steps[0].steps[0].micro[0]
    assert first.batches == (0,) and first.samples == 2 and first.supervised == 9  # lengths 3 and 8


def _loop_states(run: Run, rank: int) -> list[int]:
    return [d.state for s in run.steps[rank].steps for m in s.micro for d in m.draws]


def test_loop_draws_match_when_ranks_are_seeded_alike(alike: Run, by_rank: Run) -> None:
    for run, same in ((alike, True), (by_rank, False)):
        assert (run.truth[0]["noise"] == run.truth[1]["noise"]) is same  # what the script drew
        states = [_loop_states(run, r) for r in (0, 1)]
        assert len(states[0]) == 4 and len(set(states[0])) == 4  # a new state at every draw
        assert all((a == b) is same for a, b in zip(*states, strict=True))
        draw = run.steps[0].steps[0].micro[0].draws[0]
        assert draw.call == "torch.randn" and draw.stream == "torch" and draw.shape == (2, 8)
        assert draw.site == f"{SCRIPT.relative_to(ROOT)}:{_line('0.1 * torch.randn')}"


def _line(text: str) -> int:
    return next(i for i, line in enumerate(SCRIPT.read_text().splitlines(), 1) if text in line)


def test_worker_fetch_draws_match_when_workers_are_seeded_blind(alike: Run, by_rank: Run) -> None:
    for run, same in ((alike, True), (by_rank, False)):
        assert (run.truth[0]["aug"] == run.truth[1]["aug"]) is same  # what the workers drew
        fetched = [run.fetches[r]["loader0"][0] for r in (0, 1)]
        assert [f.worker for f in fetched[0]] == [0, 1, 0, 1]
        assert [f.batch for f in fetched[0]] == [0, 1, 2, 3]
        for a, b in zip(*fetched, strict=True):
            assert {d.stream for d in a.draws} == {"torch", "numpy", "random"}
            assert all((x.state == y.state) is same for x, y in zip(a.draws, b.draws, strict=True))
        workers = {f.worker: f.draws[0].state for f in fetched[0][:2]}
        assert workers[0] != workers[1]  # distinct across one rank's workers either way


def _replay(base: Run, tmp: Path, script_args: list[str]) -> Run:
    return _launch(tmp, 1, script_args, replay=base.out)


def test_replay_gives_the_ddp_gradient_for_a_correct_loss(alike: Run, tmp_path: Path) -> None:
    replay = _replay(alike, tmp_path, ALIKE)
    ranks, reference = alike.steps[0].steps, replay.steps[0].steps
    assert replay.steps[0].replay == str(alike.out) and len(reference) == len(ranks) == 2
    for step, own in zip(ranks, reference, strict=True):
        assert own.not_comparable == ""
        assert [m.samples for m in own.micro] == [4, 4]  # both ranks' batches at each micro-step
        diff = float((_grad(own) - _grad(step)).norm() / _grad(step).norm())
        assert diff < 1e-5, diff


def test_replay_shows_a_per_rank_mean_over_variable_lengths(by_rank: Run, tmp_path: Path) -> None:
    replay = _replay(by_rank, tmp_path, BY_RANK)
    for step, own in zip(by_rank.steps[0].steps, replay.steps[0].steps, strict=True):
        assert own.not_comparable == ""
        diff = float((_grad(own) - _grad(step)).norm() / _grad(step).norm())
        assert diff > 1e-2, diff  # 9 and 14 supervised tokens: the mean of means is not the mean


def test_noise_per_token_of_padded_lengths_is_not_comparable(tmp_path: Path) -> None:
    args = [*ALIKE, "--noise", "token", "--steps", "1"]
    ranks = _launch(tmp_path / "ranks", 2, args)
    replay = _replay(ranks, tmp_path / "replay", args)
    assert ranks.steps[0].steps[0].not_comparable == ""
    reason = replay.steps[0].steps[0].not_comparable
    assert f"two_tower.py:{_line('0.1 * torch.randn')} torch.randn" in reason
    assert "the replay draws [4, 10, 8] and the ranks drew [2, 8, 8], [2, 10, 8]" in reason


def test_record_entry_point_watches_the_step(tmp_path: Path) -> None:
    """``python -m ddpcheck.record --step``: the rank's trace carries the step (the recorder does not hand
    batches through the watcher yet: counts and the step structure only)."""
    out = tmp_path / "record"
    command = ["-m", "ddpcheck.record", "--out", str(out), "--step", "--model-steps", "4", "--epochs", "1",
               "--", str(SCRIPT), *ALIKE]  # fmt: skip
    launch = launch_script(
        command, 2, str(out), cwd=str(ROOT), limits=Limits(TIMEOUT), env={"STEP_TRUTH": str(out)}
    )
    assert all(r.returncode == 0 for r in launch.ranks), launch.ranks[0].output
    for rank in (0, 1):
        trace = pickle.loads((out / f"rank{rank}.trace").read_bytes())
        truth = torch.load(out / f"truth{rank}.pt")
        assert isinstance(trace, ScriptRankTrace) and trace.steps is not None
        assert [len(s.micro) for s in trace.steps.steps] == [t["backward"] for t in truth["steps"]]


def test_record_refuses_a_replay_of_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ddpcheck.record import EXIT_BAD_INPUT, main

    nowhere = str(tmp_path / "none")
    assert main(["--out", str(tmp_path), "--replay", nowhere, "--", __file__]) == EXIT_BAD_INPUT
    assert "no recorded steps there" in capsys.readouterr().err


def test_record_takes_a_replays_mesh_only_with_a_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--mesh`` names the recorded launch's mesh for a replay (one rank per data-parallel coordinate):
    without ``--replay``, without a data dimension, or ``--data-dims`` alone, one line and exit 2."""
    from ddpcheck.record import EXIT_BAD_INPUT, main

    (tmp_path / "run" / "step").mkdir(parents=True)
    replay = ["--replay", str(tmp_path / "run")]
    cases = [
        (["--mesh", "dp=2,tp=2"], "--mesh: only with --replay"),
        ([*replay, "--mesh", "tp=2,pp=2"], "has no data-parallel dimension"),
        ([*replay, "--data-dims", "dp"], "--data-dims: give --mesh too"),
    ]
    for ours, said in cases:
        assert main(["--out", str(tmp_path / "out"), *ours, "--", __file__]) == EXIT_BAD_INPUT
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1, err
