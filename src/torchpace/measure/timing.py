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

In a paired comparison (`torchpace.trial.pair`) the meter takes turns with another trial through a
`torchpace.measure.gate.Gate`: it stops before the first step and when warm-up is over (so the two
warm-ups and any compile never overlap the other arm's measurement), then measures one window per
turn, the first `turn_lead_in` of each turn's time untimed (caches and clocks the other arm left
cold; in whole steps, none for a turn of a few long steps), and the parent, which compares the two
arms round by round, says when to end. Every turn lasts the time the parent gives both arms
(`Gate.turn_s`), at the whole steps nearest it, however fast this arm's steps are: two arms sized
at different speeds (one warmed up while two OpenMP threads had lost a core, the other once they had
it back) would otherwise take turns of different lengths, and on a host whose speed switches, a
long turn averages the slow spells that a short one mostly misses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torchpace.measure.gate import END, LOADED, READY, REPORT, REPORTED, WINDOW, Gate, GateEvent
from torchpace.measure.stats import MIN_WINDOWS_FOR_CI, Summary, summarize, windows_agree

Clock = Callable[[], float]
_MAX_STEPS_PER_WINDOW = 10_000  # bounds a window of a near-free step
_SIZING_STEPS = 8  # the window is sized from the mean of the last few single steps
_MAX_WINDOW_GROWTH = 8  # warm-up doubles a window while it is shorter than this many `window_s`
_OVERRUN = 4  # a warm-up window that lasts this many times its plan ends early and re-sizes the next
WARMUP_SHARE = 0.4  # warm-up may use up to this share of the time cap (compile can take ~20 s)
# consecutive warm-up windows (or, for latency, blocks of calls) agreeing within this share end the warm-up
WARMUP_TOLERANCE = 0.10


def turn_full(elapsed_s: float, steps: int, turn_s: float) -> bool:
    """A paired comparison's turn ends at this step: the step nearest its time `turn_s` (at the mean time of its
    `steps` so far), however long each step takes, so both arms' turns last alike."""
    return elapsed_s + elapsed_s / steps / 2 >= turn_s


def window_for(max_time_s: float) -> float:
    """The window of a measurement capped at `max_time_s`: a fortieth of it, within [0.1, 1.0] s."""
    return min(1.0, max(0.1, max_time_s / 40))


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
    warmup_tolerance: float = WARMUP_TOLERANCE
    target_ci_rel: float = 0.02
    min_windows: int = MIN_WINDOWS_FOR_CI
    # single steps at most: a step with a rhythm of its own (loader workers that deliver in bursts)
    # never has two agreeing singles, and its windows are then sized from the mean of the last 8
    max_single_steps: int = 16
    # paired comparisons: this share of a window's steps (rounded to whole steps) runs untimed at the
    # start of each turn, after the other arm had the host
    turn_lead_in: float = 0.1
    # the warm-up may run this long past its deadline, and the measuring deadline then moves by as much as it
    # used (a separate run of a comparison measures a share of the time but warms up as a whole trial would)
    warmup_extra_s: float = 0.0


@dataclass(frozen=True)
class Throughput:
    """The outcome of one measurement phase."""

    windows: tuple[Window, ...]
    summary: Summary
    warmup_s: float
    warmup_steps: int
    warmup_converged: bool
    stopped_by: str  # "ci" when the CI target was met, "time" when the deadline passed, "pair" when a paired comparison ended

    @property
    def step_summary(self) -> Summary:
        """Steps/s over the measured windows: each window's steps over its time, their median and its CI."""
        return summarize([w.steps / w.elapsed_s for w in self.windows if w.elapsed_s > 0])

    @property
    def step_time_s(self) -> float:
        """Seconds per step: the reciprocal of the windows' median steps/s (`step_summary`), so that steps/s and
        step time are one window median, whatever the number of windows (with an even number, the median lies
        between the two middle windows)."""
        return 1 / self.step_summary.median

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


