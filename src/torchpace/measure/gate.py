"""Taking turns on the host: the measured process's side of an alternating comparison.

A paired comparison (`torchpace.trial.pair`) runs the two configs as two trial processes at once and
lets them take turns: while one measures a window, the other's whole process group (DataLoader
workers, compile workers) is stopped. This module is the measured process's part, used by the meter
(`torchpace.measure.timing.WindowMeter`) in a Workload trial and in a script alike:

- at each *gate* (the measurement is about to start; warm-up is over; a measured window closed) the
  process writes one JSON line to the event pipe, saying where it is, and stops its own process group
  with SIGSTOP, so nothing of it runs while the other arm measures, not even for the moment it would
  take the parent to stop it;
- the parent continues it (SIGCONT) when its turn comes, after writing what to do to the control
  pipe: `go SECONDS` (measure the next window, for that long: the parent gives both arms the same
  turn time, `Gate.turn_s`), `end` (the comparison is over: finish as a plain bench does)
  or `report` (the comparison is over, but the process is kept for the next one: it hands the
  windows measured since its last report to `Gate.reporter`, which writes them as a result, forgets
  them, and stops again at a `reported` gate until its next comparison continues it);
- `Gate.clock` leaves out the time the process was stopped, so its warm-up deadline, its window
  timing and its own time cap count only its turns;
- a process that measures something more after its windows (an inference workload's batch-1
  latency; under the latency objective, whose turns time the batch-1 calls, its throughput) sets
  `Gate.alone_after`, and says so at every gate, so the parent ends the arms one at a time; otherwise
  both end at once.

The pipes are file descriptors the trial process inherits, named in its spec (`TrialSpec.gate`, or
`ScriptMeasure.gate` in a script), never in the environment, so processes the trial starts never take
part. This module imports only the standard library.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Callable

GO, END, REPORT = "go", "end", "report"  # what the parent tells a stopped arm
LOADED, READY, WINDOW, REPORTED = "loaded", "ready", "window", "reported"  # where an arm stopped


@dataclass(frozen=True)
class GateEvent:
    """What an arm says at a gate: one JSON line on the event pipe.

    Attributes:
        event: where it stopped: `loaded`, `ready`, `window` or `reported`.
        warmup_s, warmup_converged, steps_per_window: `ready`: its warm-up, and the steps of its windows.
        steps, samples, elapsed_s: `window`: what the turn measured (samples: steps when unknown).
        rate: `window`: the turn's figure when it is not samples over time (a latency turn's 1 / median call).
        alone_after: it measures something more after its windows, alone (`Gate.alone_after`).
        keepable: it can report its windows and be kept for another comparison (`Gate.reporter`).
    """

    event: str
    warmup_s: float | None = None
    warmup_converged: bool | None = None
    steps_per_window: int | None = None
    steps: int | None = None
    samples: float | None = None
    elapsed_s: float | None = None
    rate: float | None = None
    alone_after: bool = False
    keepable: bool = False

    def to_line(self) -> bytes:
        """The event as the pipe carries it: its set fields as one JSON object and a newline."""
        data = {k: v for k, v in asdict(self).items() if v is not None and v is not False}
        return (json.dumps(data) + "\n").encode()

    @classmethod
    def from_line(cls, line: bytes) -> "GateEvent":
        """The event of one line of the pipe (names this version does not know are left out)."""
        data = json.loads(line)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def turn_rate(self) -> float:
        """A `window`'s figure: its `rate` when it sends one, else its samples (or steps) over its time; 0
        when it measured nothing."""
        if self.rate is not None:
            return float(self.rate)
        return self.samples / self.elapsed_s if self.elapsed_s and self.samples is not None else 0.0


def go(turn_s: float) -> str:
    """The command that continues an arm for a turn of `turn_s` seconds."""
    return f"{GO} {turn_s!r}"


def stop_own_group() -> None:
    """Stop this process's whole group (SIGSTOP): it resumes when someone sends SIGCONT."""
    os.killpg(os.getpgrp(), signal.SIGSTOP)


class Gate:
    """The measured process's end of the two pipes to the parent that alternates two trials.

    Args:
        control_fd: read end of the pipe the parent writes commands (`go` / `end`) to.
        event_fd: write end of the pipe this process reports its gates on.
        stop: stops this process until the parent continues it (injectable for tests).
        clock: the raw clock; `Gate.clock` is it minus the time spent stopped.
    """

    def __init__(self, control_fd: int, event_fd: int, stop: Callable[[], None] = stop_own_group,
                 clock: Callable[[], float] = time.perf_counter):
        self.control_fd, self.event_fd = control_fd, event_fd
        self._stop, self._raw_clock = stop, clock
        self.paused_s = 0.0
        self.alone_after = False  # this process measures more after its windows, and must then run alone
        # writes the windows measured since the last report as a result (set by what runs the meter; None:
        # this process cannot be kept for another comparison, and says so at its gates)
        self.reporter: Callable[[Any], None] | None = None
        self._frozen: float | None = None  # the clock's reading while stopped, until `pause` counted that time
        self.turn_s: float | None = None  # how long the parent's last `go` asked a turn to last (None: not said)
        self._pending = b""

    @classmethod
    def open(cls, fds: str | None) -> Gate | None:
        """The gate of a spec's `"CONTROL_FD,EVENT_FD"` (None for a trial that does not take turns)."""
        if not fds:
            return None
        control, _, event = fds.partition(",")
        return cls(int(control), int(event))

    def clock(self) -> float:
        """Seconds on the raw clock, less the time this process was stopped at its gates. From a pause
        until it has counted the time stopped, it reads as at the pause: another thread of the process
        (a watchdog) continued with it never sees the time stopped as its own."""
        frozen = self._frozen
        return frozen if frozen is not None else self._raw_clock() - self.paused_s

    def pause(self, event: GateEvent) -> str:
        """Report `event`, stop until continued, and return the parent's command."""
        started = self._raw_clock()
        self._frozen = started - self.paused_s
        event = replace(event, alone_after=self.alone_after, keepable=self.reporter is not None)
        os.write(self.event_fd, event.to_line())
        self._stop()
        command = self._read_command()
        self.paused_s += self._raw_clock() - started
        self._frozen = None
        return command

    def _read_command(self) -> str:
        while b"\n" not in self._pending:
            chunk = os.read(self.control_fd, 64)
            if not chunk:  # the parent is gone (it would have killed us): end as if told to
                return END
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        command, _, turn_s = line.decode().strip().partition(" ")
        if command == GO and turn_s:
            self.turn_s = float(turn_s)
        return command
