"""Symptom alerts: pure rules over `Sample`s, with hysteresis, that become `Finding`s.

Each `Rule` looks at one sample and returns evidence text when the symptom is present. An alert is
*raised* only after the symptom was present in `raise_after` consecutive samples, and *cleared* only
after it was absent in `clear_after` consecutive samples, so a one-sample blip (a checkpoint write,
a DataLoader worker restarting at an epoch boundary) neither raises nor clears one. Nothing here
reads the clock or the machine: the same samples always give the same alerts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

from torchpace.findings import Finding, Remedy, Severity
from torchpace.monitor.samples import GpuSample, Sample

_RAISE_AFTER_SAMPLES = 5  # ~5 s at 1 Hz: longer than a checkpoint save or an epoch-boundary worker restart
_CLEAR_AFTER_SAMPLES = 5  # as long to clear as to raise, so a flapping symptom stays one alert
_GPU_IN_USE_BYTES = 1 << 30  # a CUDA context alone holds ~0.3-0.5 GiB; below 1 GiB the GPU is not running the job
_GPU_LOW_UTIL_PCT = 50.0  # below half busy, the GPU waits longer than it computes
_TREE_SATURATED_FRAC = 0.85  # the tree uses 85% of its usable cores: no headroom left to feed the GPU faster
_HOST_SATURATED_PCT = 90.0  # the host as a whole is nearly out of CPU, whoever is using it
_IOWAIT_PCT = 20.0  # a fifth of CPU time idle waiting on I/O: storage, not compute, sets the pace
_IO_PRESSURE_FRAC = 0.25  # some task stalled on I/O a quarter of the time (Linux PSI "some")
_DISK_BUSY_FRAC = 0.9  # a disk with I/O in flight 90% of the time is saturated (iostat %util; lenient on NVMe)
_GPU_MEM_FULL_FRAC = 0.95  # within 5% of device memory, the next larger batch or fragmentation OOMs
_HOST_MEM_AVAILABLE_FRAC = 0.10  # under 10% available the kernel evicts page cache and the OOM killer is near
_DEMAND_OVER_USABLE = 1.25  # the tree's threads want 25% more CPU than its usable cores: they queue all the time
_CPU_PRESSURE_FRAC = 0.25  # without schedstat: runnable threads waited for a CPU a quarter of the time (PSI "some")
_RUNNABLE_PER_CORE = 1.5  # without schedstat or PSI: 1.5 runnable tasks per usable core means threads queue
_THERMAL_REASONS = frozenset({"hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"})


@dataclass(frozen=True)
class SymptomContext:
    """What the rules need to know besides the samples: the cores CMD may use."""

    usable_cores: int


@dataclass(frozen=True)
class Rule:
    """One symptom: `check` returns evidence text when a sample shows it, else None."""

    id: str
    severity: Severity
    area: str
    title: str
    remedy: Remedy
    check: Callable[[Sample, SymptomContext], str | None]


# --------------------------------------------------------------------------- checks


def _gpus_in_use(sample: Sample) -> list[GpuSample]:
    return [g for g in sample.gpus if g.util_pct is not None and (g.mem_used_bytes or 0) >= _GPU_IN_USE_BYTES]


def _cpu_saturation(sample: Sample, context: SymptomContext) -> str | None:
    """Why CMD's CPU side counts as saturated, or None."""
    cores = sample.tree_cpu_pct / 100.0
    if cores >= _TREE_SATURATED_FRAC * context.usable_cores:
        return f"CMD's processes use {cores:.1f} of {context.usable_cores} usable cores"
    if sample.cpu_pct >= _HOST_SATURATED_PCT:
        return f"the host CPU is {sample.cpu_pct:.0f}% busy"
    if sample.tree_procs >= 2 and sample.tree_busy_procs >= sample.tree_procs - 1:
        return f"{sample.tree_busy_procs} of CMD's {sample.tree_procs} processes each keep a core busy"
    return None


def check_input_bound(sample: Sample, context: SymptomContext) -> str | None:
    """GPU mostly idle while the CPU side (DataLoader workers, decode) is saturated."""
    gpus = _gpus_in_use(sample)
    if not gpus:
        return None
    util = sum(g.util_pct or 0.0 for g in gpus) / len(gpus)
    cpu = _cpu_saturation(sample, context) if util < _GPU_LOW_UTIL_PCT else None
    if cpu is None:
        return None
    return f"GPU utilisation {util:.0f}% (< {_GPU_LOW_UTIL_PCT:.0f}%) while {cpu}"


