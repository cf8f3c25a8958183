"""The measurement loop with an injected clock and a scripted step: no torch, no real time."""

import pytest

from torchpace.measure.timing import TimingOptions, WindowMeter, measure_throughput, time_window


class ScriptedClock:
    """A clock the step advances: each step 'takes' the next scripted duration."""

    def __init__(self, durations):
        self.now = 0.0
        self.durations = durations
        self.steps = 0
        self.syncs = 0

    def __call__(self):
        return self.now

    def step(self):
        self.now += self.durations(self.steps)
        self.steps += 1
        return 10  # samples per step

    def sync(self):
        self.syncs += 1


def _run_to_the_end(meter, clock, closed):
    """Drive `meter` with the scripted steps until it is done; each window it closes is appended to
    `closed` as (the phase it closed in, the window)."""
    meter.start()
    while not meter.done:
        phase = meter.phase
        window = meter.record(clock.step())
        if window is not None:
            closed.append((phase, window))


def test_window_syncs_once_and_counts_samples():
    clock = ScriptedClock(lambda i: 0.01)
    window = time_window(clock.step, 5, clock, clock.sync)
    assert (window.steps, window.samples, clock.syncs) == (5, 50, 1)
    assert abs(window.samples_per_s - 1000.0) < 1e-6


def test_slow_first_steps_are_warm_up_not_measurement():
    # a 20 s "compile" first step, then 3 slow steps, then a steady 10 ms step
    clock = ScriptedClock(lambda i: 20.0 if i == 0 else 0.05 if i < 4 else 0.01)
    result = measure_throughput(clock.step, clock, clock.sync, TimingOptions(window_s=0.1), 100.0, 200.0)
    assert result.warmup_converged
    assert result.warmup_s >= 20.0
    assert abs(result.summary.median - 1000.0) < 1e-6  # steady state only: 10 samples / 10 ms
    assert result.stopped_by == "ci"
    assert result.summary.n >= TimingOptions().min_windows


def test_window_is_sized_from_the_steady_step_time():
    clock = ScriptedClock(lambda i: 0.02)
    result = measure_throughput(clock.step, clock, clock.sync, TimingOptions(window_s=0.2), 10.0, 20.0)
    assert {w.steps for w in result.windows} == {10}


