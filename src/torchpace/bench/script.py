"""`torchpace bench -- CMD` and `torchpace profile -- CMD`: an unmodified script measured or traced in
its own process, as a script-mode trial (`torchpace.trial.script`), with a spinner while it runs.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from torchpace.config import RunConfig
from torchpace.errors import HookFailed, ScriptFailed, UsageError
from torchpace.host import HostFacts
from torchpace.launch.command import parse_python_command
from torchpace.measure.result import ScriptInfo
from torchpace.stop_policy import temporary_folder
from torchpace.profile.effect import settings_in_effect
from torchpace.profile.ranks import rank_profile, ranks_finding
from torchpace.profile.result import build_profile_result
from torchpace.profile.trace import METADATA_KEY, parse_trace
from torchpace.profile.verdict import build_offer
from torchpace.protocol import INVALID
from torchpace.script.knobs import check_script_config, script_target
from torchpace.script.spec import OWN_FAILURE, OWN_FAILURE_LINE
from torchpace.trial import run_trial
from torchpace.trial.output import plan_log_path
from torchpace.trial.script import fitted_max_time_s, script_trial_spec, too_short_hint
from torchpace.tune.space import build_space

_BENCH_TIMEOUT_MARGIN_S = 120.0  # start-up (imports, data) beyond the measurement's own cap


def bench_script(command: Sequence[str], config: RunConfig, max_time_s: float, host: HostFacts, *,
                 samples_per_step: int | None = None, show_progress: bool = True, show_output: bool = False):
    """`torchpace bench -- CMD`: the script measured in its own process; returns its BenchResult.

    The script's output is kept in a log file under `.torchpace/logs/` (its path is said on stderr and
    is `script.output_log` in the result); `show_output` also streams it to stderr as it comes.

    Raises:
        UsageError: the command is not a Python program, or a knob cannot reach it here.
        ScriptFailed: the script failed, never stepped, or ended before enough windows.
    """
    label = parse_python_command(command).label
    check_script_config(config, host, label)
    log = plan_log_path("bench", command)

    def measure(cap_s: float):
        spec = script_trial_spec(command, config, cap_s, samples_per_step=samples_per_step)
        with waiting_bar(show_progress and not show_output, f"bench {label}", cap_s):
            return run_trial(spec, host, timeout_s=cap_s + _BENCH_TIMEOUT_MARGIN_S + spec.compile_allowance_s,
                             log_path=log, echo=sys.stderr if show_output else None)

    result = measure(max_time_s)
    fitted = fitted_max_time_s(result, max_time_s)
    if fitted is not None:  # the script ends sooner than the measurement: measure it again, sized to it
        sys.stderr.write(f"torchpace: {_ended_early(result)}: measuring it again for {fitted:g} s "
                         f"(`--max-time {fitted:g}`)\n")
        result = measure(fitted)
    say_output_log(log)
    if result.status == INVALID:
        raise UsageError(result.error)
    if not result.ok:
        hint = f"; {too_short_hint(result, '--max-time')}" if result.ended_after else ""
        raise script_failure(result, f"the script `{shlex.join(command)}` ({result.status}): {result.error}{hint}")
    bench = result.bench
    return replace(bench, script=replace(bench.script or ScriptInfo(command=tuple(command)), output_log=str(log)))


def script_failure(result, message: str) -> HookFailed | ScriptFailed:
    """The error of a failed script run: torchpace's own when its hook raised in the script's process
    (with the traceback the hook printed), else the script's (with the tail of its output)."""
    if not result.error.startswith(OWN_FAILURE):
        return ScriptFailed(message, result.stderr_tail)
    start = result.stderr_tail.rfind(OWN_FAILURE_LINE)
    return HookFailed(message + (f"\n{result.stderr_tail[start:].strip()}" if start >= 0 else ""))


def _ended_early(result) -> str:
    ended = result.ended_after
    return (f"the script ended {ended['seconds']:.1f} s after its first step, with {ended['windows']} measured "
            "window(s)")


def say_output_log(log: Path) -> None:
    """Tell the user (on stderr: stdout may be JSON) where the script's output is."""
    if log.exists():
        sys.stderr.write(f"torchpace: the script's output is in {log}\n")


class waiting_bar:
    """A Rich spinner with the elapsed time on stderr while a child runs (nothing when disabled or not a tty)."""

    def __init__(self, enabled: bool, label: str, cap_s: float):
        self.enabled = enabled and sys.stderr.isatty()
        self.label, self.cap_s = label, cap_s

    def __enter__(self):
        if self.enabled:
            self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                     console=Console(stderr=True), transient=True)
            self.progress.__enter__()
            cap = f" (measures up to {self.cap_s:.0f} s after its first step)" if self.cap_s else ""
            self.progress.add_task(f"{self.label}{cap}", total=None)
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self.progress.__exit__(*exc)



