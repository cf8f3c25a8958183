"""Trials: each measurement runs in its own process (docs/design.md#trials-one-process-each)."""

from torchpace.protocol import STATUSES, TrialResult, TrialSpec
from torchpace.trial.runner import plan_trial, run_trial

__all__ = ["TrialSpec", "TrialResult", "STATUSES", "run_trial", "plan_trial"]
