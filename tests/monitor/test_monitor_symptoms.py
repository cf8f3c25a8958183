"""Alert rules over recorded sample sequences: pure, no clock, no machine."""

from __future__ import annotations

import pytest

from torchpace.findings import Finding, Severity
from torchpace.monitor.symptoms import (
    RULES,
    RuleState,
    SymptomContext,
    SymptomTracker,
    advance_rule,
    check_symptoms,
)

CTX = SymptomContext(usable_cores=4)
GIB = 2**30


def _sequence(make_sample, pattern: str, bad: dict, good: dict | None = None) -> list:
    """One sample per character: 'x' has the symptom (`bad` fields), '.' does not."""
    return [make_sample(t_s=float(i + 1), **(bad if c == "x" else (good or {}))) for i, c in enumerate(pattern)]


INPUT_BOUND = {"gpu": {"util_pct": 20.0}, "tree_cpu_pct": 390.0, "tree_procs": 5, "tree_busy_procs": 4}


def test_quiet_run_raises_nothing(make_sample):
    assert check_symptoms([make_sample(t_s=float(i)) for i in range(30)], CTX) == []


def test_input_bound_raises_after_five_samples_not_on_a_blip(make_sample):
    blips = _sequence(make_sample, "xx.xxxx.x.xx", INPUT_BOUND)
    assert check_symptoms(blips, CTX) == []
    sustained = _sequence(make_sample, "..xxxxxx", INPUT_BOUND)
    [alert] = check_symptoms(sustained, CTX)
    assert isinstance(alert, Finding)
    assert alert.id == "monitor.input_bound" and alert.severity is Severity.WARN
    assert alert.data["onset_s"] == 3.0 and alert.data["raised_at_s"] == 7.0
    assert alert.data["cleared_at_s"] is None
    assert "GPU utilisation 20%" in alert.evidence and "3.9 of 4 usable cores" in alert.evidence
    assert "num_workers" in alert.remedy.text and "pin_memory" in alert.remedy.text


def test_alert_clears_only_after_five_clean_samples_and_can_rise_again(make_sample):
    samples = _sequence(make_sample, "xxxxx.x....x.....xxxxx", INPUT_BOUND)
    first, second = check_symptoms(samples, CTX)
    assert (first.data["raised_at_s"], first.data["cleared_at_s"]) == (5.0, 17.0)
    assert (second.data["raised_at_s"], second.data["cleared_at_s"]) == (22.0, None)


def test_input_bound_needs_the_cpu_side_saturated(make_sample):
    idle_cpu = {"gpu": {"util_pct": 20.0}, "tree_cpu_pct": 100.0, "tree_procs": 5, "tree_busy_procs": 1}
    assert check_symptoms(_sequence(make_sample, "xxxxxxxx", idle_cpu), CTX) == []
    workers_pegged = {"gpu": {"util_pct": 20.0}, "tree_cpu_pct": 200.0, "tree_procs": 3, "tree_busy_procs": 2}
    assert [a.id for a in check_symptoms(_sequence(make_sample, "xxxxx", workers_pegged), CTX)] == ["monitor.input_bound"]


def test_input_bound_ignores_gpus_the_job_does_not_use(make_sample):
    no_job_on_gpu = {**INPUT_BOUND, "gpu": {"util_pct": 0.0, "mem_used_bytes": 300 * 2**20}}
    assert check_symptoms(_sequence(make_sample, "xxxxxxxx", no_job_on_gpu), CTX) == []
    no_gpu = {**INPUT_BOUND, "gpus": ()}
    assert check_symptoms(_sequence(make_sample, "xxxxxxxx", no_gpu), CTX) == []


READING = {"tree_read_bytes_per_s": 80e6, "tree_write_bytes_per_s": 0.0}  # CMD's tree reads from storage


@pytest.mark.parametrize("bad, expected", [
    ({"iowait_pct": 35.0}, "iowait 35%"),
    ({"io_pressure_frac": 0.6}, "stalled on I/O 60%"),
    ({"disk_busy_frac": 0.99}, "busy 99%"),
])
def test_storage_bound(make_sample, bad, expected):
    [alert] = check_symptoms(_sequence(make_sample, "xxxxx", {**bad, **READING}), CTX)
    assert alert.id == "monitor.storage_bound" and expected in alert.evidence
    assert "CMD's processes read 80.0 MB/s" in alert.evidence


def test_storage_bound_needs_the_trees_own_storage_io(make_sample):
    # another job's disk traffic on a shared host: the host waits on I/O, CMD's tree reads and writes nothing
    host_waits = {"iowait_pct": 35.0, "io_pressure_frac": 0.6, "disk_busy_frac": 0.99}
    assert check_symptoms(_sequence(make_sample, "xxxxxxxx", host_waits), CTX) == []
    writing = {**host_waits, "tree_write_bytes_per_s": 5e6}  # a checkpoint that does not end: the tree's own
    assert [a.id for a in check_symptoms(_sequence(make_sample, "xxxxx", writing), CTX)] == ["monitor.storage_bound"]
    unaccounted = {**host_waits, "tree_read_bytes_per_s": None, "tree_write_bytes_per_s": None}
    [alert] = check_symptoms(_sequence(make_sample, "xxxxx", unaccounted), CTX)  # the host's signs alone decide
    assert alert.id == "monitor.storage_bound" and "CMD's processes" not in alert.evidence


