"""Samplers: read the host (psutil, /proc) and the GPUs (NVML) into frozen readings.

Method. Every counter the kernel keeps is cumulative (CPU seconds, bytes read, PSI stall
microseconds), so a sampler takes a `HostReading` of the raw counters each interval and
`build_sample` turns two consecutive readings into rates: the change in a counter divided by the
time between the readings. One reading costs a few /proc reads per process in CMD's tree, which
keeps sampling at 1 Hz far below 1% of one core.

CMD's process tree is found by walking ``/proc/PID/task/TID/children`` from CMD down (a few reads per
process) rather than scanning every process on the host; kernels without that file fall back to
psutil's scan. NVML is optional: without the library or a GPU, `GpuSampler.open` returns None and an
info `Finding`, and the GPU columns are absent.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import psutil

from torchpace.findings import Finding, Remedy, Severity
from torchpace.host import read_text
from torchpace.monitor.samples import GpuSample, Sample

Clock = Callable[[], float]

_BUSY_PROC_FRAC = 0.9  # a process using 90% of a core is pegged: it cannot go faster on one core
_VIRTUAL_DISK_PREFIXES = ("loop", "ram", "zram", "dm-", "md", "sr")  # stacked or RAM-backed: counting them double-counts I/O
_VIRTUAL_NIC_PREFIXES = ("lo", "ifb")  # loopback and traffic mirrors carry no off-host traffic


@dataclass(frozen=True)
class CoreTimes:
    """Cumulative seconds of one logical core: all time, idle time, idle-waiting-for-I/O time."""

    total_s: float
    idle_s: float
    iowait_s: float


@dataclass(frozen=True)
class ProcReading:
    """Cumulative counters of one process in CMD's tree."""

    pid: int
    create_time: float
    cpu_s: float
    rss_bytes: int
    threads: int
    read_bytes: int | None
    write_bytes: int | None
    run_wait_s: float | None = None


@dataclass(frozen=True)
class HostReading:
    """Raw cumulative host counters at clock time `t_s`; two of them make a `Sample`."""

    t_s: float
    cores: tuple[CoreTimes, ...]
    mem_used_bytes: int
    mem_available_bytes: int
    mem_total_bytes: int
    swap_used_bytes: int
    swap_total_bytes: int
    disk_read_bytes: int
    disk_write_bytes: int
    disk_busy_ms: tuple[int, ...]
    net_recv_bytes: int
    net_sent_bytes: int
    cpu_pressure_us: int | None
    io_pressure_us: int | None
    runnable_tasks: int | None
    procs: tuple[ProcReading, ...]


# --------------------------------------------------------------------------- pure helpers


def parse_psi_some_total_us(text: str | None) -> int | None:
    """The cumulative ``some ... total=`` stall microseconds from a /proc/pressure/* file."""
    for line in (text or "").splitlines():
        if line.startswith("some "):
            for field in line.split():
                if field.startswith("total="):
                    return int(field[6:])
    return None


def parse_runnable_tasks(loadavg: str | None) -> int | None:
    """Runnable tasks from /proc/loadavg (the ``3`` in ``0.68 0.32 0.14 3/90 4228``)."""
    fields = (loadavg or "").split()
    if len(fields) >= 4 and "/" in fields[3]:
        return int(fields[3].split("/")[0])
    return None


def is_physical_disk(name: str) -> bool:
    """True for whole disks worth counting (``vda``, ``nvme0n1``), False for loop, RAM, device-mapper."""
    return not name.startswith(_VIRTUAL_DISK_PREFIXES)


def pick_interfaces(names: list[str], physical: set[str]) -> list[str]:
    """Interfaces to count: the physical NICs when there are any, else all but loopback and mirrors.

    Containers see only virtual interfaces (veth), so "physical only" would count nothing there;
    on a host with NICs, counting bridges and veths as well would count container traffic twice.
    """
    chosen = [n for n in names if n in physical]
    return chosen or [n for n in names if not n.startswith(_VIRTUAL_NIC_PREFIXES)]


def _rate(before: float, after: float, dt_s: float) -> float:
    """Per-second change of a cumulative counter; a counter that went back (reset) reads as 0."""
    return max(0.0, after - before) / dt_s


def _busy_s(before: CoreTimes, after: CoreTimes) -> float:
    """Seconds a core was busy: neither idle nor idle-waiting-for-I/O."""
    total = after.total_s - before.total_s
    idle = (after.idle_s - before.idle_s) + (after.iowait_s - before.iowait_s)
    return max(0.0, total - idle)


