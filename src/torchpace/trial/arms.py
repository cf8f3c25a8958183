"""The arms of a paired comparison: each a trial process the parent stops and continues at its gates, and
the arms a tune keeps, stopped, from one comparison for the next.

`Arm` is the parent's handle on one arm (its process, its two pipes, its folder); it reads the arm's
`measure.gate.GateEvent`s, continues it with a command, asks it to report, and ends its whole tree.
`KeptArms` holds arms between comparisons (see its docstring), `hold_both_reason` judges whether a
comparison's two arms fit in memory beside the ones kept, and `LoadMeter` charges other processes' CPU
to the arm whose turn it was. The schedule the arms follow is `torchpace.trial.schedule`; running a
comparison with them is `torchpace.trial.pair`.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Mapping, Sequence, TextIO

import psutil

from torchpace.host import HostFacts
from torchpace.knobs.distributed import nproc_of
from torchpace.measure.contention import other_load_cores, probe_cpu_times
from torchpace.measure.gate import READY, REPORT, REPORTED, WINDOW, GateEvent
from torchpace.measure.render import config_label
from torchpace.process import StoppedGroupGuard, signal_group, start_child, stop_tree
from torchpace.protocol import TrialResult, TrialSpec
from torchpace.trial.runner import (child_stdout, open_trial_output, plan_trial_child, read_trial_result, trial_dir,
                                    trial_paths)
from torchpace.trial.schedule import fits_beside, sequential_reason

_KILL_GRACE_S = 3.0
_POLL_S = 0.05  # how often a wait for an arm looks at whether it is still running
_STOP_WAIT_S = 5.0  # an arm that reported a gate is stopped within this (it stops itself right after)


@dataclass(frozen=True)
class ArmOutput:
    """Where the arms' script output goes: a log per arm, and arm B's also streamed to `echo`."""

    logs: tuple[Path | None, Path | None] = (None, None)
    echo: TextIO | None = None

    def log(self, name: str) -> Path | None:
        return self.logs["ab".index(name)]

    def echo_of(self, name: str) -> TextIO | None:
        return self.echo if name == "b" else None


def hold_both_reason(spec_a: TrialSpec, spec_b: TrialSpec, kept_arms: KeptArms | None, peak_bytes: int | None,
                     available_bytes: Callable[[], int | None]) -> str | None:
    """Why the two arms of a comparison that takes its arms from `kept_arms` cannot be held at once
    (`sequential_reason`; None: they can), judged by `peak_bytes` times the arms to start against the memory
    free (`available_bytes()`, read again after ending arms). When memory alone is short, the kept arms this
    comparison does not need are ended first. When the comparison must be separate runs anyway (several
    ranks), the kept arms stay stopped through them, for the comparisons after them, while the runs' ranks
    fit beside them (else every kept arm is ended)."""
    specs = (spec_a, spec_b)
    new = 2 - kept_arms.reusable(specs) if kept_arms is not None else 2

    def reason() -> str | None:
        return sequential_reason(spec_a, spec_b, peak_bytes=peak_bytes, available_bytes=available_bytes(),
                                 new_processes=new)

    first = reason()
    if first is None or kept_arms is None:
        return first
    if sequential_reason(spec_a, spec_b) is None:  # memory alone: the kept arms it does not need may hold it
        return reason() if kept_arms.keep_only(specs) else first
    ranks = max(nproc_of(spec_a.config), nproc_of(spec_b.config))
    if not fits_beside(peak_bytes, available_bytes(), ranks):
        kept_arms.keep_only(())
    return first


class Arm:
    """The parent's handle on one arm: its process, its two pipes, its folder and files. An arm lives as long
    as its process: for one comparison, or for several when an `KeptArms` keeps it between them."""

    def __init__(self, name: str, spec: TrialSpec, workdir: Path | None, log_path: Path | None = None):
        self.name = name
        self._folder = contextlib.ExitStack()
        self.folder = self._folder.enter_context(trial_dir(workdir))
        self.spec_path, self.result_path, self.err_path = trial_paths(self.folder, spec, log_path)
        self.control_r, self.control_w = os.pipe()
        self.event_r, self.event_w = os.pipe()
        self.spec = replace(spec, gate=f"{self.control_r},{self.event_w}", compute_only=False)
        self.proc = None
        self._buffer = b""
        self.events: list[GateEvent] = []
        self.load_cpu_s = self.load_wall_s = 0.0
        self.ready = False  # warmed up: the rounds may start (a kept arm comes to its next comparison ready)
        self.kept = False  # handed to an `KeptArms`: the comparison that ends leaves it be

    def start(self, host: HostFacts, base_env: Mapping[str, str], timeout_s: float, guard: StoppedGroupGuard) -> None:
        self.spec.save(self.spec_path)
        argv, env, nofile = plan_trial_child(self.spec, host, base_env, self.spec_path, self.result_path, timeout_s)
        with open_trial_output(self.err_path) as err:
            self.proc = start_child(argv, death_signal=signal.SIGKILL, nofile=nofile, env=env,
                                    stdout=child_stdout(self.spec, err), stderr=err, pass_fds=(self.control_r, self.event_w))
        guard.hold(self.proc.pid)
        self._close_child_ends()  # the child holds them now: its end of the event pipe closes when it dies

    def _close_child_ends(self) -> None:
        for fd in (self.control_r, self.event_w):
            if fd is not None:
                os.close(fd)
        self.control_r = self.event_w = None

    def next_event(self, deadline: float) -> GateEvent | None:
        """The next gate this arm reports, None when it ended first or `deadline` (monotonic) passed."""
        while b"\n" not in self._buffer:
            if self.proc.poll() is not None or time.monotonic() >= deadline:
                return None
            ready, _, _ = select.select([self.event_r], [], [], _POLL_S)
            if ready:
                chunk = os.read(self.event_r, 4096)
                if not chunk:  # every writer closed: the arm's processes are gone
                    self.proc.wait()
                    return None
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        event = GateEvent.from_line(line)
        self.events.append(event)
        return event

    def await_gate(self, kind: str, deadline: float) -> GateEvent | None:
        """Wait until this arm reports gate `kind` and is stopped; its event (None: it ended or time ran out)."""
        event = self.next_event(deadline)
        if event is None or event.event != kind:
            return None
        return event if wait_stopped(self.proc, min(deadline, time.monotonic() + _STOP_WAIT_S)) else None

    def resume(self, command: str) -> None:
        os.write(self.control_w, f"{command}\n".encode())
        signal_group(self.proc.pid, signal.SIGCONT)

    @property
    def keepable(self) -> bool:
        """Stopped at a gate, and able to report its windows and go on with another comparison."""
        last = self.events[-1] if self.events else None
        return (self.proc is not None and self.proc.poll() is None and last is not None and last.keepable
                and last.event in (READY, WINDOW, REPORTED))

    @property
    def measured(self) -> bool:
        """It stopped after a measured window (not at a gate before any, or at its last report)."""
        return bool(self.events) and self.events[-1].event == WINDOW

    def report(self, deadline: float) -> TrialResult | None:
        """Ask a `keepable` arm that `measured` for the result of its windows since its last report; it then
        waits, stopped, for its next comparison. None: it did not stop at its report (it ended, or the
        deadline passed)."""
        self.resume(REPORT)
        if self.await_gate(REPORTED, deadline) is None or not self.result_path.exists():
            return None
        result = read_trial_result(self.spec, self.result_path, self.err_path, 0, 0.0)
        self.result_path.unlink()  # a later ending without a result must not read this one
        return result

    def join(self, name: str) -> Arm:
        """Take part in a new comparison as arm `name`: its events and other load are that comparison's."""
        self.name, self.events, self.kept = name, [], False
        self.load_cpu_s = self.load_wall_s = 0.0
        return self

    def dispose(self, guard: StoppedGroupGuard) -> None:
        """End what is left of the arm's tree (a stopped group is continued so it can act on SIGTERM), close
        its pipes and remove its folder; nothing when an `KeptArms` holds it now."""
        if self.kept:
            return
        if self.proc is not None:
            signal_group(self.proc.pid, signal.SIGTERM)
            signal_group(self.proc.pid, signal.SIGCONT)
            stop_tree(self.proc, _KILL_GRACE_S)
            guard.release(self.proc.pid)
            self.proc = None
        self._close_child_ends()
        for fd in (self.control_w, self.event_r):
            if fd is not None:
                os.close(fd)
        self.control_w = self.event_r = None
        self._folder.close()

    @property
    def other_load(self) -> float | None:
        return self.load_cpu_s / self.load_wall_s if self.load_wall_s > 0 else None


