"""Parent side of script mode: a script-mode trial is a launch of the user's command with the trial's
config (planned by the launch planner) plus the measurement hook; then its result is read back.

- `check_script_config`: the knobs of a config that cannot reach an unmodified script, or do not
  apply on this host, are a UsageError (exit 2) before anything starts;
- `plan_script_trial`: argv and env of the script's process for one trial;
- `read_script_result`: the trial result from the file the hook wrote, or the script's own failure
  (labelled as the script's, with its stderr tail); a knob that never reached the script (no
  DataLoader was built, the optimizer has no fused kernel...) makes the trial `invalid`;
- `bench_script`: `torchpace bench -- python train.py`.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Mapping, Sequence

from torchpace.config import RunConfig
from torchpace.errors import UsageError, UserCodeError
from torchpace.host import HostFacts
from torchpace.knobs import REGISTRY
from torchpace.script.spec import MEASURE_ENV, ScriptMeasure
from torchpace.trial.protocol import CRASH, INVALID, TrialResult, TrialSpec, classify_exit

_NO_STEP_MARGIN_S = 10.0  # the hook's "no step" verdict comes this long before the parent's timeout
_BENCH_TIMEOUT_MARGIN_S = 120.0  # start-up (imports, data) beyond the measurement's own cap
_IN_PROCESS_REACH = ("loader", "optimizer", "autocast")  # knobs that must meet something in the script
_WHAT_IT_MISSED = {"loader": "it built no torch.utils.data.DataLoader", "optimizer": "it built no torch.optim optimizer",
                   "autocast": "it called no module with parameters"}


def script_target(label: str) -> SimpleNamespace:
    """What the knobs' `applies` see of a script: nothing about its model or data is known before it runs."""
    return SimpleNamespace(name=label, model=None, dataset=None, optimizer=None, is_training=True)


def check_script_config(config: RunConfig, host: HostFacts, label: str) -> None:
    """UsageError naming the first knob of `config` that cannot run with an unmodified script here."""
    target = script_target(label)
    for name, value in config.non_default().items():
        knob = REGISTRY[name]
        reason = knob.script_reason(value) or knob.applies(host, target) or knob.value_applies(value, host, target)
        if reason:
            raise UsageError(f"knob {name} = {value!r} cannot be used with `{label}`: {reason}")


def plan_script_trial(spec: TrialSpec, host: HostFacts, base_env: Mapping[str, str], result_path: Path,
                      timeout_s: float) -> tuple[list[str], dict[str, str]]:
    """(argv, env) of the script's process for trial `spec`: the launch plan of its config, plus the hook."""
    measure = ScriptMeasure(result_path=str(result_path), command=tuple(spec.command), mode=spec.script_mode,
                            max_time_s=spec.max_time_s, guard_steps=spec.guard_steps,
                            samples_per_step=spec.samples_per_step,
                            no_step_timeout_s=max(5.0, timeout_s - _NO_STEP_MARGIN_S), profile=dict(spec.script_profile))
    plan = plan_script_launch(spec.command, RunConfig(spec.config), host, base_env)
    return list(plan.argv), {**plan.env, MEASURE_ENV: measure.to_json()}