class WindowMeter:
    """The measurement as a state machine driven by step events: one method, two drivers.

    `measure_throughput` drives it by calling a step function (the Workload bench); a training script
    drives it from inside its own process, one `record` per optimizer step (script mode, see
    `torchpace.script.hook`). Either way the phases are the same:

    1. ``single``: one-step windows until two consecutive ones agree within 3x `warmup_tolerance`,
       `max_single_steps` or the warm-up deadline; the agreeing pair (else the mean of the last few,
       the first step, which holds compile and start-up, left out) sizes the window.
    2. ``warmup``: windows until two consecutive ones agree within `warmup_tolerance` (converged) or
       the warm-up deadline passes (not converged). When two disagree, the next window is twice as
       long (while that stays within 8x `window_s`, ends before the warm-up deadline and leaves the
       measuring time room for `min_windows` windows of its length, which a CI needs): a window
       must hold the step's own rhythm, e.g. DataLoader workers that deliver batches in bursts, or a
       1-step window alternates fast and slow forever. A warm-up window still running at 4x its
       planned length ends at that step, and the next is sized from its own step time: the single
       steps that sized it were faster than the steady ones (batches a loader had prefetched before
       the first step), and one such window would otherwise use the whole warm-up.
    3. ``measure``: windows until `min_windows` and the 95% CI of the median within `target_ci_rel`
       (stopped by "ci"), or the deadline (stopped by "time"); then the phase is ``done``.

    A window starts when `start()` or the previous window's bookkeeping returns, and ends after its
    last step with one `sync()` and one clock reading.

    With a `gate` (a paired comparison), `start()` and the end of warm-up stop at the gate, and the
    ``measure`` phase is one window per turn (of the gate's `turn_s`, else its planned time), ended by
    the parent (stopped by "pair"), not by the CI or the deadline; `clock` must then be the gate's,
    which leaves out the time stopped.

    With `agree` (the ranks of a job of several processes, each running this meter), every decision is taken
    at window ends only, so that each rank takes it at the same step: windows end at their planned steps (a
    warm-up window does not end early on overrunning its plan, a time reading no two ranks share), and at each
    window's end, after `sync()`, `agree(steps, samples)` returns the job's window (every rank's samples over
    the slowest rank's time), read alike by every rank; `clock` must then read the time the ranks agreed at
    their last window's end.
    """

    def __init__(self, clock: Clock, sync: Callable[[], None], options: TimingOptions, warmup_deadline: float,
                 deadline: float, on_window: Callable[[str, int, Summary | None], None] | None = None,
                 gate: Gate | None = None, agree: Callable[[int, int], Window] | None = None):
        if gate is not None and agree is not None:
            raise ValueError("a meter agreed across ranks cannot take turns at a gate")
        self.clock, self.sync, self.options, self.gate, self.agree = clock, sync, options, gate, agree
        self.warmup_deadline, self.deadline, self.on_window = warmup_deadline, deadline, on_window
        self.phase = "idle"
        self.windows: list[Window] = []
        self.summary: Summary | None = None
        self.warmup_steps = 0
        self.warmup_s = 0.0
        self.warmup_converged = False
        self.stopped_by = ""
        self._per_window = 1
        self._step_s = 0.0  # the step time the window was sized from
        self._last: Window | None = None  # the previous single / warm-up window
        self._singles_s: list[float] = []  # single-step times after the first
        self._steps = self._samples = 0
        self._lead_in = 0  # untimed steps left at the start of this turn (paired comparisons)
        self._lead_in_until = 0.0  # ... and the clock's reading at which the lead-in ends however many are left

    @property
    def done(self) -> bool:
        return self.phase == "done"

    def start(self) -> None:
        """Begin: the first window (a single step) starts now (at the gate's first turn, if any)."""
        self.phase = "single"
        if self.gate is not None and self.gate.pause(GateEvent(LOADED)) == END:
            self.stopped_by, self.phase = "pair", "done"
        self._begin = self._window_start = self.clock()

    def record(self, samples: int) -> Window | None:
        """One step that processed `samples` finished; returns the window it closed, if any (steps after
        the measurement is done are not counted)."""
        if self.done:
            return None
        if self._lead_in:
            self._window_start = self.clock()
            self._lead_in = 0 if self._window_start >= self._lead_in_until else self._lead_in - 1
            return None
        self._steps += 1
        self._samples += samples
        if not self._window_full():
            return None
        self.sync()
        if self.agree is not None:
            window = self.agree(self._steps, self._samples)
        else:
            window = Window(self._steps, self._samples, self.clock() - self._window_start)
        self._steps = self._samples = 0
        {"single": self._after_single, "warmup": self._after_warmup, "measure": self._after_measured}[self.phase](window)
        self._window_start = self.clock()
        return window

    def _after_single(self, window: Window) -> None:
        previous, self._last = self._last, window
        self.warmup_steps += 1
        if previous is not None:  # the first step (compile, start-up) does not size the window
            self._singles_s.append(window.elapsed_s)
        # single steps jitter more than windows: a looser test only to size the window
        agreed = previous is not None and windows_agree(window.elapsed_s, previous.elapsed_s, self.options.warmup_tolerance * 3)
        if agreed or self.warmup_steps >= self.options.max_single_steps or self.clock() >= self._warmup_until:
            # the agreeing pair, else the mean of the last few (steps that alternate fast and slow)
            recent = self._singles_s[-2 if agreed else -_SIZING_STEPS:] or [window.elapsed_s]
            self._size_windows(max(sum(recent) / len(recent), 1e-9))
            self._last = None
            self._enter("warmup" if self.clock() < self._warmup_until else "measure")

    def _size_windows(self, step_s: float) -> None:
        self._step_s = step_s
        self._per_window = max(1, min(_MAX_STEPS_PER_WINDOW, round(self.options.window_s / step_s)))

    def _window_full(self) -> bool:
        """The window ends at this step: a single step; a warm-up window at its planned steps, or at
        `_OVERRUN` times its planned time; a turn of a paired comparison at the step nearest its turn
        time (`_turn_s`; at the step's mean time so far, checked at each step), whatever this arm's
        steps now take, so both arms' turns last alike and a host whose speed changed mid-comparison
        gives turns of a millisecond or of many seconds to neither."""
        if self.phase == "single":
            return True
        if self.agree is not None:  # the ranks end each window at the same step: by its steps alone
            return self._steps >= self._per_window
        planned_s, elapsed_s = self._per_window * self._step_s, self.clock() - self._window_start
        if self.gate is not None and self.phase == "measure":
            return turn_full(elapsed_s, self._steps, self._turn_s())
        return self._steps >= self._per_window or (self.phase == "warmup" and elapsed_s > _OVERRUN * planned_s)

    def _turn_s(self) -> float:
        """A paired turn's time: the parent's (the same for both arms), else this arm's planned window."""
        return self.gate.turn_s if self.gate is not None and self.gate.turn_s else self._per_window * self._step_s

    def _after_warmup(self, window: Window) -> None:
        previous, self._last = self._last, window
        self.warmup_steps += window.steps
        own_step_s = window.elapsed_s / window.steps
        resized = own_step_s > _OVERRUN * self._step_s
        if resized:  # sized from steps faster than the steady ones: the next window from this one's,
            self._size_windows(own_step_s)  # and the next two compared with each other, not with it
            previous = self._last = None
        if previous is not None and windows_agree(window.samples_per_s, previous.samples_per_s, self.options.warmup_tolerance):
            self.warmup_converged = True
            self._enter("measure")
        elif self.clock() >= self._warmup_until:
            self._enter("measure")
        elif (previous is not None and 2 * window.elapsed_s <= _MAX_WINDOW_GROWTH * self.options.window_s
              and self.clock() + 2 * window.elapsed_s <= self._warmup_until
              and 2 * window.elapsed_s * self.options.min_windows <= self.deadline - self.warmup_deadline):
            # Neighbours disagree: the window may be too short to hold the step's own rhythm (loader
            # workers that deliver batches in bursts, periodic logging); the next one is twice as long,
            # as long as it stays within 8x `window_s`, the warm-up's deadline and a `min_windows`-th of
            # the measuring time (a host whose load makes every window disagree must not grow them into
            # the time left for measuring: a 20 s bench grown to 4 s windows measured one window).
            self._per_window = min(_MAX_STEPS_PER_WINDOW, self._per_window * 2)

    @property
    def _warmup_until(self) -> float:
        """When the warm-up stops unconverged: its deadline, and the extra time it may take."""
        return self.warmup_deadline + self.options.warmup_extra_s

    def _enter(self, phase: str) -> None:
        self.phase = phase
        if phase == "measure":
            self.warmup_s = self.clock() - self._begin
            # the measuring keeps its own length: its deadline moves by the extra warm-up used, no more
            self.deadline += min(self.options.warmup_extra_s, max(0.0, self.clock() - self.warmup_deadline))
            if self.gate is not None:
                self._take_turn(GateEvent(READY, warmup_s=self.warmup_s, warmup_converged=self.warmup_converged,
                                          steps_per_window=self._per_window))

    def _take_turn(self, event: GateEvent) -> None:
        """Stop at the gate; on `end` the measurement is done, else the next turn begins untimed. On `report`
        the windows so far go to `Gate.reporter` and are forgotten (the comparison is over, and this
        process is kept for the next one), and the process stops again until that one continues it; a
        process that cannot report (no reporter, no window since the last report) ends as on `end`."""
        command = self.gate.pause(event)
        while command == REPORT and self.gate.reporter is not None and self.windows:
            self.gate.reporter(self.result("pair"))
            self.windows, self.summary = [], None
            command = self.gate.pause(GateEvent(REPORTED))
        if command in (END, REPORT):
            self.stopped_by, self.phase = "pair", "done"
        else:
            # a share of the turn's time, in whole steps: none for a turn of a few long steps, where one
            # step's cold caches are a small part of it and an untimed step would cost a whole step's time;
            # and no longer than that share of the time, should the steps have become much slower (two
            # OpenMP threads beside busy processes: 100x), where a count of steps sized for fast ones
            # would leave the turn mostly untimed
            lead_in_s = self.options.turn_lead_in * self._turn_s()
            self._lead_in = round(lead_in_s / self._step_s)
            self._lead_in_until = self.clock() + lead_in_s

    def _after_measured(self, window: Window) -> None:
        self.windows.append(window)
        self.summary = summarize([w.samples_per_s for w in self.windows])
        if self.on_window:
            self.on_window("measure", len(self.windows), self.summary)
        if self.gate is not None:  # the parent compares the arms round by round and says when to end
            self._take_turn(GateEvent(WINDOW, steps=window.steps, samples=window.samples, elapsed_s=window.elapsed_s))
        elif len(self.windows) >= self.options.min_windows and self.summary.ci_rel_halfwidth <= self.options.target_ci_rel:
            self.stopped_by, self.phase = "ci", "done"
        elif self.clock() >= self.deadline:
            self.stopped_by, self.phase = "time", "done"

    def result(self, stopped_by: str | None = None) -> Throughput:
        """The measurement so far (`stopped_by` overrides why it ended, e.g. the script ended first).

        Raises:
            ValueError: no window was measured yet.
        """
        if not self.windows or self.summary is None:
            raise ValueError("no measured window yet")
        return Throughput(tuple(self.windows), self.summary, self.warmup_s, self.warmup_steps, self.warmup_converged,
                          stopped_by or self.stopped_by)


def measure_throughput(
    step: Callable[[], int],
    clock: Clock,
    sync: Callable[[], None],
    options: TimingOptions,
    warmup_deadline: float,
    deadline: float,
    on_window: Callable[[str, int, Summary | None], None] | None = None,
    gate: Gate | None = None,
) -> Throughput:
    """Warm up, then measure windows of `step` (which returns the samples it processed).

    Args:
        warmup_deadline: clock time after which warm-up stops (flagged as not converged).
        deadline: clock time after which no new window starts.
        on_window: progress callback (phase, windows so far, current summary).
        gate: take turns with another trial (see `WindowMeter`); `clock` is then `gate.clock`.
    """
    meter = WindowMeter(clock, sync, options, warmup_deadline, deadline, on_window, gate)
    meter.start()
    while not meter.done:
        meter.record(step())
    return meter.result()