def _busy_pct(before: CoreTimes, after: CoreTimes) -> float:
    total = after.total_s - before.total_s
    return 100.0 * _busy_s(before, after) / total if total > 0 else 0.0


def _grown(before: int | None, after: int) -> int:
    """How much a counter grew; a process first seen this interval counts from zero."""
    return max(0, after - (before or 0))


@dataclass(frozen=True)
class TreeUsage:
    """CMD's process tree over one interval."""

    procs: int
    busy_procs: int
    threads: int
    cpu_pct: float
    cpu_wait_pct: float | None
    rss_bytes: int
    read_bytes_per_s: float | None
    write_bytes_per_s: float | None


def build_tree_usage(before: tuple[ProcReading, ...], after: tuple[ProcReading, ...], dt_s: float) -> TreeUsage:
    """CPU, memory and I/O of the tree between two readings.

    A process absent from `before` started during the interval, so all its counters count. A process
    that started and ended between two readings is not seen (its CPU time is lost).
    """
    old = {(p.pid, p.create_time): p for p in before}
    cpu_s = 0.0
    wait_s: float | None = None
    busy = 0
    io: dict[str, float] = {"read": 0.0, "write": 0.0}
    io_known = not after  # a tree with no process left (CMD just ended) did no I/O: 0, not unknown
    for proc in after:
        prev = old.get((proc.pid, proc.create_time))
        used = max(0.0, proc.cpu_s - (prev.cpu_s if prev else 0.0))
        cpu_s += used
        busy += used / dt_s >= _BUSY_PROC_FRAC
        if proc.run_wait_s is not None:
            waited_before = prev.run_wait_s if prev is not None and prev.run_wait_s is not None else 0.0
            wait_s = (wait_s or 0.0) + max(0.0, proc.run_wait_s - waited_before)
        if proc.read_bytes is not None and proc.write_bytes is not None:
            io_known = True
            io["read"] += _grown(prev.read_bytes if prev else None, proc.read_bytes)
            io["write"] += _grown(prev.write_bytes if prev else None, proc.write_bytes)
    return TreeUsage(
        procs=len(after),
        busy_procs=busy,
        threads=sum(p.threads for p in after),
        cpu_pct=100.0 * cpu_s / dt_s,
        cpu_wait_pct=100.0 * wait_s / dt_s if wait_s is not None else None,
        rss_bytes=sum(p.rss_bytes for p in after),
        read_bytes_per_s=io["read"] / dt_s if io_known else None,
        write_bytes_per_s=io["write"] / dt_s if io_known else None,
    )


def _pressure_frac(before: int | None, after: int | None, dt_s: float) -> float | None:
    if before is None or after is None:
        return None
    return min(1.0, _rate(before, after, dt_s) / 1e6)


def build_sample(before: HostReading, after: HostReading, t0_s: float, gpus: tuple[GpuSample, ...] = ()) -> Sample:
    """The `Sample` for the interval between two readings; `t0_s` is the clock time CMD started."""
    dt = max(after.t_s - before.t_s, 1e-9)
    pairs = list(zip(before.cores, after.cores))
    total = sum(b.total_s - a.total_s for a, b in pairs)
    busy = sum(_busy_s(a, b) for a, b in pairs)
    iowait = sum(max(0.0, b.iowait_s - a.iowait_s) for a, b in pairs)
    tree = build_tree_usage(before.procs, after.procs, dt)
    busiest_disk_ms = max((_rate(a, b, 1.0) for a, b in zip(before.disk_busy_ms, after.disk_busy_ms)), default=0.0)
    return Sample(
        t_s=after.t_s - t0_s,
        interval_s=dt,
        cpu_pct=100.0 * busy / total if total > 0 else 0.0,
        cpu_core_pct=tuple(_busy_pct(a, b) for a, b in pairs),
        iowait_pct=100.0 * iowait / total if total > 0 else 0.0,
        cpu_pressure_frac=_pressure_frac(before.cpu_pressure_us, after.cpu_pressure_us, dt),
        io_pressure_frac=_pressure_frac(before.io_pressure_us, after.io_pressure_us, dt),
        runnable_tasks=after.runnable_tasks,
        mem_used_bytes=after.mem_used_bytes,
        mem_available_bytes=after.mem_available_bytes,
        mem_total_bytes=after.mem_total_bytes,
        swap_used_bytes=after.swap_used_bytes,
        swap_total_bytes=after.swap_total_bytes,
        disk_read_bytes_per_s=_rate(before.disk_read_bytes, after.disk_read_bytes, dt),
        disk_write_bytes_per_s=_rate(before.disk_write_bytes, after.disk_write_bytes, dt),
        disk_busy_frac=min(1.0, busiest_disk_ms / 1000.0 / dt),
        net_recv_bytes_per_s=_rate(before.net_recv_bytes, after.net_recv_bytes, dt),
        net_sent_bytes_per_s=_rate(before.net_sent_bytes, after.net_sent_bytes, dt),
        tree_procs=tree.procs,
        tree_busy_procs=tree.busy_procs,
        tree_threads=tree.threads,
        tree_cpu_pct=tree.cpu_pct,
        tree_cpu_wait_pct=tree.cpu_wait_pct,
        tree_rss_bytes=tree.rss_bytes,
        tree_read_bytes_per_s=tree.read_bytes_per_s,
        tree_write_bytes_per_s=tree.write_bytes_per_s,
        gpus=gpus,
    )