def test_noisy_steps_stop_at_the_deadline_with_a_wide_ci():
    pattern = [0.01, 0.03, 0.015, 0.05, 0.012, 0.02]
    clock = ScriptedClock(lambda i: pattern[i % len(pattern)] * (1 + (i // 7) % 3))
    result = measure_throughput(clock.step, clock, clock.sync, TimingOptions(window_s=0.01, target_ci_rel=0.001), 2.0, 5.0)
    assert result.stopped_by == "time"
    assert clock.now >= 5.0
    assert result.summary.ci_low <= result.summary.median <= result.summary.ci_high


def test_progress_callback_sees_every_measured_window():
    clock = ScriptedClock(lambda i: 0.01)
    seen = []
    result = measure_throughput(clock.step, clock, clock.sync, TimingOptions(window_s=0.05), 1.0, 10.0,
                                on_window=lambda phase, n, summary: seen.append(n))
    assert seen == list(range(1, result.summary.n + 1))


def test_the_meter_driven_by_step_events_measures_what_the_pull_loop_does():
    """Script mode pushes one `record` per step into the same WindowMeter; started at the same moment,
    it closes the same windows with the same decisions."""
    from torchpace.measure.timing import WindowMeter

    durations = lambda i: 0.5 if i == 0 else 0.02 + 0.002 * (i % 3)
    pulled_clock = ScriptedClock(durations)
    pulled = measure_throughput(pulled_clock.step, pulled_clock, pulled_clock.sync, TimingOptions(window_s=0.1), 5.0, 10.0)
    clock = ScriptedClock(durations)
    meter = WindowMeter(clock, clock.sync, TimingOptions(window_s=0.1), 5.0, 10.0)
    meter.start()
    closed = []
    while not meter.done:
        window = meter.record(clock.step())
        if window is not None:
            closed.append(window)
    pushed = meter.result()
    assert pushed.windows == pulled.windows and pushed.stopped_by == pulled.stopped_by
    assert (pushed.warmup_steps, pushed.warmup_converged) == (pulled.warmup_steps, pulled.warmup_converged)
    assert closed[-len(pushed.windows):] == list(pushed.windows)  # record() hands back each window it closes
    assert clock.syncs == len(closed)  # one device sync per window, none per step


def test_a_meter_stopped_early_reports_the_windows_it_has():
    from torchpace.measure.timing import WindowMeter

    import random

    jitter = random.Random(0)
    durations = [0.01 * (1 + 0.3 * jitter.random()) for _ in range(1000)]
    clock = ScriptedClock(lambda i: durations[i])  # no rhythm a window could hold: never a 0.1% CI
    meter = WindowMeter(clock, clock.sync, TimingOptions(window_s=0.05, target_ci_rel=0.001), 0.5, 100.0)
    meter.start()
    with pytest.raises(ValueError):
        meter.result()
    for _ in range(200):
        meter.record(clock.step())
    partial = meter.result("script-ended")
    assert not meter.done and partial.stopped_by == "script-ended" and len(partial.windows) >= 2


def test_windows_grow_until_they_hold_a_bursty_steps_rhythm():
    """Two loader workers delivering together: a fast step (batch ready), then a slow one (waiting for
    the next pair). One-step windows would alternate 80x apart; the measured median must be the true
    rate (2 steps per 81 ms)."""
    clock = ScriptedClock(lambda i: 0.001 if i % 2 else 0.080)
    result = measure_throughput(clock.step, clock, clock.sync, TimingOptions(window_s=0.1), 5.0, 20.0)
    true_rate = 10 * 2 / 0.081  # samples/s
    assert abs(result.summary.median - true_rate) / true_rate < 0.05
    assert min(w.steps for w in result.windows) >= 2 and result.warmup_converged



def test_windows_that_disagree_on_a_loaded_host_stop_growing_at_8x_and_at_the_warmup_deadline():
    """Every window 30% slower or faster than the one before (a host whose load comes and goes in step
    with the windows): warm-up never converges, so windows double, but none is planned past 8x
    `window_s`, warm-up ends by its deadline plus one window, and the rest is measured."""
    clock = ScriptedClock(lambda i: 0.0)
    closed = []
    clock.durations = lambda i: 0.01 if len(closed) % 2 == 0 else 0.013
    meter = WindowMeter(clock, clock.sync, TimingOptions(window_s=0.1), 3.0, 9.0)
    _run_to_the_end(meter, clock, closed)
    warmup = [w for phase, w in closed if phase == "warmup"]
    assert not meter.warmup_converged and len(warmup) >= 4
    assert max(w.elapsed_s for _, w in closed) <= 8 * 0.1 * 1.3  # planned from a fast window, run slow
    assert meter.warmup_s <= 3.0 + 8 * 0.1 * 1.3
    assert len(meter.windows) >= 6


def test_windows_that_disagree_grow_no_longer_than_leaves_room_for_the_windows_a_ci_needs():
    """A 20 s bench (0.5 s windows, warm-up until 8 s) whose windows disagree by 30% one after another: 8x
    `window_s` would be 4 s windows, three of them in the 12 s measured. They stop growing at a sixth of
    the measuring time, so the measured phase holds at least the windows a CI needs (at the step times
    they were planned for; the slow ones run 30% over)."""
    clock = ScriptedClock(lambda i: 0.0)
    closed = []
    clock.durations = lambda i: 0.01 if len(closed) % 2 == 0 else 0.013
    options = TimingOptions(window_s=0.5)
    meter = WindowMeter(clock, clock.sync, options, 8.0, 20.0)
    _run_to_the_end(meter, clock, closed)
    assert not meter.warmup_converged
    assert max(w.elapsed_s for _, w in closed) <= (20.0 - 8.0) / options.min_windows * 1.3
    assert len(meter.windows) >= 4 and meter.stopped_by == "time"


def test_a_window_sized_from_prefetched_batches_ends_early_and_the_next_is_sized_from_steady_steps():
    """Loader workers had 4 batches ready before the first step: the single steps that size the window
    take 2 ms, the steady ones 40 ms. A window planned from 2 ms steps (50 steps, 2 s) would use the
    whole 1.6 s warm-up and leave one measured window; it ends at 4x its plan instead, the next
    windows last about `window_s`, warm-up converges and the steady rate is measured."""
    clock = ScriptedClock(lambda i: 0.5 if i == 0 else 0.002 if i <= 4 else 0.040)
    closed = []
    meter = WindowMeter(clock, clock.sync, TimingOptions(window_s=0.1), 1.6, 4.0)
    _run_to_the_end(meter, clock, closed)
    assert max(w.elapsed_s for phase, w in closed if phase != "single") <= 4 * 0.1 + 0.040  # none ran far past its plan
    assert meter.warmup_converged and meter.warmup_s < 1.6
    assert all(w.elapsed_s <= 2 * 0.1 for w in meter.windows) and len(meter.windows) >= TimingOptions().min_windows
    assert abs(meter.result().summary.median - 10 / 0.040) / (10 / 0.040) < 0.01


def test_a_bursty_step_converges_within_the_warm_up_of_a_short_trial():
    """Two loader workers deliver together (2 ms, then 80 ms): single steps never agree. They stop
    after `max_single_steps`, so 2-step windows (which do agree) still converge within the 1.6 s
    warm-up of a 4 s trial instead of the singles using it all."""
    clock = ScriptedClock(lambda i: 0.5 if i == 0 else 0.002 if i % 2 else 0.080)
    result = measure_throughput(clock.step, clock, clock.sync, TimingOptions(window_s=0.1), 1.6, 4.0)
    true_rate = 10 * 2 / 0.082
    assert result.warmup_converged and result.warmup_s < 1.6
    assert abs(result.summary.median - true_rate) / true_rate < 0.05 and result.summary.n >= TimingOptions().min_windows
