"""Convergence guard, measuring side: the same seeded steps over the same data order.

Baseline and candidate each run `steps` optimizer steps from the same seed, so their loss curves are
comparable step by step (the comparing side is pure: `check_guard`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

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
    from torchpace.runtime.batch import batch_len

    if not workload.is_training:
        return [], None
    losses: list[torch.Tensor] = []
    with prepare(workload, config, device=device) as run:
        loader = run.loader
        if run.world_size > 1:
            from torchpace.runtime.distributed import global_batch_loader, global_mean

            if workload.batch_size < run.world_size:
                from torchpace.errors import UsageError

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


# The guard's defaults: a candidate's smoothed loss may sit at most 10% (and 0.05 absolute) above the
# baseline's over the second half of the guard steps; bf16 and reordered reductions move curves a
# few percent, real divergence moves them far more.
GUARD_REL_TOLERANCE = 0.10
GUARD_ABS_TOLERANCE = 0.05
_EMA_ALPHA = 0.3  # smoothing of per-step losses before comparing curves
GUARD_METRIC_TOLERANCE = 0.02  # evaluate() may drop at most 2% (relative) below the baseline's


@dataclass(frozen=True)
class GuardVerdict:
    """Whether a candidate converged like the baseline, and the figure behind the decision."""

    ok: bool
    reason: str
    max_rel_departure: float


def smooth(values: list[float], alpha: float = _EMA_ALPHA) -> list[float]:
    """Exponential moving average of a loss curve."""
    out: list[float] = []
    for value in values:
        out.append(value if not out else alpha * value + (1 - alpha) * out[-1])
    return out


def check_trial_guard(baseline: dict, candidate: dict) -> GuardVerdict | None:
    """The guard verdict of a candidate trial's stored info against the baseline's, or None when
    there is nothing to compare (no guard steps recorded)."""
    base_losses, losses = baseline.get("guard_losses") or [], candidate.get("guard_losses") or []
    if not base_losses or not losses:
        return None
    verdict = check_guard(base_losses, losses)
    base_metric, metric = baseline.get("guard_metric"), candidate.get("guard_metric")
    if verdict.ok and base_metric is not None and metric is not None:
        drop = (base_metric - metric) / max(abs(base_metric), 1e-12)
        if drop > GUARD_METRIC_TOLERANCE:
            return GuardVerdict(False, f"evaluate() {metric:.4g} vs baseline {base_metric:.4g} ({-drop:+.1%}, "
                                       f"tolerance -{GUARD_METRIC_TOLERANCE:.0%})", verdict.max_rel_departure)
    return verdict


def check_guard(baseline: list[float], candidate: list[float], rel_tol: float = GUARD_REL_TOLERANCE,
                abs_tol: float = GUARD_ABS_TOLERANCE) -> GuardVerdict:
    """Compare a candidate's loss curve with the baseline's over the same seeded steps.

    Fails when a loss is NaN/Inf, or when the candidate's smoothed loss sits above the baseline's by
    more than `rel_tol` (relative) and `abs_tol` (absolute) anywhere in the second half. Lower loss
    is never a failure. A short guard shows the early curve only: it catches divergence and broken
    numerics, not a slightly worse final accuracy after many epochs.
    """
    if not all(math.isfinite(v) for v in candidate):
        return GuardVerdict(False, "loss became NaN/Inf", math.inf)
    n = min(len(baseline), len(candidate))
    if n == 0:
        return GuardVerdict(True, "no guard steps to compare", 0.0)
    base, cand = smooth(baseline[:n]), smooth(candidate[:n])
    worst = 0.0
    for b, c in zip(base[n // 2:], cand[n // 2:]):
        rel = (c - b) / max(abs(b), 1e-12)
        if rel > rel_tol and c - b > abs_tol:
            return GuardVerdict(False, f"smoothed loss {c:.4g} vs baseline {b:.4g} ({rel:+.1%}, tolerance {rel_tol:.0%})", rel)
        worst = max(worst, rel)
    return GuardVerdict(True, f"within tolerance (worst {worst:+.1%} vs baseline)", worst)
