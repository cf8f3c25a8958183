"""Fixtures for the monitor tests: a factory of plausible `Sample`s to build recorded sequences."""

from __future__ import annotations

import dataclasses

import pytest

from torchpace.monitor.samples import GpuSample, Sample

_GIB = 2**30

QUIET = Sample(
    t_s=1.0, interval_s=1.0, cpu_pct=10.0, cpu_core_pct=(10.0, 10.0, 10.0, 10.0), iowait_pct=0.0,
    cpu_pressure_frac=0.0, io_pressure_frac=0.0, runnable_tasks=1,
    mem_used_bytes=8 * _GIB, mem_available_bytes=24 * _GIB, mem_total_bytes=32 * _GIB,
    swap_used_bytes=0, swap_total_bytes=0,
    disk_read_bytes_per_s=0.0, disk_write_bytes_per_s=0.0, disk_busy_frac=0.0,
    net_recv_bytes_per_s=0.0, net_sent_bytes_per_s=0.0,
    tree_procs=1, tree_busy_procs=0, tree_threads=4, tree_cpu_pct=50.0, tree_cpu_wait_pct=0.0, tree_rss_bytes=_GIB,
    tree_read_bytes_per_s=0.0, tree_write_bytes_per_s=0.0,
    gpus=(GpuSample(index=0, util_pct=95.0, mem_bw_util_pct=40.0, mem_used_bytes=20 * _GIB,
                    mem_total_bytes=80 * _GIB, temp_c=60.0, power_w=300.0, sm_clock_mhz=1980),),
)


def _make_sample(t_s: float = 1.0, gpu: dict | None = None, **fields) -> Sample:
    """A healthy sample (4 cores, one busy GPU) with `fields` and GPU-0 `gpu` fields replaced."""
    gpus = QUIET.gpus
    if gpu is not None:
        gpus = (dataclasses.replace(QUIET.gpus[0], **gpu),)
    return dataclasses.replace(QUIET, t_s=t_s, gpus=fields.pop("gpus", gpus), **fields)


@pytest.fixture
def make_sample():
    return _make_sample
