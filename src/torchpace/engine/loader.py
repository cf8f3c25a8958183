"""`LoaderCycle`: a DataLoader read as a training loop reads it, epoch after epoch, for the meter's
steps (bench), the profiler's and `bench-data`'s."""

from __future__ import annotations

from typing import Any

import torch


class LoaderCycle:
    """Endless batches: restarts the DataLoader at each epoch's end, as a training loop does (a
    DistributedSampler is told the new epoch, so each epoch reshuffles)."""

    def __init__(self, loader: torch.utils.data.DataLoader):
        self.loader = loader
        self.epoch = 0
        self.iterator = iter(loader)

    def next(self) -> Any:
        try:
            return next(self.iterator)
        except StopIteration:
            self.epoch += 1
            set_epoch = getattr(self.loader.sampler, "set_epoch", None)
            if set_epoch is not None:
                set_epoch(self.epoch)
            self.iterator = iter(self.loader)
            return next(self.iterator)

    def close(self) -> None:
        shutdown = getattr(self.iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()  # do not leave worker processes behind (persistent ones included)
        if getattr(self.loader, "_iterator", None) is self.iterator:
            self.loader._iterator = None  # persistent workers: the next iter() would reuse the shut-down iterator
        self.iterator = None
