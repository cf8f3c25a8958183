"""Workloads of `make bench-compare` with a known effect (loaded as `benchmarks/compare_workloads.py:NAME`)."""

import time

import torch
from torch import nn

from torchpace.workload import Workload


class _SleepyItems(torch.utils.data.Dataset):
    """Each item waits 3 ms (a read from slow storage) and costs almost no CPU: two DataLoader workers
    deliver batches twice as fast as one, however busy the CPUs are."""

    def __init__(self, n: int = 512):
        self.x = torch.randn(n, 8, generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(0.003)
        return self.x[i], (self.x[i, 0] > 0).long()


def sleepy_loader() -> Workload:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    return Workload(model=model, dataset=_SleepyItems(), loss=lambda out, batch: nn.functional.cross_entropy(out, batch[1]),
                    batch_size=8, name="sleepy_loader")
