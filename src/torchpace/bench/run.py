"""The `torchpace bench WORKLOAD` flow: in this process, or in a trial process when the config has
process-level knobs (allocator, NUMA, thread env vars) this process is not already running with; the
measurement itself is `torchpace.trial.bench.run_bench` either way. (`bench -- CMD` is
`torchpace.bench.script.bench_script`.)"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from contextlib import contextmanager
from typing import Iterator

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from torchpace.config import RunConfig
from torchpace.errors import UsageError, UserCodeError
from torchpace.host import HostFacts
from torchpace.knobs.system import fix_glibc_thresholds
from torchpace.measure.bench import BenchOptions
from torchpace.measure.result import BenchResult
from torchpace.protocol import check_eval_batches, compile_allowance_s, is_nonfinite
from torchpace.runtime import pending_env_knobs
from torchpace.trial import TrialSpec, run_trial
from torchpace.trial.bench import run_bench
from torchpace.workload import exits_as_errors, load_workload

_log = logging.getLogger(__name__)

_TRIAL_TIMEOUT_MARGIN_S = 120.0  # start-up, workload build and compile beyond the bench's own cap


@contextmanager
def progress_bar(enabled: bool, total_s: float, label: str) -> Iterator:
    """A Rich progress bar over the time cap on stderr (a no-op callback when disabled)."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[status]}"),
                  TimeElapsedColumn(), transient=True, console=_stderr_console()) as progress:
        task = progress.add_task(label, total=total_s, status="warming up")

        start = time.perf_counter()

        def on_window(phase, windows, summary):
            status = f"{phase}: {windows} windows, {summary.median:,.0f} samples/s ±{summary.ci_rel_halfwidth:.1%}"
            progress.update(task, completed=min(total_s, time.perf_counter() - start), status=status)

        yield on_window


def _stderr_console():
    return Console(stderr=True)


def bench_workload(spec: str | None, config: RunConfig, options: BenchOptions, *, host: HostFacts,
                   device: str | None = None, show_progress: bool = True, accuracy_batches: int = 0) -> BenchResult:
    """Load and bench workload `spec`; in a trial process when process-level knobs require it.

    Args:
        accuracy_batches: for inference workloads, also report the outputs' distance from the fp32
            eager reference on this many batches (reported, never rejected; 0 skips it).
    """
    check_eval_batches(accuracy_batches)
    workload = load_workload(spec)
    pending = pending_env_knobs(config, host)
    _log.info("bench in %s", f"a trial process: {pending} take effect only in a new process" if pending else "this process")
    if pending:  # process-level knobs need a fresh process with their env
        from torchpace.runtime.prepare import check_config

        check_config(config, host, workload)  # a knob that does not apply: say so before starting processes
        return _bench_in_trial(spec, config, options, host, device, accuracy_batches)
    fix_glibc_thresholds()  # as a trial process and a launch run: one speed for one config
    # in this process, an exit in the workload's code would end torchpace silently with its code: say so
    # (a trial child's exit is classified by its parent from the exit status instead)
    with exits_as_errors("running the workload's training step"):
        accuracy = _accuracy_report(workload, accuracy_batches)
        with progress_bar(show_progress, options.max_time_s, f"bench {workload.name}") as on_window:
            return run_bench(workload, config, options, host=host, device=device, on_window=on_window, accuracy=accuracy)


def _accuracy_report(workload, batches: int):
    """A report-only accuracy guard for an inference workload (None for training or 0 batches)."""
    if workload.is_training or batches <= 0:
        return None
    from torchpace.inference.accuracy import AccuracyGuard

    return AccuracyGuard.capture(workload, batches, enforce=False)


def _bench_in_trial(spec, config: RunConfig, options: BenchOptions, host: HostFacts, device, accuracy_batches: int = 0) -> BenchResult:
    trial = TrialSpec(workload=spec or "tabular", config=dict(config.values), max_time_s=options.max_time_s,
                      compute_only=options.compute_only, device=device, sys_path=[os.getcwd()],
                      accuracy_batches=accuracy_batches, accuracy_enforce=False,
                      compile_allowance_s=compile_allowance_s(config.values))
    result = run_trial(trial, host, timeout_s=options.max_time_s + _TRIAL_TIMEOUT_MARGIN_S + trial.compile_allowance_s)
    _log.info("the bench's trial ended %s, wall time %.1f s", result.status, result.wall_time_s)
    if result.status == "invalid":
        raise UsageError(result.error)
    if not result.ok:
        raise UserCodeError(f"running the workload in a trial process ({result.status})",
                            result.error + "\n" + result.stderr_tail)
    return result.bench


def nonfinite_loss_message(losses: list[float]) -> str | None:
    """Why a bench's figures measure a run that diverged (a NaN or infinite loss), or None."""
    if not is_nonfinite(losses):
        return None
    first = next(i for i, value in enumerate(losses) if not math.isfinite(value))
    return (f"the loss was {losses[first]} at loss value {first + 1} of {len(losses)}: these figures time a run that "
            "diverged; check the learning rate, the data and precision knobs (precision.amp)")
