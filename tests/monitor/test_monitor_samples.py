"""Samples, columns, statistics, and the pure reading -> sample arithmetic of the samplers."""

from __future__ import annotations

import os
import types
from pathlib import Path

import pytest

from torchpace.monitor.samplers import (
    CoreTimes,
    GpuSampler,
    HostReading,
    HostSampler,
    ProcReading,
    Sampler,
    build_sample,
    build_tree_usage,
    decode_throttle_reasons,
    is_physical_disk,
    parse_schedstat,
    parse_psi_some_total_us,
    parse_runnable_tasks,
    pick_interfaces,
    walk_tree,
)
from torchpace.monitor.samples import (
    GPU_COLUMNS,
    HOST_COLUMNS,
    MetricsAccumulator,
    build_column_names,
    describe_column,
    flatten_sample,
    percentile,
    summarize_samples,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "guide" / "monitor.md"  # documents every column


def _reading(t_s: float, busy_s: float, iowait_s: float, procs=(), disk=(0, 0), psi=0, **kw) -> HostReading:
    """Two cores; each spent `busy_s` busy and `iowait_s` in iowait since boot (of `t_s` seconds)."""
    core = CoreTimes(total_s=t_s, idle_s=t_s - busy_s - iowait_s, iowait_s=iowait_s)
    return HostReading(
        t_s=t_s, cores=(core, core), mem_used_bytes=1, mem_available_bytes=3, mem_total_bytes=4,
        swap_used_bytes=0, swap_total_bytes=0, disk_read_bytes=disk[0], disk_write_bytes=disk[1],
        disk_busy_ms=(kw.get("busy_ms", 0),), net_recv_bytes=kw.get("net", 0), net_sent_bytes=0,
        cpu_pressure_us=psi, io_pressure_us=None, runnable_tasks=3, procs=tuple(procs),
    )


def _proc(pid: int, cpu_s: float, write: int | None = 0, wait_s: float | None = None) -> ProcReading:
    return ProcReading(pid=pid, create_time=100.0 + pid, cpu_s=cpu_s, rss_bytes=1000, threads=2,
                       read_bytes=0 if write is not None else None, write_bytes=write, run_wait_s=wait_s)


def test_build_sample_turns_counters_into_rates():
    before = _reading(10.0, busy_s=2.0, iowait_s=1.0, procs=[_proc(1, 1.0)], disk=(0, 0), psi=0, busy_ms=0, net=0)
    after = _reading(12.0, busy_s=3.0, iowait_s=1.5, procs=[_proc(1, 2.9, write=4096)], disk=(2048, 8192),
                     psi=500_000, busy_ms=1000, net=4000)
    sample = build_sample(before, after, t0_s=9.0)
    assert sample.t_s == pytest.approx(3.0) and sample.interval_s == pytest.approx(2.0)
    assert sample.cpu_pct == pytest.approx(50.0) and sample.cpu_core_pct == pytest.approx((50.0, 50.0))
    assert sample.iowait_pct == pytest.approx(25.0)
    assert sample.disk_read_bytes_per_s == 1024 and sample.disk_write_bytes_per_s == 4096
    assert sample.disk_busy_frac == pytest.approx(0.5) and sample.net_recv_bytes_per_s == 2000
    assert sample.cpu_pressure_frac == pytest.approx(0.25) and sample.io_pressure_frac is None
    assert sample.tree_cpu_pct == pytest.approx(95.0) and sample.tree_busy_procs == 1
    assert sample.tree_write_bytes_per_s == 2048


def test_tree_usage_sums_processes_and_counts_newcomers_from_zero():
    before = (_proc(1, 10.0, wait_s=1.0), _proc(2, 5.0, wait_s=2.0))
    after = (_proc(1, 10.2, wait_s=1.5), _proc(2, 6.0, wait_s=1.0), _proc(3, 0.5, wait_s=0.25))  # 3 is new
    usage = build_tree_usage(before, after, dt_s=1.0)
    assert usage.procs == 3 and usage.threads == 6 and usage.rss_bytes == 3000
    assert usage.cpu_pct == pytest.approx(170.0) and usage.busy_procs == 1
    assert usage.cpu_wait_pct == pytest.approx(75.0)  # 0.5 + 0 (a thread exited: no negative) + 0.25
    reused = (ProcReading(2, 999.0, 0.3, 1, 1, None, None),)  # same pid, new process
    assert build_tree_usage(before, reused, dt_s=1.0).cpu_pct == pytest.approx(30.0)
    assert build_tree_usage(before, reused, dt_s=1.0).write_bytes_per_s is None
    ended = build_tree_usage(before, (), dt_s=1.0)  # CMD ended between two samples: its tree did nothing
    assert (ended.procs, ended.cpu_pct, ended.read_bytes_per_s, ended.write_bytes_per_s) == (0, 0.0, 0.0, 0.0)


def test_counter_reset_reads_as_zero_not_negative():
    sample = build_sample(_reading(1.0, 0.5, 0.0, disk=(10_000, 10_000)), _reading(2.0, 0.6, 0.0, disk=(0, 0)), 0.0)
    assert sample.disk_read_bytes_per_s == 0.0 and sample.disk_write_bytes_per_s == 0.0


def test_proc_file_parsers():
    psi = "some avg10=0.00 avg60=0.09 avg300=0.41 total=3770158\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    assert parse_psi_some_total_us(psi) == 3770158 and parse_psi_some_total_us(None) is None
    assert parse_runnable_tasks("0.68 0.32 0.14 3/90 4228\n") == 3 and parse_runnable_tasks("") is None
    assert [n for n in ("vda", "nvme0n1", "loop0", "zram0", "dm-1", "md0", "sda") if is_physical_disk(n)] == [
        "vda", "nvme0n1", "sda"]
    assert pick_interfaces(["lo", "eth0", "docker0", "veth1"], {"eth0"}) == ["eth0"]
    assert pick_interfaces(["lo", "ifb0", "eth0"], set()) == ["eth0"]


def test_tree_walk_follows_every_threads_children(tmp_path):
    for pid, tid, children in [(10, 10, "11 12"), (10, 13, "14"), (11, 11, "15"), (12, 12, ""), (14, 14, ""),
                               (15, 15, "")]:
        task = tmp_path / str(pid) / "task" / str(tid)
        task.mkdir(parents=True)
        (task / "children").write_text(children + (" " if children else ""))
    tree = dict(walk_tree(10, tmp_path))
    assert sorted(tree) == [10, 11, 12, 14, 15] and sorted(tree[10]) == ["10", "13"]
    assert walk_tree(99, tmp_path) == [(99, [])]  # gone: only itself, whose stats then read as exited
    assert parse_schedstat("142802 3040270 2\n") == pytest.approx(0.00304027) and parse_schedstat("") is None


def test_host_sampler_reads_this_process():
    sampler = Sampler(HostSampler(os.getpid()), None, t0_s=0.0)
    assert sampler.take() is None
    sum(i * i for i in range(200_000))
    sample = sampler.take()
    assert sample.tree_procs >= 1 and sample.tree_threads >= 1 and sample.tree_rss_bytes > 0
    assert sample.tree_cpu_wait_pct is None or sample.tree_cpu_wait_pct >= 0
    assert len(sample.cpu_core_pct) == os.cpu_count() and 0.0 <= sample.cpu_pct <= 100.0
    assert sample.mem_total_bytes > sample.mem_available_bytes > 0 and sample.gpus == ()


# ----------------------------------------------------------------------------- NVML


class _NVMLError(Exception):
    def __init__(self, value):
        super().__init__(f"NVML error {value}")
        self.value = value


def _fake_nvml(count=1, init_error=None, power_supported=True) -> types.SimpleNamespace:
    """NVML bindings as injected into GpuSampler.open (the shape of nvidia-ml-py's pynvml)."""
    calls = {"power": 0}

    def init():
        if init_error is not None:
            raise _NVMLError(init_error)

    def power(handle):
        calls["power"] += 1
        if not power_supported:
            raise _NVMLError(3)
        return 312_500

    return types.SimpleNamespace(
        NVMLError=_NVMLError, NVML_ERROR_NOT_SUPPORTED=3, NVML_ERROR_LIBRARY_NOT_FOUND=12,
        NVML_TEMPERATURE_GPU=0, NVML_CLOCK_SM=1, calls=calls,
        nvmlInit=init, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: count,
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=87, memory=41),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=30 * 2**30, total=80 * 2**30, free=50 * 2**30),
        nvmlDeviceGetTemperature=lambda h, sensor: 71,
        nvmlDeviceGetPowerUsage=power,
        nvmlDeviceGetClockInfo=lambda h, clock: 1755,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0x4 | 0x40 | 0x1,
    )


