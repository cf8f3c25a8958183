"""Other processes' CPU use while torchpace measures: the pure arithmetic on hand-made snapshots, and
the probe on real processes (one inside the measured tree, one outside it)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from torchpace.measure.contention import (CpuSnapshot, contention_note, is_material, measure_other_load,
                                          other_load_cores, probe_cpu_times)
from torchpace.measure.render import noise_warnings


def test_cores_are_cpu_seconds_gained_over_wall_seconds():
    before = CpuSnapshot(10.0, {100: (1.0, 5.0), 200: (2.0, 1.0), 300: (3.0, 9.0)})
    after = CpuSnapshot(12.0, {100: (1.0, 7.0),  # +2 s
                               200: (2.5, 0.5),  # pid reused by a new process: all its 0.5 s count
                               400: (11.0, 1.5)})  # started in between: all of it; 300 ended: not seen
    assert other_load_cores(before, after) == (2.0 + 0.5 + 1.5) / 2.0
    assert other_load_cores(after, after) is None


def test_material_means_half_a_core_or_a_tenth_of_the_host():
    assert not is_material(0.4, 2) and is_material(0.5, 2) and not is_material(None, 2)
    assert not is_material(3.0, 64) and is_material(6.4, 64)
    assert contention_note(0.1, 2) is None
    assert contention_note(1.94, 2, "tuned") == ("tuned while other processes used 1.9 of 2 cores: "
                                                 "the result reflects that contention")


def test_bench_profile_and_report_warn_alike_about_spread_and_load():
    assert noise_warnings(False, 0.05, "windows", "raise --max-time", 0.1, 2) == []
    spread, load = noise_warnings(True, 0.23, "profiled steps' times", "raise --steps", 1.5, 2)
    assert spread == ("noisy measurement: the IQR of the profiled steps' times is 23% of the median (over 10%). "
                      "Other load on this host? Re-run, or raise --steps.")
    assert load == "measured while other processes used 1.5 of 2 cores: the result reflects that contention."


def _busy(seconds: float) -> list[str]:
    return [sys.executable, "-c", f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass"]


def test_the_probe_counts_processes_outside_the_tree_and_not_those_inside(tmp_path):
    # "own": a process whose child is busy (a DataLoader worker, say); "other": a busy process beside it
    own = subprocess.Popen([sys.executable, "-c", f"import subprocess; subprocess.run({_busy(30)!r})"])
    other = subprocess.Popen(_busy(30))
    try:
        deadline = time.monotonic() + 30
        while not psutil.Process(own.pid).children() and time.monotonic() < deadline:
            time.sleep(0.05)
        inner_child = psutil.Process(own.pid).children()[0]
        before = probe_cpu_times(own.pid)
        other_before = psutil.Process(other.pid).cpu_times()
        time.sleep(1.0)
        other_after = psutil.Process(other.pid).cpu_times()
        after = probe_cpu_times(own.pid)
        assert other.pid in after.cpu_s and own.pid not in after.cpu_s and inner_child.pid not in after.cpu_s
        # the busy neighbour's CPU seconds between the snapshots bound the reading from below
        gained = (other_after.user + other_after.system) - (other_before.user + other_before.system)
        assert gained > 0 and other_load_cores(before, after) * (after.at_s - before.at_s) >= gained - 1e-9
        with measure_other_load(own.pid) as load:
            time.sleep(0.2)
        assert load.cores is not None and load.cores > 0
    finally:
        for proc in (own, other):
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
            proc.kill()
            proc.wait()
