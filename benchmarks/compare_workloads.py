"""Workloads of `make bench-compare` with a known effect (loaded as `benchmarks/compare_workloads.py:NAME`)."""

import time

import torch
from torch import nn

from torchpace.workload import Workload


class _SleepyItems(torch.utils.data.Dataset):
    """Each item waits 25 ms (a read from slow storage) and costs almost no CPU, and a batch is one item:
    two DataLoader workers deliver batches twice as fast as one, however busy the CPUs are. (Short waits
    of many items per batch would not do: on a busy host each wake-up waits for a CPU, several
    milliseconds, and the batch time is then the scheduler's, not the storage's.)"""

    def __init__(self, n: int = 512):
        self.x = torch.randn(n, 8, generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(0.025)
        return self.x[i], (self.x[i, 0] > 0).long()


def sleepy_loader() -> Workload:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    return Workload(model=model, dataset=_SleepyItems(), loss=lambda out, batch: nn.functional.cross_entropy(out, batch[1]),
                    batch_size=1, name="sleepy_loader")
