"""The meter's side of a paired comparison: the gate's pipes, its clock, and the meters (throughput, batch-1
latency) taking turns (scripted clock, real pipes, the stop played by the test instead of SIGSTOP)."""

import json
import os

import pytest

from torchpace.measure.gate import END, GO, REPORT, Gate, GateEvent, go
from torchpace.measure.latency import LatencyOptions, measure_latency
from torchpace.measure.timing import TimingOptions, WindowMeter


class ScriptedParent:
    """Plays the parent: records each event, lets `away_s` pass on the clock while the arm is stopped,
    and answers `go` (with `turn_s`, when given) until `end_after` measured windows were reported."""

    def __init__(self, clock, end_after: int, away_s: float = 5.0, turn_s: float | None = None):
        self.control_r, self.control_w = os.pipe()
        self.event_r, self.event_w = os.pipe()
        self.clock, self.end_after, self.away_s = clock, end_after, away_s
        self.go = go(turn_s) if turn_s else GO
        self.events = []

    def gate(self) -> Gate:
        return Gate(self.control_r, self.event_w, stop=self.stop, clock=self.clock)

    def stop(self) -> None:
        event = json.loads(os.read(self.event_r, 4096).decode())
        self.events.append(event)
        self.clock.now += self.away_s  # the other arm's turn
        windows = sum(e["event"] == "window" for e in self.events)
        os.write(self.control_w, f"{END if windows >= self.end_after else self.go}\n".encode())

    def close(self):
        for fd in (self.control_r, self.control_w, self.event_r, self.event_w):
            os.close(fd)


class ListedParent(ScriptedParent):
    """Plays the parent by a list of commands, one per gate, in order."""

    def __init__(self, clock, commands: list[str], away_s: float = 5.0):
        super().__init__(clock, end_after=0, away_s=away_s)
        self.commands = list(commands)

    def stop(self) -> None:
        self.events.append(json.loads(os.read(self.event_r, 4096).decode()))
        self.clock.now += self.away_s
        os.write(self.control_w, f"{self.commands.pop(0)}\n".encode())


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock():
    return Clock()


def test_pause_reports_the_event_and_returns_the_command(clock):
    parent = ScriptedParent(clock, end_after=0, away_s=3.0)
    try:
        gate = parent.gate()
        clock.now = 10.0
        assert gate.pause(GateEvent("window", steps=3, samples=96, elapsed_s=0.5)) == END
        assert parent.events == [{"event": "window", "steps": 3, "samples": 96, "elapsed_s": 0.5}]
        assert clock.now == 13.0 and gate.clock() == pytest.approx(10.0)  # the time stopped is not the arm's
    finally:
        parent.close()


def test_a_go_carries_the_turn_time_the_parent_gives_both_arms(clock):
    parent = ListedParent(clock, [go(0.25), GO, END])
    try:
        gate = parent.gate()
        assert gate.turn_s is None  # not said yet: the meter's own planned window
        assert gate.pause(GateEvent("loaded")) == GO and gate.turn_s == 0.25
        assert gate.pause(GateEvent("ready")) == GO and gate.turn_s == 0.25  # a go without a time keeps the last one
        assert gate.pause(GateEvent("window")) == END
    finally:
        parent.close()


def test_a_process_that_measures_after_its_windows_says_so_at_every_gate(clock):
    parent = ScriptedParent(clock, end_after=0)
    try:
        gate = parent.gate()
        gate.alone_after = True
        gate.pause(GateEvent("loaded"))
        assert parent.events == [{"event": "loaded", "alone_after": True}]
    finally:
        parent.close()


def test_the_clock_never_counts_the_time_stopped_even_before_the_pause_has_counted_it(clock):
    """A watchdog thread continued with the process reads the clock while `pause` is still reading its
    command: it must read as at the pause, not jump by the other arm's whole turn (a long compile there)."""
    parent = ScriptedParent(clock, end_after=0, away_s=30.0)
    gate = parent.gate()
    seen = []
    read_command = gate._read_command

    def continued_then_read():  # the other threads run again before the command is read
        seen.append(gate.clock())
        return read_command()

    gate._read_command = continued_then_read
    try:
        clock.now = 10.0
        gate.pause(GateEvent("loaded"))
        assert seen == [pytest.approx(10.0)] and gate.clock() == pytest.approx(10.0)
    finally:
        parent.close()


def test_an_event_reads_back_as_it_was_sent_and_gives_its_turns_figure():
    window = GateEvent("window", steps=4, samples=128, elapsed_s=0.5, keepable=True)
    assert GateEvent.from_line(window.to_line()) == window and window.turn_rate == 256.0
    latency = GateEvent("window", steps=9, samples=9, elapsed_s=0.01, rate=1000.0)
    assert latency.turn_rate == 1000.0  # a latency turn sends its figure: 1 / its median call
    assert GateEvent("window", steps=0, samples=0, elapsed_s=0.0).turn_rate == 0.0  # measured nothing
    assert GateEvent.from_line(b'{"event": "ready", "later_field": 1}') == GateEvent("ready")  # a newer arm's word