def test_gpu_memory_near_full(make_sample):
    [alert] = check_symptoms(_sequence(make_sample, "xxxxx", {"gpu": {"mem_used_bytes": 78 * GIB}}), CTX)
    assert alert.id == "monitor.gpu_memory_full" and "78.0 of 80.0 GiB" in alert.evidence


def test_host_memory_near_full(make_sample):
    low = {"mem_available_bytes": 2 * GIB, "mem_used_bytes": 30 * GIB, "swap_used_bytes": GIB}
    [alert] = check_symptoms(_sequence(make_sample, "xxxxx", low), CTX)
    assert alert.id == "monitor.host_memory_full" and "2.0 of 32.0 GiB" in alert.evidence


def test_thermal_throttle_warns_and_power_cap_informs(make_sample):
    hot = {"gpu": {"throttle_reasons": ("hw_thermal", "sw_thermal"), "temp_c": 91.0}}
    [alert] = check_symptoms(_sequence(make_sample, "xxxxx", hot), CTX)
    assert alert.id == "monitor.gpu_thermal_throttle" and alert.severity is Severity.WARN
    assert "hw_thermal, sw_thermal at 91" in alert.evidence and "nvidia-smi" in alert.remedy.command
    capped = {"gpu": {"throttle_reasons": ("sw_power_cap",)}}
    [alert] = check_symptoms(_sequence(make_sample, "xxxxx", capped), CTX)
    assert alert.id == "monitor.gpu_power_cap" and alert.severity is Severity.INFO


def test_cpu_oversubscribed_when_threads_want_more_than_the_usable_cores(make_sample):
    crowded = {"tree_cpu_pct": 390.0, "tree_cpu_wait_pct": 300.0}
    [alert] = check_symptoms(_sequence(make_sample, "xxxxx", crowded), CTX)
    assert alert.id == "monitor.cpu_oversubscribed" and "wanted 6.9 cores (3.9 running, 3.0 waiting" in alert.evidence
    assert "OMP_NUM_THREADS" in alert.remedy.text
    all_cores_little_queue = {"tree_cpu_pct": 395.0, "tree_cpu_wait_pct": 20.0}
    noisy_neighbours = {"tree_cpu_pct": 150.0, "tree_cpu_wait_pct": 150.0}  # waits, but wants 3 of 4 cores
    for fields in (all_cores_little_queue, noisy_neighbours):
        assert check_symptoms(_sequence(make_sample, "xxxxx", fields), CTX) == []


def test_cpu_oversubscribed_without_schedstat_uses_pressure_or_run_queue(make_sample):
    with_psi = {"tree_cpu_pct": 395.0, "tree_cpu_wait_pct": None, "cpu_pressure_frac": 0.7}
    [alert] = check_symptoms(_sequence(make_sample, "xxxxx", with_psi), CTX)
    assert "waited for a CPU 70%" in alert.evidence
    without_psi = {"tree_cpu_pct": 395.0, "tree_cpu_wait_pct": None, "cpu_pressure_frac": None, "runnable_tasks": 12}
    assert [a.id for a in check_symptoms(_sequence(make_sample, "xxxxx", without_psi), CTX)] == ["monitor.cpu_oversubscribed"]
    no_queue = {"tree_cpu_pct": 395.0, "tree_cpu_wait_pct": None, "cpu_pressure_frac": 0.02}
    assert check_symptoms(_sequence(make_sample, "xxxxx", no_queue), CTX) == []


def test_tracker_reports_raise_and_clear_events(make_sample):
    tracker = SymptomTracker(CTX, raise_after=2, clear_after=2)
    bad = {"iowait_pct": 50.0, **READING}
    kinds = [[e.kind for e in tracker.update(s)] for s in _sequence(make_sample, "xx..", bad)]
    assert kinds == [[], ["raised"], [], ["cleared"]]
    assert tracker.active() == [] and len(tracker.alerts()) == 1


def test_advance_rule_is_a_pure_step():
    state, change = advance_rule(RuleState(), "e", 1.0, raise_after=1, clear_after=1)
    assert change == "raise" and state.active and state.raised_at_s == 1.0
    again, change = advance_rule(state, "e", 2.0, raise_after=1, clear_after=1)
    assert change is None and again.raised_at_s == 1.0
    cleared, change = advance_rule(again, None, 3.0, raise_after=1, clear_after=1)
    assert change == "clear" and not cleared.active


def test_every_rule_has_a_remedy_and_a_stable_id():
    ids = [rule.id for rule in RULES]
    assert len(ids) == len(set(ids)) and all(i.startswith("monitor.") for i in ids)
    assert all(rule.remedy and rule.remedy.text for rule in RULES)
