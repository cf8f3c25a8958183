"""Window timing: warm up until stable, then measure windows until the median's CI is tight.

How a measurement runs (`measure_throughput`):

1. Single steps are timed until two consecutive ones agree within `warmup_tolerance` (this absorbs
   torch.compile, cuDNN autotuning and DataLoader worker start-up); their time sizes the window so
   one window lasts about `window_s`.
2. Warm-up windows run until two consecutive windows agree within `warmup_tolerance`.
3. Measured windows run until there are at least `min_windows` and the 95% CI of the median
   samples/s is within ±`target_ci_rel`, or the deadline passes.

The device is synchronised only at window boundaries (`sync`), never per step. The clock and the
step are injected, so the loop is tested with a scripted clock and no torch at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torchpace.measure.stats import MIN_WINDOWS_FOR_CI, Summary, summarize, windows_agree

Clock = Callable[[], float]
_MAX_STEPS_PER_WINDOW = 10_000  # bounds a window of a near-free step


@dataclass(frozen=True)
class Window:
    """`steps` steps that processed `samples` samples in `elapsed_s` seconds."""

    steps: int
    samples: int
    elapsed_s: float

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.elapsed_s if self.elapsed_s > 0 else float("inf")


@dataclass(frozen=True)
class TimingOptions:
    """Knobs of the measurement itself (not of the workload)."""

    window_s: float = 0.5
    warmup_tolerance: float = 0.10
    target_ci_rel: float = 0.02
    min_windows: int = MIN_WINDOWS_FOR_CI
    max_warmup_steps: int = 50


@dataclass(frozen=True)
class Throughput:
    """The outcome of one measurement phase."""

    windows: tuple[Window, ...]
    summary: Summary
    warmup_s: float
    warmup_steps: int
    warmup_converged: bool
    stopped_by: str  # "ci" when the CI target was met, "time" when the deadline passed

    @property
    def step_time_s(self) -> float:
        """Median seconds per step over the measured windows."""
        per_step = sorted(w.elapsed_s / w.steps for w in self.windows)
        return per_step[len(per_step) // 2]

    @property
    def measured_steps(self) -> int:
        return sum(w.steps for w in self.windows)


def time_window(step: Callable[[], int], steps: int, clock: Clock, sync: Callable[[], None]) -> Window:
    """Run `steps` steps and time them as one window, synchronising the device once at the end."""
    start = clock()
    samples = 0
    for _ in range(steps):
        samples += step()
    sync()
    return Window(steps, samples, clock() - start)


def _warm_up(step, clock, sync, options: TimingOptions, deadline: float) -> tuple[int, int, bool]:
    """Warm up; returns (steps per window, warm-up steps, converged)."""
    single = time_window(step, 1, clock, sync)  # the first step always runs: compile happens here
    steps = 1
    while steps < options.max_warmup_steps and clock() < deadline:
        previous, single = single, time_window(step, 1, clock, sync)
        steps += 1
        # single steps jitter more than windows: a looser test only to size the window
        if windows_agree(single.elapsed_s, previous.elapsed_s, options.warmup_tolerance * 3):
            break
    step_s = max(single.elapsed_s, 1e-9)
    per_window = max(1, min(_MAX_STEPS_PER_WINDOW, round(options.window_s / step_s)))
    last = None
    while clock() < deadline:
        window = time_window(step, per_window, clock, sync)
        steps += per_window
        if last is not None and windows_agree(window.samples_per_s, last.samples_per_s, options.warmup_tolerance):
            return per_window, steps, True
        last = window
    return per_window, steps, False


def measure_throughput(
    step: Callable[[], int],
    clock: Clock,
    sync: Callable[[], None],
    options: TimingOptions,
    warmup_deadline: float,
    deadline: float,
    on_window: Callable[[str, int, Summary | None], None] | None = None,
) -> Throughput:
    """Warm up, then measure windows of `step` (which returns the samples it processed).

    Args:
        warmup_deadline: clock time after which warm-up stops (flagged as not converged).
        deadline: clock time after which no new window starts.
        on_window: progress callback (phase, windows so far, current summary).
    """
    start = clock()
    per_window, warmup_steps, converged = _warm_up(step, clock, sync, options, warmup_deadline)
    warmup_s = clock() - start
    windows: list[Window] = []
    summary = None
    while True:
        windows.append(time_window(step, per_window, clock, sync))
        summary = summarize([w.samples_per_s for w in windows])
        if on_window:
            on_window("measure", len(windows), summary)
        if len(windows) >= options.min_windows and summary.ci_rel_halfwidth <= options.target_ci_rel:
            stopped_by = "ci"
            break
        if clock() >= deadline:
            stopped_by = "time"
            break
    return Throughput(tuple(windows), summary, warmup_s, warmup_steps, converged, stopped_by)
