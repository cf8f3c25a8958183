"""Batch-1 latency: percentiles and the p50 CI from an injected clock (no torch, no real time)."""

import pytest

from torchpace.measure.latency import (LatencyOptions, measure_latency, percentile_nearest_rank, summarize_latency,
                                       time_call)


class ScriptedClock:
    """A clock that each call advances by the next scripted duration (seconds)."""

    def __init__(self, durations):
        self.now = 0.0
        self.durations = durations
        self.calls = 0
        self.syncs = 0

    def __call__(self):
        return self.now

    def call(self):
        self.now += self.durations(self.calls)
        self.calls += 1

    def sync(self):
        self.syncs += 1


def test_nearest_rank_percentiles():
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile_nearest_rank(values, 0.5) == 50.0
    assert percentile_nearest_rank(values, 0.9) == 90.0
    assert percentile_nearest_rank(values, 0.99) == 99.0
    assert percentile_nearest_rank([3.0], 0.99) == 3.0
    with pytest.raises(ValueError):
        percentile_nearest_rank([], 0.5)


def test_summary_orders_percentiles_and_brackets_p50():
    summary = summarize_latency([0.001 * (1 + (i * 37) % 100) for i in range(400)])
    assert summary.n == 400
    assert summary.p50_ci_low_s <= summary.p50_s <= summary.p50_ci_high_s
    assert summary.p50_s <= summary.p90_s <= summary.p99_s
    assert summary.ci_coverage >= 0.95


def test_each_call_is_timed_and_synced_on_its_own():
    clock = ScriptedClock(lambda i: 0.004)
    assert time_call(clock.call, clock, clock.sync) == pytest.approx(0.004)
    assert clock.syncs == 1


def test_percentiles_of_scripted_calls_exclude_the_compile_call():
    # a 20 s first call (compile), then a repeating 1..10 ms pattern: p50 5.5 ms, p90 9 ms, p99 10 ms
    pattern = [0.001 * (k + 1) for k in range(10)]
    clock = ScriptedClock(lambda i: 20.0 if i == 0 else pattern[i % 10])
    options = LatencyOptions(min_calls=1000, max_calls=1000, warmup_tolerance=0.6)
    latency = measure_latency(clock.call, clock, clock.sync, options, warmup_deadline=100.0, deadline=1000.0)
    assert latency.warmup_s >= 20.0 and latency.warmup_converged
    assert 20.0 not in latency.calls_s
    assert latency.summary.n == 1000 and latency.stopped_by == "calls"
    assert latency.summary.p50_s == pytest.approx(0.0055)
    assert latency.summary.p90_s == pytest.approx(0.009)
    assert latency.summary.p99_s == pytest.approx(0.010)
    assert clock.syncs == clock.calls  # one sync per call, warm-up included


def test_steady_calls_stop_once_the_p50_ci_is_tight():
    clock = ScriptedClock(lambda i: 0.002)
    latency = measure_latency(clock.call, clock, clock.sync, LatencyOptions(), 10.0, 100.0)
    assert latency.stopped_by == "ci" and latency.summary.n == LatencyOptions().min_calls
    assert latency.summary.p50_s == latency.summary.p99_s == pytest.approx(0.002)


def test_noisy_calls_stop_at_the_deadline():
    pattern = [0.001, 0.009, 0.002, 0.02, 0.004]
    clock = ScriptedClock(lambda i: pattern[i % 5] * (1 + (i // 11) % 4))
    latency = measure_latency(clock.call, clock, clock.sync, LatencyOptions(target_ci_rel=0.0001), 0.5, 3.0)
    assert latency.stopped_by == "time" and clock.now >= 3.0
    assert latency.summary.p50_ci_low_s <= latency.summary.p50_s <= latency.summary.p50_ci_high_s


def test_large_samples_use_the_normal_approximation_of_the_median_ranks():
    from torchpace.measure.latency import median_ci_ranks_large
    from torchpace.measure.stats import median_ci_ranks

    assert median_ci_ranks_large(50) == median_ci_ranks(50)
    lo, hi, coverage = median_ci_ranks_large(10_000)
    assert lo < 5000 < hi and 190 < hi - lo < 210 and coverage == 0.95  # +- 1.96 * sqrt(n) / 2 ranks
    exact_lo, exact_hi, _ = median_ci_ranks(101)
    approx_lo, approx_hi, _ = median_ci_ranks_large(101)
    assert approx_lo <= exact_lo and approx_hi >= exact_hi  # never narrower than the exact interval
