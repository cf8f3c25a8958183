"""Capturing a profile: run a workload's real steps under `torch.profiler` and cProfile (effects).

Method. `prepare(workload, config, label_phases=True)` builds the same step `bench` and `tune`
time, labelled with `record_function` per phase (`torchpace.h2d`, `.forward`, `.backward`,
`.optimizer`); the loop here adds `torchpace.input_wait` around fetching the next batch. The loop
runs `wait + warmup + steps` steps under `torch.profiler.profile` with
`schedule(wait, warmup, active=steps, repeat=1)`: the first step is not traced at all (lazy
initialisation, optimizer state, allocator growth), the warm-up step is traced and thrown away (the
profiler's own start-up cost lands there), and only the `steps` active ones are exported, each as a
`ProfilerStep#N` span. Activities: CPU, plus CUDA when the run is on a CUDA device; memory events
on. Then a few more steps run under cProfile to see the interpreted-Python share, which the trace
cannot show without `with_stack` (whose cost would distort the step split).

The exported Chrome trace gets a top-level ``torchpace`` block (workload, device, peak memory and
capacity, the cProfile summary), so the trace file alone is enough to re-run the analyzers.
"""

from __future__ import annotations

import cProfile
import gzip
import json
import os
import pstats
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from torchpace.config import RunConfig, resolve_config
from torchpace.errors import TorchpaceError, UsageError, UserCodeError
from torchpace.files import write_atomic
from torchpace.host import HostFacts, probe_host
from torchpace.engine.loader import LoaderCycle
from torchpace.measure.memory import device_sync, read_peak_memory, reset_peak_memory
from torchpace.profile.trace import MAX_PROFILED_STEPS, METADATA_KEY
from torchpace.stop_policy import temporary_folder
from torchpace.redact import redact
from torchpace.runtime import Prepared, prepare
from torchpace.workload import Workload

METADATA_SCHEMA_VERSION = 1
_PYTHON_TOP_N = 15  # cProfile rows kept in the trace metadata (the analyzer shows fewer)


@dataclass(frozen=True)
class CaptureOptions:
    """How many steps to run and record.

    Attributes:
        steps: steps recorded in the trace (the profiler schedule's `active`).
        wait_steps: steps run first, untraced.
        warmup_steps: steps traced and discarded (the profiler's start-up cost).
        python_steps: steps run under cProfile after the trace (0 skips the Python pass).
        profile_memory: record allocator events (`[memory]`) in the trace.
    """

    steps: int = 5
    wait_steps: int = 1
    warmup_steps: int = 1
    python_steps: int = 3
    profile_memory: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.steps <= MAX_PROFILED_STEPS:
            raise UsageError(f"steps must be between 1 and {MAX_PROFILED_STEPS}, got {self.steps}")
        if not 0 <= self.python_steps <= MAX_PROFILED_STEPS:
            raise UsageError(f"python_steps must be between 0 and {MAX_PROFILED_STEPS}, got {self.python_steps}")
        if self.wait_steps < 0 or self.warmup_steps < 1:
            raise UsageError("wait_steps must be >= 0 and warmup_steps >= 1")


@dataclass(frozen=True)
class Capture:
    """A captured profile: the Chrome trace document (with torchpace's metadata) and where it went."""

    document: dict[str, Any]
    trace_path: Path | None
    wall_time_s: float