# --------------------------------------------------------------------------- process tree


def has_children_files(proc_root: Path = Path("/proc")) -> bool:
    """True when the kernel exposes /proc/PID/task/TID/children (CONFIG_PROC_CHILDREN)."""
    return (proc_root / str(os.getpid()) / "task" / str(threading.get_native_id()) / "children").exists()


def list_tids(proc_root: Path, pid: int) -> list[str]:
    """Thread ids of `pid` (empty once it exited)."""
    try:
        return os.listdir(proc_root / str(pid) / "task")
    except OSError:
        return []


def walk_tree(root_pid: int, proc_root: Path = Path("/proc")) -> list[tuple[int, list[str]]]:
    """`root_pid` and all its descendants with their thread ids, from /proc/PID/task/TID/children.

    A thread that forks is the child's parent, so every thread's children file is read; no
    host-wide scan of /proc is needed.
    """
    tree: list[tuple[int, list[str]]] = []
    frontier = [root_pid]
    while frontier:
        pid = frontier.pop()
        tids = list_tids(proc_root, pid)
        tree.append((pid, tids))
        for tid in tids:
            frontier.extend(int(child) for child in (read_text(proc_root, f"{pid}/task/{tid}/children") or "").split())
    return tree


def parse_schedstat(text: str | None) -> float | None:
    """Seconds a thread waited on a run queue, from /proc/PID/task/TID/schedstat (``run_ns wait_ns slices``)."""
    fields = (text or "").split()
    return int(fields[1]) / 1e9 if len(fields) >= 2 else None


def read_run_wait_s(proc_root: Path, pid: int, tids: list[str]) -> float | None:
    """Seconds the live threads of `pid` spent runnable but waiting for a CPU, summed; None if unreadable."""
    waits = [parse_schedstat(read_text(proc_root, f"{pid}/task/{tid}/schedstat")) for tid in tids]
    known = [w for w in waits if w is not None]
    return sum(known) if known else None


# --------------------------------------------------------------------------- host sampler


