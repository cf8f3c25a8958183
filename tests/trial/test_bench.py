"""run_bench on real torch with tiny workloads: invariants only, never absolute times."""

import pytest

from torchpace.measure.bench import BenchOptions
from torchpace.trial.bench import run_bench

from _support import still_running
from fixtures.workloads import tiny_inference, tiny_mlp


@pytest.fixture(scope="module")
def result():
    from torchpace.host import probe_host

    return run_bench(tiny_mlp(), None, BenchOptions(max_time_s=4, window_s=0.05), host=probe_host())


def test_median_lies_in_its_ci_and_windows_add_up(result):
    t = result.throughput
    assert t.samples_per_s_ci_low <= t.samples_per_s <= t.samples_per_s_ci_high
    assert t.windows == len(t.window_samples_per_s) == len(t.window_steps_per_s) >= 1
    assert t.measured_steps >= t.windows
    assert t.stopped_by in ("ci", "time")
    objective = result.objective  # what the result is judged by: samples/s, with the same CI
    assert (objective.name, objective.unit, objective.value) == ("throughput", "samples/s", t.samples_per_s)
    assert (objective.ci_low, objective.ci_high) == (t.samples_per_s_ci_low, t.samples_per_s_ci_high)


def test_every_step_left_a_loss_value(result):
    # warm-up + measured steps; compute-only steps train too but are not the loader-fed curve
    assert len(result.loss_values) == result.throughput.warmup_steps + result.throughput.measured_steps
    assert all(isinstance(v, float) for v in result.loss_values)


def test_compute_only_ceiling_and_input_bound_fraction_are_consistent(result):
    assert result.compute_only_samples_per_s > 0
    assert 0.0 <= result.input_bound_frac < 1.0
    expected = max(0.0, 1 - result.throughput.samples_per_s / result.compute_only_samples_per_s)
    assert result.input_bound_frac == pytest.approx(expected)


def test_units_are_in_the_names_and_memory_is_measured(result):
    payload = result.to_dict()
    assert payload["kind"] == "torchpace.bench" and payload["schema_version"] == 1
    assert payload["peak_memory_bytes"] > 10 * 2**20 and payload["peak_memory_kind"] == "cpu_peak_rss"
    assert payload["step_time_s"] > 0 and payload["host"]["fingerprint"]
    assert payload["other_load_cores"] >= 0  # other processes' CPU while measuring (measure.contention)
    assert payload["objective"] == {"name": "throughput", "unit": "samples/s", "value": payload["samples_per_s"],
                                    "ci_low": payload["samples_per_s_ci_low"], "ci_high": payload["samples_per_s_ci_high"],
                                    "ci_rel_halfwidth": payload["ci_rel_halfwidth"]}


def test_inference_workload_is_measured_without_losses(host):
    r = run_bench(tiny_inference(), None, BenchOptions(max_time_s=2, window_s=0.05, compute_only=False), host=host)
    assert r.throughput.samples_per_s > 0 and r.loss_values == () and r.compute_only_samples_per_s is None


@pytest.mark.parametrize("compute_only", [False, True])
def test_workers_are_shut_down_after_the_bench(host, compute_only):
    import psutil

    # with persistent workers the loader keeps its iterator: the compute-only phase after the real
    # steps must get a fresh one, not the one whose workers the real phase shut down
    result = run_bench(tiny_mlp(), {"data.num_workers": 2, "data.persistent_workers": True},
                       BenchOptions(max_time_s=3, window_s=0.05, compute_only=compute_only), host=host)
    assert result.throughput.samples_per_s > 0
    if compute_only:
        assert result.compute_only_samples_per_s > 0
    import gc

    gc.collect()
    assert still_running([c.pid for c in psutil.Process().children(recursive=True)], timeout_s=0) == []