def profiler_activities(device: torch.device) -> list:
    """CPU always; CUDA too when the run is on a CUDA device."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda" and torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return activities


def capture_profile(
    workload: Workload,
    config: RunConfig | dict | str | None = None,
    options: CaptureOptions = CaptureOptions(),
    *,
    host: HostFacts | None = None,
    device: str | None = None,
    trace_path: str | Path | None = None,
) -> Capture:
    """Run `workload` under the profiler (see the module docstring) and export its trace.

    Args:
        workload: what to run.
        config: knob values applied through `prepare()`.
        options: step counts.
        host: HostFacts (probed when None).
        device: torch device; default CUDA when available, else CPU.
        trace_path: where to write the Chrome trace (gzip-compressed when it ends in `.gz`), or None.

    Raises:
        UsageError: the config does not apply here.
        UserCodeError: the workload's model, loss, optimizer or dataset raised.
    """
    config = resolve_config(config)
    host = host or probe_host()
    start = time.perf_counter()
    with prepare(workload, config, device=device, host=host, label_phases=True) as run:
        reset_peak_memory(run.device)
        cycle = LoaderCycle(run.loader)
        try:
            document = _run_traced_steps(run, cycle, options)
            python = _run_python_steps(run, cycle, options.python_steps) if options.python_steps else None
        except TorchpaceError:
            raise
        except Exception as err:  # the user's model/loss/data raised: report it as theirs
            raise UserCodeError("running the workload's step under the profiler",
                                "".join(traceback.format_exception(err))) from err
        finally:
            cycle.close()
        document[METADATA_KEY] = build_metadata(run, options, python)
    if trace_path is not None:
        save_trace(document, trace_path)
    return Capture(document, Path(trace_path) if trace_path is not None else None, time.perf_counter() - start)


def _step(run: Prepared, cycle: LoaderCycle) -> None:
    with torch.profiler.record_function("torchpace.input_wait"):
        batch = cycle.next()
    run.step(batch)


def _run_traced_steps(run: Prepared, cycle: LoaderCycle, options: CaptureOptions) -> dict[str, Any]:
    """The scheduled profiler loop; returns the exported Chrome trace document."""
    with temporary_folder("torchpace-profile-") as tmp:
        raw_path = tmp / "trace.json"
        schedule = torch.profiler.schedule(wait=options.wait_steps, warmup=options.warmup_steps,
                                           active=options.steps, repeat=1)
        with torch.profiler.profile(activities=profiler_activities(run.device), schedule=schedule,
                                    on_trace_ready=lambda prof: prof.export_chrome_trace(str(raw_path)),
                                    profile_memory=options.profile_memory) as prof:
            for _ in range(options.wait_steps + options.warmup_steps + options.steps):
                _step(run, cycle)
                prof.step()
        with raw_path.open(encoding="utf-8") as fh:
            return json.load(fh)


def _run_python_steps(run: Prepared, cycle: LoaderCycle, steps: int) -> dict[str, Any]:
    """Run `steps` steps under cProfile; summarise self time in interpreted Python vs C/C++ calls."""
    profiler = cProfile.Profile()
    sync = device_sync(run.device)
    profiler.enable()
    try:
        for _ in range(steps):
            _step(run, cycle)
        sync()  # queued GPU work finishes inside the pass, so its wait is counted
    finally:
        profiler.disable()
    return summarize_cprofile(pstats.Stats(profiler).stats, steps)


def summarize_cprofile(stats: dict, steps: int) -> dict[str, Any]:
    """cProfile's raw stats -> total and Python-level self seconds, and the top Python functions.

    Builtins (C functions, torch's C++ bindings) have the file name ``~``; everything else is
    interpreted Python, whose self time is the overhead compile or a larger batch can remove.
    """
    rows = []
    total_s = python_s = 0.0
    for (filename, line, func), (_, calls, self_s, cumulative_s, _) in stats.items():
        total_s += self_s
        if filename == "~":
            continue
        python_s += self_s
        rows.append({"function": func, "file": _short_path(filename), "line": line, "calls": calls,
                     "self_s": self_s, "cumulative_s": cumulative_s})
    rows.sort(key=lambda row: -row["self_s"])
    return {"steps": steps, "total_s": total_s, "python_self_s": python_s, "top": rows[:_PYTHON_TOP_N]}


def _short_path(filename: str) -> str:
    for marker in ("site-packages/", "dist-packages/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    try:
        return os.path.relpath(filename)
    except ValueError:
        return filename


def build_metadata(run: Prepared, options: CaptureOptions, python: dict[str, Any] | None) -> dict[str, Any]:
    """torchpace's block in the exported trace: what ran, where, and the figures not in the events."""
    peak_bytes, peak_kind = read_peak_memory(run.device)
    return {
        "schema_version": METADATA_SCHEMA_VERSION,
        "workload": run.workload.name,
        "device": str(run.device),
        "config": run.config.non_default(),
        "batch_size": run.workload.batch_size,
        "steps": options.steps,
        "wait_steps": options.wait_steps,
        "warmup_steps": options.warmup_steps,
        "peak_memory_bytes": peak_bytes,
        "peak_memory_kind": peak_kind,
        "memory_capacity_bytes": memory_capacity_bytes(run),
        "torch_version": torch.__version__,
        "python_profile": python,
        "run": run_facts(run),
    }


def run_facts(run: Prepared) -> dict[str, Any]:
    """What the prepared run already does, for the advice (`torchpace.profile.effect`)."""
    parameter = next(iter(run.model.parameters()), None)
    facts: dict[str, Any] = {"num_workers": run.loader.num_workers, "pin_memory": bool(run.loader.pin_memory)}
    if parameter is not None:
        facts["param_dtype"] = str(parameter.dtype).replace("torch.", "")
    if run.options.amp_dtype is not None:
        facts["autocast_dtype"] = str(run.options.amp_dtype).replace("torch.", "")
    return facts


def memory_capacity_bytes(run: Prepared) -> int | None:
    """The run device's memory: the GPU's total, or the host's RAM on CPU (None when unknown)."""
    if run.device.type == "cuda":
        return int(torch.cuda.get_device_properties(run.device).total_memory)
    return run.host.memory_bytes


def save_trace(document: dict[str, Any], path: str | Path) -> Path:
    """Write a trace document as JSON (gzip when `path` ends in `.gz`), atomically, secrets masked.

    Raises:
        OutputWriteFailed: the file could not be written (full disk, permissions); nothing is left behind.
    """
    path = Path(path)
    payload = redact(json.dumps(document, separators=(",", ":"))).encode("utf-8")
    if path.name.endswith(".gz"):
        payload = gzip.compress(payload, compresslevel=6, mtime=0)
    return write_atomic(path, payload)
