"""run_bench on real torch with tiny workloads: invariants only, never absolute times."""

import pytest

from torchpace.measure.bench import BenchOptions, run_bench

from fixtures.workloads import tiny_inference, tiny_mlp


@pytest.fixture(scope="module")
def result():
    from torchpace.host import probe_host

    return run_bench(tiny_mlp(), None, BenchOptions(max_time_s=4, window_s=0.05), host=probe_host())


def test_median_lies_in_its_ci_and_windows_add_up(result):
    assert result.samples_per_s_ci_low <= result.samples_per_s <= result.samples_per_s_ci_high
    assert result.windows == len(result.window_samples_per_s) >= 1
    assert result.measured_steps >= result.windows
    assert result.stopped_by in ("ci", "time")


def test_every_step_left_a_loss_value(result):
    # warm-up + measured steps; compute-only steps train too but are not the loader-fed curve
    assert len(result.loss_values) == result.warmup_steps + result.measured_steps
    assert all(isinstance(v, float) for v in result.loss_values)


def test_compute_only_ceiling_and_input_bound_fraction_are_consistent(result):
    assert result.compute_only_samples_per_s > 0
    assert 0.0 <= result.input_bound_frac < 1.0
    expected = max(0.0, 1 - result.samples_per_s / result.compute_only_samples_per_s)
    assert result.input_bound_frac == pytest.approx(expected)


def test_units_are_in_the_names_and_memory_is_measured(result):
    payload = result.to_dict()
    assert payload["kind"] == "torchpace.bench" and payload["schema_version"] == 1
    assert payload["peak_memory_bytes"] > 10 * 2**20 and payload["peak_memory_kind"] == "cpu_peak_rss"
    assert payload["step_time_s"] > 0 and payload["host"]["fingerprint"]
    assert payload["other_load_cores"] >= 0  # other processes' CPU while measuring (measure.contention)


def test_inference_workload_is_measured_without_losses(host):
    r = run_bench(tiny_inference(), None, BenchOptions(max_time_s=2, window_s=0.05, compute_only=False), host=host)
    assert r.samples_per_s > 0 and r.loss_values == [] and r.compute_only_samples_per_s is None


@pytest.mark.parametrize("compute_only", [False, True])
def test_workers_are_shut_down_after_the_bench(host, compute_only):
    import psutil

    # with persistent workers the loader keeps its iterator: the compute-only phase after the real
    # steps must get a fresh one, not the one whose workers the real phase shut down
    result = run_bench(tiny_mlp(), {"data.num_workers": 2, "data.persistent_workers": True},
                       BenchOptions(max_time_s=3, window_s=0.05, compute_only=compute_only), host=host)
    assert result.samples_per_s > 0
    if compute_only:
        assert result.compute_only_samples_per_s > 0
    import gc

    gc.collect()
    alive = [c for c in psutil.Process().children(recursive=True) if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert alive == []
