"""Samples: what `torchpace monitor` saw at one instant, as frozen data, and the pure functions over
them (CSV columns, summary statistics).

A `Sample` covers the `interval_s` seconds before its timestamp `t_s`: rates (`*_bytes_per_s`) and
busy shares (`*_pct`, `*_frac`) are averages over that interval, levels (`*_bytes`, `*_c`, `*_w`) are
read at `t_s`. Units live in the field names. `HOST_COLUMNS` and `GPU_COLUMNS` document every CSV
column; the table in docs/guide/monitor.md is written from them.
"""

from __future__ import annotations

import array
import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

Value = float | int | str | None


@dataclass(frozen=True)
class GpuSample:
    """One NVIDIA GPU as NVML reported it. A field NVML does not support on this GPU is None.

    Attributes:
        index: NVML device index (not CUDA_VISIBLE_DEVICES order).
        util_pct: share of the interval a kernel was running (NVML "GPU utilization"), 0-100.
        mem_bw_util_pct: share of the interval device memory was read or written, 0-100.
        mem_used_bytes: device memory in use, by every process (PyTorch's cache included).
        mem_total_bytes: device memory size.
        temp_c: GPU die temperature, degrees Celsius.
        power_w: board power draw, watts.
        sm_clock_mhz: current SM clock, MHz.
        throttle_reasons: why clocks are below maximum (e.g. ``sw_power_cap``, ``hw_thermal``).
    """

    index: int
    util_pct: float | None = None
    mem_bw_util_pct: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    temp_c: float | None = None
    power_w: float | None = None
    sm_clock_mhz: int | None = None
    throttle_reasons: tuple[str, ...] = ()

    @property
    def mem_used_frac(self) -> float | None:
        if not self.mem_total_bytes or self.mem_used_bytes is None:
            return None
        return self.mem_used_bytes / self.mem_total_bytes


@dataclass(frozen=True)
class Sample:
    """The host, CMD's process tree and the GPUs over one sampling interval.

    Attributes:
        t_s: seconds since CMD started, at the end of the interval.
        interval_s: length of the interval this sample averages over.
        cpu_pct: host CPU busy (not idle, not iowait), mean over all cores, 0-100.
        cpu_core_pct: the same per logical core.
        iowait_pct: host CPU time idle while waiting for I/O, 0-100.
        cpu_pressure_frac: share of the interval some runnable task waited for a CPU (Linux PSI);
            None without PSI.
        io_pressure_frac: share of the interval some task was stalled on I/O (Linux PSI).
        runnable_tasks: tasks runnable at `t_s`, host-wide (/proc/loadavg).
        mem_used_bytes, mem_available_bytes, mem_total_bytes: host memory (psutil's meanings).
        swap_used_bytes, swap_total_bytes: swap space.
        disk_read_bytes_per_s, disk_write_bytes_per_s: all physical disks.
        disk_busy_frac: share of the interval the busiest disk had I/O in flight (iostat %util).
        net_recv_bytes_per_s, net_sent_bytes_per_s: network interfaces other than loopback.
        tree_procs: processes in CMD's tree (CMD and every descendant, DataLoader workers included).
        tree_busy_procs: of those, processes that used at least 90% of one core.
        tree_threads: threads in the tree.
        tree_cpu_pct: CPU used by the tree, percent of ONE core (200 = two cores busy), as `top`.
        tree_cpu_wait_pct: time the tree's threads were runnable but waiting for a CPU, percent of one
            core (100 = on average one thread waiting); `tree_cpu_pct + tree_cpu_wait_pct` is the CPU
            the tree wanted. None without per-thread schedstat.
        tree_rss_bytes: sum of the tree's resident set sizes (pages shared between processes count
            once per process, so forked DataLoader workers overstate it).
        tree_read_bytes_per_s, tree_write_bytes_per_s: the tree's storage-layer I/O (/proc/PID/io);
            None when the kernel does not account it.
        gpus: one entry per NVIDIA GPU; empty without NVML.
    """

    t_s: float
    interval_s: float
    cpu_pct: float
    cpu_core_pct: tuple[float, ...]
    iowait_pct: float
    cpu_pressure_frac: float | None
    io_pressure_frac: float | None
    runnable_tasks: int | None
    mem_used_bytes: int
    mem_available_bytes: int
    mem_total_bytes: int
    swap_used_bytes: int
    swap_total_bytes: int
    disk_read_bytes_per_s: float
    disk_write_bytes_per_s: float
    disk_busy_frac: float
    net_recv_bytes_per_s: float
    net_sent_bytes_per_s: float
    tree_procs: int
    tree_busy_procs: int
    tree_threads: int
    tree_cpu_pct: float
    tree_cpu_wait_pct: float | None
    tree_rss_bytes: int
    tree_read_bytes_per_s: float | None
    tree_write_bytes_per_s: float | None
    gpus: tuple[GpuSample, ...] = ()

    @property
    def mem_available_frac(self) -> float:
        return self.mem_available_bytes / self.mem_total_bytes if self.mem_total_bytes else 1.0