def check_storage_bound(sample: Sample, context: SymptomContext) -> str | None:
    """Tasks wait on the disk (high iowait, I/O pressure, or a saturated disk) while CMD's tree does storage
    I/O. These signs are the host's: on a shared host another job's disk traffic shows in them, and a tree
    that read and wrote nothing from storage in the interval did not wait on the disk. Where the kernel
    does not account the tree's I/O, the host's signs alone decide."""
    tree_io = (sample.tree_read_bytes_per_s, sample.tree_write_bytes_per_s)
    if None not in tree_io and not any(tree_io):
        return None
    signs = []
    if sample.iowait_pct >= _IOWAIT_PCT:
        signs.append(f"iowait {sample.iowait_pct:.0f}% (>= {_IOWAIT_PCT:.0f}%)")
    if sample.io_pressure_frac is not None and sample.io_pressure_frac >= _IO_PRESSURE_FRAC:
        signs.append(f"tasks stalled on I/O {sample.io_pressure_frac:.0%} of the time (>= {_IO_PRESSURE_FRAC:.0%})")
    if sample.disk_busy_frac >= _DISK_BUSY_FRAC:
        signs.append(f"busiest disk busy {sample.disk_busy_frac:.0%} of the time (>= {_DISK_BUSY_FRAC:.0%})")
    if not signs:
        return None
    if None not in tree_io:
        signs.append(f"CMD's processes read {tree_io[0] / 1e6:.1f} MB/s and write {tree_io[1] / 1e6:.1f} MB/s from storage")
    return "; ".join(signs)


def check_gpu_memory_full(sample: Sample, context: SymptomContext) -> str | None:
    """A GPU's memory is nearly all in use."""
    full = [g for g in sample.gpus if (g.mem_used_frac or 0.0) >= _GPU_MEM_FULL_FRAC]
    return "; ".join(
        f"GPU {g.index} memory {_gib(g.mem_used_bytes)} of {_gib(g.mem_total_bytes)} GiB used "
        f"({g.mem_used_frac:.0%} >= {_GPU_MEM_FULL_FRAC:.0%})" for g in full
    ) or None


def check_host_memory_full(sample: Sample, context: SymptomContext) -> str | None:
    """Little host memory is left available."""
    if sample.mem_available_frac > _HOST_MEM_AVAILABLE_FRAC:
        return None
    return (f"host memory available {_gib(sample.mem_available_bytes)} of {_gib(sample.mem_total_bytes)} GiB "
            f"({sample.mem_available_frac:.0%} <= {_HOST_MEM_AVAILABLE_FRAC:.0%}); "
            f"swap used {_gib(sample.swap_used_bytes)} GiB")


def check_gpu_thermal_throttle(sample: Sample, context: SymptomContext) -> str | None:
    """A GPU holds its clocks down for temperature or a hardware slowdown signal."""
    hot = [(g, sorted(_THERMAL_REASONS.intersection(g.throttle_reasons))) for g in sample.gpus]
    return "; ".join(
        f"GPU {g.index} clocks held down by {', '.join(reasons)} at {_num(g.temp_c)} °C, SM {_num(g.sm_clock_mhz)} MHz"
        for g, reasons in hot if reasons
    ) or None


def check_gpu_power_cap(sample: Sample, context: SymptomContext) -> str | None:
    """A GPU runs at its power limit."""
    return "; ".join(
        f"GPU {g.index} at its power limit (sw_power_cap) drawing {_num(g.power_w)} W, SM {_num(g.sm_clock_mhz)} MHz"
        for g in sample.gpus if "sw_power_cap" in g.throttle_reasons
    ) or None


def check_cpu_oversubscribed(sample: Sample, context: SymptomContext) -> str | None:
    """CMD's threads want more cores than it may use.

    Wanted CPU is what the tree's threads ran plus what they spent runnable but waiting for a CPU
    (per-thread schedstat). Waiting because other programs hog the CPUs adds to both, but stays
    below the usable cores unless the tree itself runs more busy threads than there are cores.
    """
    cores = sample.tree_cpu_pct / 100.0
    if sample.tree_cpu_wait_pct is not None:
        waiting = sample.tree_cpu_wait_pct / 100.0
        if cores + waiting < _DEMAND_OVER_USABLE * context.usable_cores:
            return None
        return (f"CMD's threads wanted {cores + waiting:.1f} cores ({cores:.1f} running, {waiting:.1f} waiting "
                f"for a CPU) with {context.usable_cores} usable")
    return _check_host_cpu_queue(sample, context)


