"""The progress display: positions from real ranks, plain lines off a terminal, a live display on one.

Every run here is real (rank processes, the command in a subprocess, a pseudo-terminal); nothing
asserts how long anything takes.
"""

from __future__ import annotations

import io
import json
import os
import re
import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from ddpcheck.checker.loaderfile import LoaderSpec
from ddpcheck.checker.recipe import LoaderRecipe, RecordOptions
from ddpcheck.checker.recording import record_rank
from ddpcheck.launch import GroupCall, TargetRef, report_progress, run_ranks
from ddpcheck.progress import Display, LiveDisplay, PlainDisplay, make_display, parse_position
from tests.conftest import DATA

# A loader whose sampler takes 0.1 s per index: a reference epoch of 3 s, 1.5 s per rank at W=2.
SLEEPY = """
import time

from torch.utils.data import DataLoader, DistributedSampler


class SleepySampler(DistributedSampler):
    def __iter__(self):
        for index in super().__iter__():
            time.sleep(0.1)
            yield index


def make_loader(rank: int, world_size: int) -> DataLoader:
    dataset = list(range(30))
    sampler = SleepySampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    return DataLoader(dataset, batch_size=2, sampler=sampler)
"""


# --- the launch layer's callback, in real groups ---


class _Seen(Exception):
    pass


def test_callback_hears_every_rank_of_a_real_group() -> None:
    """A 2-rank run of the slow loader: the callback gets both ranks' positions, with totals."""
    calls: list[tuple[list[str], float, bool]] = []

    def on_progress(positions: list[str], elapsed_s: float, finished: bool) -> None:
        calls.append((list(positions), elapsed_s, finished))
        batches = [re.fullmatch(r"epoch 0, batch (\d+)/100", p) for p in positions]
        if all(m and int(m.group(1)) >= 2 for m in batches):
            raise _Seen  # both ranks are into their epoch: enough (and it stops the group)

    spec = LoaderSpec(path=str(DATA / "slow_loader.py"), factory="make_loader")
    with pytest.raises(_Seen):
        run_ranks(
            GroupCall(
                TargetRef.of(record_rank),
                2,
                timeout=120,
                kwargs={"options": RecordOptions(LoaderRecipe(spec), epochs=1, load_data=True)},
                on_progress=on_progress,
            )
        )
    assert all(len(positions) == 2 for positions, _, _ in calls)
    assert not any(finished for _, _, finished in calls)
    elapsed = [e for _, e, _ in calls]
    assert elapsed == sorted(elapsed) and elapsed[0] >= 0
    # 400 samples, 2 ranks, batch 2: each rank publishes "epoch 0, batch N/100" as it goes
    last = calls[-1][0]
    assert all(re.fullmatch(r"epoch 0, batch \d+/100", p) for p in last), last


def _two_steps() -> str:
    report_progress("epoch 0, batch 1/2")
    time.sleep(0.3)
    report_progress("epoch 0, batch 2/2")
    return "done"


def test_callback_hears_the_end_once() -> None:
    calls: list[tuple[list[str], float, bool]] = []
    result = run_ranks(
        GroupCall(_two_steps, 2, timeout=60, on_progress=lambda p, e, f: calls.append((p, e, f)))
    )
    assert result.ok and result.values == ["done", "done"]
    finished = [c for c in calls if c[2]]
    assert finished == [calls[-1]]
    positions, elapsed, _ = calls[-1]
    assert len(positions) == 2 and all(p.startswith("finished") for p in positions)
    assert elapsed == pytest.approx(result.seconds)


# --- what the display makes of positions ---


def test_positions_parse() -> None:
    p = parse_position("epoch 1, batch 4/13")
    assert (p.epoch, p.batch, p.total, p.label) == (1, 4, 13, "epoch 1 batch 4/13")
    assert p.fraction(2) == pytest.approx((1 + 3 / 13) / 2)
    unknown = parse_position("epoch 0, batch 7")
    assert unknown.total is None and unknown.fraction(2) is None and unknown.label == "epoch 0 batch 7"
    assert parse_position("epoch 0, batch 14/13").fraction(1) == 1.0  # the probe past the last batch
    assert parse_position("finished; waiting for peers at ddpcheck's final barrier").label == "done"
    assert parse_position("").label == "starting"
    assert parse_position("joining the process group").label == "joining"


def test_plain_lines_say_where_every_rank_is_and_how_long_is_left() -> None:
    out = io.StringIO()
    display = PlainDisplay(out, epochs=2)
    clock = [100.0]
    display.clock = lambda: clock[0]  # type: ignore[method-assign]
    display.update(["joining the process group", ""], 0.2, False)
    assert out.getvalue() == ""  # a group that ends within a second prints nothing
    display.update(["epoch 0, batch 3/10", "epoch 0, batch 2/10"], 1.5, False)
    clock[0] += 0.5
    display.update(["epoch 0, batch 5/10", "epoch 0, batch 4/10"], 2.0, False)  # too soon for another line
    clock[0] += 1.0
    display.update(["epoch 1, batch 1/10", "epoch 0, batch 10/10"], 3.0, False)
    display.update(["finished", "finished"], 3.2, True)
    display.message("ddpcheck: world size 2: ok (3.20s)")
    assert out.getvalue().splitlines() == [
        "ddpcheck: world size 2: epoch 0: rank 0 batch 3/10 | rank 1 batch 2/10; 1.5s elapsed",
        "ddpcheck: world size 2: rank 0: epoch 1 batch 1/10 | rank 1: epoch 0 batch 10/10; "
        "3.0s elapsed, about 2.1s left",  # 0.05 -> 0.45 of the run in 1.5s: 0.55 left
        "ddpcheck: world size 2: ok (3.20s)",
    ]