def plan_script_launch(command: Sequence[str], config: RunConfig, host: HostFacts, base_env: Mapping[str, str]):
    """The LaunchPlan of one script-mode trial: `launch --config` of the trial's config, with the config
    over the caller's env (a trial runs what it measures) and the hook on the path even for the defaults."""
    from torchpace.launch.command import parse_python_command
    from torchpace.launch.plan import ChildOptions, plan_child
    from torchpace.launch.probe import probe_launch_facts

    facts = probe_launch_facts()
    options = ChildOptions(command=parse_python_command(command), facts=facts, config_name="the trial's config",
                           config_over_env=True)
    plan = plan_child(config, host, base_env, options)
    paths = [p for p in plan.env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if facts.hook_dir not in paths:
        plan = replace(plan, env={**plan.env, "PYTHONPATH": os.pathsep.join([facts.hook_dir, *paths])})
    return plan


def read_script_result(spec: TrialSpec, result_path: Path, returncode: int, stderr_tail: str, wall_s: float) -> TrialResult:
    """The trial's result: the hook's file when the script's process ended cleanly, else the script's failure."""
    label = " ".join(spec.command)
    if returncode == 0 and result_path.exists():
        result = TrialResult.from_dict(json.loads(result_path.read_text()))
        bench = dict(result.bench, config=RunConfig(spec.config).non_default()) if result.bench else None
        result = replace(result, bench=bench, stderr_tail=stderr_tail, returncode=0)
        unreached = unreached_knobs(spec.config, (bench or {}).get("script") or {})
        if result.ok and unreached:
            return replace(result, status=INVALID, error="; ".join(f"{k}: {why}" for k, why in unreached.items()))
        return result
    if returncode == 0:
        return TrialResult(CRASH, stderr_tail=stderr_tail, returncode=0, wall_time_s=wall_s, error=(
            f"`{label}` exited (status 0) before torchpace's hook saw a step: it must import torch and train "
            "(an optimizer step() or a backward()) in its own process"))
    how = f"was killed by signal {-returncode}" if returncode < 0 else f"exited with status {returncode}"
    return TrialResult(classify_exit(returncode, stderr_tail), stderr_tail=stderr_tail, returncode=returncode,
                       wall_time_s=wall_s, error=f"`{label}` {how} (the script's own failure; its stderr ends above)")


def unreached_knobs(config: Mapping[str, Any], script: Mapping[str, Any]) -> dict[str, str]:
    """knob -> why, for each non-default knob applied in-process that never took effect in the script."""
    reached, not_applied = set(script.get("reached") or ()), dict(script.get("not_applied") or {})
    why: dict[str, str] = {}
    for name, value in RunConfig(dict(config)).non_default().items():
        reach = REGISTRY[name].script_reach
        if reach not in _IN_PROCESS_REACH or name in reached:
            continue
        why[name] = not_applied.get(name) or f"never took effect in the script: {_WHAT_IT_MISSED[reach]}"
    return why


def script_trial_spec(command: Sequence[str], config: RunConfig, max_time_s: float, *, guard_steps: int = 0,
                      samples_per_step: int | None = None, **fields: Any) -> TrialSpec:
    """The TrialSpec of one script-mode run of `command` under `config`."""
    return TrialSpec(workload=" ".join(command), command=list(command), config=dict(config.values), max_time_s=max_time_s,
                     guard_steps=guard_steps, samples_per_step=samples_per_step, sys_path=[os.getcwd()], **fields)


def bench_script(command: Sequence[str], config: RunConfig, max_time_s: float, host: HostFacts, *,
                 samples_per_step: int | None = None, show_progress: bool = True):
    """`torchpace bench -- CMD`: the script measured in its own process; returns its BenchResult.

    Raises:
        UsageError: the command is not a Python program, or a knob cannot reach it here.
        UserCodeError: the script failed, never stepped, or ended before enough windows.
    """
    from torchpace.launch.command import parse_python_command
    from torchpace.measure.bench import BenchResult
    from torchpace.trial import run_trial

    label = parse_python_command(command).label
    check_script_config(config, host, label)
    spec = script_trial_spec(command, config, max_time_s, samples_per_step=samples_per_step)
    with waiting_bar(show_progress, f"bench {label}", max_time_s):
        result = run_trial(spec, host, timeout_s=max_time_s + _BENCH_TIMEOUT_MARGIN_S)
    if result.status == INVALID:
        raise UsageError(result.error)
    if not result.ok:
        raise UserCodeError(f"running the script `{' '.join(command)}` ({result.status}): {result.error}", result.stderr_tail)
    return BenchResult(**result.bench)


class waiting_bar:
    """A Rich spinner with the elapsed time on stderr while a child runs (nothing when disabled or not a tty)."""

    def __init__(self, enabled: bool, label: str, cap_s: float):
        import sys

        self.enabled = enabled and sys.stderr.isatty()
        self.label, self.cap_s = label, cap_s

    def __enter__(self):
        if self.enabled:
            from rich.console import Console
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                     console=Console(stderr=True), transient=True)
            self.progress.__enter__()
            cap = f" (measures up to {self.cap_s:.0f} s after its first step)" if self.cap_s else ""
            self.progress.add_task(f"{self.label}{cap}", total=None)
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self.progress.__exit__(*exc)


def profile_script(command: Sequence[str], config: RunConfig, options, host: HostFacts, *,
                   trace_path: str | None, show_progress: bool = True):
    """`torchpace profile -- CMD`: a few of the script's own steps traced inside its process
    (`torchpace.script.profile`), then the same analyzers and verdict as a Workload's profile.

    Args:
        options: a `torchpace.profile.capture.CaptureOptions` (steps, warm-up, cProfile steps).

    Raises:
        UsageError: the command is not a Python program, or a knob cannot reach it here.
        UserCodeError: the script failed or ended before the profile's steps.
    """
    import tempfile
    import time

    from torchpace.launch.command import parse_python_command
    from torchpace.profile.capture import save_trace
    from torchpace.profile.result import build_profile_result
    from torchpace.profile.trace import METADATA_KEY, parse_trace
    from torchpace.trial import run_trial
    from torchpace.tune.space import build_space

    start = time.perf_counter()
    label = parse_python_command(command).label
    check_script_config(config, host, label)
    with tempfile.TemporaryDirectory(prefix="torchpace-profile-") as tmp:
        raw = Path(tmp) / "trace.json"
        schedule = {"trace_path": str(raw), "wait": options.wait_steps, "warmup": options.warmup_steps,
                    "active": options.steps, "python_steps": options.python_steps, "profile_memory": options.profile_memory}
        spec = script_trial_spec(command, config, 60.0, script_mode="profile", script_profile=schedule)
        with waiting_bar(show_progress, f"profile {label}", 0):
            result = run_trial(spec, host, timeout_s=_BENCH_TIMEOUT_MARGIN_S * 3)
        if not result.ok:
            raise UserCodeError(f"profiling the script `{' '.join(command)}` ({result.status}): {result.error}",
                                result.stderr_tail)
        document = json.loads(raw.read_text())
    document[METADATA_KEY]["config"] = config.non_default()
    if trace_path is not None:
        save_trace(document, trace_path)
    space = build_space(host, script_target(label), script=True)
    knobs_by_stage: dict[str, list[str]] = {}
    for knob in space:
        knobs_by_stage.setdefault(knob.stage, []).append(knob.name)
    return build_profile_result(parse_trace(document), workload_spec=" ".join(command), knobs_by_stage=knobs_by_stage,
                                candidates={k.name: list(k.values) for k in space}, trace_path=trace_path,
                                wall_time_s=time.perf_counter() - start, usable_cores=host.usable_cores)