@dataclass(frozen=True)
class Column:
    """One CSV column: its name, unit and meaning. `{i}` in a name is the core or GPU index."""

    name: str
    unit: str
    description: str


HOST_COLUMNS: tuple[Column, ...] = (
    Column("t_s", "s", "seconds since CMD started, at the end of the sample's interval"),
    Column("unix_time_s", "s", "wall-clock time of the sample, seconds since the Unix epoch"),
    Column("interval_s", "s", "length of the interval the sample averages over"),
    Column("cpu_pct", "%", "host CPU busy, mean over all logical cores"),
    Column("iowait_pct", "%", "host CPU time idle while waiting for I/O"),
    Column("cpu_pressure_frac", "0-1", "share of time some runnable task waited for a CPU (PSI; empty without PSI)"),
    Column("io_pressure_frac", "0-1", "share of time some task was stalled on I/O (PSI; empty without PSI)"),
    Column("runnable_tasks", "tasks", "tasks runnable host-wide at the sample time"),
    Column("mem_used_bytes", "bytes", "host memory in use"),
    Column("mem_available_bytes", "bytes", "host memory available to new allocations without swapping"),
    Column("mem_total_bytes", "bytes", "host memory size"),
    Column("swap_used_bytes", "bytes", "swap in use"),
    Column("swap_total_bytes", "bytes", "swap size"),
    Column("disk_read_bytes_per_s", "bytes/s", "read from all physical disks"),
    Column("disk_write_bytes_per_s", "bytes/s", "written to all physical disks"),
    Column("disk_busy_frac", "0-1", "share of time the busiest disk had I/O in flight (iostat %util)"),
    Column("net_recv_bytes_per_s", "bytes/s", "received on all non-loopback interfaces"),
    Column("net_sent_bytes_per_s", "bytes/s", "sent on all non-loopback interfaces"),
    Column("tree_procs", "processes", "processes in CMD's tree (CMD, DataLoader workers, every descendant)"),
    Column("tree_busy_procs", "processes", "processes in the tree using at least 90% of one core"),
    Column("tree_threads", "threads", "threads in the tree"),
    Column("tree_cpu_pct", "% of one core", "CPU used by the tree; 200 means two cores busy"),
    Column("tree_cpu_wait_pct", "% of one core",
           "time the tree's threads were runnable but waited for a CPU; 100 means one thread waiting on average"),
    Column("tree_rss_bytes", "bytes", "sum of the tree's resident memory (shared pages counted per process)"),
    Column("tree_read_bytes_per_s", "bytes/s", "read by the tree from storage (page-cache hits excluded)"),
    Column("tree_write_bytes_per_s", "bytes/s", "written by the tree to storage (counted when pages are dirtied)"),
    Column("cpu{i}_pct", "%", "logical core i busy"),
)

GPU_COLUMNS: tuple[Column, ...] = (
    Column("gpu{i}_util_pct", "%", "share of time a kernel ran on GPU i"),
    Column("gpu{i}_mem_bw_util_pct", "%", "share of time GPU i's memory was read or written"),
    Column("gpu{i}_mem_used_bytes", "bytes", "device memory in use (all processes, PyTorch's cache included)"),
    Column("gpu{i}_mem_total_bytes", "bytes", "device memory size"),
    Column("gpu{i}_temp_c", "°C", "GPU temperature"),
    Column("gpu{i}_power_w", "W", "board power draw"),
    Column("gpu{i}_sm_clock_mhz", "MHz", "current SM clock"),
    Column("gpu{i}_throttle_reasons", "names", "why clocks are below maximum, `|`-separated (empty: none)"),
)

_HOST_FIELDS = [c.name for c in HOST_COLUMNS if c.name not in ("t_s", "unix_time_s", "interval_s", "cpu{i}_pct")]
_GPU_FIELDS = [c.name.removeprefix("gpu{i}_") for c in GPU_COLUMNS]


