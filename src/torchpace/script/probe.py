"""The measurement inside an unmodified script's process (`ScriptProbe`): the events the hooks of
`torchpace.script.hook` report become steps (`torchpace.script.events`), fed to the Workload bench's
`WindowMeter`; the result is written for the parent, and the process ends when the measurement is done.

Which process measures is decided at its first step (`ScriptProbe.role`), since a script may start its own
processes and any of them may be the one that trains:

- a process whose script initialised a torch.distributed group of 2 or more ranks is a *rank* of a job
  (a launcher's, or ranks the script spawned itself): every rank measures the job together, agreed at each
  window's end (`torchpace.script.job`), and rank 0 writes the result;
- a process that trains without such a group measures *alone* if it is the first to (it claims RESULT.claim;
  `torchpace launch`'s usual single process), and a launcher's rank that trains without a group is refused,
  since its ranks would each train alone;
- any other process (a second one that trains alone, a DataLoader worker, a helper) is a *bystander*: it never
  measures nor writes.

Everything it depends on is passed in: the spec, the process's `HookReport` (what the config's knobs did,
and the compile the meter waits for), the clock and the call that ends the process
(`torchpace.script.ending.end_script` in a script: its own clean-up runs, within a bound; a test passes a
scripted clock and an exit that records, as the meter's tests do). The stall rules are
`torchpace.script.watch`'s.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from typing import Any

from torchpace.files import OutputWriteFailed, write_atomic
from torchpace.measure.bench import WARMUP_SHARE, BenchOptions, build_script_bench
from torchpace.measure.contention import other_load_cores, probe_cpu_times
from torchpace.measure.gate import Gate
from torchpace.measure.memory import read_peak_memory
from torchpace.measure.timing import WindowMeter
from torchpace.process import owner_pid
from torchpace.protocol import CRASH, GUARD, INVALID, NONFINITE, OK, TIMEOUT, TrialResult, is_nonfinite
from torchpace.script.ending import end_script
from torchpace.script.events import StepEvents, read_losses
from torchpace.script.inprocess import HookReport
from torchpace.script.job import JobBroken, JobRanks, find_job, launcher_world, replica_fingerprint, replicas_disagree, \
    write_rank_failure
from torchpace.script.knobs import unreached_knobs
from torchpace.script.spec import (CLAIM_SUFFIX, NO_STEP_MESSAGE, OWN_FAILURE, OWN_FAILURE_EXIT, OWN_FAILURE_LINE,
                                   STEPS_SUFFIX, ScriptMeasure)
from torchpace.script.watch import CAP_GRACE_S, WATCH_S, CompileTime, StepWatch, Stopped

_MIN_WINDOWS_IF_ENDED = 2  # a script that ends first must leave at least this many measured windows

UNDECIDED, ALONE, RANK, BYSTANDER = "undecided", "alone", "rank", "bystander"  # `ScriptProbe.role`
SEPARATE_RUNS = ("the script runs {world} ranks, which take turns with another config only as one job: the "
                 "comparison goes on in separate runs")


class ScriptProbe:
    """The measurement state inside the script's process (one per process)."""

    label_phases = False  # profile mode: record_function labels around the script's phases

    def __init__(self, spec: ScriptMeasure, report: HookReport, clock=time.perf_counter, exit=end_script):
        self.gate = Gate.open(spec.gate)  # a paired comparison: the meter takes turns on the gate's clock
        self.spec, self.clock = spec, self.gate.clock if self.gate else clock
        self.report, self._exit = report, exit
        self.started_s = clock()
        self.events = StepEvents(spec.samples_per_step, report)
        self.watch = StepWatch(self.clock, None, spec.compile_allowance_s)
        self.role = UNDECIDED
        self.job: JobRanks | None = None
        self.meter = None
        self.meter_started_s = 0.0
        self.measured_wait_s = 0.0
        self._wait_mark = self._agreed_wait = self._agreed_backward = 0.0
        self._agreed_losses = 0  # losses sent to the other ranks so far
        self.finished = False
        self.ended_how = "script-ended"  # "script-stalled", or "time" (the cap): why it ended before the meter did
        self._failed_own = False
        self._lock = threading.Lock()

    # ---- what the tests and the profiler read --------------------------------------------------------
    @property
    def steps(self) -> int:
        return self.events.steps

    @property
    def last_step_samples(self) -> int | None:
        return self.events.last_step_samples

    @property
    def device(self):
        return self.events.device

    @property
    def compiles(self) -> CompileTime:
        return self.watch.compiles

    @property
    def longest_step_s(self) -> float:
        return self.watch.longest_step_s

    @property
    def last_step_at(self) -> float | None:
        return self.watch.last_step_at

    @property
    def measuring(self) -> bool:
        """This process measures (alone, or as a rank of the job)."""
        return self.role in (ALONE, RANK)

    @property
    def writes_result(self) -> bool:
        """This process writes the trial's result: it measures alone, or it is the job's rank 0."""
        return self.role == ALONE or (self.role == RANK and (self.job is None or self.job.is_leader))

    # ---- events from the script ----------------------------------------------------------------
    def on_optimizer_built(self) -> None:
        self.events.on_optimizer_built()

    def on_optimizer_step(self, optimizer: Any) -> None:
        if self.events.on_optimizer_step(optimizer):
            self.on_step()

    def on_backward(self, tensors: Any, took_s: float = 0.0) -> None:
        if self.events.on_backward(tensors, took_s):
            self.on_step()

    def on_batch(self, batch: Any, waited_s: float, loader_iter: Any = None) -> None:
        self.events.on_batch(batch, waited_s, loader_iter)

    def on_step(self) -> None:
        """One step of the script ended: feed the meter; finish when it is done."""
        if self.finished or self.role == BYSTANDER:
            return
        samples = self.events.close_step()
        if self.role == UNDECIDED and not self.take_role():
            return
        self.watch.note_step(self.steps)
        if self.meter is None:
            if self._ready_to_measure():
                self._start_meter()
            return
        measured = len(self.meter.windows)
        window = self.meter.record(samples if self.events.samples_known else 1)
        if window is not None:
            if len(self.meter.windows) > measured:  # a measured window, not a warm-up one
                self.measured_wait_s += self.events.wait_s - self._wait_mark
                if self.job is not None:
                    self.job.mark_measured()
            self._wait_mark = self.events.wait_s
        if self.meter.done and self.steps >= self.spec.guard_steps:  # the guard compares this many first losses
            self.finish(ended_early=False)

    # ---- which process measures -----------------------------------------------------------------------
    def take_role(self) -> bool:
        """At this process's first step: measure alone, as a rank of the job, or not at all (see the module
        docstring). Returns whether it measures; a job asked to take turns, or a launcher's rank without a
        process group, ends the trial with its result instead."""
        place = find_job()
        if place is not None:
            self.role = RANK
            if self.spec.gate is not None or self.spec.in_turns:
                return self._refuse_turns(place.rank, place.world_size)
            try:
                self.job = JobRanks(place, self.clock, self.spec.result_path)
            except JobBroken as err:
                self._job_failed(err)
                return False
            self._start_watching(steps_file=self.job.is_leader)
            return True
        launched = launcher_world()
        if launched is not None:
            rank, world = launched
            self.role = RANK if rank == 0 else BYSTANDER
            if rank == 0 and self.claim_end():
                write_result(TrialResult(INVALID, wall_time_s=self.clock() - self.started_s, ranks=world, error=(
                    f"the launcher started {world} processes, and rank 0 trained its first step without a "
                    "torch.distributed process group: each rank would train alone; initialise one "
                    "(torch.distributed.init_process_group) before training, or run one process")), self.spec.result_path)
                self.end()
            return False
        if not self._claim():
            self.role = BYSTANDER
            return False
        self.role = ALONE
        self._start_watching(steps_file=True)
        return True

    def _claim(self) -> bool:
        """Claim the measurement for this process (the first process of the script's tree that trains alone)."""
        try:
            fd = os.open(self.spec.result_path + CLAIM_SUFFIX, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        except OSError:
            return not self.spec.descendant  # no claim file can be made: the process torchpace started measures
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        return True

    def _start_watching(self, steps_file: bool) -> None:
        """Keep the steps file the parent reads (when this process writes the result), and watch for stalls."""
        if steps_file:
            self.watch.steps_path = self.spec.result_path + STEPS_SUFFIX
            self.watch_for_stalls()

    def _refuse_turns(self, rank: int, world: int) -> bool:
        """A job of several ranks was asked to take turns: rank 0 says so (the comparison goes on in separate
        runs) and every rank ends."""
        if rank == 0 and self.claim_end():
            write_result(TrialResult(CRASH, wall_time_s=self.clock() - self.started_s, ranks=world,
                                     error=SEPARATE_RUNS.format(world=world),
                                     separate_runs=SEPARATE_RUNS.format(world=world)), self.spec.result_path)
        self.finished = True
        self.end()
        return False

    # ---- the meter --------------------------------------------------------------------------------------
    def _ready_to_measure(self) -> bool:
        """Whether timing starts after this step: once `compile.mode` has compiled the script's model (on every
        rank of a job, which start together)."""
        pending = self.compile_pending()
        if self.finished:
            return False
        if self.job is None:
            return not pending
        try:
            return self.job.agree_flag(not pending)
        except JobBroken as err:
            self._job_failed(err)
            return False

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

    def _start_meter(self) -> None:
        """The first step ended: timing starts now (that step held start-up and compile)."""
        # other processes' CPU time from here to the result; this script's own tree is the parent's (the bench or
        # tune process that started it), as for a Workload trial
        self._cpu_before = probe_cpu_times(self._own_root())
        options = BenchOptions(max_time_s=self.spec.max_time_s, target_ci_rel=self.spec.target_ci_rel,
                               warmup_s=self.spec.warmup_s)
        clock = self.job.clock if self.job is not None else self.clock
        agree = self._agree if self.job is not None else None
        now = self.meter_started_s = clock()
        self.meter = WindowMeter(clock, self._sync, options.timing(WARMUP_SHARE), now + WARMUP_SHARE * options.max_time_s,
                                 now + options.max_time_s, gate=self.gate, agree=agree)
        self.meter.start()
        self._wait_mark = self.events.wait_s

    def _agree(self, steps: int, samples: int):
        """A window of this rank ended: the job's window, as every rank agrees it (`JobRanks.agree`)."""
        losses = read_losses(self.events.losses[self._agreed_losses:])
        self._agreed_losses = len(self.events.losses)
        wait_s, self._agreed_wait = self.events.wait_s - self._agreed_wait, self.events.wait_s
        backward_s, self._agreed_backward = self.events.backward_s - self._agreed_backward, self.events.backward_s
        peak = read_peak_memory(self._device())[0]
        return self.job.agree(steps, samples, wait_s, losses, peak, backward_s)

    def _own_root(self) -> int:
        """The root of torchpace's own process tree, whose CPU is not "other load": the process that started the
        process torchpace started (a rank's root is its job's)."""
        return owner_pid(self.spec.root_pid if self.spec.descendant and self.spec.root_pid else None)

    def _device(self):
        import torch

        return self.events.device if self.events.device is not None else torch.device("cpu")

    def _sync(self) -> None:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    # ---- the end --------------------------------------------------------------------------------
    def finish(self, ended_early: bool) -> None:
        """Write the result; end the process unless the script is already exiting by itself. A job's ranks all
        finish at the same step (their meters agree), gather their last figures, and end together once rank 0
        has written the result; a job that ends otherwise is reported by rank 0 from what was agreed."""
        if self.role == RANK and self.job is not None and not ended_early:
            return self._finish_job()
        if not self.writes_result or not self.claim_end():
            return
        write_result(self.build_result(ended_early), self.spec.result_path)
        if not ended_early:
            self.end()

    def _finish_job(self) -> None:
        if not self.claim_end():
            return
        try:
            final = self.job.gather_final({"replicas": replica_fingerprint(self.report.ddp_models())})
            if self.job.is_leader:
                disagree = replicas_disagree([entry["replicas"] for entry in final])
                write_result(self.build_result(False, disagree), self.spec.result_path)
            self.job.barrier()  # the result is written before any rank ends
        except JobBroken as err:
            self.finished = False  # this rank reports the broken job if it writes the result
            self._job_failed(err)
            return
        self.end()

    def _job_failed(self, err: JobBroken) -> None:
        """torchpace's collectives lost a rank: rank 0 reports the job's failure (the parent names the rank that
        failed, from its files); every rank ends."""
        if self.writes_result and self.claim_end():
            write_result(TrialResult(CRASH, wall_time_s=self.clock() - self.started_s, error=str(err),
                                     ranks=self.job.world_size if self.job else None), self.spec.result_path)
        self.finished = True
        self.end()

    def finish_invalid(self, why: str) -> None:
        """A knob of the config cannot run in this script: write an `invalid` result and end the process."""
        if not self.writes_result or not self.claim_end():
            self.finished = True
            self.end()
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

    def on_no_step(self) -> None:
        """The watchdog of the process torchpace started: no step in the script's whole tree after
        `no_step_timeout_s` ends it with a `timeout` result (a process of its tree that stepped measures itself)."""
        if self.steps or self._someone_steps() or not self.claim_end():
            return
        waited = self.spec.no_step_timeout_s
        write_result(TrialResult(TIMEOUT, error=f"{NO_STEP_MESSAGE} (waited {waited:.0f} s after `import torch`)",
                                 wall_time_s=self.clock() - self.started_s), self.spec.result_path)
        self.end()

    def _someone_steps(self) -> bool:
        """Whether a process of the script's tree took the measurement (it trained alone, or as a rank)."""
        folder = os.path.dirname(self.spec.result_path) or "."
        name = os.path.basename(self.spec.result_path)
        try:
            return any(entry.startswith(name + ".") and entry != name + STEPS_SUFFIX for entry in os.listdir(folder))
        except OSError:
            return False

    def watch_for_stalls(self) -> None:
        """Start the stall watchdog (a daemon thread): see `check_stall`."""
        def watch() -> None:
            while not self.finished:
                time.sleep(WATCH_S)
                self.check_stall()

        threading.Thread(target=watch, name="torchpace-stall-watchdog", daemon=True).start()

    # ---- compiling ------------------------------------------------------------------------------------
    def on_compile_start(self, *args: Any) -> None:
        """torch.compile began compiling (dynamo traces a frame, or a backward compiled when first called)."""
        self.watch.compiles.start()

    def on_compile_end(self, *args: Any) -> None:
        self.watch.compiles.end()

    def compiling_for(self, now: float) -> float | None:
        """Seconds the compile under way has run (None when none is): see `StepWatch.compiling_for`; with
        `compile.mode`, from the step before the model's compiled forward until a backward() completed after it."""
        return self.watch.compiling_for(now, self._hooked_compile_since())

    def _hooked_compile_since(self) -> float | None:
        compiled = self.report.compiled
        if compiled is not None and compiled.triggered and compiled.modules and not compiled.warm and not compiled.failure:
            return self.watch.last_step_at
        return None

    @property
    def compile_limit_s(self) -> float:
        return self.watch.compile_limit_s

    def check_stall(self) -> None:
        """End the measurement when the script stopped stepping (`StepWatch.verdict`): a stall, or the cap's end.
        A stall is bounded by the time cap, never by the parent's kill."""
        if self.finished:
            return
        stopped = self.watch.verdict(self.past_cap, self._hooked_compile_since())
        if stopped is None:
            return
        if stopped.how == "cap":
            self.on_cap(stopped.gap_s)
        else:
            self.on_stall(stopped.gap_s, stopped.compiling_s)

    def past_cap(self, now: float, gap_s: float) -> bool:
        """Past the measurement's time cap, no step for `CAP_GRACE_S` and 3x the longest step: the cap ends the
        measurement with its windows (a script past its last step is often ending: evaluating, saving). Not before
        a step time is known: after the first step a slow step (a short script's, on a busy host) is waited for;
        nor in a paired comparison, whose turns the parent ends (its own clock runs only in its turns)."""
        if self.meter is None or self.meter.gate is not None or self.watch.longest_step_s <= 0:
            return False
        deadline = self.meter.deadline + (self.job.origin if self.job is not None else 0.0)  # a job's runs on its clock
        return now >= deadline and gap_s >= max(CAP_GRACE_S, 3 * self.watch.longest_step_s)

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
                f"(its longest step took {self.watch.longest_step_s:.2g} s: it stalled, or it was ending, evaluating or "
                f"saving); {windows} window(s) were measured, at least {_MIN_WINDOWS_IF_ENDED} are needed"))
        write_result(result, self.spec.result_path)
        self.end()

    def stall_text(self, gap_s: float, compiling_s: float | None) -> str:
        """Why the script is ended as stalled: no step for `gap_s`, or a compile that ran `compiling_s`."""
        if compiling_s is None:
            who = f"the job (rank {self.job.rank} of {self.job.world_size}) made" if self.job is not None else "the script made"
            return f"{who} no step for {gap_s:.0f} s after step {self.steps}"
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
                " (it stalled: a deadlock, a hung read, a rank that stopped, or one step slower than --max-time allows)"
            result = TrialResult(TIMEOUT, guard_losses=result.guard_losses, wall_time_s=result.wall_time_s, error=(
                f"{self.stall_text(gap_s, compiling_s)}{why}; {len(self.meter.windows) if self.meter else 0} "
                f"window(s) were measured, at least {_MIN_WINDOWS_IF_ENDED} are needed"), ranks=result.ranks)
        write_result(result, self.spec.result_path)
        self.end()

    # ---- the result ---------------------------------------------------------------------------------
    def build_result(self, ended_early: bool, ranks_disagree: str | None = None) -> TrialResult:
        """The trial result of what was measured (a failure when nothing usable was)."""
        wall_s = self.clock() - self.started_s
        world = self.job.world_size if self.job is not None else 1
        losses = self.job.step_losses() if self.job is not None else read_losses(self.events.losses)
        guard = losses[: self.spec.guard_steps]
        windows = len(self.meter.windows) if self.meter is not None else 0
        if self.steps == 0:
            return TrialResult(CRASH, error=f"the script ended without a step: {NO_STEP_MESSAGE}", wall_time_s=wall_s)
        unreached = unreached_knobs(self.report.config, self.report.reached, self.report.not_applied)
        if unreached:  # the config could not run in this script: that is the verdict, however far it got
            return TrialResult(INVALID, guard_losses=guard, wall_time_s=wall_s, ranks=world,
                               error="; ".join(f"{knob}: {why}" for knob, why in unreached.items()))
        ended_after = None
        if ended_early and self.ended_how != "time":  # how long the script ran once timing started: a trial can be sized to fit it
            ran_s = self._since_meter_started() if self.meter is not None else 0.0
            ended_after = {"steps": self.steps, "seconds": ran_s, "windows": windows}
        if ended_early and windows < _MIN_WINDOWS_IF_ENDED and ended_after is None:  # the cap's: `on_cap` says why
            return TrialResult(CRASH, guard_losses=guard, wall_time_s=wall_s, error="too few windows before the time cap",
                               ranks=world)
        if ended_early and windows < _MIN_WINDOWS_IF_ENDED:
            return TrialResult(CRASH, guard_losses=guard, wall_time_s=wall_s, ended_after=ended_after, ranks=world, error=(
                f"the script ended after {self.steps} step(s), {ended_after['seconds']:.1f} s after its first one, "
                f"before torchpace had measured enough ({windows} window(s); at least {_MIN_WINDOWS_IF_ENDED} needed "
                "after warm-up): let it run longer (more steps or epochs), or measure for less time"))
        bench = self._bench(losses, ended_early, wall_s, self.report.to_dict())
        if ranks_disagree:
            return TrialResult(GUARD, bench, guard, error=ranks_disagree, wall_time_s=wall_s, ranks=world)
        status = NONFINITE if is_nonfinite(losses) else OK
        error = "loss became NaN/Inf while measuring" if status == NONFINITE else ""
        return TrialResult(status, bench, guard, error=error, wall_time_s=wall_s, ended_after=ended_after, ranks=world)

    def _since_meter_started(self) -> float:
        """Seconds since timing started, on this process's clock (a job's meter started on the job's clock)."""
        origin = self.job.origin if self.job is not None else 0.0
        return self.clock() - origin - self.meter_started_s

    def _bench(self, losses: list[float], ended_early: bool, wall_s: float, hook: dict) -> Any:
        load = other_load_cores(self._cpu_before, probe_cpu_times(self._own_root()))
        real = self.meter.result(self.ended_how if ended_early else None)
        events = self.events
        script = {"command": list(self.spec.command), "steps_seen": self.steps,
                  "ended_early": ended_early and self.ended_how != "time",
                  "step_source": events.step_source, "samples_source": events.samples_source, **hook}
        batch = events.last_step_samples if events.samples_known else None
        common = dict(samples_known=events.samples_known, device=events.device, losses=losses, wall_s=wall_s,
                      batch_size=batch, backwards_per_step=events.typical_backwards(), script=script,
                      other_load_cores=load)
        if self.job is None:
            return build_script_bench(real, measured_wait_s=self.measured_wait_s if events.batches_seen else None, **common)
        per_rank = self.job.rank_samples_per_step()
        return build_script_bench(
            real, measured_wait_s=None, ranks=self.job.rank_figures(),
            global_batch_size=sum(per_rank) if events.samples_known and per_rank else None,
            input_wait_frac=self.job.input_wait_frac() if events.batches_seen else None,
            peak_bytes=self.job.peak_bytes(), **common)

    def on_exit(self) -> None:
        """atexit: the script finished before the measurement did."""
        if not self.finished and self.measuring:
            self.finish(ended_early=True)

    def claim_end(self) -> bool:
        """True for the one caller that ends the measurement (the script's steps, the watchdogs and the exit
        handler race for it); False once another did."""
        with self._lock:
            if self.finished:
                return False
            self.finished = True
            return True

    def script_raised(self, exc: BaseException | None = None) -> None:
        """The script's own uncaught exception: its crash, so no partial result is written for it; a rank of a
        job leaves its traceback for the parent, which ends the job at once."""
        with self._lock:
            self.finished = True
        if self.role == RANK and exc is not None:
            place = find_job() if self.job is None else self.job.place
            if place is not None:
                write_rank_failure(self.spec.result_path, place.rank, place.world_size, exc)

    def end(self, status: int = 0) -> None:
        """End the script now, with exit `status`: flush what it printed; its own clean-up (`finally`, `with`,
        `atexit`) runs within a bound (`torchpace.script.ending`), and the parent ends what is left of its tree."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed or broken pipe: nothing left to say
                continue
        self._exit(status)


def write_result(result: TrialResult, path: str) -> None:
    """Write the trial result atomically (the parent reads it after the process ends)."""
    write_atomic(path, json.dumps(result.to_dict()))


__all__ = ["ScriptProbe", "CompileTime", "Stopped", "write_result", "UNDECIDED", "ALONE", "RANK", "BYSTANDER"]
