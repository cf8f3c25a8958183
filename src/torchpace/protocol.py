"""The trial protocol: a trial is `python -m torchpace.trial SPEC.json` in its own process, writing
RESULT.json. Frozen data and pure classification here; the parent-side runner is in `runner.py`.
"""

from __future__ import annotations

import json
import math
import signal
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from torchpace.errors import UsageError, whole_number_in
from torchpace.measure.result import AccuracyReport, BenchResult, ScriptInfo
from torchpace.records import from_json, to_json

# Failure classes (docs/design.md#trials-one-process-each). "ok" is a finished measurement.
OK = "ok"
OOM = "oom"
CRASH = "crash"
TIMEOUT = "timeout"
NONFINITE = "nonfinite"
GUARD = "guard"
INVALID = "invalid"
STATUSES = (OK, OOM, CRASH, TIMEOUT, NONFINITE, GUARD, INVALID)
# The most evaluation batches an inference trial compares with the fp32 reference (`bench
# --accuracy-batches`): the reference outputs of every one are kept in memory, so a bound keeps a slip of the
# keyboard from holding a dataset's outputs; a handful judge a conversion already.
MAX_EVAL_BATCHES = 256


def check_eval_batches(batches: int) -> None:
    """Raise UsageError unless `batches` is a number of evaluation batches a trial can hold (0: skip)."""
    if not whole_number_in(batches, 0, MAX_EVAL_BATCHES):
        raise UsageError(f"--accuracy-batches must be a whole number of batches from 0 (skip) to {MAX_EVAL_BATCHES}, "
                         f"got {batches!r}")


@dataclass(frozen=True)
class TrialSpec:
    """What one trial process runs: a workload spec, knob values, and how to measure.

    Attributes:
        workload: workload spec string (`pkg.mod:fn`, `file.py:fn`, or a built-in name).
        config: knob name -> value.
        max_time_s: the bench's own time cap (the parent's timeout is larger).
        warmup_s: the warm-up's own cap (None: its share of `max_time_s`); the measuring after it keeps its
            own length, moved by the extra warm-up used: a separate run of a comparison measures its share
            of the time but may warm up as a whole trial would (`torchpace.trial.pair`).
        guard_steps: run this many seeded steps first and record their losses (0: no guard run).
        device: torch device string, or None for the default.
        sys_path: directories to prepend to sys.path in the child (the user's cwd).
        profile: after the bench, profile a few steps and record the verdict (the tuner asks this
            of the baseline, to try the stage that matters first).
        objective: what the tuner optimises, `throughput` (samples/s) or `latency` (batch-1 p50);
            the child measures both for inference workloads, the parent ranks by this one.
        accuracy_batches: for inference workloads, compare outputs with the fp32 eager reference
            on this many batches before measuring (0: no accuracy guard); beyond `accuracy_rtol`
            (relative to the largest reference output), `accuracy_atol` or `min_top1_agreement`,
            the trial ends as `guard` without being timed.
        command: script mode: the user's command (`python train.py ARGS`); the trial launches it with
            the config and measures it from inside (`torchpace.script`), and `workload` is only its label.
        samples_per_step: script mode: samples in one step when its batches do not tell.
        script_mode: script mode: `bench` (measure) or `profile` (trace a few steps).
        script_profile: script mode, `profile`: the trace path and the profiler's step schedule.
        gate: `"CONTROL_FD,EVENT_FD"` of the pipes to a parent that alternates this trial with another
            (`torchpace.trial.pair`): the real step is measured one window per turn
            (`torchpace.measure.gate`); None for a trial that runs alone.
        script_ranks: script mode: the processes of the script's job where known (its launcher's options, or the
            study's baseline): a job of several runs its comparisons as separate runs, since its ranks take
            turns only as one (None: unknown, or one).
        compile_allowance_s: seconds the trial may spend compiling (torch.compile) beyond its time cap, its
            measurement starting once compiling is over: the parent's cap holds it, and a script's stall
            watchdog waits that long for one compile (`ScriptMeasure.compile_allowance_s`). Whoever builds the
            spec sets it from `compile_allowance_s(config)`, the one rule.
    """

    workload: str
    config: dict[str, Any] = field(default_factory=dict)
    max_time_s: float = 30.0
    warmup_s: float | None = None
    guard_steps: int = 0
    compute_only: bool = True
    device: str | None = None
    sys_path: list[str] = field(default_factory=list)
    profile: bool = False  # also profile a few steps and report the bottleneck verdict
    objective: str = "throughput"
    accuracy_batches: int = 0
    accuracy_rtol: float = 0.05
    accuracy_atol: float = 1e-5
    min_top1_agreement: float = 0.99
    accuracy_enforce: bool = True  # False: report the accuracy figures, never reject (`torchpace bench`)
    command: list[str] = field(default_factory=list)
    samples_per_step: int | None = None
    script_mode: str = "bench"
    script_profile: dict[str, Any] = field(default_factory=dict)
    gate: str | None = None
    compile_allowance_s: float = 0.0
    script_ranks: int | None = None

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: Path) -> "TrialSpec":
        return cls(**json.loads(Path(path).read_text()))