def build_column_names(n_cores: int, n_gpus: int) -> list[str]:
    """The CSV header for a host with `n_cores` logical cores and `n_gpus` NVIDIA GPUs."""
    names = ["t_s", "unix_time_s", "interval_s", *_HOST_FIELDS]
    names += [f"cpu{i}_pct" for i in range(n_cores)]
    names += [f"gpu{g}_{name}" for g in range(n_gpus) for name in _GPU_FIELDS]
    return names


def flatten_sample(sample: Sample, started_unix_s: float = 0.0) -> dict[str, Value]:
    """One row: the sample as {column name: value}, in `build_column_names` order."""
    row: dict[str, Value] = {
        "t_s": sample.t_s,
        "unix_time_s": started_unix_s + sample.t_s,
        "interval_s": sample.interval_s,
    }
    row.update({name: getattr(sample, name) for name in _HOST_FIELDS})
    row.update({f"cpu{i}_pct": pct for i, pct in enumerate(sample.cpu_core_pct)})
    for gpu in sample.gpus:
        for name in _GPU_FIELDS:
            value = getattr(gpu, name)
            row[f"gpu{gpu.index}_{name}"] = "|".join(value) if name == "throttle_reasons" else value
    return row


def describe_column(name: str) -> Column | None:
    """The documentation of a concrete column name (``gpu1_power_w`` -> the ``gpu{i}_power_w`` entry)."""
    for column in (*HOST_COLUMNS, *GPU_COLUMNS):
        prefix, _, suffix = column.name.partition("{i}")
        if name == column.name or (suffix and name.startswith(prefix) and name.endswith(suffix)
                                   and name[len(prefix):-len(suffix)].isdigit()):
            return column
    return None


@dataclass(frozen=True)
class MetricStats:
    """Mean, 95th percentile and maximum of one column over a run."""

    name: str
    unit: str
    mean: float
    p95: float
    max: float
    count: int


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between ranks, as numpy's default."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    rank = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(rank), math.ceil(rank)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


_SUMMARY_SKIP = ("t_s", "unix_time_s", "interval_s")
_MAX_KEPT_VALUES = 65536  # per metric: bounds memory on week-long runs; p95 is then taken over a regular subsample


def is_summary_column(name: str) -> bool:
    """True for columns summarised at exit: all but time, per-core and (constant) size columns."""
    per_core = name.startswith("cpu") and name[3:4].isdigit()
    return name not in _SUMMARY_SKIP and not per_core and not name.endswith("_total_bytes")


@dataclass
class _Series:
    count: int = 0
    total: float = 0.0
    peak: float = -math.inf
    stride: int = 1
    kept: array.array = field(default_factory=lambda: array.array("d"))


class MetricsAccumulator:
    """Running mean / p95 / max per column, in bounded memory.

    Mean and max are exact. For p95 every value is kept until `max_kept` per metric; after that
    every other kept value is dropped and only every `stride`-th new value kept, so the percentile
    comes from an evenly spaced subsample of the whole run.
    """

    def __init__(self, max_kept: int = _MAX_KEPT_VALUES):
        self._max_kept = max_kept
        self._series: dict[str, _Series] = {}

    def add(self, row: dict[str, Value]) -> None:
        """Add one row (`flatten_sample`); empty and non-numeric cells are skipped."""
        for name, value in row.items():
            if not is_summary_column(name) or isinstance(value, (str, bool)) or value is None:
                continue
            series = self._series.setdefault(name, _Series())
            if series.count % series.stride == 0:
                series.kept.append(float(value))
                if len(series.kept) >= self._max_kept:
                    series.kept = series.kept[::2]
                    series.stride *= 2
            series.count += 1
            series.total += value
            series.peak = max(series.peak, value)

    def stats(self) -> list[MetricStats]:
        """Statistics per column, in the order columns were first seen."""
        out = []
        for name, series in self._series.items():
            column = describe_column(name)
            out.append(MetricStats(name=name, unit=column.unit if column else "", mean=series.total / series.count,
                                   p95=percentile(series.kept, 95.0), max=series.peak, count=series.count))
        return out


def summarize_samples(samples: Iterable[Sample]) -> list[MetricStats]:
    """Mean / p95 / max of every numeric column except time, per-core and size columns.

    Columns that were never measured (all empty, e.g. PSI on an old kernel) are left out.
    """
    accumulator = MetricsAccumulator()
    for sample in samples:
        accumulator.add(flatten_sample(sample))
    return accumulator.stats()
