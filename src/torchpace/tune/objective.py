"""What the tuner maximises, as one "higher is better" figure per trial (pure).

A bench result names the figure of each objective (`BenchResult.objective_for`, an `Objective` with
its unit and CI); the tuner ranks by its `score`:

- `throughput`: samples/s of the real step at the run's batch size, or steps/s for a script whose
  samples per step are unknown (the same unit for every trial of the script, so the ratios are the same);
- `latency` (inference workloads only): batch-1 p50 in seconds, ranked as requests/s served one at a
  time, i.e. `1 / p50`. Maximising it minimises the median latency, so the greedy policy and Optuna
  (direction "maximize") need no second comparison rule; every speedup reads the same way
  (`baseline p50 / tuned p50`).

The score and its relative CI half-width are stored on each trial (`objective_value`,
`objective_ci_rel`); the policy's `Record.figure` holds that score.
"""

from __future__ import annotations

from torchpace.errors import UsageError
from torchpace.measure.result import BenchResult

OBJECTIVES = ("throughput", "latency")


def objective_value(bench: BenchResult | None, objective: str) -> tuple[float | None, float | None]:
    """(figure as "higher is better", relative CI half-width) of a bench result under `objective`;
    (None, None) without one."""
    figure = bench.objective_for(objective) if bench is not None else None
    if figure is None or figure.score is None:
        return None, None
    return figure.score, figure.ci_rel_halfwidth


def check_objective(objective: str, is_training: bool, workload_name: str) -> None:
    """UsageError for an unknown objective, or `latency` on a training workload."""
    if objective not in OBJECTIVES:
        raise UsageError(f"--objective {objective!r} is not valid; valid objectives: {', '.join(OBJECTIVES)}")
    if objective == "latency" and is_training:
        raise UsageError(
            f"--objective latency needs an inference workload, and {workload_name!r} trains (its Workload has a loss). "
            "Latency is the time of one forward pass at batch 1 of a model in eval mode: tune this workload with "
            "--objective throughput, or give an inference workload (loss=None), e.g. the built-in `inference`"
        )