def test_the_gate_is_opened_from_the_spec():
    gate = Gate.open("7,9")
    assert (gate.control_fd, gate.event_fd) == (7, 9)
    assert Gate.open(None) is None and Gate.open("") is None


def test_a_parent_that_is_gone_ends_the_measurement(clock):
    control_r, control_w = os.pipe()
    event_r, event_w = os.pipe()
    os.close(control_w)  # EOF on the control pipe
    try:
        assert Gate(control_r, event_w, stop=lambda: None, clock=clock).pause(GateEvent("ready")) == END
    finally:
        for fd in (control_r, event_r, event_w):
            os.close(fd)


def test_a_gated_meter_takes_turns_and_ends_when_told(clock):
    parent = ScriptedParent(clock, end_after=9)
    step_s = 0.01
    options = TimingOptions(window_s=0.1, target_ci_rel=0.5, turn_lead_in=0.2)
    try:
        gate = parent.gate()
        # deadlines that a meter without a gate would stop at long before 9 windows
        meter = WindowMeter(gate.clock, lambda: None, options, warmup_deadline=2.0, deadline=2.5, gate=gate)
        meter.start()
        steps = 0
        while not meter.done:
            clock.now += step_s
            meter.record(10)
            steps += 1
        result = meter.result()
    finally:
        parent.close()
    kinds = [e["event"] for e in parent.events]
    assert kinds == ["loaded", "ready", *["window"] * 9]
    assert result.stopped_by == "pair" and len(result.windows) == 9  # not the CI target, not the deadline
    assert all(w.steps == 10 and w.elapsed_s == pytest.approx(0.1) for w in result.windows)  # lead-in not timed
    assert [e["steps"] for e in parent.events if e["event"] == "window"] == [10] * 9
    warm = steps - 9 * (10 + 2)  # each turn: 2 untimed lead-in steps, then a 10-step window
    assert parent.events[1]["steps_per_window"] == 10 and warm == result.warmup_steps
    assert result.warmup_s < 1.0  # the other arm's turns (5 s each) are not this arm's time


def test_end_before_the_first_step_measures_nothing(clock):
    parent = ScriptedParent(clock, end_after=0)
    try:
        gate = parent.gate()
        meter = WindowMeter(gate.clock, lambda: None, TimingOptions(), 1.0, 2.0, gate=gate)
        meter.start()
    finally:
        parent.close()
    assert meter.done and meter.stopped_by == "pair"
    with pytest.raises(ValueError):
        meter.result()


def _three_turns(clock, options: TimingOptions, warmup_step_s: float, step_s: float, turn_s: float | None = None):
    """A gated meter warmed up on steps of `warmup_step_s`, then measured over three turns of steps of
    `step_s` (of `turn_s` each when the parent says so): (its windows, the steps run during the turns,
    timed or not)."""
    parent = ScriptedParent(clock, end_after=3, turn_s=turn_s)
    try:
        gate = parent.gate()
        meter = WindowMeter(gate.clock, lambda: None, options, warmup_deadline=2.0, deadline=2.5, gate=gate)
        meter.start()
        while meter.phase != "measure":
            clock.now += warmup_step_s
            meter.record(1)
        turn_steps = 0
        while not meter.done:
            clock.now += step_s
            meter.record(1)
            turn_steps += 1
    finally:
        parent.close()
    return meter.result().windows, turn_steps


@pytest.mark.parametrize("step_s, steps", [
    (0.045, 2),  # 4.5x slower: 2 steps (0.09 s) are nearer the 0.1 s turn than 3 (0.135 s)
    (0.0015, 67),  # 6.7x faster (two OpenMP threads got their cores back): 67 steps, 0.1005 s
])
def test_a_turn_lasts_its_time_at_the_nearest_whole_step_when_the_host_changes_speed(clock, step_s, steps):
    windows, _ = _three_turns(clock, TimingOptions(window_s=0.1, turn_lead_in=0.0), 0.01, step_s)
    assert [w.steps for w in windows] == [steps] * 3
    assert all(w.samples_per_s == pytest.approx(1 / step_s) for w in windows)


def test_arms_sized_at_different_speeds_take_turns_of_the_time_the_parent_gives_both(clock):
    # one arm warmed up on 20 ms steps (its 0.1 s windows: 5 steps), the other on 1 ms steps (100 steps);
    # then both run 2 ms steps: by their own plans their turns would last 10 ms and 0.2 s
    slow_sized, _ = _three_turns(clock, TimingOptions(window_s=0.1, turn_lead_in=0.0), 0.02, 0.002, turn_s=0.3)
    fast_sized, _ = _three_turns(clock, TimingOptions(window_s=0.1, turn_lead_in=0.0), 0.001, 0.002, turn_s=0.3)
    assert [w.steps for w in slow_sized] == [w.steps for w in fast_sized] == [150] * 3
    assert all(w.elapsed_s == pytest.approx(0.3) for w in slow_sized + fast_sized)


