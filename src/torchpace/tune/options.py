"""`TuneOptions`: everything `torchpace tune` takes, read by the study loop (`tuner.py`) and the trial
executor (`executor.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TuneOptions:
    """Everything `torchpace tune` takes. Times in seconds."""

    workload: str | None = None
    command: tuple[str, ...] = ()  # script mode: the unmodified training command (`python train.py ARGS`)
    samples_per_step: int | None = None  # script mode: when the script's batches do not tell
    show_output: bool = False  # script mode: stream each trial's output to stderr (it is kept in a log either way)
    budget_s: float = 900.0
    max_trials: int | None = None
    strategy: str = "greedy"
    storage: str | None = None
    study: str | None = None
    resume: bool = False
    out: Path = Path("torchpace.toml")
    guard_steps: int = 30
    trial_time_s: float = 20.0
    knobs: frozenset[str] | None = None  # restrict the search to these knobs
    seed: int = 0
    trial_timeout_s: float | None = None  # default: trial_time_s * 3 + 60 (guard steps, compile)
    profile_baseline: bool = True  # profile the baseline; its verdict picks the stage tried first
    objective: str = "throughput"  # or "latency": batch-1 p50 of an inference workload (see tune.objective)
    # inference workloads: the accuracy guard (torchpace.inference.accuracy) and the exported model
    accuracy_batches: int = 4  # batches compared with the fp32 eager reference (0: no accuracy guard)
    accuracy_rtol: float = 0.05  # max abs error allowed, relative to the largest reference output
    accuracy_atol: float = 1e-5
    min_top1_agreement: float = 0.99  # classifiers: share of samples whose argmax must match
    export_path: Path | None = None  # write the chosen model here (torch.export .pt2 or TorchScript)
    # script mode: the kept config runs the script past its measured steps for up to this long before it is
    # written, through its first save or evaluation (`torchpace.trial.runon`); 0: no such check
    run_on_s: float = 120.0
