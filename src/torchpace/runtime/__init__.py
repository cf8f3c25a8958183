"""Runtime: `prepare()` applies a config to a workload; nothing else applies knobs."""

from torchpace.runtime.prepare import Prepared, StepOptions, check_config, pending_env_knobs, prepare

__all__ = ["prepare", "Prepared", "StepOptions", "check_config", "pending_env_knobs"]
