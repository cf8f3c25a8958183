"""Inside an unmodified script's process: trace a few of its steps with `torch.profiler` (script mode
of `torchpace profile`), with the same step labels the Workload profile has.

The steps are the script's own (see `torchpace.script.hook` for what a step is). The labels come from
the hook: `torchpace.input_wait` around the DataLoader iterator's `__next__`, `torchpace.forward`
around the forward of the outermost module with parameters, `torchpace.backward` around
`backward()`, `torchpace.optimizer` around the optimizer's `step()`. The schedule is the Workload
profile's (`torchpace.profile.capture`): `wait` steps untraced (the first holds start-up and
compile), `warmup` traced and dropped, `active` exported as `ProfilerStep#N` spans; then a few steps
under cProfile for the interpreted-Python share. The trace document, with torchpace's metadata
block, is written to `profile["trace_path"]` and the process ends; the parent analyses it.
"""

from __future__ import annotations

import cProfile
import os
import json
import pstats
import shlex
from pathlib import Path
from typing import Any

import psutil

from torchpace.files import write_atomic
from torchpace.measure.contention import other_load_cores, probe_cpu_times
from torchpace.measure.result import ScriptInfo
from torchpace.process import owner_pid
from torchpace.profile.trace import METADATA_KEY
from torchpace.protocol import CRASH, INVALID, OK, TIMEOUT, TrialResult
from torchpace.records import from_json
from torchpace.script.inprocess import HookReport
from torchpace.script.knobs import unreached_knobs
from torchpace.script.probe import BYSTANDER, RANK, UNDECIDED, ScriptProbe, write_result
from torchpace.script.spec import ScriptMeasure


