"""Script-mode trials, parent side: a script-mode trial is a launch of the user's command with the trial's
config (planned by `plan_child`, as `torchpace launch --config` plans it) plus the measurement hook;
its result is read back from the file the hook wrote, or is the script's own failure (labelled as the
script's, with the tail of its output). A knob that never reached the script makes the trial `invalid` (the hook
says so in the result it writes).
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import psutil

from torchpace.config import RunConfig
from torchpace.host import HostFacts
from torchpace.launch.command import parse_python_command
from torchpace.launch.plan import ChildOptions, plan_child
from torchpace.launch.probe import probe_launch_facts
from torchpace.measure.stats import MIN_WINDOWS_FOR_CI
from torchpace.protocol import CRASH, INVALID, TrialResult, TrialSpec, classify_exit, compile_allowance_s
from torchpace.script.knobs import unreached_knobs
from torchpace.launch.torchrun import parse_failures
from torchpace.script.spec import (FAILED_SUFFIX, MEASURE_ENV, OWN_FAILURE, OWN_FAILURE_EXIT, OWN_FAILURE_LINE, RANK_SUFFIX,
                                   STEPS_SUFFIX, ScriptMeasure)

_NO_STEP_MARGIN_S = 10.0  # the hook's "no step" verdict comes this long before the parent's timeout
# A script that ends before its measurement could (pytorch/examples' regression: ~800 steps in a few
# seconds) is measured again for this share of the time it ran after its first step, so the measurement
# ends before the script does even when a later run is somewhat faster; below the minimum it is too
# short to measure (warm-up, then windows of at least 0.1 s).
_FIT_SHARE = 0.7
_MIN_FITTED_S = 1.0
# Once a script's tree has written its result, or one of its ranks failed or died, the rest of the tree gets this
# long to end by itself (the hook ends the ranks within `torchpace.script.ending.END_BOUND_S`; torchrun then ends),
# then torchpace stops it: no rank is left behind, and a job whose rank failed is never waited for.
END_GRACE_S = 12.0
FAILED_GRACE_S = 2.0  # after a rank failed or died: time for the others' failure files and the launcher's lines
_TAIL_BYTES = 3000


class JobWatch:
    """What the parent sees of a script-mode trial's tree while it runs, from the files its hook writes beside the
    result (`torchpace.script.spec`): the result itself, a rank whose script raised (RESULT.rankR.failed), or a
    registered rank whose process is gone (RESULT.rankR names its pid).

    `check()` says `result`, `failed`, `died` or None (still running); `failure(...)` is the trial's result when a
    rank failed or died."""

    def __init__(self, result_path: Path):
        self.result_path = Path(result_path)
        self.gone: dict[int, int] = {}  # rank -> pid, registered ranks whose process ended without a result

    def check(self) -> str | None:
        if self.result_path.exists():
            return "result"
        if self.failures():
            return "failed"
        self.gone = {rank: pid for rank, pid in self.ranks().items() if not _running(pid)}
        return "died" if self.gone else None

    def ranks(self) -> dict[int, int]:
        """rank -> pid of every rank that registered (stepped once)."""
        found = {}
        for path in self.result_path.parent.glob(self.result_path.name + RANK_SUFFIX.format(rank="*")):
            if path.name.endswith(FAILED_SUFFIX):
                continue
            try:
                member = json.loads(path.read_text())
                found[int(member["rank"])] = int(member["pid"])
            except (OSError, ValueError, KeyError, TypeError):
                continue  # being written
        return found

    def failures(self) -> list[dict[str, Any]]:
        """The failure files of the ranks whose script raised, earliest first."""
        found = []
        for path in self.result_path.parent.glob(self.result_path.name + RANK_SUFFIX.format(rank="*") + FAILED_SUFFIX):
            try:
                found.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
        return sorted(found, key=lambda f: f.get("at", 0))

    def failure(self, spec: TrialSpec, output_tail: str, wall_s: float, returncode: int | None) -> TrialResult | None:
        """The trial's result when a rank of the job failed or died; None when none did. The rank named is the
        cause, not an echo of it: a rank whose own script raised (its traceback), before a rank that died
        without one (killed, out of memory, `os._exit`), before a rank that raised only because a peer was gone
        (its collective lost the connection)."""
        label = shlex.join(spec.command)
        failures = self.failures()
        own = [f for f in failures if not _lost_peer(str(f.get("error", "")))]
        failed_ranks = {int(f["rank"]) for f in failures}
        exits = parse_failures(output_tail)
        silent = {r: p for r, p in (self.gone or self.ranks()).items()
                  if r not in failed_ranks and not _running(p) and exits.get(r) not in _STOPPED}
        if own or (failures and not silent):
            first = (own or failures)[0]
            rank, tail = int(first["rank"]), str(first.get("traceback", ""))
            return TrialResult(classify_exit(1, tail), stderr_tail=tail, returncode=returncode, wall_time_s=wall_s,
                               failed_rank=rank, ranks=first.get("world_size"), error=(
                f"rank {rank} of `{label}` raised {first.get('error', '')} (the script's own failure; its traceback "
                "ends above): the whole job was stopped"))
        if not silent:
            return None
        rank = min(silent)
        how = (f"ended with signal {-exits[rank]}" if exits.get(rank, 0) < 0 else
               f"exited with status {exits[rank]}" if rank in exits else "ended")
        return TrialResult(classify_exit(exits.get(rank, -9), output_tail), stderr_tail=output_tail[-_TAIL_BYTES:],
                           returncode=returncode, wall_time_s=wall_s, failed_rank=rank, error=(
            f"rank {rank} (pid {silent[rank]}) of `{label}` {how} without a result and without a Python traceback "
            "(killed by a signal, out of memory, or os._exit): the whole job was stopped"))


# what a rank's collective raises when another rank is gone: an echo of that rank's failure, not a cause
_PEER_LOST = ("connection reset by peer", "connection closed by peer", "broken pipe", "socket closed",
              "communicator was aborted", "nccl communicator", "connection refused", "lost the other ranks")
_STOPPED = (-15, 143)  # a launcher's exit lines for ranks it stopped itself (SIGTERM)


def _lost_peer(error: str) -> bool:
    text = error.lower()
    return any(sign in text for sign in _PEER_LOST)


def _running(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie has ended)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def plan_script_trial(spec: TrialSpec, host: HostFacts, base_env: Mapping[str, str], result_path: Path,
                      timeout_s: float) -> tuple[list[str], dict[str, str], int | None]:
    """(argv, env, soft RLIMIT_NOFILE) of the script's process for trial `spec`: the launch plan of its
    config, plus the hook."""
    measure = ScriptMeasure(result_path=str(result_path), command=tuple(spec.command), mode=spec.script_mode,
                            max_time_s=spec.max_time_s, warmup_s=spec.warmup_s, guard_steps=spec.guard_steps,
                            samples_per_step=spec.samples_per_step,
                            no_step_timeout_s=max(5.0, timeout_s - _NO_STEP_MARGIN_S), profile=dict(spec.script_profile),
                            gate=spec.gate, compile_allowance_s=spec.compile_allowance_s)
    plan = plan_script_launch(spec.command, RunConfig(spec.config), host, base_env)
    return list(plan.argv), {**plan.env, MEASURE_ENV: measure.to_json()}, plan.nofile



def plan_script_launch(command: Sequence[str], config: RunConfig, host: HostFacts, base_env: Mapping[str, str]):
    """The LaunchPlan of one script-mode trial: `launch --config` of the trial's config, with the config
    over the caller's env (a trial runs what it measures) and the hook on the path even for the defaults."""
    facts = probe_launch_facts()
    options = ChildOptions(command=parse_python_command(command), facts=facts, config_name="the trial's config",
                           config_over_env=True)
    plan = plan_child(config, host, base_env, options)
    paths = [p for p in plan.env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if facts.hook_dir not in paths:
        plan = replace(plan, env={**plan.env, "PYTHONPATH": os.pathsep.join([facts.hook_dir, *paths])})
    return plan



def read_script_result(spec: TrialSpec, result_path: Path, returncode: int, stderr_tail: str, wall_s: float,
                       stopped: bool = False) -> TrialResult:
    """The trial's result: the hook's file when the script's process ended cleanly (a job's, however its ranks'
    teardown ended: its ranks wrote it together; or when torchpace stopped the tree after it, `stopped`), else the
    script's failure (a rank's, named, when one failed)."""
    label = shlex.join(spec.command)
    if result_path.exists() and (returncode == 0 or stopped or _job_result(result_path)):
        result = TrialResult.from_dict(json.loads(result_path.read_text()))
        # every value the config set, a default too: it replaced the script's own argument
        bench = replace(result.bench, config=dict(RunConfig(spec.config).values)) if result.bench else None
        result = replace(result, bench=bench, stderr_tail=stderr_tail, returncode=0)
        script = bench.script if bench is not None else result.script  # a profile has no bench: the hook's report
        unreached = unreached_knobs(spec.config, script.reached if script else (), script.not_applied if script else {})
        if result.ok and unreached:
            return replace(result, status=INVALID, error="; ".join(f"{k}: {why}" for k, why in unreached.items()))
        return result
    rank_failure = JobWatch(result_path).failure(spec, stderr_tail, wall_s, returncode)
    if rank_failure is not None and rank_failure.failed_rank is not None and JobWatch(result_path).failures():
        return rank_failure
    steps = _steps_seen(result_path)
    if returncode == 0 and steps:
        return TrialResult(CRASH, stderr_tail=stderr_tail, returncode=0, wall_time_s=wall_s, error=(
            f"`{label}` exited (status 0) after {steps} step(s), before torchpace's measurement ended, without "
            "running Python's exit handlers (os._exit(), or a process that exec'd another program), so torchpace's "
            "hook could not write what it measured: let the script end normally (return, or sys.exit), or run "
            "longer than the measurement"))
    if returncode == 0:
        return TrialResult(CRASH, stderr_tail=stderr_tail, returncode=0, wall_time_s=wall_s, error=(
            f"`{label}` exited (status 0) before torchpace's hook saw a step: it must import torch and train "
            "(an optimizer step() or a backward()) in its own process"))
    if returncode == OWN_FAILURE_EXIT and OWN_FAILURE_LINE in stderr_tail:
        return TrialResult(CRASH, stderr_tail=stderr_tail, returncode=returncode, wall_time_s=wall_s,
                           error=f"{OWN_FAILURE} and could not write its result (see the traceback above)")
    how = f"was killed by signal {-returncode}" if returncode < 0 else f"exited with status {returncode}"
    return TrialResult(classify_exit(returncode, stderr_tail), stderr_tail=stderr_tail, returncode=returncode,
                       wall_time_s=wall_s, error=f"`{label}` {how} (the script's own failure; its output ends above)")



def _job_result(result_path: Path) -> bool:
    """Whether the result was written by the ranks of a job of several processes."""
    try:
        return (json.loads(result_path.read_text()).get("ranks") or 1) > 1
    except (OSError, ValueError, AttributeError):
        return False


def _steps_seen(result_path: Path) -> int:
    """The steps the hook counted before the script ended (0 when it saw none)."""
    try:
        return int(Path(f"{result_path}{STEPS_SUFFIX}").read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def script_trial_spec(command: Sequence[str], config: RunConfig, max_time_s: float, *, guard_steps: int = 0,
                      samples_per_step: int | None = None, **fields: Any) -> TrialSpec:
    """The TrialSpec of one script-mode run of `command` under `config` (with the compile allowance of that config)."""
    fields.setdefault("compile_allowance_s", compile_allowance_s(config.values))
    launcher = parse_python_command(command).launcher
    fields.setdefault("script_ranks", launcher.world_size if launcher is not None else None)
    return TrialSpec(workload=shlex.join(command), command=list(command), config=dict(config.values), max_time_s=max_time_s,
                     guard_steps=guard_steps, samples_per_step=samples_per_step, sys_path=[os.getcwd()], **fields)


def fitted_max_time_s(result: TrialResult, max_time_s: float) -> float | None:
    """A shorter measurement cap for a script that ended before its measurement had the windows a CI needs,
    sized to how long it ran after its first step; None when it did not end early, when it ran too briefly
    to measure at all, or when its steps are too long for a shorter cap to hold more windows (a window holds
    at least one step)."""
    from torchpace.measure.bench import WARMUP_SHARE, BenchOptions

    ended = result.ended_after
    if not ended or ended.get("windows", 0) >= MIN_WINDOWS_FOR_CI:
        return None
    seconds = float(ended.get("seconds", 0.0))
    fitted = round(seconds * _FIT_SHARE, 1)
    if not _MIN_FITTED_S <= fitted < max_time_s:
        return None
    step_s = seconds / max(1, int(ended.get("steps", 1)) - 1)
    window_s = max(BenchOptions(max_time_s=fitted).timing().window_s, step_s)
    return fitted if (1 - WARMUP_SHARE) * fitted / window_s >= MIN_WINDOWS_FOR_CI else None


def steps_after_first(result: TrialResult) -> int | None:
    """The steps a script that ended before its measurement made after its first one (None: it did not end)."""
    ended = result.ended_after
    return max(0, int(ended.get("steps", 1)) - 1) if ended else None


def sized_to_steps_s(steps: int, step_s: float | None, max_time_s: float) -> float | None:
    """The measurement time of a trial of a script that makes `steps` steps after its first one and ends, at
    `step_s` a step as its latest trials ran: the same share of the time those steps take as a measurement
    fitted to the script (`fitted_max_time_s`), at most `max_time_s`; None when `step_s` is unknown or the time
    is too short to measure. A script's run lasts as long as its steps do, so on a host whose speed changes
    this follows it where the seconds one quiet run took would not."""
    if not step_s or steps < 1:
        return None
    sized = round(steps * step_s * _FIT_SHARE, 1)
    return min(max_time_s, sized) if sized >= _MIN_FITTED_S else None


def rounds_for_steps_s(steps: int, step_s: float, max_time_s: float, limit_s: float) -> float:
    """The rounds' time of a comparison of a script that makes `steps` steps after its first one and ends (each
    arm runs the whole script: warm-up and turns come out of its own steps): what both arms' steps take at
    `step_s`, so that the script's end, not a share of its time, ends the rounds; at least `max_time_s` (a
    trial's measurement), at most `limit_s` (the tune's trial time)."""
    return max(max_time_s, min(limit_s, 2 * steps * step_s))


def too_short_hint(result: TrialResult, option: str) -> str:
    """What to change when a script ended too early to be measured, naming the verb's time option."""
    ended = result.ended_after or {}
    seconds = float(ended.get("seconds", 0.0))
    fitted = round(seconds * _FIT_SHARE, 1)
    if fitted >= _MIN_FITTED_S:
        return f"give the script more steps or epochs, or measure for less time: `{option} {fitted:g}`"
    return (f"it trained for {seconds:.1f} s after its first step, too little to measure (at least "
            f"{_MIN_FITTED_S / _FIT_SHARE:.1f} s): give the script more steps or epochs")