def _check_host_cpu_queue(sample: Sample, context: SymptomContext) -> str | None:
    """Without per-thread schedstat: the tree fills its cores and the host's run queue is long."""
    cores = sample.tree_cpu_pct / 100.0
    if cores < _TREE_SATURATED_FRAC * context.usable_cores:
        return None
    used = f"CMD's processes use {cores:.1f} of {context.usable_cores} usable cores"
    if sample.cpu_pressure_frac is not None:
        if sample.cpu_pressure_frac >= _CPU_PRESSURE_FRAC:
            return f"{used} and runnable threads waited for a CPU {sample.cpu_pressure_frac:.0%} of the time"
        return None
    if sample.runnable_tasks is not None and sample.runnable_tasks >= _RUNNABLE_PER_CORE * context.usable_cores:
        return f"{used} and {sample.runnable_tasks} tasks are runnable at once"
    return None


def _gib(value: int | None) -> str:
    return "?" if value is None else f"{value / 2**30:.1f}"


def _num(value: float | int | None) -> str:
    return "?" if value is None else f"{value:.0f}"


RULES: tuple[Rule, ...] = (
    Rule("monitor.input_bound", Severity.WARN, "input", "Input-bound: the GPU waits for data the CPU prepares",
         Remedy("Feed the GPU faster: raise the DataLoader's num_workers (up to the usable cores), set "
                "pin_memory=True and persistent_workers=True, raise prefetch_factor, and make decoding cheaper "
                "(store images pre-resized, decode on the GPU). If only the main process is busy, the step is "
                "host-bound instead: `torchpace profile` tells which."),
         check_input_bound),
    Rule("monitor.storage_bound", Severity.WARN, "io", "Storage-bound: tasks wait on the disk",
         Remedy("Read data faster: copy the dataset to local NVMe or RAM (/dev/shm), store it as fewer large "
                "shards (tar / WebDataset) rather than many small files, cache decoded samples, and raise "
                "prefetch_factor so reads overlap compute."),
         check_storage_bound),
    Rule("monitor.gpu_memory_full", Severity.WARN, "gpu", "GPU memory nearly full",
         Remedy("Lower the batch size, train in bf16/fp16 (AMP), use activation checkpointing, or set "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation. NVML counts PyTorch's "
                "cached blocks as used; torch.cuda.memory_allocated() shows the live share."),
         check_gpu_memory_full),
    Rule("monitor.host_memory_full", Severity.WARN, "memory", "Host memory nearly full",
         Remedy("Use fewer DataLoader workers or a smaller prefetch_factor, keep datasets as numpy arrays or "
                "tensors rather than lists of Python objects (forked workers copy those on read), and "
                "memory-map large files instead of loading them."),
         check_host_memory_full),
    Rule("monitor.gpu_thermal_throttle", Severity.WARN, "gpu", "GPU throttling: clocks held down for temperature",
         Remedy("Check the cooling (fans, airflow, inlet temperature) and the reasons NVML gives.",
                "nvidia-smi -q -d TEMPERATURE,PERFORMANCE"),
         check_gpu_thermal_throttle),
    Rule("monitor.gpu_power_cap", Severity.INFO, "gpu", "GPU at its power limit",
         Remedy("Usual under full load. If the enforced power limit is below the board's default, raise it "
                "(nvidia-smi -pl) or ask the administrator.", "nvidia-smi -q -d POWER"),
         check_gpu_power_cap),
    Rule("monitor.cpu_oversubscribed", Severity.WARN, "cpu", "CPU oversubscribed: more busy threads than usable cores",
         Remedy("Size the thread pools to the cores: processes x threads per process <= usable cores, e.g. "
                "OMP_NUM_THREADS=1 for many-process jobs, torch.set_num_threads() in the trainer, fewer "
                "DataLoader workers. `torchpace launch` sets these for you."),
         check_cpu_oversubscribed),
)


# --------------------------------------------------------------------------- hysteresis


@dataclass(frozen=True)
class RuleState:
    """Where one rule stands: its current streaks and, while raised, since when."""

    on_streak: int = 0
    off_streak: int = 0
    onset_s: float | None = None
    raised_at_s: float | None = None
    evidence: str = ""

    @property
    def active(self) -> bool:
        return self.raised_at_s is not None