class HostSampler:
    """Reads host counters and CMD's process tree with psutil and /proc.

    Args:
        root_pid: CMD's process id; its tree is every descendant.
        clock: monotonic seconds; injectable so tests control time stamps.
        proc_root: where /proc is (tests pass a fixture tree for the tree walk and PSI files).
        sys_root: where /sys is (for telling physical disks and NICs from virtual ones).
    """

    def __init__(self, root_pid: int, clock: Clock = time.monotonic,
                 proc_root: Path = Path("/proc"), sys_root: Path = Path("/sys")):
        self.root_pid = root_pid
        self._clock = clock
        self._proc_root = proc_root
        self._walk_children = has_children_files(proc_root)
        self._disks = [n for n in _list_dir(sys_root / "block") if is_physical_disk(n)]
        nics = list(psutil.net_io_counters(pernic=True))
        physical = {n for n in nics if (sys_root / "class/net" / n / "device").exists()}
        self._nics = pick_interfaces(nics, physical)
        self._procs: dict[int, psutil.Process] = {}
        self._lock = threading.Lock()

    def read(self) -> HostReading:
        """One reading of every counter, stamped with the clock."""
        t_s = self._clock()
        memory, swap = psutil.virtual_memory(), psutil.swap_memory()
        disk_read, disk_write, disk_busy = self._read_disks()
        net_recv, net_sent = self._read_net()
        return HostReading(
            t_s=t_s,
            cores=tuple(_core_times(c) for c in psutil.cpu_times(percpu=True)),
            mem_used_bytes=memory.used,
            mem_available_bytes=memory.available,
            mem_total_bytes=memory.total,
            swap_used_bytes=swap.used,
            swap_total_bytes=swap.total,
            disk_read_bytes=disk_read,
            disk_write_bytes=disk_write,
            disk_busy_ms=disk_busy,
            net_recv_bytes=net_recv,
            net_sent_bytes=net_sent,
            cpu_pressure_us=parse_psi_some_total_us(read_text(self._proc_root, "pressure/cpu")),
            io_pressure_us=parse_psi_some_total_us(read_text(self._proc_root, "pressure/io")),
            runnable_tasks=parse_runnable_tasks(read_text(self._proc_root, "loadavg")),
            procs=self._read_tree(),
        )

    def known_processes(self) -> list[psutil.Process]:
        """Every process seen in CMD's tree so far (still running or not), for clean-up."""
        with self._lock:
            return list(self._procs.values())

    def _read_disks(self) -> tuple[int, int, tuple[int, ...]]:
        counters = psutil.disk_io_counters(perdisk=True) or {}
        disks = [counters[name] for name in self._disks if name in counters]
        busy = tuple(getattr(d, "busy_time", 0) for d in disks)
        return sum(d.read_bytes for d in disks), sum(d.write_bytes for d in disks), busy

    def _read_net(self) -> tuple[int, int]:
        counters = psutil.net_io_counters(pernic=True)
        nics = [counters[name] for name in self._nics if name in counters]
        return sum(n.bytes_recv for n in nics), sum(n.bytes_sent for n in nics)

    def _tree(self) -> list[tuple[int, list[str]]]:
        if self._walk_children:
            return walk_tree(self.root_pid, self._proc_root)
        try:
            root = psutil.Process(self.root_pid)
            pids = [self.root_pid, *(child.pid for child in root.children(recursive=True))]
        except psutil.NoSuchProcess:
            return []
        return [(pid, list_tids(self._proc_root, pid)) for pid in pids]

    def _read_tree(self) -> tuple[ProcReading, ...]:
        readings = []
        for pid, tids in self._tree():
            proc = self._process(pid)
            reading = _read_process(proc) if proc is not None else None
            if reading is not None:
                wait_s = read_run_wait_s(self._proc_root, pid, tids)
                readings.append(dataclasses.replace(reading, run_wait_s=wait_s))
        return tuple(readings)

    def _process(self, pid: int) -> psutil.Process | None:
        proc = self._procs.get(pid)
        if proc is None:
            try:
                proc = psutil.Process(pid)
            except psutil.NoSuchProcess:
                return None
            with self._lock:
                self._procs[pid] = proc
        return proc


