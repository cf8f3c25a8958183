"""What a script-mode measurement asks of the hook inside the script (pure, no torch).

The parent passes a `ScriptMeasure` to the script's process as JSON in the `MEASURE_ENV` variable;
the launch hook installs `torchpace.script.hook` with it when the script imports torch.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
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
# Several processes of one job (`torchpace.script.job`): beside the result file, each rank that steps writes
# RESULT.rankR (where it runs) at its first step and RESULT.rankR.failed (its traceback) when its script raises;
# a process that trains without a process group claims the measurement with RESULT.claim, so that only one does.
RANK_SUFFIX = ".rank{rank}"
FAILED_SUFFIX = ".failed"
CLAIM_SUFFIX = ".claim"


def rank_file(result_path: str, rank: int) -> str:
    """RESULT.rankR: where rank R of a job runs (pid, host), written at its first step."""
    return result_path + RANK_SUFFIX.format(rank=rank)


def rank_failure_file(result_path: str, rank: int) -> str:
    """RESULT.rankR.failed: why rank R's script failed (its traceback), written as it raised."""
    return rank_file(result_path, rank) + FAILED_SUFFIX


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
        descendant: this process was started by the script's process, not by torchpace (a launcher's rank, a
            rank the script spawned, a DataLoader worker): it measures only if it trains (`torchpace.script.job`).
        in_turns: the process torchpace started takes turns with another trial (its `gate`): a job of several
            ranks cannot, and says so in its result, so that the comparison goes on in separate runs.
        root_pid: a descendant's: the pid of the process torchpace started (the root of the script's tree).
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
    descendant: bool = False
    in_turns: bool = False
    root_pid: int | None = None

    def for_descendants(self) -> "ScriptMeasure":
        """The spec the processes this one starts inherit: they may be ranks of its job; the gate's pipes are
        this process's alone."""
        return replace(self, descendant=True, gate=None, in_turns=self.in_turns or self.gate is not None,
                       root_pid=self.root_pid if self.descendant else os.getpid())

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ScriptMeasure":
        data = json.loads(text)
        data["command"] = tuple(data.get("command", ()))
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})