class KeptArms:
    """Keeps the arms of a comparison, stopped, for the next one (a tune's comparisons: the incumbent of one
    is the reference of the next; a candidate compared again is the same candidate).

    An arm is taken back when the next comparison asks for the same process: the same trial spec but for
    its time cap and its gate, and the guard steps it ran when the new role needs them (a reference needs
    none). Its start-up, guard steps and warm-up are then not spent again, and no process is started for
    it. At most `capacity` processes are held, the comparison's own two included: before anything starts,
    the arms it does not take are ended, the least recently used first, down to `capacity - 2` (the
    default 3 keeps the candidate before the last one, which greedy compares again once a knob's values
    are all in), besides one arm for each spec `hold` names (a tune's defaults, which its final
    comparison measures again): that one is ended only when memory is short (`keep_only`) or at the
    end. Use it as a context manager around the comparisons
    (`run_pair(..., kept_arms=)`): on the way out, however it is left, every kept arm is ended, and its
    `process.StoppedGroupGuard` SIGKILLs them should torchpace itself be killed meanwhile.

    Only arms that can report (a workload's training step, measured in turns: `Gate.reporter`) are kept: a
    script runs to its own end, and an inference workload measures a figure once, alone, after its turns
    (batch-1 latency, or under the latency objective its throughput).
    """

    def __init__(self, capacity: int = 3):
        self.capacity = max(2, capacity)
        self._arms: list[Arm] = []  # the least recently used first
        self._held: list[TrialSpec] = []  # specs an arm is kept for beyond the capacity
        self._stack = contextlib.ExitStack()
        self.guard: StoppedGroupGuard | None = None

    def __enter__(self) -> KeptArms:
        self.guard = self._stack.enter_context(StoppedGroupGuard())
        self._stack.callback(self.release)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    @property
    def pids(self) -> list[int]:
        """The processes held, stopped, for the next comparison."""
        return [arm.proc.pid for arm in self._arms]

    def take(self, specs: Sequence[TrialSpec]) -> list[Arm | None]:
        """The kept arm of each spec (None: a process must be started for it); of the arms not taken, the
        least recently used are ended down to `capacity - 2`."""
        taken = self._match(specs)
        for arm in taken:
            if arm is not None:
                self._arms.remove(arm)
        held = {id(arm) for arm in self._match(self._held) if arm is not None}
        spare = [arm for arm in self._arms if id(arm) not in held]
        self._release(spare[:max(0, len(spare) - (self.capacity - 2))])
        return taken

    def hold(self, spec: TrialSpec) -> None:
        """Keep an arm that serves `spec` beyond the capacity, for a comparison that comes later (a tune's
        final one measures the defaults of its first one again): `keep_only` and the end still end it."""
        if not any(same_process(held, spec) for held in self._held):
            self._held.append(spec)

    def end_serving(self, spec: TrialSpec) -> int:
        """End every arm held that runs `spec`'s config (whatever guard steps it ran), so that a comparison
        measures it in a fresh process (a tune's final one: the process a decision kept was more likely a fast
        one); the arms ended."""
        serving = [arm for arm in self._arms if same_process(arm.spec, replace(spec, guard_steps=0))]
        self._release(serving)
        return len(serving)

    def reusable(self, specs: Sequence[TrialSpec]) -> int:
        """How many of `specs` a kept arm would serve (see `take`)."""
        return sum(arm is not None for arm in self._match(specs))

    def keep_only(self, specs: Sequence[TrialSpec]) -> int:
        """End every arm held that would not serve one of `specs` (their memory is needed); the arms ended."""
        serving = {id(arm) for arm in self._match(specs) if arm is not None}
        spare = [arm for arm in self._arms if id(arm) not in serving]
        self._release(spare)
        return len(spare)

    def _match(self, specs: Sequence[TrialSpec]) -> list[Arm | None]:
        taken: list[Arm | None] = [None] * len(specs)
        for i in sorted(range(len(specs)), key=lambda i: -specs[i].guard_steps):  # the roles that need guard steps first
            taken[i] = next((arm for arm in reversed(self._arms)  # the most recently used first
                             if arm not in taken and same_process(arm.spec, specs[i])), None)
        return taken

    def keep(self, arm: Arm) -> None:
        arm.kept = True
        self._arms.append(arm)

    def release(self) -> None:
        """End every arm held."""
        self._release(list(self._arms))

    def _release(self, arms: Sequence[Arm]) -> None:
        for arm in arms:
            self._arms.remove(arm)
            arm.kept = False
            arm.dispose(self.guard)