def test_gpu_sampler_reads_nvml_in_units():
    nvml = _fake_nvml(count=2)
    sampler, note = GpuSampler.open(nvml)
    assert note is None and sampler.count == 2
    gpu0, gpu1 = sampler.read()
    assert (gpu0.index, gpu1.index) == (0, 1)
    assert gpu0.util_pct == 87.0 and gpu0.mem_bw_util_pct == 41.0 and gpu0.mem_used_frac == pytest.approx(0.375)
    assert gpu0.temp_c == 71 and gpu0.power_w == pytest.approx(312.5) and gpu0.sm_clock_mhz == 1755
    assert gpu0.throttle_reasons == ("sw_power_cap", "hw_thermal")
    sampler.close()


def test_gpu_metric_not_supported_is_none_and_asked_once():
    nvml = _fake_nvml(power_supported=False)
    sampler, _ = GpuSampler.open(nvml)
    assert sampler.read()[0].power_w is None and sampler.read()[0].power_w is None
    assert nvml.calls["power"] == 1


def test_without_nvml_gpu_columns_are_absent_with_one_info_note():
    sampler, note = GpuSampler.open(_fake_nvml(init_error=12))
    assert sampler is None and note.severity.value == "info" and "libnvidia-ml.so.1" in note.evidence
    assert GpuSampler.open(_fake_nvml(count=0))[1].evidence == "NVML sees no GPU"
    real_sampler, real_note = GpuSampler.open()  # the real pynvml: no driver on the CI machine
    if real_sampler is not None:
        real_sampler.close()
        pytest.skip("this machine has an NVIDIA driver")
    assert real_note.id == "monitor.gpu_unavailable"


