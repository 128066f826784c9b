"""The rank side of the script's evaluation (issue 41): ``python -m ddpcheck.record`` on one process, as a
launch of one rank runs it, on small scripts that say what they saw themselves.

What is an evaluation (gradients off, or the model in eval mode as the HF Trainer runs it; never a loader
that trained), the weights held (saved by one recording, loaded by the next, the script's own put back
before its next training batch), and what is read (a printed line after the loop; per-batch lines and a
progress bar left out; a logging record; torchmetrics' compute but not its forward's batch value)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ddpcheck.eval_trace import EvalRecord
from ddpcheck.tracefile import read_rank
from tests.conftest import ROOT

EVALUATES = """
import json, logging, sys
import torch
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import MeanMetric

torch.manual_seed(int(sys.argv[1]))
model = torch.nn.Linear(2, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(0)
train = DataLoader(TensorDataset(torch.randn(8, 2, generator=g)), batch_size=2)
held_out = DataLoader(TensorDataset(torch.randn(6, 2, generator=g)), batch_size=2)
metric = MeanMetric()
seen = {"during": [], "after": []}
for epoch in range(2):
    model.train()
    for i, (x,) in enumerate(train):
        if i == 0 and epoch == 1:
            seen["after"] = model.weight.tolist()  # the next training batch: own weights back
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    seen["own"] = model.weight.tolist() if epoch == 0 else seen["own"]
    model.eval()  # no no_grad around the loop: the HF Trainer's way
    total = 0.0
    for (x,) in held_out:
        with torch.no_grad():
            out = model(x)
            if not seen["during"]:
                seen["during"] = model.weight.tolist()
            total += float(out.sum())
            metric(out.sum(dim=1))  # forward: a batch value, not the epoch's
        print(f"batch val score {total:.4f}")  # progress inside the loop
    print(f"epoch {epoch}: val score {total:.4f}, mean {float(metric.compute()):.4f}")
    logging.getLogger("eval").warning("val loss %.5f", total / 6)
    print("\\r100%|##########| 3/3 [00:00<00:00, 9.1it/s]")
    metric.reset()
with open(sys.argv[2], "w") as handle:
    json.dump(seen, handle)
"""

TRAINS_IN_EVAL_MODE = """
import torch
from torch.utils.data import DataLoader, TensorDataset

model = torch.nn.Linear(2, 2)
model.eval()  # frozen statistics while fine-tuning: every step trains in eval mode
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2)
for epoch in range(2):
    for (x,) in loader:
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch}: acc 0.5")
"""


def record(
    tmp_path: Path, source: str, out: str, *args: str, options: tuple[str, ...] = ()
) -> EvalRecord | None:
    script = tmp_path / "script.py"
    script.write_text(source)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "ddpcheck.record", "--out", str(tmp_path / out), *options]
    done = subprocess.run(
        [*command, "--", str(script), *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    trace = read_rank(tmp_path / out / "rank0.trace")
    assert trace is not None
    return trace.evaluation


def test_an_eval_mode_loop_is_an_evaluation_whose_weights_are_held_and_whose_report_is_read(
    tmp_path: Path,
) -> None:
    first = record(tmp_path, EVALUATES, "one", "0", str(tmp_path / "one.json"))
    assert first is not None
    assert (tmp_path / "one" / "eval" / "round0.pt").exists()
    (saved,) = first.rounds
    assert saved.whole and saved.held == "saved" and saved.index == 0
    assert [e[0] for e in saved.epochs] and saved.drew == ()
    printed = {(v.source, v.name, v.shown) for v in saved.values}
    assert ("print", "epoch {}: val score {}, mean {}", "0") in printed  # the epoch number: left alone later
    assert any(v.source == "log" and v.name == "val loss {}" for v in saved.values)
    assert any(v.source == "torchmetrics" and v.name == "MeanMetric" for v in saved.values)  # compute() once
    assert sum(v.source == "torchmetrics" for v in saved.values) == 1  # forward's batch values left out
    assert ("print", "batch val score {}") in saved.progress
    assert not any("it/s" in v.name for v in saved.values)  # the progress bar
    assert "torchmetrics" in first.libraries
    second = record(
        tmp_path,
        EVALUATES,
        "two",
        "1",
        str(tmp_path / "two.json"),
        options=("--eval-weights", str(tmp_path / "one")),
    )
    assert second is not None
    (loaded,) = second.rounds
    assert loaded.held == "loaded" and loaded.weights == saved.weights
    one, two = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("one", "two"))
    assert two["during"] == one["during"] != two["own"]  # evaluated on the first recording's weights...
    assert two["after"] == two["own"]  # ...and trained on from its own


def test_a_loader_that_trains_in_eval_mode_is_no_evaluation(tmp_path: Path) -> None:
    found = record(tmp_path, TRAINS_IN_EVAL_MODE, "out")
    assert found is not None
    assert not any(r.whole for r in found.rounds), found.rounds  # the optimizer step proved it training


def test_eval_rounds_0_records_no_evaluation(tmp_path: Path) -> None:
    found = record(tmp_path, EVALUATES, "out", "0", str(tmp_path / "x.json"), options=("--eval-rounds", "0"))
    assert found is None
