"""What a script-mode measurement asks of the hook inside the script (pure, no torch).

The parent passes a `ScriptMeasure` to the script's process as JSON in the `MEASURE_ENV` variable;
the launch hook installs `torchpace.script.hook` with it when the script imports torch.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

NO_STEP_MESSAGE = ("no optimizer step or backward() seen: script mode counts a step at each step() of a torch.optim "
                   "optimizer, or at each backward() when the script builds no optimizer")

# the directory of the `sitecustomize` hook (`torchpace.script.site`), put first on the script's PYTHONPATH
HOOK_DIR = Path(__file__).resolve().parent / "site"
MEASURE_ENV = "TORCHPACE_SCRIPT_MEASURE"
GUARD_SEED = 0  # torch / random seeded with this at `import torch` (a seed the script sets later wins)
# beside the result file, the hook keeps the count of steps it saw: the parent reads it when the script
# ended without letting the hook write its result (`os._exit`)
STEPS_SUFFIX = ".steps"
# An exception in torchpace's own hook inside the script is torchpace's failure, labelled so (never the
# script's): the hook's result says OWN_FAILURE; where it could not write one, it says OWN_FAILURE_LINE on
# stderr and exits with OWN_FAILURE_EXIT (EX_SOFTWARE).
OWN_FAILURE = "torchpace's own failure, not the script's: its hook in the script's process raised"
OWN_FAILURE_LINE = "torchpace: its hook in this script's process failed (torchpace's failure, not the script's):"
OWN_FAILURE_EXIT = 70


@dataclass(frozen=True)
class ScriptMeasure:
    """How to measure a script from inside its process.

    Attributes:
        result_path: where the hook writes the trial result (JSON of `TrialResult`).
        command: the user's command, for the result's `workload` name.
        mode: `bench` (measure windows) or `profile` (trace a few steps with torch.profiler).
        max_time_s: the measurement's time cap, counted from the end of the first step.
        warmup_s: the warm-up's own cap (None: its share of `max_time_s`; see `TrialSpec.warmup_s`).
        target_ci_rel: stop once the 95% CI of the median is within this relative half-width.
        guard_steps: how many first step losses to return as the guard curve.
        seed: seeds torch (and `random`, numpy when loaded) at `import torch`; None leaves them alone.
        samples_per_step: samples in one step when the batches do not tell (None: from the DataLoader).
        no_step_timeout_s: give up when no step was seen this long after `import torch`.
        compile_allowance_s: the trial's compile allowance (`TrialSpec.compile_allowance_s`): how long the stall
            watchdog waits for one compile (torch.compile, or `compile.mode`'s first compiled step) before it
            ends the script as stalled while compiling; at least the stall floor.
        profile: profile mode only: {"trace_path", "wait", "warmup", "active"} (steps of each phase).
        gate: `"CONTROL_FD,EVENT_FD"`: take turns with another trial in a paired comparison
            (`torchpace.measure.gate`); None to measure alone.
    """

    result_path: str
    command: tuple[str, ...] = ()
    mode: str = "bench"
    max_time_s: float = 30.0
    warmup_s: float | None = None
    target_ci_rel: float = 0.02
    guard_steps: int = 0
    seed: int | None = GUARD_SEED
    samples_per_step: int | None = None
    no_step_timeout_s: float = 120.0
    compile_allowance_s: float = 0.0
    profile: dict = field(default_factory=dict)
    gate: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ScriptMeasure":
        data = json.loads(text)
        data["command"] = tuple(data.get("command", ()))
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})