def advance_rule(state: RuleState, evidence: str | None, t_s: float,
                 raise_after: int, clear_after: int) -> tuple[RuleState, str | None]:
    """One step of the hysteresis: the new state and ``"raise"``, ``"clear"`` or None.

    Args:
        state: the rule's state before this sample.
        evidence: the rule's evidence for this sample, None when the symptom is absent.
        t_s: the sample's time.
        raise_after: consecutive symptomatic samples that raise the alert.
        clear_after: consecutive clean samples that clear a raised alert.
    """
    if evidence is not None:
        onset = state.onset_s if (state.on_streak or state.active) else t_s
        on = state.on_streak + 1
        if not state.active and on >= raise_after:
            return RuleState(on, 0, onset, t_s, evidence), "raise"
        kept = state.evidence if state.active else evidence
        return RuleState(on, 0, onset, state.raised_at_s, kept), None
    off = state.off_streak + 1
    if state.active and off >= clear_after:
        return RuleState(0, off), "clear"
    return RuleState(0, off, state.onset_s if state.active else None, state.raised_at_s, state.evidence), None


@dataclass(frozen=True)
class AlertEvent:
    """An alert raised or cleared at sample time `t_s`."""

    kind: str  # "raised" or "cleared"
    t_s: float
    finding: Finding


def build_alert(rule: Rule, state: RuleState, samples: int, cleared_at_s: float | None = None) -> Finding:
    """The `Finding` for a raised alert; `data` says when (seconds since CMD started)."""
    return Finding(
        id=rule.id,
        severity=rule.severity,
        title=rule.title,
        evidence=state.evidence,
        remedy=rule.remedy,
        area=rule.area,
        data={"onset_s": state.onset_s, "raised_at_s": state.raised_at_s,
              "cleared_at_s": cleared_at_s, "raise_after_samples": samples},
    )


@dataclass
class SymptomTracker:
    """Feeds samples one at a time through every rule; keeps every alert raised so far.

    No I/O and no clock: `check_symptoms` is this tracker folded over a list of samples.
    """

    context: SymptomContext
    rules: tuple[Rule, ...] = RULES
    raise_after: int = _RAISE_AFTER_SAMPLES
    clear_after: int = _CLEAR_AFTER_SAMPLES
    _states: dict[str, RuleState] = field(default_factory=dict)
    _history: list[Finding] = field(default_factory=list)

    def update(self, sample: Sample) -> list[AlertEvent]:
        """Apply one sample; the alerts it raised or cleared."""
        events = []
        for rule in self.rules:
            before = self._states.get(rule.id, RuleState())
            after, change = advance_rule(before, rule.check(sample, self.context), sample.t_s,
                                         self.raise_after, self.clear_after)
            self._states[rule.id] = after
            if change == "raise":
                finding = build_alert(rule, after, self.raise_after)
                self._history.append(finding)
                events.append(AlertEvent("raised", sample.t_s, finding))
            elif change == "clear":
                finding = self._close(rule, before, sample.t_s)
                events.append(AlertEvent("cleared", sample.t_s, finding))
        return events

    def alerts(self) -> list[Finding]:
        """Every alert raised so far, in order; `data["cleared_at_s"]` is None while still active."""
        return list(self._history)

    def active(self) -> list[Finding]:
        """The alerts raised and not cleared."""
        return [f for f in self._history if f.data["cleared_at_s"] is None]

    def _close(self, rule: Rule, state: RuleState, t_s: float) -> Finding:
        closed = build_alert(rule, state, self.raise_after, cleared_at_s=t_s)
        for i in range(len(self._history) - 1, -1, -1):
            if self._history[i].id == rule.id and self._history[i].data["cleared_at_s"] is None:
                self._history[i] = closed
                break
        return closed


def check_symptoms(samples: Iterable[Sample], context: SymptomContext,
                   raise_after: int = _RAISE_AFTER_SAMPLES, clear_after: int = _CLEAR_AFTER_SAMPLES) -> list[Finding]:
    """Every alert a run of samples raises, each with when it was raised and cleared."""
    tracker = SymptomTracker(context, raise_after=raise_after, clear_after=clear_after)
    for sample in samples:
        tracker.update(sample)
    return tracker.alerts()
