"""Peak memory: `torch.cuda.max_memory_allocated` on a GPU, peak RSS of this process on CPU."""

from __future__ import annotations

import resource

import torch


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak on CUDA (CPU peak RSS cannot be reset: it is the process's lifetime peak)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def read_peak_memory(device: torch.device) -> tuple[int, str]:
    """(peak bytes, kind): kind is `cuda_max_allocated` or `cpu_peak_rss` (of this process)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "cpu_peak_rss"


def device_sync(device: torch.device):
    """A function that waits for `device`'s queued work (a no-op on CPU)."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None