def test_a_turn_whose_steps_became_much_slower_spends_no_more_than_its_share_of_the_planned_time_untimed(clock):
    # sized on 1 ms steps: 100-step windows of 0.1 s, each turn's first 20 steps untimed (0.02 s); then every
    # step takes 50 ms (two OpenMP threads beside busy processes): 20 untimed steps would be a whole second
    windows, turn_steps = _three_turns(clock, TimingOptions(window_s=0.1, turn_lead_in=0.2), 0.001, 0.05)
    # each turn: one untimed step (the lead-in's 0.02 s is over after it), then the window: 2 steps of
    # 50 ms, the nearest its 0.1 s
    assert [w.steps for w in windows] == [2] * 3
    assert turn_steps - sum(w.steps for w in windows) == 3


def _gated_run(clock, gate: Gate) -> WindowMeter:
    meter = WindowMeter(gate.clock, lambda: None, TimingOptions(window_s=0.1, turn_lead_in=0.0), warmup_deadline=2.0,
                        deadline=2.5, gate=gate)
    meter.start()
    while not meter.done:
        clock.now += 0.01
        meter.record(1)
    return meter


def test_a_kept_process_reports_each_comparisons_windows_and_goes_on_with_the_next(clock):
    # loaded, ready, 2 windows of a first comparison, its report; then 3 windows of the next comparison, end
    parent = ListedParent(clock, [GO, GO, GO, REPORT, GO, GO, GO, END])
    reports = []
    try:
        gate = parent.gate()
        gate.reporter = reports.append
        meter = _gated_run(clock, gate)
    finally:
        parent.close()
    assert [e["event"] for e in parent.events] == ["loaded", "ready", "window", "window", "reported",
                                                   "window", "window", "window"]
    assert all(e.get("keepable") for e in parent.events)  # a process with a reporter says it can be kept
    assert len(reports) == 1 and len(reports[0].windows) == 2 and reports[0].stopped_by == "pair"
    # the next comparison's figures hold its own windows only; the warm-up is the one the process did
    final = meter.result()
    assert len(final.windows) == 3 and final.warmup_steps == reports[0].warmup_steps


def test_a_process_that_cannot_report_ends_when_asked_to(clock):
    parent = ListedParent(clock, [GO, GO, GO, REPORT])
    try:
        meter = _gated_run(clock, parent.gate())  # no reporter: nothing can write a report
    finally:
        parent.close()
    assert [e["event"] for e in parent.events] == ["loaded", "ready", "window", "window"]
    assert not any(e.get("keepable") for e in parent.events)
    assert meter.stopped_by == "pair" and len(meter.result().windows) == 2


def test_the_latency_meter_takes_turns_each_figured_at_its_median_call(clock):
    """Under the latency objective the turns time single batch-1 calls: each turn reports 1 / its median call
    (a slow call now and then moves the mean, not the median), the lead-in calls are not timed, and the
    percentiles are those of the turns' calls alone."""
    parent = ScriptedParent(clock, end_after=4, turn_s=0.1)
    durations = []

    def call():  # 10 ms calls, every seventh one 40 ms
        duration = 0.04 if len(durations) % 7 == 3 else 0.01
        durations.append(duration)
        clock.now += duration

    try:
        gate = parent.gate()
        latency = measure_latency(call, gate.clock, lambda: None, LatencyOptions(), warmup_deadline=5.0,
                                  deadline=5.5, gate=gate)
    finally:
        parent.close()
    assert [e["event"] for e in parent.events] == ["loaded", "ready", *["window"] * 4]
    turns = [e for e in parent.events if e["event"] == "window"]
    assert all(turn["rate"] == pytest.approx(100.0) for turn in turns)  # 1 / 10 ms, whatever the 40 ms calls do
    assert any(turn["samples"] / turn["elapsed_s"] < 95 for turn in turns)  # ... which the mean of a turn feels
    assert latency.stopped_by == "pair" and latency.summary.n == sum(turn["steps"] for turn in turns)
    assert sum(turn["elapsed_s"] for turn in turns) == pytest.approx(sum(latency.calls_s))
    untimed = len(durations) - latency.warmup_calls - latency.summary.n
    assert untimed == 4  # one lead-in call before each turn (a tenth of its 0.1 s)
    assert latency.summary.p50_s == pytest.approx(0.01) and latency.warmup_s < 5.0  # the other arm's time is not its


def test_a_latency_meter_ended_before_its_first_call_measures_nothing(clock):
    parent = ScriptedParent(clock, end_after=0)
    try:
        with pytest.raises(ValueError, match="before this arm's first call"):
            measure_latency(lambda: None, parent.gate().clock, lambda: None, LatencyOptions(), 1.0, 2.0,
                            gate=parent.gate())
    finally:
        parent.close()
