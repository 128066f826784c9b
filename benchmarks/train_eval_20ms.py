"""The evaluating training script bench_run.py audits for the metric comparison (issue 41): train_20ms.py's
training (20,000 samples, batch 32, a 20 ms step) and, after every epoch, an evaluation of 1,001 samples
(batch 32, a 5 ms step: a forward on a GPU), each rank its strided share (no sample repeated), the sum and
the count all-reduced, printed on rank 0 (correct: ddpcheck run exits 0). ``ddpcheck run`` hands the first
evaluation to the script whole (32 batches at one process) and holds its weights; ``--no-metrics`` cuts it
like any epoch."""

import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Samples(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((8,), float(i % 97))


def main() -> None:
    dist.init_process_group("gloo")
    train, held_out = Samples(20_000), Samples(1_001)
    sampler = DistributedSampler(train, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=32, sampler=sampler)
    share = range(dist.get_rank(), len(held_out), dist.get_world_size())
    eval_loader = DataLoader(held_out, batch_size=32, sampler=list(share))
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-5)
    try:
        for epoch in range(2):
            sampler.set_epoch(epoch)
            model.train()
            for batch in loader:
                optimizer.zero_grad()
                model(batch).pow(2).mean().backward()
                optimizer.step()
                time.sleep(0.020)  # the rest of a GPU step
            model.eval()
            totals = torch.zeros(2, dtype=torch.float64)
            with torch.no_grad():
                for batch in eval_loader:
                    totals += torch.stack(
                        [model(batch).pow(2).sum().double(), torch.tensor(len(batch.double()))]
                    )
                    time.sleep(0.005)
            dist.all_reduce(totals)
            if dist.get_rank() == 0:
                print(f"epoch {epoch}: val_mse {float(totals[0] / totals[1]):.6f}", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
