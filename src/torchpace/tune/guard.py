"""Convergence guard, comparing side (pure, no torch): does a candidate's loss curve, and its
`evaluate()` figure, stay with the baseline's over the same seeded steps?

The measuring side, which runs those steps in the trial process, is `torchpace.trial.guard_steps`.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from torchpace.errors import UsageError, whole_number_in

# The guard's defaults: a candidate's smoothed loss may sit at most 10% (and 0.05 absolute, or its own noise
# where it is wider) above the baseline's over the second half of the guard steps; bf16 and reordered reductions move curves a
# few percent, real divergence moves them far more.
GUARD_REL_TOLERANCE = 0.10
GUARD_ABS_TOLERANCE = 0.05
_EMA_ALPHA = 0.3  # smoothing of per-step losses before comparing curves
# A curve whose per-step losses scatter (small batches, augmentation) moves its smoothed loss by chance: a knob
# that only draws other random numbers (loader workers seed their augmentations per worker) moves it as much.
# The absolute tolerance is at least this many standard deviations of the difference of two smoothed curves
# with the baseline's step-to-step scatter (`_scatter`), so a curve is failed for departing more than its own
# noise does; real divergence (a loss that climbs back or explodes) departs by far more.
_NOISE_SIGMAS = 3.0
GUARD_METRIC_TOLERANCE = 0.02  # evaluate() may drop at most 2% (relative) below the baseline's
# The most guard steps a trial runs (`tune --guard-steps`): a curve of a thousand steps is plenty to compare,
# and every trial runs them before it is measured, within its time limit.
MAX_GUARD_STEPS = 1000


def check_guard_steps(steps: int) -> None:
    """Raise UsageError unless `steps` is a number of guard steps a trial can run (0: no guard)."""
    if not whole_number_in(steps, 0, MAX_GUARD_STEPS):
        raise UsageError(f"--guard-steps must be a whole number of steps from 0 (no guard) to {MAX_GUARD_STEPS}, "
                         f"got {steps!r}")


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


def check_trial_guard(baseline: Any, candidate: Any, scatter: bool = True) -> GuardVerdict | None:
    """The guard verdict of a candidate trial against the baseline's (each with `guard_losses` and
    `guard_metric`, e.g. a `TrialRecord`), or None when there is nothing to compare (no guard steps recorded).
    `scatter`: `check_guard`'s (False for a study tuned before it, `tune.policy.guard_scatter`)."""
    base_losses, losses = list(baseline.guard_losses), list(candidate.guard_losses)
    if not base_losses or not losses:
        return None
    verdict = check_guard(base_losses, losses, scatter=scatter)
    base_metric, metric = baseline.guard_metric, candidate.guard_metric
    if verdict.ok and base_metric is not None and metric is not None:
        drop = (base_metric - metric) / max(abs(base_metric), 1e-12)
        if drop > GUARD_METRIC_TOLERANCE:
            return GuardVerdict(False, f"evaluate() {metric:.4g} vs baseline {base_metric:.4g} ({-drop:+.1%}, "
                                       f"tolerance -{GUARD_METRIC_TOLERANCE:.0%})", verdict.max_rel_departure)
    return verdict


def check_guard(baseline: list[float], candidate: list[float], rel_tol: float = GUARD_REL_TOLERANCE,
                abs_tol: float = GUARD_ABS_TOLERANCE, scatter: bool = True) -> GuardVerdict:
    """Compare a candidate's loss curve with the baseline's over the same seeded steps.

    Fails when a loss is NaN/Inf, or when the candidate's smoothed loss sits above the baseline's by
    more than `rel_tol` (relative) and the absolute tolerance anywhere in the second half: `abs_tol`, or
    `_NOISE_SIGMAS` standard deviations of two smoothed curves' difference where the baseline's per-step
    losses scatter more (`_scatter`). Lower loss is never a failure. A short guard shows the early curve
    only: it catches divergence and broken numerics, not a slightly worse final accuracy after many epochs.
    `scatter=False` keeps `abs_tol` alone, the rule a study tuned before the scatter came was tuned with.
    """
    if not all(math.isfinite(v) for v in candidate):
        return GuardVerdict(False, "loss became NaN/Inf", math.inf)
    n = min(len(baseline), len(candidate))
    if n == 0:
        return GuardVerdict(True, "no guard steps to compare", 0.0)
    base, cand = smooth(baseline[:n]), smooth(candidate[:n])
    noise = _NOISE_SIGMAS * _scatter(baseline[n // 2:n]) * math.sqrt(2 * _EMA_ALPHA / (2 - _EMA_ALPHA)) if scatter else 0.0
    tolerance = f"tolerance {rel_tol:.0%}" if noise <= abs_tol else \
        f"tolerance {rel_tol:.0%} and {noise:.3g} absolute, the baseline's own step-to-step scatter"
    worst = 0.0
    for b, c in zip(base[n // 2:], cand[n // 2:]):
        rel = (c - b) / max(abs(b), 1e-12)
        if rel > rel_tol and c - b > max(abs_tol, noise):
            return GuardVerdict(False, f"smoothed loss {c:.4g} vs baseline {b:.4g} ({rel:+.1%}, {tolerance})", rel)
        worst = max(worst, rel)
    return GuardVerdict(True, f"within tolerance (worst {worst:+.1%} vs baseline; {tolerance})", worst)


def _scatter(losses: list[float]) -> float:
    """The standard deviation of one step's loss about the curve's trend, from successive differences (a
    slow trend cancels in them): the sample standard deviation of the differences over sqrt(2); 0 for
    fewer than three losses."""
    if len(losses) < 3:
        return 0.0
    diffs = [b - a for a, b in zip(losses, losses[1:])]
    return statistics.stdev(diffs) / math.sqrt(2)


def guard_cannot_judge(first: Any, again: Any, scatter: bool = True) -> str | None:
    """Why the guard cannot judge this workload, or None: two runs of the *baseline* (the `baseline`
    trial and the defaults' second run, each with `guard_losses`) already depart from each other by the
    guard's own rule.

    A Workload's guard steps are seeded and repeat; an unmodified script may draw its own randomness
    (an unseeded generator, a data order from the clock), and then every candidate would "fail" the
    guard by noise alone. The guard then says so instead of rejecting.
    """
    a, b = list(first.guard_losses), list(again.guard_losses)
    if not a or not b:
        return None
    worst = max((check_guard(a, b, scatter=scatter), check_guard(b, a, scatter=scatter)), key=lambda v: (not v.ok, v.max_rel_departure))
    if worst.ok:
        return None
    return (f"two runs of the baseline already depart from each other ({worst.reason}): its own randomness "
            "(unseeded data order, dropout or sampling) hides any change a knob makes, so the convergence guard "
            "cannot judge it and rejected no candidate")