def same_process(kept: TrialSpec, wanted: TrialSpec) -> bool:
    """A kept arm's process serves `wanted`: the same spec but for the time cap and gate, with the guard
    steps the role needs (none, or the ones it ran)."""
    ignored = {"gate": None, "max_time_s": 0.0, "guard_steps": 0, "compute_only": False}
    return replace(kept, **ignored) == replace(wanted, **ignored) and wanted.guard_steps in (0, kept.guard_steps)


def wait_stopped(proc, deadline: float) -> bool:
    """True once `proc` is stopped (state T); False when it ended or `deadline` passed."""
    try:
        process = psutil.Process(proc.pid)
        while time.monotonic() < deadline:
            if process.status() == psutil.STATUS_STOPPED:
                return True
            if proc.poll() is not None:
                return False
            time.sleep(0.001)
    except psutil.Error:
        return False
    return False


class LoadMeter:
    """Other processes' CPU seconds between turns, read while both arms are stopped."""

    def __init__(self):
        self._probe = probe_cpu_times
        self._last = probe_cpu_times()

    def charge(self, arm: Arm) -> None:
        """The load since the last reading counts for `arm`, whose turn it was."""
        now = self._probe()
        cores = other_load_cores(self._last, now)
        if cores is not None:
            wall_s = now.at_s - self._last.at_s
            arm.load_cpu_s += cores * wall_s
            arm.load_wall_s += wall_s
        self._last = now


def arm_label(arm: Arm) -> str:
    return f"arm {arm.name.upper()} ({config_label(arm.spec.config, bool(arm.spec.command))})"


def stderr_tail(path: Path, size: int = 4000) -> str:
    data = path.read_bytes() if path.exists() else b""
    return data[-size:].decode(errors="replace")
