"""The measurement state inside an unmodified script's process (`ScriptProbe`): the events the hooks of
`torchpace.script.hook` report (optimizer built and stepped, backward, DataLoader batches) become
steps, samples, input wait and losses, fed to the Workload bench's `WindowMeter`; the result is
written for the parent, and the process ends when the measurement is done.

Everything it depends on is passed in: the spec, the process's `HookReport` (what the config's knobs
did, and the compile the meter waits for), the clock and the call that ends the process
(`torchpace.script.ending.end_script` in a script: its own clean-up runs, within a bound; a test passes a
scripted clock and an exit that records, as the meter's tests do).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from collections import deque
from typing import Any

from torchpace.engine.batch import batch_len
from torchpace.files import OutputWriteFailed, write_atomic
from torchpace.measure.bench import WARMUP_SHARE, BenchOptions, build_script_bench
from torchpace.measure.contention import other_load_cores, probe_cpu_times
from torchpace.measure.gate import Gate
from torchpace.measure.timing import WindowMeter
from torchpace.process import owner_pid
from torchpace.protocol import CRASH, INVALID, NONFINITE, OK, TIMEOUT, TrialResult, is_nonfinite
from torchpace.script.inprocess import HookReport
from torchpace.script.ending import end_script
from torchpace.script.knobs import unreached_knobs
from torchpace.script.spec import (NO_STEP_MESSAGE, OWN_FAILURE, OWN_FAILURE_EXIT, OWN_FAILURE_LINE, STEPS_SUFFIX,
                                   ScriptMeasure)

_MIN_WINDOWS_IF_ENDED = 2  # a script that ends first must leave at least this many measured windows
# A script that stops stepping (a deadlock, a hung read, waiting on input) is not waited for without bound:
_STALL_MIN_S = 30.0  # no step for this long (and _STALL_FACTOR times its longest step) ends it as stalled
_STALL_FACTOR = 5.0
_CAP_GRACE_S = 2.0  # past the measurement's time cap, a step this late (and 3x its longest) ends the measurement
_WATCH_S = 0.25  # how often the stall watchdog looks


class ScriptProbe:
    """The measurement state inside the script's process (one per process)."""

    label_phases = False  # profile mode: record_function labels around the script's phases

    def __init__(self, spec: ScriptMeasure, report: HookReport, clock=time.perf_counter, exit=end_script):
        self.gate = Gate.open(spec.gate)  # a paired comparison: the meter takes turns on the gate's clock
        self.spec, self.clock = spec, self.gate.clock if self.gate else clock
        self.report, self._exit = report, exit
        self.started_s = clock()
        self.meter = None
        self.meter_started_s = 0.0
        self.steps = 0
        self.optimizer_built = False
        self.lead_optimizer: int | None = None
        self.step_losses: list = []
        self.losses: list = []
        self.backwards_per_step: list[int] = []
        self.fetched: deque[int] = deque()  # sizes of the batches read and not yet counted in a step
        self.batches_seen = 0
        self.last_step_samples: int | None = None
        self.wait_s = 0.0
        self._wait_mark = 0.0
        self.measured_wait_s = 0.0
        self.samples_known = False
        self.device = None
        self.finished = False
        self.last_step_at: float | None = None
        self.longest_step_s = 0.0  # the longest gap between two steps after the first
        self.ended_how = "script-ended"  # "script-stalled", or "time" (the cap): why it ended before the meter did
        self.compiles = CompileTime(self.clock)  # time spent inside torch.compile (never a stall)
        self._compiled_at_step = 0.0  # `compiles.total_s()` when the last step ended
        self._steps_fd: int | None = None
        self._failed_own = False
        self._lock = threading.Lock()

    # ---- events from the script ----------------------------------------------------------------
    def on_optimizer_built(self) -> None:
        self.optimizer_built = True

    def on_optimizer_step(self, optimizer: Any) -> None:
        if self.lead_optimizer is None:
            self.lead_optimizer = id(optimizer)
            self.report.note_script_settings(optimizer)  # the script's own optimizer arguments: the baseline's
        if id(optimizer) == self.lead_optimizer:
            self.on_step()

    def on_backward(self, tensors: Any) -> None:
        loss = _loss_tensor(tensors)
        if loss is not None:
            self.step_losses.append(loss)
        if not self.optimizer_built:
            self.on_step()

    def on_batch(self, batch: Any, waited_s: float, loader_iter: Any = None) -> None:
        if not self.batches_seen and loader_iter is not None:  # the first loader read: its own settings, the baseline's
            self.report.note_script_settings(loader_iter)
        self.wait_s += waited_s
        try:
            size = batch_len(batch)
        except ValueError:  # no tensor with a batch dimension: the samples stay unknown
            return
        self.fetched.append(size)
        self.batches_seen += 1

    def note_step(self) -> None:
        """Count a step: its gap (for the stall watchdog, less the time it spent compiling) and the steps file
        the parent reads when the script ends without letting the hook write its result (`os._exit`)."""
        now = self.clock()
        compiled_s = self.compiles.total_s()
        if self.last_step_at is not None and self.steps > 1:
            self.longest_step_s = max(self.longest_step_s, now - self.last_step_at - (compiled_s - self._compiled_at_step))
        self.last_step_at, self._compiled_at_step = now, compiled_s
        try:
            if self._steps_fd is None:
                self._steps_fd = os.open(self.spec.result_path + STEPS_SUFFIX, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.pwrite(self._steps_fd, f"{self.steps:<12d}".encode(), 0)
        except OSError:
            pass  # only a better message is lost

    def on_step(self) -> None:
        """One step of the script ended: feed the meter; finish when it is done."""
        if self.finished:
            return
        self._close_step_loss()
        self.steps += 1
        self.note_step()
        samples = self.step_samples()
        if self.meter is None:
            if not self.compile_pending():
                self._start_meter()
            return
        measured = len(self.meter.windows)
        window = self.meter.record(samples if self.samples_known else 1)
        if window is not None:
            if len(self.meter.windows) > measured:  # a measured window, not a warm-up one
                self.measured_wait_s += self.wait_s - self._wait_mark
            self._wait_mark = self.wait_s
        if self.meter.done and self.steps >= self.spec.guard_steps:  # the guard compares this many first losses
            self.finish(ended_early=False)

    def compile_pending(self) -> bool:
        """True while `compile.mode` is still compiling the script's model (the meter and the profiler wait);
        a model that could not be compiled, or none to compile, ends the trial as `invalid` at once."""
        compiled = self.report.compiled
        if compiled is None or not compiled.triggered:
            return compiled is not None
        if compiled.failure or not compiled.modules:
            self.finish_invalid(f"{compiled.knob_name}: " + (compiled.failure or "never took effect in the script: it "
                                                             "called no module with trainable parameters before its first backward()"))
        return not compiled.warm

    def finish_invalid(self, why: str) -> None:
        """A knob of the config cannot run in this script: write an `invalid` result and end the process."""
        if not self.claim_end():
            return
        write_result(TrialResult(INVALID, error=why, wall_time_s=self.clock() - self.started_s), self.spec.result_path)
        self.end()

    def fail_own(self, exc: BaseException) -> None:
        """torchpace's own hook raised `exc` inside the script's process: a `crash` result that names it as
        torchpace's failure (its traceback also on stderr, in the script's output log), then the process
        ends; where even the result cannot be written, the exit status `OWN_FAILURE_EXIT` with the line
        `OWN_FAILURE_LINE` on stderr say it. The script's own exceptions never come here: they are its crash."""
        with self._lock:
            if self._failed_own:
                return
            self._failed_own = self.finished = True
        sys.stderr.write(f"{OWN_FAILURE_LINE}\n{''.join(traceback.format_exception(exc))}")
        status = 0
        if not os.path.exists(self.spec.result_path):  # a result already written stands
            try:
                write_result(TrialResult(CRASH, wall_time_s=self.clock() - self.started_s, error=(
                    f"{OWN_FAILURE}: {type(exc).__name__}: {exc} (please report it, with the traceback in the "
                    "script's output)")), self.spec.result_path)
            except OutputWriteFailed:
                status = OWN_FAILURE_EXIT
        self.end(status)

    def step_samples(self) -> int:
        """The samples of the step that just ended (after `_close_step_loss`): the batches its backward
        passes consumed, one batch each, in the order they were read.

        A loader wrapper may read one batch ahead of the script to know where an epoch ends (accelerate's
        `DataLoaderShard`, under every Hugging Face Trainer, does): the batches read since the last step are
        then one more than the step used at an epoch's first step and one fewer at its last. Counted as
        read, a window that held one of those steps and not the other was off by a batch. One batch read
        ahead is carried to the next step; more than that (batches with no backward of their own:
        validation, a second loader) is counted in this step, as is every batch of a step without a
        backward the probe saw."""
        backwards = self.backwards_per_step[-1] if self.backwards_per_step else 0
        read = len(self.fetched)
        take = read if not backwards else min(read, max(backwards, read - 1))
        samples = sum(self.fetched.popleft() for _ in range(take))
        if self.spec.samples_per_step:
            samples = self.spec.samples_per_step
        if samples:
            self.last_step_samples = samples
        return samples

    def _close_step_loss(self) -> None:
        import torch

        self.backwards_per_step.append(len(self.step_losses))
        if self.step_losses:
            losses, self.step_losses = self.step_losses, []
            loss = losses[0] if len(losses) == 1 else torch.stack([l.float() for l in losses]).mean()
            self.losses.append(loss)
            self.device = loss.device

    def _start_meter(self) -> None:
        """The first step ended: timing starts now (that step held start-up and compile)."""
        self.samples_known = bool(self.spec.samples_per_step) or self.batches_seen > 0
        # other processes' CPU time from here to the result; this script's own tree is the parent's
        # (the bench or tune process that started it), as for a Workload trial
        self._cpu_before = probe_cpu_times(owner_pid())
        options = BenchOptions(max_time_s=self.spec.max_time_s, target_ci_rel=self.spec.target_ci_rel,
                               warmup_s=self.spec.warmup_s)
        now = self.meter_started_s = self.clock()
        self.meter = WindowMeter(self.clock, self._sync, options.timing(WARMUP_SHARE), now + WARMUP_SHARE * options.max_time_s,
                                 now + options.max_time_s, gate=self.gate)
        self.meter.start()
        self._wait_mark = self.wait_s

    def _sync(self) -> None:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    # ---- the end --------------------------------------------------------------------------------
    def finish(self, ended_early: bool) -> None:
        """Write the result; end the process unless the script is already exiting by itself."""
        if not self.claim_end():
            return
        write_result(self.build_result(ended_early), self.spec.result_path)
        if not ended_early:
            self.end()

    def on_no_step(self) -> None:
        """The watchdog: no step after `no_step_timeout_s` ends the script with a `timeout` result."""
        if self.steps or not self.claim_end():
            return
        waited = self.spec.no_step_timeout_s
        write_result(TrialResult(TIMEOUT, error=f"{NO_STEP_MESSAGE} (waited {waited:.0f} s after `import torch`)",
                                 wall_time_s=self.clock() - self.started_s), self.spec.result_path)
        self.end()

    def watch_for_stalls(self) -> None:
        """Start the stall watchdog (a daemon thread): see `check_stall`."""
        def watch() -> None:
            while not self.finished:
                time.sleep(_WATCH_S)
                self.check_stall()

        threading.Thread(target=watch, name="torchpace-stall-watchdog", daemon=True).start()

    # ---- compiling ------------------------------------------------------------------------------------
    def on_compile_start(self, *args: Any) -> None:
        """torch.compile began compiling (dynamo traces a frame, or a backward compiled when first called)."""
        self.compiles.start()

    def on_compile_end(self, *args: Any) -> None:
        self.compiles.end()

    def compiling_for(self, now: float) -> float | None:
        """Seconds the compile under way has run (None when none is): torch's own compile events, or, with
        `compile.mode`, the time since the first step until a backward() completed after the first compiled
        forward (the model compiled in place after the first backward(); torch reports no event for a lazily
        compiled backward on every version)."""
        since = self.compiles.since
        compiled = self.report.compiled
        if compiled is not None and compiled.triggered and compiled.modules and not compiled.warm and not compiled.failure \
                and self.last_step_at is not None:
            since = self.last_step_at if since is None else min(since, self.last_step_at)
        return None if since is None else now - since

    @property
    def compile_limit_s(self) -> float:
        """How long one compile is waited for: the trial's compile allowance, at least the stall floor."""
        return max(_STALL_MIN_S, self.spec.compile_allowance_s)

    def check_stall(self) -> None:
        """End the measurement when the script stopped stepping: no step for `_STALL_MIN_S` (and
        `_STALL_FACTOR` times its longest step), a stall; or, past the time cap, none for `_CAP_GRACE_S` (and 3x
        its longest step, once one is known: `past_cap`), the cap's end. A stall is bounded by the time cap,
        never by the parent's kill.

        Time spent compiling is no gap (`CompileTime`, `compiling_for`): a compile is waited for within the
        trial's compile allowance (`compile_limit_s`), and one that runs longer ends the script as stalled while
        compiling."""
        if self.finished or self.last_step_at is None:
            return
        now = self.clock()
        compiling_s = self.compiling_for(now)
        if compiling_s is not None:
            if compiling_s >= self.compile_limit_s:
                self.on_stall(now - self.last_step_at, compiling_s)
            return
        gap = now - self.last_step_at - (self.compiles.total_s() - self._compiled_at_step)
        if gap >= max(_STALL_MIN_S, _STALL_FACTOR * self.longest_step_s):
            self.on_stall(gap)
        elif self.past_cap(now, gap):
            self.on_cap(gap)

    def past_cap(self, now: float, gap_s: float) -> bool:
        """Past the measurement's time cap, no step for `_CAP_GRACE_S` and 3x the longest step: the cap ends the
        measurement with its windows (a script past its last step is often ending: evaluating, saving). Not before
        a step time is known: after the first step a slow step (a short script's, on a busy host) is waited for;
        nor in a paired comparison, whose turns the parent ends (its own clock runs only in its turns)."""
        return (self.meter is not None and self.meter.gate is None and self.longest_step_s > 0
                and now >= self.meter.deadline and gap_s >= max(_CAP_GRACE_S, 3 * self.longest_step_s))

    def on_cap(self, gap_s: float) -> None:
        """The time cap passed and the script made no step for `gap_s`: the windows measured, as the cap's (a
        `timeout` saying the steps are slower than the cap allows when there are too few)."""
        if not self.claim_end():
            return
        self.ended_how = "time"
        result = self.build_result(ended_early=True)
        if not result.ok:
            windows = len(self.meter.windows) if self.meter else 0
            result = TrialResult(TIMEOUT, guard_losses=result.guard_losses, wall_time_s=result.wall_time_s, error=(
                f"the script made no step for {gap_s:.0f} s after step {self.steps}, past the measurement's time cap "
                f"(its longest step took {self.longest_step_s:.2g} s: it stalled, or it was ending, evaluating or "
                f"saving); {windows} window(s) were measured, at least {_MIN_WINDOWS_IF_ENDED} are needed"))
        write_result(result, self.spec.result_path)
        self.end()

    def stall_text(self, gap_s: float, compiling_s: float | None) -> str:
        """Why the script is ended as stalled: no step for `gap_s`, or a compile that ran `compiling_s`."""
        if compiling_s is None:
            return f"the script made no step for {gap_s:.0f} s after step {self.steps}"
        compiled = self.report.compiled
        what = f"torch.compile ({compiled.knob_name} = {compiled.mode})" if compiled is not None else "torch.compile"
        return (f"the script was compiling for {compiling_s:.0f} s after step {self.steps} ({what}) without finishing, "
                f"past the trial's compile allowance of {self.compile_limit_s:.0f} s (a compile that hangs, or a model "
                "that takes longer than that to compile)")

    def on_stall(self, gap_s: float, compiling_s: float | None = None) -> None:
        """The script made no step for `gap_s` (or compiled for `compiling_s`): what was measured (enough
        windows) or a `timeout` naming the stall."""
        if not self.claim_end():
            return
        self.ended_how = "script-stalled"
        result = self.build_result(ended_early=True)
        if not result.ok:
            why = "" if compiling_s is not None else \
                " (it stalled: a deadlock, a hung read, or one step slower than --max-time allows)"
            result = TrialResult(TIMEOUT, guard_losses=result.guard_losses, wall_time_s=result.wall_time_s, error=(
                f"{self.stall_text(gap_s, compiling_s)}{why}; {len(self.meter.windows) if self.meter else 0} "
                f"window(s) were measured, at least {_MIN_WINDOWS_IF_ENDED} are needed"))
        write_result(result, self.spec.result_path)
        self.end()

    def build_result(self, ended_early: bool) -> TrialResult:
        """The trial result of what was measured (a failure when nothing usable was)."""
        wall_s = self.clock() - self.started_s
        losses = _read_losses(self.losses)
        guard = losses[: self.spec.guard_steps]
        windows = len(self.meter.windows) if self.meter is not None else 0
        if self.steps == 0:
            return TrialResult(CRASH, error=f"the script ended without a step: {NO_STEP_MESSAGE}", wall_time_s=wall_s)
        unreached = unreached_knobs(self.report.config, self.report.reached, self.report.not_applied)
        if unreached:  # the config could not run in this script: that is the verdict, however far it got
            return TrialResult(INVALID, guard_losses=guard, wall_time_s=wall_s,
                               error="; ".join(f"{knob}: {why}" for knob, why in unreached.items()))
        ended_after = None
        if ended_early and self.ended_how != "time":  # how long the script ran once timing started: a trial can be sized to fit it
            ran_s = self.clock() - self.meter_started_s if self.meter is not None else 0.0
            ended_after = {"steps": self.steps, "seconds": ran_s, "windows": windows}
        if ended_early and windows < _MIN_WINDOWS_IF_ENDED and ended_after is None:  # the cap's: `on_cap` says why
            return TrialResult(CRASH, guard_losses=guard, wall_time_s=wall_s, error="too few windows before the time cap")
        if ended_early and windows < _MIN_WINDOWS_IF_ENDED:
            return TrialResult(CRASH, guard_losses=guard, wall_time_s=wall_s, ended_after=ended_after, error=(
                f"the script ended after {self.steps} step(s), {ended_after['seconds']:.1f} s after its first one, "
                f"before torchpace had measured enough ({windows} window(s); at least {_MIN_WINDOWS_IF_ENDED} needed "
                "after warm-up): let it run longer (more steps or epochs), or measure for less time"))
        bench = self._bench(losses, ended_early, wall_s, self.report.to_dict())
        status = NONFINITE if is_nonfinite(losses) else OK
        error = "loss became NaN/Inf while measuring" if status == NONFINITE else ""
        return TrialResult(status, bench, guard, error=error, wall_time_s=wall_s, ended_after=ended_after)

    def _bench(self, losses: list[float], ended_early: bool, wall_s: float, hook: dict) -> dict[str, Any]:
        load = other_load_cores(self._cpu_before, probe_cpu_times(owner_pid()))
        real = self.meter.result(self.ended_how if ended_early else None)
        per_step = sorted(n for n in self.backwards_per_step if n)
        script = {"command": list(self.spec.command), "steps_seen": self.steps,
                  "ended_early": ended_early and self.ended_how != "time",
                  "step_source": "optimizer" if self.optimizer_built else "backward",
                  "samples_source": ("--samples-per-step" if self.spec.samples_per_step else
                                     "dataloader" if self.samples_known else None), **hook}
        return build_script_bench(
            real, samples_known=self.samples_known, device=self.device, losses=losses, wall_s=wall_s,
            measured_wait_s=self.measured_wait_s if self.batches_seen else None, batch_size=self.last_step_samples if self.samples_known else None,
            backwards_per_step=per_step[len(per_step) // 2] if per_step else 1, script=script, other_load_cores=load)

    def on_exit(self) -> None:
        """atexit: the script finished before the measurement did."""
        if not self.finished:
            self.finish(ended_early=True)

    def claim_end(self) -> bool:
        """True for the one caller that ends the measurement (the script's steps, the watchdogs and the exit
        handler race for it); False once another did."""
        with self._lock:
            if self.finished:
                return False
            self.finished = True
            return True

    def script_raised(self) -> None:
        """The script's own uncaught exception: its crash, so no partial result is written for it."""
        with self._lock:
            self.finished = True

    def end(self, status: int = 0) -> None:
        """End the script now, with exit `status`: flush what it printed; its own clean-up (`finally`, `with`,
        `atexit`) runs within a bound (`torchpace.script.ending`), and the parent ends what is left of its tree."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed or broken pipe: nothing left to say
                continue
        self._exit(status)


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


def _loss_tensor(tensors: Any):
    """The scalar tensor `backward()` was called on (the first one of a sequence), detached; else None."""
    import torch

    first = tensors[0] if isinstance(tensors, (list, tuple)) and tensors else tensors
    if isinstance(first, torch.Tensor) and first.numel() == 1:
        return first.detach().reshape(())
    return None


def _read_losses(losses: list) -> list[float]:
    """All step losses as floats, read from the device once."""
    import torch

    if not losses:
        return []
    return [float(v) for v in torch.stack([l.float().to(losses[0].device) for l in losses]).tolist()]


def write_result(result: TrialResult, path: str) -> None:
    """Write the trial result atomically (the parent reads it after the process ends)."""
    write_atomic(path, json.dumps(result.to_dict()))