@dataclass(frozen=True)
class TrialResult:
    """What a trial produced: its status, the bench figures when ok, and why not otherwise.

    Attributes:
        status: `ok`, or what went wrong: `oom`, `crash`, `timeout`, `nonfinite`, `guard` or `invalid`.
        bench: the bench result (`torchpace.measure.result`) when ok.
        guard_losses: the first steps' losses, which the convergence guard compares with the baseline's.
        guard_metric: the workload's evaluate() after the guard steps.
        error: why the trial is not ok, in words (empty when it is).
        stderr_tail: the end of the trial process's stderr (the user's own traceback for a crash).
        returncode: the trial process's exit status (None while unknown).
        wall_time_s: the trial's seconds from start to result.
        verdict: the profile's verdict on the step (a baseline trial profiled for the tuner), else None.
        accuracy: inference: outputs vs the fp32 eager reference.
        failed_rank: multi-process trials: the rank that failed first.
        script: a script-mode trial without a bench (a profile): what the launch hook changed.
        ended_after: script mode, a script that ended before the measurement did: {"steps", "seconds" (run
            after its first step), "windows" (measured)}, so a trial can be sized to fit it.
        separate_runs: script mode: why this trial cannot take turns with another one (a job of several ranks
            asked to, `ScriptMeasure.in_turns`): the comparison goes on in separate runs; None otherwise.
        ranks: script mode: the ranks of the script's job (1 for one process), as its hook found them; None
            when unknown.
    """

    status: str
    bench: BenchResult | None = None
    guard_losses: list[float] = field(default_factory=list)
    guard_metric: float | None = None
    error: str = ""
    stderr_tail: str = ""
    returncode: int | None = None
    wall_time_s: float = 0.0
    verdict: str | None = None
    accuracy: AccuracyReport | None = None
    failed_rank: int | None = None
    script: ScriptInfo | None = None
    ended_after: dict[str, Any] | None = None
    separate_runs: str | None = None
    ranks: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == OK

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["bench"] = self.bench.to_dict() if self.bench is not None else None
        data["accuracy"] = self.accuracy.to_dict() if self.accuracy is not None else None
        data["script"] = to_json(self.script) if self.script is not None else None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrialResult":
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        if fields.get("bench") is not None:
            fields["bench"] = BenchResult.from_dict(fields["bench"])
        if fields.get("accuracy") is not None:
            fields["accuracy"] = AccuracyReport.from_dict(fields["accuracy"])
        if fields.get("script") is not None:
            fields["script"] = from_json(ScriptInfo, fields["script"])
        return cls(**fields)


def is_nonfinite(values: list[float]) -> bool:
    """True when any loss value is NaN or infinite."""
    return any(not math.isfinite(v) for v in values)


# torch.compile of a large model on a CPU host takes minutes before the first compiled step: a trial that
# compiles gets this much longer before its cap (its measurement starts only once compiling is over)
_COMPILE_ALLOWANCE_S = 300.0


def compile_allowance_s(config: dict[str, Any]) -> float:
    """Seconds a trial of `config` may spend compiling before its measurement starts (0 without compile): the
    value its `TrialSpec.compile_allowance_s` carries."""
    return _COMPILE_ALLOWANCE_S if config.get("compile.mode", "off") != "off" else 0.0


STACK_DUMP_SIGNAL = signal.SIGUSR1  # at the cap, the parent asks each trial process for its threads' stacks


_DEAD_WORKER_SIGNS = ("DataLoader worker (pid", "exited unexpectedly")


def classify_timeout(stderr_tail: str, dead_children: list[int]) -> tuple[str, str]:
    """(failure class, why) of a trial that reached its cap without a result.

    A child process of the trial (a DataLoader worker) that had died by then, unreaped, or a worker
    death the loader reported in stderr without acting on it (torch raises it from a SIGCHLD handler,
    at whatever line runs then: code that catches every exception there swallows it, and the loader
    then waits for that worker's batch for ever), is a crash: the trial stopped progressing because
    a process died, not because it was slow. Otherwise it is a timeout.
    """
    reported = all(sign in stderr_tail for sign in _DEAD_WORKER_SIGNS)
    if dead_children or reported:
        which = f"process(es) {', '.join(map(str, dead_children))} of the trial had died" if dead_children else \
            "a DataLoader worker died (see the stderr tail)"
        return CRASH, f"{which} and the trial then made no progress until its cap: a crash, not slowness"
    return TIMEOUT, ""


def classify_exit(returncode: int, stderr_tail: str) -> str:
    """Failure class of a child that wrote no result: OOM when the kernel or torch said so, else crash."""
    text = stderr_tail.lower()
    if "out of memory" in text or "outofmemoryerror" in text or "memoryerror" in text:
        return OOM
    if returncode == -9 and "killed" in text:
        return OOM  # the kernel's OOM killer sends SIGKILL
    return CRASH
