"""CPU time that processes outside torchpace's own tree take while it measures (psutil).

A measurement on a busy host is a measurement of that contention: a config that uses fewer cores can
look faster only because other jobs took the rest. So every bench (and every tune trial, whose bench
runs in the trial process) reads the CPU time of every other process before and after it measures:

- `probe_cpu_times(own_root_pid)` (effect): user + system CPU seconds of every process outside the
  tree rooted at `own_root_pid` (that process and its descendants: trial processes, DataLoader
  workers), and outside the kernel's own threads;
- `other_load_cores(before, after)` (pure): the CPU seconds they gained over the wall seconds between
  the two snapshots, i.e. how many cores they kept busy on average. A process that started in between
  counts with all its CPU time; one that ended in between is not seen (a lower bound);
- `is_material(cores, usable_cores)`: worth telling the user (`MATERIAL_*` below).
- `host_change(score, others)`: a measurement `HOST_CHANGE` times off its config's others: the host changed.
"""

from __future__ import annotations

import os
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Mapping

import psutil

MATERIAL_CORES = 0.5  # half a core: what a neighbour busy half the time takes; below it the noise band covers it
MATERIAL_FRAC = 0.1  # on a large host, a tenth of its usable cores
_KTHREADD_PID = 2  # the kernel's threads are its children


@dataclass(frozen=True)
class CpuSnapshot:
    """CPU seconds of other processes at one moment: pid -> (create time, user + system seconds)."""

    at_s: float
    cpu_s: Mapping[int, tuple[float, float]] = field(default_factory=dict)


def probe_cpu_times(own_root_pid: int | None = None, clock=time.monotonic) -> CpuSnapshot:
    """The CPU seconds of every process outside `own_root_pid`'s tree (default: this process)."""
    root = own_root_pid if own_root_pid is not None else os.getpid()
    try:
        own = {root, *(p.pid for p in psutil.Process(root).children(recursive=True))}
    except psutil.Error:
        own = {root}
    cpu: dict[int, tuple[float, float]] = {}
    for proc in psutil.process_iter(["pid", "ppid", "create_time", "cpu_times"]):
        info = proc.info
        if info["pid"] in own or _KTHREADD_PID in (info["pid"], info["ppid"]) or info["cpu_times"] is None:
            continue
        cpu[info["pid"]] = (info["create_time"], info["cpu_times"].user + info["cpu_times"].system)
    return CpuSnapshot(clock(), cpu)


def other_load_cores(before: CpuSnapshot, after: CpuSnapshot) -> float | None:
    """Cores other processes kept busy between the snapshots, on average (None for no time between)."""
    wall_s = after.at_s - before.at_s
    if wall_s <= 0:
        return None
    gained = 0.0
    for pid, (created, cpu_s) in after.cpu_s.items():
        earlier = before.cpu_s.get(pid)
        same_process = earlier is not None and earlier[0] == created  # else a new process (or a reused pid)
        gained += max(0.0, cpu_s - earlier[1]) if same_process else cpu_s
    return gained / wall_s


HOST_CHANGE = 1.2  # a measurement this many times off its config's other measurements, either way: the host changed


def host_change(score: float | None, others: list[float]) -> float | None:
    """`score` over the median of `others` (the same config's other measurements, higher is better) when that is
    `HOST_CHANGE` times as high or as low: the host changed under the measurement (None otherwise, or without
    others). Other processes' load is not all a host can change: on a virtual machine the physical cores' other
    tenants, which no process of this machine shows, can slow a step with two intra-op threads by half for tens
    of seconds while one thread keeps its speed."""
    others = [o for o in others if o]
    if not score or not others:
        return None
    change = score / statistics.median(others)
    return None if 1 / HOST_CHANGE < change < HOST_CHANGE else change


def is_material(cores: float | None, usable_cores: int | float) -> bool:
    """True when other processes took enough CPU to say so beside a figure."""
    return cores is not None and cores >= max(MATERIAL_CORES, MATERIAL_FRAC * usable_cores)


def contention_note(cores: float | None, usable_cores: int | float, verb: str = "measured") -> str | None:
    """The sentence shown beside a figure when the load was material, else None."""
    if not is_material(cores, usable_cores):
        return None
    return (f"{verb} while other processes used {cores:.1f} of {usable_cores} cores: "
            "the result reflects that contention")


def decision_note(cores: float | None, usable_cores: int | float, core_knobs: list[str] = ()) -> str | None:
    """The sentence shown next to a comparison's decision when other processes' load was material
    (None otherwise): the gain is real for this host at that time, and `core_knobs` (knobs among
    those compared whose gain depends on free cores: threads, workers, ranks) may not hold on a quiet host."""
    if not is_material(cores, usable_cores):
        return None
    said = f"measured while other processes used {cores:.1f} of {usable_cores:g} cores"
    if core_knobs:
        return f"{said}; gains of {', '.join(core_knobs)} may not hold on a quiet host"
    return f"{said}: the ratio reflects that contention"


@dataclass
class OtherLoad:
    """The reading of `measure_other_load`: `cores` is set when the block ends (None when unreadable)."""

    cores: float | None = None


@contextmanager
def measure_other_load(own_root_pid: int | None = None) -> Iterator[OtherLoad]:
    """Measure the other processes' CPU use over the `with` block."""
    load = OtherLoad()
    before = probe_cpu_times(own_root_pid)
    yield load
    load.cores = other_load_cores(before, probe_cpu_times(own_root_pid))
