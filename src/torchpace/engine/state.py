"""Set-and-restore contexts for torch's global state (threads, matmul precision, cudnn flags).

Knobs at the GLOBAL point change process-wide torch settings only through these, so a config's
effect ends when `prepare()`'s context exits, as `torch.utils.benchmark`'s `set_torch_threads` does.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


@contextlib.contextmanager
def torch_threads(num_threads: int) -> Iterator[None]:
    """Run with `torch.set_num_threads(num_threads)`, restoring the previous count after."""
    before = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def matmul_precision(precision: str) -> Iterator[None]:
    """Run with `torch.set_float32_matmul_precision(precision)` (highest/high/medium), then restore."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


@contextlib.contextmanager
def cudnn_benchmark(enabled: bool) -> Iterator[None]:
    """Run with `torch.backends.cudnn.benchmark = enabled`, then restore."""
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = enabled
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before
