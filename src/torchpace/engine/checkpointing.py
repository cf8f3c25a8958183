"""Activation checkpointing by wrapping a container's blocks (torch.utils.checkpoint, non-reentrant)."""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint


class CheckpointedBlock(nn.Module):
    """Runs `block` under non-reentrant activation checkpointing while training."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, *args, **kwargs):
        if self.training and torch.is_grad_enabled():
            return checkpoint(self.block, *args, use_reentrant=False, **kwargs)
        return self.block(*args, **kwargs)


def wrap_blocks(container: nn.Module) -> int:
    """Wrap each parameterised child of `container` in place; returns how many were wrapped."""
    wrapped = 0
    for name, child in list(container.named_children()):
        if any(True for _ in child.parameters()) and not isinstance(child, CheckpointedBlock):
            setattr(container, name, CheckpointedBlock(child))
            wrapped += 1
    return wrapped


def find_block_container(model):
    """The ModuleList/Sequential with the most parameterised children (the model's repeated blocks),
    or None when no container holds at least two of them."""
    best, best_count = None, 1
    for module in model.modules():
        if isinstance(module, (nn.ModuleList, nn.Sequential)):
            count = sum(1 for child in module if any(True for _ in child.parameters()))
            if count > best_count:
                best, best_count = module, count
    return best
