"""The training script bench_run.py audits: 20,000 samples, batch 32, a 20 ms step (a sleep: the time a
GPU step takes, which costs the host no CPU) after a tiny DDP model's forward, backward and optimizer step
(so ``ddpcheck run`` watches and replays a real step), DistributedSampler with set_epoch, 2 epochs.

``--steps-per-epoch N`` makes the script itself stop each epoch after N steps: the baseline for the
recording overhead (what ``ddpcheck run --model-steps N`` hands the script)."""

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Samples(Dataset):
    def __len__(self) -> int:
        return 20_000

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((8,), float(i))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps-per-epoch", type=int, default=0)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    dataset = Samples()
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    try:
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            for step, batch in enumerate(loader):
                optimizer.zero_grad()
                model(batch).pow(2).mean().backward()
                optimizer.step()
                time.sleep(0.020)  # the rest of a GPU step
                if args.steps_per_epoch and step + 1 >= args.steps_per_epoch:
                    break
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
