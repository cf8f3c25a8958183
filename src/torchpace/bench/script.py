"""`torchpace bench -- CMD` and `torchpace profile -- CMD`: an unmodified script measured or traced in
its own process, as a script-mode trial (`torchpace.trial.script`), with a spinner while it runs.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Sequence

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from torchpace.config import RunConfig
from torchpace.errors import ScriptFailed, UsageError
from torchpace.host import HostFacts
from torchpace.launch.command import parse_python_command
from torchpace.process import temporary_folder
from torchpace.profile.result import build_profile_result
from torchpace.profile.trace import METADATA_KEY, parse_trace
from torchpace.protocol import INVALID
from torchpace.script.knobs import check_script_config, script_target
from torchpace.trial import run_trial
from torchpace.trial.script import script_trial_spec
from torchpace.tune.space import build_space

_BENCH_TIMEOUT_MARGIN_S = 120.0  # start-up (imports, data) beyond the measurement's own cap


def bench_script(command: Sequence[str], config: RunConfig, max_time_s: float, host: HostFacts, *,
                 samples_per_step: int | None = None, show_progress: bool = True):
    """`torchpace bench -- CMD`: the script measured in its own process; returns its BenchResult.

    Raises:
        UsageError: the command is not a Python program, or a knob cannot reach it here.
        ScriptFailed: the script failed, never stepped, or ended before enough windows.
    """
    label = parse_python_command(command).label
    check_script_config(config, host, label)
    spec = script_trial_spec(command, config, max_time_s, samples_per_step=samples_per_step)
    with waiting_bar(show_progress, f"bench {label}", max_time_s):
        result = run_trial(spec, host, timeout_s=max_time_s + _BENCH_TIMEOUT_MARGIN_S)
    if result.status == INVALID:
        raise UsageError(result.error)
    if not result.ok:
        raise ScriptFailed(f"the script `{' '.join(command)}` ({result.status}): {result.error}", result.stderr_tail)
    return result.bench



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



def profile_script(command: Sequence[str], config: RunConfig, options, host: HostFacts, *,
                   trace_path: str | None, show_progress: bool = True):
    """`torchpace profile -- CMD`: a few of the script's own steps traced inside its process
    (`torchpace.script.profile`), then the same analyzers and verdict as a Workload's profile.

    Args:
        options: a `torchpace.profile.capture.CaptureOptions` (steps, warm-up, cProfile steps).

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
        with waiting_bar(show_progress, f"profile {label}", 0):
            result = run_trial(spec, host, timeout_s=_BENCH_TIMEOUT_MARGIN_S * 3)
        if not result.ok:
            raise ScriptFailed(f"the script `{' '.join(command)}` under the profiler ({result.status}): {result.error}",
                               result.stderr_tail)
        document = json.loads(raw.read_text())
    document[METADATA_KEY]["config"] = config.non_default()
    written, failure = save_trace_keeping_figures(document, trace_path)
    space = build_space(host, script_target(label), script=True)
    knobs_by_stage: dict[str, list[str]] = {}
    for knob in space:
        knobs_by_stage.setdefault(knob.stage, []).append(knob.name)
    result = build_profile_result(parse_trace(document), workload_spec=" ".join(command), knobs_by_stage=knobs_by_stage,
                                  candidates={k.name: list(k.values) for k in space}, trace_path=written,
                                  wall_time_s=time.perf_counter() - start, usable_cores=host.usable_cores)
    if failure is not None:  # the figures go with the error: the CLI prints them, then the one line
        failure.figures = result
        raise failure
    return result
