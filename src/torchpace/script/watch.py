"""The script's rhythm, watched from another thread: when it stepped last, how long its steps take, how long it
spent compiling; and the rule that says it stopped stepping (`StepWatch.verdict`).

A script that stops stepping (a deadlock, a hung read, waiting on input, a peer rank that died) is not waited
for without bound: no step for `STALL_MIN_S` and `STALL_FACTOR` times its longest step ends it as stalled; past
the measurement's time cap, no step for `CAP_GRACE_S` and 3x its longest step ends it at the cap. Time spent
compiling is never a gap (`CompileTime`, from torch's compile events), and one compile is waited for within
the trial's compile allowance. The probe (`torchpace.script.probe`) acts on the verdict.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Callable

STALL_MIN_S = 30.0  # no step for this long (and STALL_FACTOR times its longest step) ends it as stalled
STALL_FACTOR = 5.0
CAP_GRACE_S = 2.0  # past the measurement's time cap, a step this late (and 3x its longest) ends the measurement
WATCH_S = 0.25  # how often the stall watchdog looks


class CompileTime:
    """Seconds the script's process spends inside torch.compile, from torch's compile start and end events
    (`torch._dynamo.callback`: a frame traced and compiled, a backward compiled when first called), read by
    the stall watchdog from another thread: a compile is never a stall."""

    def __init__(self, clock):
        self.clock = clock
        self.since: float | None = None  # when the compile under way began
        self._depth = 0
        self._spent_s = 0.0
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self._depth == 0:
                self.since = self.clock()
            self._depth += 1

    def end(self) -> None:
        with self._lock:
            self._depth = max(0, self._depth - 1)
            if self._depth == 0 and self.since is not None:
                self._spent_s += self.clock() - self.since
                self.since = None

    def total_s(self) -> float:
        """Every second spent compiling so far, the compile under way included."""
        with self._lock:
            return self._spent_s + (self.clock() - self.since if self.since is not None else 0.0)


@dataclass(frozen=True)
class Stopped:
    """The script stopped stepping: `stall` (no step for `gap_s`, or a compile of `compiling_s` past the
    allowance) or `cap` (past the measurement's time cap, no step for `gap_s`)."""

    how: str
    gap_s: float
    compiling_s: float | None = None


class StepWatch:
    """When the script stepped, its longest step, its compiles, and the steps file the parent reads when the
    script ends without letting the hook write its result (`os._exit`).

    Attributes:
        last_step_at: the clock at the latest step (None before the first).
        longest_step_s: the longest gap between two steps after the first, time spent compiling left out.
        compiles: the time spent compiling.
    """

    def __init__(self, clock, steps_path: str | None, compile_allowance_s: float):
        self.clock, self.steps_path = clock, steps_path
        self.compile_allowance_s = compile_allowance_s
        self.last_step_at: float | None = None
        self.longest_step_s = 0.0
        self.compiles = CompileTime(clock)
        self._compiled_at_step = 0.0  # `compiles.total_s()` when the last step ended
        self._steps_fd: int | None = None

    def note_step(self, steps: int) -> None:
        """Step `steps` ended: its gap (less the time it spent compiling) and the steps file."""
        now = self.clock()
        compiled_s = self.compiles.total_s()
        if self.last_step_at is not None and steps > 1:
            self.longest_step_s = max(self.longest_step_s, now - self.last_step_at - (compiled_s - self._compiled_at_step))
        self.last_step_at, self._compiled_at_step = now, compiled_s
        if self.steps_path is None:
            return
        try:
            if self._steps_fd is None:
                self._steps_fd = os.open(self.steps_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.pwrite(self._steps_fd, f"{steps:<12d}".encode(), 0)
        except OSError:
            pass  # only a better message is lost

    @property
    def compile_limit_s(self) -> float:
        """How long one compile is waited for: the trial's compile allowance, at least the stall floor."""
        return max(STALL_MIN_S, self.compile_allowance_s)

    def compiling_for(self, now: float, hooked_compile_since: float | None = None) -> float | None:
        """Seconds the compile under way has run (None when none is): torch's own compile events, or
        `hooked_compile_since`, when `compile.mode`'s own compile began (the model compiled in place after the
        first backward(); torch reports no event for a lazily compiled backward on every version)."""
        since = self.compiles.since
        if hooked_compile_since is not None:
            since = hooked_compile_since if since is None else min(since, hooked_compile_since)
        return None if since is None else now - since

    def verdict(self, past_cap: Callable[[float, float], bool], hooked_compile_since: float | None = None) -> Stopped | None:
        """Whether the script stopped stepping (see the module docstring); `past_cap(now, gap_s)` says whether the
        measurement's time cap ends it (the probe knows its deadline)."""
        if self.last_step_at is None:
            return None
        now = self.clock()
        compiling_s = self.compiling_for(now, hooked_compile_since)
        if compiling_s is not None:
            return Stopped("stall", now - self.last_step_at, compiling_s) if compiling_s >= self.compile_limit_s else None
        gap = now - self.last_step_at - (self.compiles.total_s() - self._compiled_at_step)
        if gap >= max(STALL_MIN_S, STALL_FACTOR * self.longest_step_s):
            return Stopped("stall", gap)
        if past_cap(now, gap):
            return Stopped("cap", gap)
        return None
