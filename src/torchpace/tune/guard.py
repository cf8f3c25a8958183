"""Convergence guard, measuring side: the same seeded steps over the same data order.

Baseline and candidate each run `steps` optimizer steps from the same seed, so their loss curves are
comparable step by step (the comparing side is pure: `check_guard`).
"""

from __future__ import annotations

from typing import Any

import torch

from torchpace.workload import Workload

GUARD_SEED = 1234


def run_guard_steps(workload: Workload, config: Any, steps: int, device: str | None = None) -> list[float]:
    """Loss of each of the first `steps` optimizer steps under `config`, from a fixed seed.

    Data order comes from the workload's seeded loader generator; model-side randomness (dropout)
    from `torch.manual_seed(GUARD_SEED)` set just before the first step.
    """
    from torchpace.runtime import prepare

    if not workload.is_training:
        return []
    losses: list[torch.Tensor] = []
    with prepare(workload, config, device=device) as run:
        torch.manual_seed(GUARD_SEED)
        iterator = iter(run.loader)
        while len(losses) < steps:
            try:
                batch = next(iterator)
            except StopIteration:
                iterator = iter(run.loader)
                continue
            losses.append(run.step(batch))
        del iterator
    return torch.stack(losses).tolist()