class ScriptProfiler(ScriptProbe):
    """A `ScriptProbe` whose steps drive the profiler schedule instead of the window meter."""

    label_phases = True

    def __init__(self, spec: ScriptMeasure, report: HookReport, **kwargs: Any):
        super().__init__(spec, report, **kwargs)
        options = spec.profile
        self.wait = max(1, int(options.get("wait", 1)))
        self.warmup, self.active = int(options.get("warmup", 1)), int(options.get("active", 5))
        self.python_steps = int(options.get("python_steps", 0))
        self.profile_memory = bool(options.get("profile_memory", True))
        self.prof = None
        self.traced = 0
        self.cprofile = None
        self.python_done = 0
        self.document: dict[str, Any] | None = None
        self.python: dict[str, Any] | None = None
        # the profiler's own export goes beside the trace the parent reads, in the parent's temporary folder
        self._raw = Path(spec.profile["trace_path"]).with_name(f"raw-trace-{os.getpid()}.json")  # one per rank
        # what the run already does, for the advice (`torchpace.profile.effect`): autocast and parameter
        # dtypes (the hook notes them), the DataLoaders' workers and pinning
        self.run_facts: dict[str, Any] = {}
        self.other_load_cores: float | None = None  # read over the traced steps

    def on_batch(self, batch: Any, waited_s: float, loader_iter: Any = None) -> None:
        super().on_batch(batch, waited_s, loader_iter)
        if self.role == BYSTANDER:
            return
        if loader_iter is not None:
            workers = int(getattr(loader_iter, "_num_workers", 0) or 0)
            self.run_facts["num_workers"] = max(workers, self.run_facts.get("num_workers", 0))
            pinned = bool(getattr(loader_iter, "_pin_memory", False))
            self.run_facts["pin_memory"] = pinned or self.run_facts.get("pin_memory", False)

    def on_step(self) -> None:
        if self.finished or self.role == BYSTANDER:
            return
        self.events.close_step()
        if self.role == UNDECIDED and not self.take_role():
            return
        self.watch.note_step(self.steps)
        if self.prof is None and self.document is None and self.steps >= self.wait:
            if self._ready_to_measure():  # the steps that compile stay untraced (on every rank of a job)
                self.wait = self.steps
                self._start_profiler()
        elif self.prof is not None:
            self._profiler_step()
        elif self.cprofile is not None:
            self.python_done += 1
            if self.python_done >= self.python_steps:
                self._stop_python()

    def _start_profiler(self) -> None:
        import torch

        schedule = torch.profiler.schedule(wait=0, warmup=self.warmup, active=self.active, repeat=1)
        raw = str(self._raw)
        self.prof = torch.profiler.profile(activities=_activities(), schedule=schedule, profile_memory=self.profile_memory,
                                           on_trace_ready=lambda prof: prof.export_chrome_trace(raw))
        # other processes' CPU over the traced steps, as the Workload profile reads it around its capture; this
        # script's own tree is the parent's (the profile process that started it), as for a script's bench
        self._cpu_before = probe_cpu_times(owner_pid())
        self.prof.__enter__()

    def _profiler_step(self) -> None:
        self.prof.step()
        self.traced += 1
        if self.traced < self.warmup + self.active:
            return
        self.prof.__exit__(None, None, None)
        self.prof = None
        self.other_load_cores = other_load_cores(self._cpu_before, probe_cpu_times(owner_pid()))
        with open(self._raw, encoding="utf-8") as fh:
            self.document = json.load(fh)
        self._raw.unlink(missing_ok=True)
        if self.python_steps:
            self.cprofile = cProfile.Profile()
            self.cprofile.enable()
        else:
            self.finish(ended_early=False)

    def _stop_python(self) -> None:
        from torchpace.profile.capture import summarize_cprofile

        self._sync()  # queued GPU work finishes inside the pass, so its wait is counted
        self.cprofile.disable()
        self.python = summarize_cprofile(pstats.Stats(self.cprofile).stats, self.python_done)
        self.cprofile = None
        self.finish(ended_early=False)

    def finish(self, ended_early: bool) -> None:
        """As the probe's; each rank of a job but rank 0 first writes its own trace beside rank 0's
        (`rank_trace_path`), which the parent reads for every rank's collectives and the straggler's wait."""
        if self.role == RANK and self.job is not None and not self.job.is_leader and self.document is not None:
            self.document[METADATA_KEY] = self._metadata(self.report.to_dict())
            write_atomic(rank_trace_path(self.spec.profile["trace_path"], self.job.rank),
                         json.dumps(self.document, separators=(",", ":")))
        super().finish(ended_early)

    def on_exit(self) -> None:
        """atexit: the script ended before the profile did; stop the profiler first (a profiler still
        running at interpreter teardown crashes the process)."""
        if self.prof is not None:
            self.prof.__exit__(None, None, None)
            self.prof = None
        super().on_exit()

    def on_stall(self, gap_s: float, compiling_s: float | None = None) -> None:
        """The script made no step for `gap_s` (or compiled for `compiling_s`): the profile ends with a `timeout`
        naming the stall."""
        if not self.claim_end():
            return
        if not self.writes_result:
            self.end()
            return
        needed = self.wait + self.warmup + self.active + self.python_steps
        why = "" if compiling_s is not None else " (it stalled: a deadlock, a hung read, or a step far slower than the ones before)"
        write_result(TrialResult(TIMEOUT, wall_time_s=self.clock() - self.started_s, error=(
            f"{self.stall_text(gap_s, compiling_s)}, at step {self.steps} of the profile's {needed}{why}")),
            self.spec.result_path)
        self.end()

    def build_result(self, ended_early: bool, ranks_disagree: str | None = None) -> TrialResult:
        wall_s = self.clock() - self.started_s
        unreached = unreached_knobs(self.report.config, self.report.reached, self.report.not_applied)
        if unreached and self.steps:  # the config could not run in this script: that is the verdict
            return TrialResult(INVALID, wall_time_s=wall_s, error="; ".join(f"{k}: {why}" for k, why in unreached.items()))
        if self.document is None:
            needed = self.wait + self.warmup + self.active
            return TrialResult(CRASH, wall_time_s=wall_s, error=(
                f"the script ended after {self.steps} step(s), before the profile's {needed} "
                f"({self.wait} untraced, {self.warmup} warm-up, {self.active} traced): let it run longer or lower --steps"))
        self.document[METADATA_KEY] = self._metadata(self.report.to_dict())
        write_atomic(self.spec.profile["trace_path"], json.dumps(self.document, separators=(",", ":")))
        # what the hook changed (which knobs reached the script), as a script bench's result carries it
        script = from_json(ScriptInfo, {"command": list(self.spec.command), "steps_seen": self.steps, **self.report.to_dict()})
        return TrialResult(OK, wall_time_s=wall_s, script=script)

    def _metadata(self, hook: dict[str, Any]) -> dict[str, Any]:
        import torch

        from torchpace.measure.memory import read_peak_memory
        from torchpace.profile.capture import METADATA_SCHEMA_VERSION

        device = self.device if self.device is not None else torch.device("cpu")
        peak_bytes, peak_kind = read_peak_memory(device)
        return {"schema_version": METADATA_SCHEMA_VERSION, "workload": shlex.join(self.spec.command), "device": str(device),
                "config": {}, "batch_size": self.last_step_samples, "steps": self.active, "wait_steps": self.wait,
                "warmup_steps": self.warmup, "peak_memory_bytes": peak_bytes, "peak_memory_kind": peak_kind,
                "memory_capacity_bytes": _capacity_bytes(device), "torch_version": torch.__version__,
                "python_profile": self.python, "script": True, "run": dict(self.run_facts), "hook": hook,
                "other_load_cores": self.other_load_cores,
                **({"rank": self.job.rank, "world_size": self.job.world_size} if self.job is not None else {})}


def rank_trace_path(trace_path: str, rank: int) -> str:
    """Where rank `rank` (> 0) of a profiled job writes its trace: beside rank 0's (`trace.json` ->
    `trace.rank1.json`)."""
    path = Path(trace_path)
    return str(path.with_name(f"{path.stem}.rank{rank}{path.suffix}"))


def _activities() -> list:
    """CPU always; CUDA too when the script has started using a CUDA device."""
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return activities


def _capacity_bytes(device) -> int | None:
    import torch

    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)

    return int(psutil.virtual_memory().total)