def _rank_documents(raw: Path) -> dict[int, dict]:
    """The traces the other ranks of a profiled job wrote beside rank 0's (`torchpace.script.profile.rank_trace_path`)."""
    found = {}
    for path in raw.parent.glob(f"{raw.stem}.rank*{raw.suffix}"):
        rank = path.name[len(raw.stem) + len(".rank"):-len(raw.suffix)]
        if rank.isdigit():
            found[int(rank)] = json.loads(path.read_text())
    return found


def _save_rank_traces(document: dict, others: dict[int, dict], written: str | None, config: RunConfig):
    """(each rank's `RankProfile`, the failure to write one's trace or None): rank 0's trace is the profile's
    (`written`), each other rank's is written beside it (`trace.json.gz` -> `trace.rank1.json.gz`)."""
    from torchpace.profile.run import save_trace_keeping_figures

    if not others:
        return [], None
    profiles, failure = [rank_profile(0, parse_trace(document), written)], None
    for rank, other in sorted(others.items()):
        other[METADATA_KEY]["config"] = config.non_default()
        path = None
        if written is not None:
            name = Path(written).name
            stem, dot, suffix = name.partition(".")
            path, failed = save_trace_keeping_figures(other, str(Path(written).with_name(f"{stem}.rank{rank}{dot}{suffix}")))
            failure = failure or failed
        profiles.append(rank_profile(rank, parse_trace(other), path))
    return profiles, failure


def profile_script(command: Sequence[str], config: RunConfig, options, host: HostFacts, *,
                   trace_path: str | None, show_progress: bool = True, show_output: bool = False):
    """`torchpace profile -- CMD`: a few of the script's own steps traced inside its process
    (`torchpace.script.profile`), then the same analyzers and verdict as a Workload's profile.

    Args:
        options: a `torchpace.profile.capture.CaptureOptions` (steps, warm-up, cProfile steps).
        show_output: also stream the script's output to stderr (it is kept in a log file either way).

    Raises:
        UsageError: the command is not a Python program, or a knob cannot reach it here.
        ScriptFailed: the script failed or ended before the profile's steps.
    """
    from torchpace.profile.run import save_trace_keeping_figures

    start = time.perf_counter()
    label = parse_python_command(command).label
    check_script_config(config, host, label)
    with temporary_folder("torchpace-profile-") as tmp:
        raw = Path(tmp) / "trace.json"
        schedule = {"trace_path": str(raw), "wait": options.wait_steps, "warmup": options.warmup_steps,
                    "active": options.steps, "python_steps": options.python_steps, "profile_memory": options.profile_memory}
        spec = script_trial_spec(command, config, 60.0, script_mode="profile", script_profile=schedule)
        log = plan_log_path("profile", command)
        with waiting_bar(show_progress and not show_output, f"profile {label}", 0):
            result = run_trial(spec, host, timeout_s=_BENCH_TIMEOUT_MARGIN_S * 3 + spec.compile_allowance_s,
                               log_path=log, echo=sys.stderr if show_output else None)
        say_output_log(log)
        if result.status == INVALID:
            raise UsageError(result.error)
        if not result.ok:
            raise script_failure(result, f"the script `{shlex.join(command)}` under the profiler ({result.status}): "
                                         f"{result.error}")
        document = json.loads(raw.read_text())
        rank_documents = _rank_documents(raw)
    document[METADATA_KEY]["config"] = config.non_default()
    written, failure = save_trace_keeping_figures(document, trace_path)
    ranks, rank_failure = _save_rank_traces(document, rank_documents, written, config)
    failure = failure or rank_failure
    target = script_target(label, parse_python_command(command))
    space = build_space(host, target, script=True)
    knobs_by_stage: dict[str, list[str]] = {}
    for knob in space:
        knobs_by_stage.setdefault(knob.stage, []).append(knob.name)
    trace = parse_trace(document)
    offer = build_offer(host, target, script=True, candidates={k.name: list(k.values) for k in space},
                        in_effect=settings_in_effect(trace))
    result = build_profile_result(trace, workload_spec=shlex.join(command), knobs_by_stage=knobs_by_stage,
                                  offer=offer, command=command, trace_path=written,
                                  wall_time_s=time.perf_counter() - start, usable_cores=host.usable_cores,
                                  other_load_cores=document[METADATA_KEY].get("other_load_cores"))
    found = ranks_finding(ranks)
    if found is not None:  # a job of several ranks: each rank's collectives, and the straggler's wait
        result = replace(result, findings=(*result.findings, found))
    if failure is not None:  # the figures go with the error: the CLI prints them, then the one line
        failure.figures = result
        raise failure
    return result
