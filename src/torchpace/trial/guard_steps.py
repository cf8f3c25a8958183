"""Convergence guard, measuring side: the same seeded steps over the same data order.

Baseline and candidate each run `steps` optimizer steps from the same seed, so their loss curves are
comparable step by step. The comparing side is pure and loads no torch: `torchpace.tune.guard`.
"""

from __future__ import annotations

from typing import Any

import torch

from torchpace.errors import UsageError
from torchpace.workload import Workload

GUARD_SEED = 1234


def run_guard_steps(workload: Workload, config: Any, steps: int, device: str | None = None) -> tuple[list[float], float | None]:
    """Loss of each of the first `steps` optimizer steps under `config`, from a fixed seed, and the
    workload's `evaluate(model)` after them (None when it has none).

    Data order comes from the workload's seeded loader generator; model-side randomness (dropout)
    from `torch.manual_seed(GUARD_SEED)` set just before the first step.

    Under a distributed config the ranks split each global batch of `batch_size` between them, so
    over all ranks step k trains on the very batch a single process would, and the loss is the
    global batch's mean: strategies are compared at equal global batch (every rank returns it).
    """
    from torchpace.runtime import prepare
    from torchpace.engine.batch import batch_len

    if not workload.is_training:
        return [], None
    losses: list[torch.Tensor] = []
    with prepare(workload, config, device=device) as run:
        loader = run.loader
        if run.world_size > 1:
            from torchpace.engine.distributed import global_batch_loader, global_mean

            if workload.batch_size < run.world_size:
                raise UsageError(f"the convergence guard splits each batch of {workload.batch_size} between "
                                 f"{run.world_size} processes: batch_size must be at least nproc_per_node")
            loader = global_batch_loader(run.loader, workload.batch_size, run.dist)
        torch.manual_seed(GUARD_SEED)
        iterator = iter(loader)
        while len(losses) < steps:
            try:
                batch = next(iterator)
            except StopIteration:
                iterator = iter(loader)
                continue
            loss = run.step(batch)
            losses.append(torch.tensor(global_mean(loss, batch_len(batch), run.dist)) if run.world_size > 1 else loss)
        del iterator
        metric = _evaluate(workload, run.model)
    return torch.stack(losses).tolist(), metric


def _evaluate(workload: Workload, model) -> float | None:
    """The workload's quality metric of `model` (eval mode, no grad), or None."""
    if workload.evaluate is None:
        return None
    model.eval()
    with torch.no_grad():
        return float(workload.evaluate(model))
