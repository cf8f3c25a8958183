"""Batch helpers over nested tuples/lists/dicts of tensors: device moves, length, splitting."""

from __future__ import annotations

from typing import Any, Callable

import torch


def map_tensors(batch: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Apply `fn` to every tensor in a nested batch, keeping its structure."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, dict):
        return {k: map_tensors(v, fn) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        items = [map_tensors(v, fn) for v in batch]
        return type(batch)(items) if not hasattr(batch, "_fields") else type(batch)(*items)
    return batch


def first_tensor(batch: Any) -> torch.Tensor | None:
    """The first tensor found in a nested batch (depth first), or None."""
    if isinstance(batch, torch.Tensor):
        return batch
    values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    for value in values:
        found = first_tensor(value)
        if found is not None:
            return found
    return None


def batch_len(batch: Any) -> int:
    """Samples in a batch: the leading dimension of its first tensor."""
    tensor = first_tensor(batch)
    if tensor is None or tensor.dim() == 0:
        raise ValueError("cannot tell the batch size: the batch holds no tensor with a batch dimension")
    return int(tensor.shape[0])


def split_batch(batch: Any, micro_batch_size: int) -> list[Any]:
    """Split every tensor of `batch` along dim 0 into chunks of `micro_batch_size`."""
    n_chunks = -(-batch_len(batch) // micro_batch_size)
    return [map_tensors(batch, lambda t, i=i: t[i * micro_batch_size:(i + 1) * micro_batch_size]) for i in range(n_chunks)]


def to_device(batch: Any, device: torch.device, non_blocking: bool = False, channels_last: bool = False) -> Any:
    """Move a nested batch to `device`; 4-D floating tensors become channels_last when asked."""

    def move(t: torch.Tensor) -> torch.Tensor:
        t = t.to(device, non_blocking=non_blocking)
        return as_channels_last(t) if channels_last else t

    return map_tensors(batch, move)


def as_channels_last(t: torch.Tensor) -> torch.Tensor:
    """`t` in channels_last when it is a 4-D floating tensor (an image batch), else `t` as it is."""
    if t.dim() == 4 and t.is_floating_point():
        return t.contiguous(memory_format=torch.channels_last)
    return t