def _list_dir(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _core_times(times: Any) -> CoreTimes:
    """psutil's per-core times as (total, idle, iowait); guest time is already inside user time."""
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    return CoreTimes(total_s=total, idle_s=times.idle, iowait_s=getattr(times, "iowait", 0.0))


def _read_process(proc: psutil.Process) -> ProcReading | None:
    """One process's counters, or None when it exited (or became a zombie) meanwhile."""
    try:
        with proc.oneshot():
            times = proc.cpu_times()
            reading = ProcReading(
                pid=proc.pid,
                create_time=proc.create_time(),
                cpu_s=times.user + times.system,
                rss_bytes=proc.memory_info().rss,
                threads=proc.num_threads(),
                read_bytes=None,
                write_bytes=None,
            )
            io = _read_io(proc)
    except psutil.NoSuchProcess:
        return None
    if io is None:
        return reading
    return dataclasses.replace(reading, read_bytes=io.read_bytes, write_bytes=io.write_bytes)


def _read_io(proc: psutil.Process) -> Any:
    """/proc/PID/io counters; None where the kernel does not account I/O or we may not read it."""
    try:
        return proc.io_counters()
    except (psutil.AccessDenied, AttributeError, NotImplementedError):
        return None


# --------------------------------------------------------------------------- GPU sampler

# NVML clock-event ("throttle") reason bits; GPU-idle is left out: an idle GPU is not throttled.
THROTTLE_REASONS: dict[int, str] = {
    0x2: "applications_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks",
}


def decode_throttle_reasons(mask: int | None) -> tuple[str, ...]:
    """Names of the reasons set in an NVML clock-event mask, lowest bit first."""
    if not mask:
        return ()
    return tuple(name for bit, name in sorted(THROTTLE_REASONS.items()) if mask & bit)


def build_gpu_note(reason: str) -> Finding:
    """The one info note shown when GPUs cannot be sampled."""
    return Finding(
        id="monitor.gpu_unavailable",
        severity=Severity.INFO,
        title="GPU not sampled; the GPU columns are left out",
        evidence=reason,
        remedy=Remedy("If this host has an NVIDIA GPU, install its driver (it ships libnvidia-ml.so.1) "
                      "and check that `nvidia-smi` works."),
        area="gpu",
    )


class GpuSampler:
    """Reads every NVIDIA GPU through NVML (the nvidia-ml-py bindings, module `pynvml`).

    A metric a GPU does not support (power on some boards, say) reads as None; it is asked once and
    then skipped. Use `open` to create one; call `close` when done.
    """

    def __init__(self, nvml: Any, handles: list[Any]):
        self._nvml = nvml
        self._handles = handles
        self._unsupported: set[tuple[int, str]] = set()
        self._reasons_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons")

    @property
    def count(self) -> int:
        return len(self._handles)

    @classmethod
    def open(cls, nvml: Any = None) -> tuple[GpuSampler | None, Finding | None]:
        """Initialise NVML. Returns (sampler, None), or (None, an info note saying why not).

        Args:
            nvml: the NVML bindings module; None imports `pynvml`. Tests inject their own.
        """
        if nvml is None:
            try:
                # lazy: NVML loads only where a GPU is sampled
                import pynvml as nvml
            except ImportError:
                return None, build_gpu_note("the nvidia-ml-py package (pynvml) is not installed")
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as err:
            return None, build_gpu_note(_describe_nvml_error(nvml, err))
        try:
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        except nvml.NVMLError as err:
            nvml.nvmlShutdown()
            return None, build_gpu_note(f"NVML could not list the GPUs ({err})")
        if not handles:
            nvml.nvmlShutdown()
            return None, build_gpu_note("NVML sees no GPU")
        return cls(nvml, handles), None

    def read(self) -> tuple[GpuSample, ...]:
        """One `GpuSample` per GPU, in NVML index order."""
        return tuple(self._read_one(i, handle) for i, handle in enumerate(self._handles))

    def close(self) -> None:
        """Shut NVML down (it is reference counted, so other users in this process are unaffected)."""
        self._nvml.nvmlShutdown()

    def _read_one(self, index: int, handle: Any) -> GpuSample:
        nv = self._nvml
        util = self._query(index, "util", nv.nvmlDeviceGetUtilizationRates, handle)
        memory = self._query(index, "memory", nv.nvmlDeviceGetMemoryInfo, handle)
        power_mw = self._query(index, "power", nv.nvmlDeviceGetPowerUsage, handle)  # milliwatts
        return GpuSample(
            index=index,
            util_pct=float(util.gpu) if util is not None else None,
            mem_bw_util_pct=float(util.memory) if util is not None else None,
            mem_used_bytes=int(memory.used) if memory is not None else None,
            mem_total_bytes=int(memory.total) if memory is not None else None,
            temp_c=self._query(index, "temp", nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU),
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            sm_clock_mhz=self._query(index, "sm_clock", nv.nvmlDeviceGetClockInfo, handle, nv.NVML_CLOCK_SM),
            throttle_reasons=decode_throttle_reasons(self._query(index, "throttle", self._reasons_fn, handle)),
        )

    def _query(self, index: int, metric: str, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)`, or None when NVML says no; "not supported" is remembered and not asked again."""
        key = (index, metric)
        if key in self._unsupported:
            return None
        try:
            return fn(*args)
        except self._nvml.NVMLError as err:
            if getattr(err, "value", None) == getattr(self._nvml, "NVML_ERROR_NOT_SUPPORTED", 3):
                self._unsupported.add(key)
            return None


def _describe_nvml_error(nvml: Any, err: Exception) -> str:
    if getattr(err, "value", None) == getattr(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", 12):
        return "the NVML library (libnvidia-ml.so.1) was not found: no NVIDIA driver on this host"
    if getattr(err, "value", None) == getattr(nvml, "NVML_ERROR_DRIVER_NOT_LOADED", 9):
        return "the NVIDIA kernel driver is not loaded"
    return f"NVML failed to start ({err})"


# --------------------------------------------------------------------------- both together


class Sampler:
    """Host and GPU samplers together: each `take()` reads both and returns the interval's `Sample`.

    The first `take()` only records the baseline counters and returns None.
    """

    def __init__(self, host: HostSampler, gpu: GpuSampler | None, t0_s: float):
        self.host = host
        self.gpu = gpu
        self._t0_s = t0_s
        self._last: HostReading | None = None

    def take(self) -> Sample | None:
        """Read everything; the `Sample` since the previous call (None on the first call)."""
        reading = self.host.read()
        gpus = self.gpu.read() if self.gpu is not None else ()
        before, self._last = self._last, reading
        if before is None:
            return None
        return build_sample(before, reading, self._t0_s, gpus)