def test_large_groups_are_summed_up_by_their_slowest_and_fastest_rank() -> None:
    out = io.StringIO()
    display = PlainDisplay(out, epochs=1)
    positions = [f"epoch 0, batch {b}/20" for b in (5, 9, 3, 7, 6, 8)]
    display.update(positions, 2.0, False)
    assert out.getvalue() == (
        "ddpcheck: world size 6: 6 ranks, slowest rank 2: epoch 0 batch 3/20 | "
        "fastest rank 1: epoch 0 batch 9/20; 2.0s elapsed\n"
    )


def test_quiet_and_terminal_choices() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    quiet = make_display(Tty(), quiet=True)
    assert type(quiet) is Display
    quiet.update(["epoch 0, batch 3/10"], 5.0, False)
    quiet.message("ddpcheck: hello")
    assert isinstance(make_display(io.StringIO()), PlainDisplay)
    assert isinstance(make_display(Tty(), color=False), LiveDisplay)


def test_importing_ddpcheck_does_not_import_rich() -> None:
    code = "import sys, ddpcheck, ddpcheck.cli, ddpcheck.progress; print('rich' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "False", proc.stderr


# --- the command, for real ---


def _command(tmp_path: Path, *extra: str) -> list[str]:
    loader = tmp_path / "sleepy.py"
    loader.write_text(textwrap.dedent(SLEEPY))
    return [
        sys.executable, "-m", "ddpcheck", str(loader), "--world-sizes", "2", "--epochs", "1",
        "--no-determinism", "--format", "json", "--report-dir", str(tmp_path / "reports"), *extra,
    ]  # fmt: skip


def _env(**changes: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS")}
    env.update(changes)
    return env


def test_plain_lines_on_a_pipe_and_a_clean_stdout(tmp_path: Path) -> None:
    proc = subprocess.run(_command(tmp_path), capture_output=True, text=True, timeout=300, env=_env())
    assert proc.returncode == 0, proc.stderr
    json.loads(proc.stdout)  # the report alone on stdout
    lines = proc.stderr.splitlines()
    for ws, total in ((1, 15), (2, 8)):
        pattern = rf"ddpcheck: world size {ws}: epoch 0: rank 0 batch \d+/{total}.*; \d+\.\ds elapsed.*"
        assert any(re.fullmatch(pattern, line) for line in lines), proc.stderr
    assert "\x1b" not in proc.stderr  # no terminal control on a pipe


def test_quiet_prints_nothing_on_stderr(tmp_path: Path) -> None:
    proc = subprocess.run(
        _command(tmp_path, "--quiet"), capture_output=True, text=True, timeout=300, env=_env()
    )
    assert proc.returncode == 0, proc.stderr
    json.loads(proc.stdout)
    assert proc.stderr == ""


def _run_on_a_terminal(command: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """stderr on a pseudo-terminal (read as it comes, so the child never blocks), stdout on a pipe."""
    master, slave = os.openpty()
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    assert proc.stdout is not None
    chunks: list[bytes] = []
    stdout: list[bytes] = []
    streams: dict[int, Any] = {master: chunks, proc.stdout.fileno(): stdout}
    deadline = time.monotonic() + 300
    try:
        while streams and time.monotonic() < deadline:
            ready, _, _ = select.select(list(streams), [], [], 1.0)
            for fd in ready:
                try:
                    data = os.read(fd, 65536)
                except OSError:  # EIO: the terminal's last writer is gone
                    data = b""
                if data:
                    streams[fd].append(data)
                else:
                    del streams[fd]
        code = proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        os.close(master)
    return code, b"".join(stdout).decode(), b"".join(chunks).decode("utf-8", "replace")


def test_live_display_on_a_terminal(tmp_path: Path) -> None:
    env = _env(TERM="xterm-256color", COLUMNS="120", NO_COLOR="1")
    code, stdout, terminal = _run_on_a_terminal(_command(tmp_path), env)
    assert code == 0, terminal
    json.loads(stdout)  # stdout is untouched by the display
    assert "\x1b[?25l" in terminal and "\x1b[?25h" in terminal  # rich's live region: cursor hidden, back
    assert "\x1b[2K" in terminal  # lines redrawn in place
    assert re.search(r"world size 2\b.*epoch 0: rank 0 batch \d+/8 \| rank 1 batch \d+/8", terminal), terminal
    assert "ddpcheck: world size 2: ok" in terminal  # the command's own messages still come through
    assert not re.search(r"ddpcheck: world size \d: epoch", terminal)  # no plain lines on a terminal
    assert "\x1b[38;" not in terminal and not re.search(r"\x1b\[3[0-7]m", terminal)  # NO_COLOR: no colours
