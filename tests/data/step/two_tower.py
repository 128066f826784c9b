"""A small DDP training script with a text tower and an image tower, for the step watcher's tests.

Variable-length token sequences padded on the right (pad id 0, labels -100), an image tower that runs
only on micro-batches holding an image, dropout, gradient accumulation, clipping, and a dataset that
draws numpy and torch random numbers per sample (carried in the batch as ``aug``). Run it plainly
(``torchrun --standalone --nproc-per-node 2 two_tower.py``) or under the watcher's harness.

Options: ``--loss global`` (sum over tokens / global token count, times the world size: the DDP average
is the one-process gradient) or ``mean`` (per-rank mean: wrong when ranks hold different token
counts); ``--seed same|rank|none``; ``--worker-init blind|default`` (numpy/torch/random seeded from the
worker id alone, or torch's own seeding); ``--noise sample|token|none`` (noise drawn in the loop per
sample, or per token).

With ``STEP_TRUTH`` set, each rank writes what its own loop did to ``STEP_TRUTH/truth<rank>.pt``: the
gradient before the first ``optimizer.step`` (parameters in order, flattened), per optimizer step the
backward count and per micro-step the forward calls of each tower, the noise it drew and the ``aug``
values of every batch: the truth the tests hold the watcher to, measured without it.
"""

from __future__ import annotations

import argparse
import os
import random

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler

VOCAB, DIM, PIXELS, N = 23, 8, 6, 64


class Tokens(Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(1000 + i)
        length = 3 + (i * 7) % 9
        ids = torch.randint(1, VOCAB, (length,), generator=g)
        labels = ids.clone()
        labels[0] = -100
        image = torch.randn(PIXELS, generator=g)
        aug = float(np.random.rand()) + float(torch.rand(1)) + random.random()  # loading draws
        return {"ids": ids, "labels": labels, "image": image, "has_image": i % 8 == 0, "aug": aug}


def collate(samples: list) -> dict:
    longest = max(len(s["ids"]) for s in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.long)
    labels = torch.full((len(samples), longest), -100)
    mask = torch.zeros(len(samples), longest, dtype=torch.long)
    for row, s in enumerate(samples):
        ids[row, : len(s["ids"])] = s["ids"]
        labels[row, : len(s["ids"])] = s["labels"]
        mask[row, : len(s["ids"])] = 1
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "labels": labels,
        "image": torch.stack([s["image"] for s in samples]),
        "has_image": torch.tensor([s["has_image"] for s in samples]),
        "aug": torch.tensor([s["aug"] for s in samples], dtype=torch.float64),
    }


class TwoTower(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.text = nn.Linear(DIM, DIM)
        self.image = nn.Linear(PIXELS, DIM)
        self.drop = nn.Dropout(0.3)
        self.head = nn.Linear(DIM, VOCAB)
        self.calls = {"embed": 0, "text": 0, "image": 0, "head": 0}

    def forward(self, batch: dict, noise: torch.Tensor | None) -> torch.Tensor:
        h = self.embed(batch["input_ids"])
        self.calls["embed"] += 1
        if noise is not None:
            h = h + (noise[:, None, :] if noise.dim() == 2 else noise)
        h = torch.tanh(self.text(h))
        self.calls["text"] += 1
        if bool(batch["has_image"].any()):  # the image tower runs only when the micro-batch holds an image
            seen = self.image(batch["image"]) * batch["has_image"][:, None]
            self.calls["image"] += 1
            h = h + seen[:, None, :]
        self.calls["head"] += 1
        return self.head(self.drop(h))


def worker_init(worker_id: int) -> None:  # rank-blind: every rank's worker k draws the same
    np.random.seed(worker_id)
    torch.manual_seed(worker_id)
    random.seed(worker_id)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--loss", choices=("global", "mean"), default="global")
    parser.add_argument("--seed", choices=("same", "rank", "none"), default="same")
    parser.add_argument("--worker-init", choices=("blind", "default"), default="blind")
    parser.add_argument("--noise", choices=("sample", "token", "none"), default="sample")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--accum", type=int, default=2)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.seed != "none":
        seed = 0 if args.seed == "same" else rank
        torch.manual_seed(seed)
        np.random.seed(seed)
        random.seed(seed)
    model = TwoTower()
    ddp = nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    sampler = DistributedSampler(Tokens(), shuffle=False)
    loader = DataLoader(
        Tokens(),
        batch_size=2,
        sampler=sampler,
        collate_fn=collate,
        num_workers=args.workers,
        worker_init_fn=worker_init if args.worker_init == "blind" else None,
    )
    truth: dict = {"steps": [], "noise": [], "aug": [], "grad": None}
    micro: list = []
    for position, batch in enumerate(loader):
        truth["aug"].append(batch["aug"].tolist())
        before = dict(model.calls)
        noise = None
        if args.noise != "none":
            shape = (len(batch["input_ids"]), DIM)
            if args.noise == "token":
                shape = (*batch["input_ids"].shape, DIM)
            noise = 0.1 * torch.randn(shape)
            truth["noise"].append(noise.flatten()[:4].tolist())
        logits = ddp(batch, noise)
        flat = F.cross_entropy(logits.reshape(-1, VOCAB), batch["labels"].reshape(-1), reduction="sum")
        if args.loss == "mean":
            loss = flat / (batch["labels"] != -100).sum() / args.accum
        else:
            count = (batch["labels"] != -100).sum()
            dist.all_reduce(count)  # the global token count of this micro-step
            loss = flat / count * world / args.accum
        loss.backward()
        micro.append({k: model.calls[k] - before[k] for k in model.calls})
        if (position + 1) % args.accum == 0:
            if truth["grad"] is None:
                truth["grad"] = torch.cat([p.grad.detach().flatten() for p in ddp.parameters()])
            torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
            truth["steps"].append({"backward": len(micro), "micro": micro})
            micro = []
            if len(truth["steps"]) == args.steps:
                break
    if os.environ.get("STEP_TRUTH"):
        torch.save(truth, os.path.join(os.environ["STEP_TRUTH"], f"truth{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
