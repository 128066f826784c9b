"""``--ignore-index`` reaches every supervised-token count (issue 44): a loader file's batches
(``work_balance``'s supervised totals, ``supervision``) and a recorded launch judged later (``ddpcheck
judge`` reads the value the ranks recorded). The labels here are -1 where nothing is supervised, as a
loss with ``ignore_index=-1`` would take them; the expected counts are computed from the data itself."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ddpcheck.evidence import WorkBalance
from ddpcheck.options import CheckOptions
from ddpcheck.result import CheckResult
from ddpcheck.verdict import FAIL, PASS, SUPERVISION, WORK_BALANCE, Verdict
from tests.conftest import ROOT

# 8 samples of 4 tokens in order, batch 2: sample i's labels are its tokens, except samples 4 to 7's, all
# -1: at 2 ranks each rank's second batch ([4, 6] and [5, 7]) supervises nothing with ignore_index=-1, and
# every token with the default -100
LOADER = textwrap.dedent(
    """
    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    N, WIDTH = 8, 4

    def sample(i):
        ids = torch.arange(1, WIDTH + 1) + 10 * i
        labels = torch.full((WIDTH,), -1) if i >= 4 else ids.clone()
        return {"input_ids": ids, "attention_mask": torch.ones(WIDTH, dtype=torch.long), "labels": labels,
                "idx": i}

    def make_loader(rank, world_size, seed=0):
        data = [sample(i) for i in range(N)]
        sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=False)
        return DataLoader(data, batch_size=2, sampler=sampler)
    """
)
SCRIPT = LOADER + textwrap.dedent(
    """
    import torch.distributed as dist

    dist.init_process_group("gloo")
    for batch in make_loader(dist.get_rank(), dist.get_world_size()):
        pass
    dist.destroy_process_group()
    """
)


def _verdicts(result: CheckResult) -> dict[str, Verdict]:
    (run,) = result.runs
    return {v.check: v for v in run.verdicts}


def _supervised(result: CheckResult) -> tuple[tuple[int, ...] | None, ...]:
    """Each epoch's supervised tokens per rank, as work_balance's evidence holds them."""
    evidence = _verdicts(result)[WORK_BALANCE].evidence
    assert isinstance(evidence, WorkBalance)
    return evidence.supervised_totals


@pytest.mark.slow  # two runs of a loader file
def test_a_loader_files_supervised_counts_leave_out_the_ignore_index(tmp_path: Path) -> None:
    from ddpcheck.session import check_loader

    path = tmp_path / "labels_minus_one.py"
    path.write_text(LOADER)
    quick = {"world_sizes": (2,), "timeout": 60.0, "resume": False, "determinism": False}
    default = check_loader(str(path), CheckOptions(**quick))
    minus_one = check_loader(str(path), CheckOptions(**quick, ignore_index=-1))
    assert _supervised(default) == ((16, 16), (16, 16))  # 2 epochs x 2 ranks: 4 samples of 4 tokens
    assert _supervised(minus_one) == ((8, 8), (8, 8))  # samples 0-3 only
    assert _verdicts(default)[SUPERVISION].status == PASS
    said = _verdicts(minus_one)[SUPERVISION]
    assert said.status == FAIL and "other than -1" in said.detail and "-100" not in said.detail


@pytest.mark.slow  # a torchrun launch of the recorder
def test_a_launch_judged_later_is_judged_with_the_ignore_index_it_recorded(tmp_path: Path) -> None:
    from ddpcheck.session.script import judge_directory

    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "rec"
    record = ["-m", "ddpcheck.record", "--out", str(out), "--ignore-index", "-1", "--", str(script)]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", *record]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = judge_directory(out)
    assert result.options.options is not None and result.options.options.ignore_index == -1
    said = _verdicts(result)[SUPERVISION]  # one rank: its batches [4, 5] and [6, 7] supervise nothing
    assert said.status == FAIL and "other than -1" in said.detail
