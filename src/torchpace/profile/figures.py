"""The figures behind each profile finding, as typed records (pure, no torch).

Each analyzer (`profile/analyzers.py`) measures one of these and writes it as its finding's `data` (its
JSON: `records.to_json`, units in the names: `*_us`, `*_bytes`, `*_frac`, `*_s`), so `--json` and a profile
read back show the same names as before; every reader (the verdict, the terminal, the report) takes the
record back with `figures_of` and reads its fields, never a name of the dict.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from torchpace.findings import Finding
from torchpace.records import from_json, spec

PHASES = ("input_wait", "h2d", "forward", "backward", "optimizer")


@dataclass(frozen=True)
class PhaseTime:
    """One phase of the step: its time per step and its share of the step.

    Attributes:
        us: microseconds per step.
        frac: share of the profiled steps' wall time.
    """

    us: float = 0.0
    frac: float = 0.0


def _phase(name: str):
    return field(default_factory=PhaseTime, metadata=spec(inline=f"{name}_"))


@dataclass(frozen=True)
class StepSplit:
    """Where each step's wall time goes (`profile.step_split`).

    Attributes:
        steps: profiled steps.
        step_time_us: their mean wall time (`step_time_median_us`: the median).
        labelled: the steps carried torchpace's phase labels (else every phase but `other` is 0).
        input_wait, h2d, forward, backward, optimizer, other: each phase's time (innermost label wins).
    """

    FINDING_ID: ClassVar[str] = "profile.step_split"

    steps: int = 0
    step_time_us: float = 0.0
    step_time_median_us: float = 0.0
    labelled: bool = False
    input_wait: PhaseTime = _phase("input_wait")
    h2d: PhaseTime = _phase("h2d")
    forward: PhaseTime = _phase("forward")
    backward: PhaseTime = _phase("backward")
    optimizer: PhaseTime = _phase("optimizer")
    other: PhaseTime = _phase("other")

    @property
    def phases(self) -> dict[str, PhaseTime]:
        """Every phase by name, in step order, `other` last."""
        return {"input_wait": self.input_wait, "h2d": self.h2d, "forward": self.forward, "backward": self.backward,
                "optimizer": self.optimizer, "other": self.other}

    @property
    def input_frac(self) -> float:
        """Waiting for data: the input wait and the host-to-device copy."""
        return self.input_wait.frac + self.h2d.frac

    @property
    def compute_frac(self) -> float:
        """The model's own work: forward, backward and optimizer."""
        return self.forward.frac + self.backward.frac + self.optimizer.frac


@dataclass(frozen=True)
class HostSync:
    """Host syncs inside the step (`profile.host_sync`).

    Attributes:
        by_name: each sync operation's count.
        on_gpu: the trace ran on CUDA (on CPU the syncs wait for no device).
    """

    FINDING_ID: ClassVar[str] = "profile.host_sync"

    sync_count: int = 0
    sync_per_step: float = 0.0
    sync_us_per_step: float = 0.0
    sync_frac: float = 0.0
    dtoh_copies: int = 0
    by_name: Mapping[str, int] = field(default_factory=dict)
    on_gpu: bool = False


@dataclass(frozen=True)
class GpuIdle:
    """The share of step time with nothing running on the GPU (`profile.gpu_idle`)."""

    FINDING_ID: ClassVar[str] = "profile.gpu_idle"

    gpu_busy_us: float = 0.0
    step_total_us: float = 0.0
    gpu_idle_frac: float = 0.0


@dataclass(frozen=True)
class OpTime:
    """One operator in the top table: its calls, and its self CPU time over the profiled steps and share."""

    name: str
    calls: int = 0
    self_us: float = 0.0
    self_frac: float = 0.0


@dataclass(frozen=True)
class KernelTime:
    """One GPU kernel in the top table: its launches, and its time over the profiled steps and share."""

    name: str
    calls: int = 0
    total_us: float = 0.0
    total_frac: float = 0.0


@dataclass(frozen=True)
class TopOps:
    """The operators with the most self CPU time in the steps (`profile.top_ops`)."""

    FINDING_ID: ClassVar[str] = "profile.top_ops"

    ops: tuple[OpTime, ...] = ()
    step_total_us: float = 0.0


@dataclass(frozen=True)
class TopKernels:
    """The longest GPU kernels in the steps (`profile.top_ops.kernels`)."""

    FINDING_ID: ClassVar[str] = "profile.top_ops.kernels"

    kernels: tuple[KernelTime, ...] = ()
    step_total_us: float = 0.0


@dataclass(frozen=True)
class Memory:
    """Peak memory against capacity (`profile.memory`).

    Attributes:
        peak_kind: what the peak is (`profiler_allocated`, or the kind the capture measured).
        profiled_allocated_peak_bytes: the profiler's own largest sample.
        capacity_bytes: the device's memory (None: unknown), `peak_frac` the peak's share of it.
    """

    FINDING_ID: ClassVar[str] = "profile.memory"

    device: str = "cpu"
    peak_bytes: int = 0
    peak_kind: str = "profiler_allocated"
    profiled_allocated_peak_bytes: int | None = None
    capacity_bytes: int | None = None
    peak_frac: float | None = None


@dataclass(frozen=True)
class Communication:
    """The share of step time in collectives (`profile.communication`).

    Attributes:
        collectives: each collective's count.
    """

    FINDING_ID: ClassVar[str] = "profile.communication"

    comm_us_per_step: float = 0.0
    comm_frac: float = 0.0
    collectives: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class PythonFunction:
    """One Python function of the cProfile pass: where it is, its calls, its self and cumulative seconds."""

    function: str
    file: str = ""
    line: int = 0
    calls: int = 0
    self_s: float = 0.0
    cumulative_s: float = 0.0


@dataclass(frozen=True)
class PythonOverhead:
    """Interpreted Python's share of the steps, from the cProfile pass (`profile.python_overhead`)."""

    FINDING_ID: ClassVar[str] = "profile.python_overhead"

    python_frac: float = 0.0
    steps: int | None = None
    total_s: float = 0.0
    top: tuple[PythonFunction, ...] = ()


@dataclass(frozen=True)
class StepShares:
    """The figures the verdict's rules compare (each None when not measured).

    Attributes:
        input_frac: input wait and host-to-device copy; `compute_frac` forward, backward and optimizer;
            `other_frac` the rest of the labelled step.
        sync_frac, gpu_idle_frac, comm_frac: host syncs, GPU idle, collectives.
        memory_peak_frac: peak memory over capacity.
        python_frac: interpreted Python's share (cProfile pass).
    """

    input_frac: float | None = None
    compute_frac: float | None = None
    other_frac: float | None = None
    sync_frac: float | None = None
    gpu_idle_frac: float | None = None
    comm_frac: float | None = None
    memory_peak_frac: float | None = None
    python_frac: float | None = None


Figures = TypeVar("Figures")


def figures_of(findings: Iterable[Finding], record: type[Figures]) -> Figures | None:
    """The `record` (one of the classes above) of the finding it belongs to (its `FINDING_ID`), None when the
    analyzer said nothing."""
    data: Mapping[str, Any] | None = next((f.data for f in findings if f.id == record.FINDING_ID), None)
    return from_json(record, data) if data is not None else None