def test_decode_throttle_reasons_ignores_idle():
    assert decode_throttle_reasons(0x1) == () and decode_throttle_reasons(None) == ()
    assert decode_throttle_reasons(0x8 | 0x20) == ("hw_slowdown", "sw_thermal")


# ----------------------------------------------------------------------------- columns and statistics


def test_columns_follow_the_host(make_sample):
    names = build_column_names(n_cores=4, n_gpus=1)
    row = flatten_sample(make_sample(t_s=2.0, gpu={"throttle_reasons": ("sw_power_cap", "hw_thermal")}), 1000.0)
    assert list(row) == names
    assert row["unix_time_s"] == 1002.0 and row["cpu3_pct"] == 10.0
    assert row["gpu0_throttle_reasons"] == "sw_power_cap|hw_thermal" and row["gpu0_power_w"] == 300.0


def test_every_column_is_documented_with_its_unit():
    names = build_column_names(n_cores=2, n_gpus=2)
    assert all(describe_column(name) is not None for name in names)
    assert describe_column("gpu1x_power_w") is None
    readme = DOCS.read_text()
    for column in (*HOST_COLUMNS, *GPU_COLUMNS):
        assert f"`{column.name}`" in readme, column.name


def test_percentile_interpolates_like_numpy():
    assert percentile([1, 2, 3, 4, 5], 50) == 3 and percentile([1, 2, 3, 4], 95) == pytest.approx(3.85)
    assert percentile([7], 95) == 7


def test_summary_is_mean_p95_max_without_time_or_per_core(make_sample):
    stats = {m.name: m for m in summarize_samples(
        [make_sample(t_s=float(i), tree_cpu_pct=float(10 * i)) for i in range(1, 21)])}
    tree = stats["tree_cpu_pct"]
    assert (tree.mean, tree.max, tree.count, tree.unit) == (105.0, 200.0, 20, "% of one core")
    assert tree.p95 == pytest.approx(190.5)
    assert "t_s" not in stats and "cpu0_pct" not in stats and "gpu0_throttle_reasons" not in stats
    assert "gpu0_util_pct" in stats


def test_accumulator_memory_is_bounded_and_stats_stay_right():
    acc = MetricsAccumulator(max_kept=64)
    for i in range(1000):
        acc.add({"tree_cpu_pct": float(i), "cpu_pressure_frac": None})
    [stats] = acc.stats()
    assert stats.mean == pytest.approx(499.5) and stats.max == 999.0 and stats.count == 1000
    assert stats.p95 == pytest.approx(949.05, rel=0.03)
