"""Inside an unmodified script's process: count its steps, measure them, write the result, end it.

Installed by the launch hook when the script imports torch and `MEASURE_ENV` is set (after the
config's knobs are applied by `torchpace.launch.inprocess`). What it observes, with torch's own hooks:

- **a step** is one optimizer step (`torch.optim.optimizer.register_optimizer_step_post_hook`; with
  several optimizers, the steps of the first one that steps) when the script built a `torch.optim`
  optimizer, else one `backward()` (`torch.autograd.backward`, which `Tensor.backward` calls): scripts
  that update parameters by hand. Gradient accumulation (several backward per optimizer step) counts
  optimizer steps;
- **samples** of a step: the leading dimension of the batches the script's DataLoader iterators
  yielded since the previous step (`ScriptMeasure.samples_per_step` when given); when neither is
  known, figures are steps/s;
- **input wait**: time inside the DataLoader iterator's `__next__`; `input_bound_frac` is its share of
  the measured windows' time;
- **the loss** of a step: the mean of the tensors `backward()` was called on during it, kept as
  detached tensors and read once at the end (no host sync per step on a GPU).

The first step (imports, compile, worker start-up) is excluded: the `WindowMeter` of `measure.timing`,
the same one the Workload bench uses, starts when it ends, then decides warm-up, windows and the CI
with one device sync per window. When it is done the result is written and the process ends at once
(`os._exit`; the parent ends the rest of the tree). A script that finishes first leaves the windows
it had, marked `script-ended`; one that shows no step within `no_step_timeout_s` leaves a `timeout`
naming what was looked for.
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import threading
import time
from typing import Any

from torchpace.script.spec import MEASURE_ENV, ScriptMeasure
from torchpace.trial.protocol import CRASH, NONFINITE, OK, TIMEOUT, TrialResult, is_nonfinite

_MIN_WINDOWS_IF_ENDED = 2  # a script that ends first must leave at least this many measured windows
NO_STEP_MESSAGE = ("no optimizer step or backward() seen: script mode counts a step at each step() of a torch.optim "
                   "optimizer, or at each backward() when the script builds no optimizer")


class ScriptProbe:
    """The measurement state inside the script's process (one per process)."""

    label_phases = False  # profile mode: record_function labels around the script's phases

    def __init__(self, spec: ScriptMeasure, clock=time.perf_counter):
        self.spec, self.clock = spec, clock
        self.started_s = clock()
        self.meter = None
        self.steps = 0
        self.optimizer_built = False
        self.lead_optimizer: int | None = None
        self.step_losses: list = []
        self.losses: list = []
        self.backwards_per_step: list[int] = []
        self.pending_samples = 0
        self.batches_seen = 0
        self.last_step_samples: int | None = None
        self.wait_s = 0.0
        self._wait_mark = 0.0
        self.measured_wait_s = 0.0
        self.samples_known = False
        self.device = None
        self.finished = False
        self._lock = threading.Lock()

    # ---- events from the script ----------------------------------------------------------------
    def on_optimizer_built(self) -> None:
        self.optimizer_built = True

    def on_optimizer_step(self, optimizer: Any) -> None:
        if self.lead_optimizer is None:
            self.lead_optimizer = id(optimizer)
        if id(optimizer) == self.lead_optimizer:
            self.on_step()

    def on_backward(self, tensors: Any) -> None:
        loss = _loss_tensor(tensors)
        if loss is not None:
            self.step_losses.append(loss)
        if not self.optimizer_built:
            self.on_step()

    def on_batch(self, batch: Any, waited_s: float) -> None:
        from torchpace.runtime.batch import batch_len

        self.wait_s += waited_s
        try:
            size = batch_len(batch)
        except ValueError:  # no tensor with a batch dimension: the samples stay unknown
            return
        self.pending_samples += size
        self.batches_seen += 1

    def on_step(self) -> None:
        """One step of the script ended: feed the meter; finish when it is done."""
        if self.finished:
            return
        self._close_step_loss()
        self.steps += 1
        samples, self.pending_samples = self.pending_samples, 0
        if self.spec.samples_per_step:
            samples = self.spec.samples_per_step
        if samples:
            self.last_step_samples = samples
        if self.meter is None:
            self._start_meter()
            return
        measuring = self.meter.phase == "measure"
        window = self.meter.record(samples if self.samples_known else 1)
        if window is not None:
            if measuring:
                self.measured_wait_s += self.wait_s - self._wait_mark
            self._wait_mark = self.wait_s
        if self.meter.done:
            self.finish(ended_early=False)

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
        from torchpace.measure.bench import WARMUP_SHARE, BenchOptions
        from torchpace.measure.timing import WindowMeter

        self.samples_known = bool(self.spec.samples_per_step) or self.batches_seen > 0
        options = BenchOptions(max_time_s=self.spec.max_time_s, target_ci_rel=self.spec.target_ci_rel)
        now = self.clock()
        self.meter = WindowMeter(self.clock, self._sync, options.timing(), now + WARMUP_SHARE * options.max_time_s,
                                 now + options.max_time_s)
        self.meter.start()
        self._wait_mark = self.wait_s

    def _sync(self) -> None:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    # ---- the end --------------------------------------------------------------------------------
    def finish(self, ended_early: bool) -> None:
        """Write the result; end the process unless the script is already exiting by itself."""
        with self._lock:
            if self.finished:
                return
            self.finished = True
        write_result(self.build_result(ended_early), self.spec.result_path)
        if not ended_early:
            end_process()

    def on_no_step(self) -> None:
        """The watchdog: no step after `no_step_timeout_s` ends the script with a `timeout` result."""
        with self._lock:
            if self.finished or self.steps:
                return
            self.finished = True
        waited = self.spec.no_step_timeout_s
        write_result(TrialResult(TIMEOUT, error=f"{NO_STEP_MESSAGE} (waited {waited:.0f} s after `import torch`)",
                                 wall_time_s=self.clock() - self.started_s), self.spec.result_path)
        end_process()

    def build_result(self, ended_early: bool) -> TrialResult:
        """The trial result of what was measured (a failure when nothing usable was)."""
        from torchpace.launch.inprocess import REPORT

        wall_s = self.clock() - self.started_s
        losses = _read_losses(self.losses)
        guard = losses[: self.spec.guard_steps]
        windows = len(self.meter.windows) if self.meter is not None else 0
        if self.steps == 0:
            return TrialResult(CRASH, error=f"the script ended without a step: {NO_STEP_MESSAGE}", wall_time_s=wall_s)
        if ended_early and windows < _MIN_WINDOWS_IF_ENDED:
            return TrialResult(CRASH, guard_losses=guard, wall_time_s=wall_s, error=(
                f"the script ended after {self.steps} step(s), before torchpace had measured enough "
                f"({windows} window(s); at least {_MIN_WINDOWS_IF_ENDED} needed after warm-up): let it run longer "
                "(more steps or epochs) or lower --max-time"))
        bench = self._bench(losses, ended_early, wall_s, REPORT.to_dict())
        status = NONFINITE if is_nonfinite(losses) else OK
        error = "loss became NaN/Inf while measuring" if status == NONFINITE else ""
        return TrialResult(status, bench, guard, error=error, wall_time_s=wall_s)

    def _bench(self, losses: list[float], ended_early: bool, wall_s: float, hook: dict) -> dict[str, Any]:
        from torchpace.measure.bench import build_script_bench

        real = self.meter.result("script-ended" if ended_early else None)
        per_step = sorted(n for n in self.backwards_per_step if n)
        script = {"command": list(self.spec.command), "steps_seen": self.steps, "ended_early": ended_early,
                  "step_source": "optimizer" if self.optimizer_built else "backward",
                  "samples_source": ("--samples-per-step" if self.spec.samples_per_step else
                                     "dataloader" if self.samples_known else None), **hook}
        return build_script_bench(
            real, samples_known=self.samples_known, device=self.device, losses=losses, wall_s=wall_s,
            measured_wait_s=self.measured_wait_s if self.batches_seen else None, batch_size=self.last_step_samples if self.samples_known else None,
            backwards_per_step=per_step[len(per_step) // 2] if per_step else 1, script=script)

    def on_exit(self) -> None:
        """atexit: the script finished before the measurement did."""
        if not self.finished:
            self.finish(ended_early=True)


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
    import json

    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(result.to_dict(), f)
    os.replace(tmp, path)


def end_process() -> None:
    """End the script now: flush what it printed, skip its teardown (the parent ends its workers)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing left to say
            continue
    os._exit(0)


# ---- installing the hooks ---------------------------------------------------------------------------

def install(spec: ScriptMeasure) -> ScriptProbe:
    """Seed the RNGs and register every hook for `spec` in this process."""
    import torch

    if spec.seed is not None:
        seed_everything(spec.seed)
    if spec.mode == "profile":
        from torchpace.script.profile import ScriptProfiler

        probe = ScriptProfiler(spec)
        _label_forward_and_optimizer(torch)
    else:
        probe = ScriptProbe(spec)
    _hook_optimizers(torch, probe)
    _hook_backward(torch, probe)
    _hook_loader(probe)
    atexit.register(probe.on_exit)
    _excepthook_marks_crash(probe)
    watchdog = threading.Timer(spec.no_step_timeout_s, probe.on_no_step)
    watchdog.daemon = True
    watchdog.start()
    return probe


def install_from_env() -> ScriptProbe | None:
    """`install` with the spec in `MEASURE_ENV` (None when the variable is not set)."""
    raw = os.environ.get(MEASURE_ENV)
    return install(ScriptMeasure.from_json(raw)) if raw else None


def seed_everything(seed: int) -> None:
    """Seed torch, `random` and (when the script already loaded it) numpy."""
    import random

    import torch

    torch.manual_seed(seed)
    random.seed(seed)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(seed)


def _hook_optimizers(torch, probe) -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook

    original = torch.optim.Optimizer.__init__

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        probe.on_optimizer_built()
        original(self, *args, **kwargs)

    torch.optim.Optimizer.__init__ = __init__
    register_optimizer_step_post_hook(lambda optimizer, args, kwargs: probe.on_optimizer_step(optimizer))


def _hook_backward(torch, probe) -> None:
    original = torch.autograd.backward

    @functools.wraps(original)
    def backward(tensors, *args, **kwargs):
        with _phase(probe, "torchpace.backward"):
            result = original(tensors, *args, **kwargs)
        probe.on_backward(tensors)
        return result

    torch.autograd.backward = backward


def _hook_loader(probe) -> None:
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    original = _BaseDataLoaderIter.__next__
    clock = probe.clock

    @functools.wraps(original)
    def __next__(self):
        start = clock()
        with _phase(probe, "torchpace.input_wait"):
            batch = original(self)
        probe.on_batch(batch, clock() - start)
        return batch

    _BaseDataLoaderIter.__next__ = __next__


def _phase(probe, name: str):
    """A `record_function` label in profile mode, nothing otherwise."""
    import contextlib

    if not probe.label_phases:
        return contextlib.nullcontext()
    import torch

    return torch.profiler.record_function(name)


def _label_forward_and_optimizer(torch) -> None:
    """Profile mode: `torchpace.forward` around the outermost module with parameters, and
    `torchpace.optimizer` around each optimizer step (global module and optimizer hooks)."""
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    from torchpace.launch.autocast import OutermostModule

    forward = OutermostModule(lambda module: torch.profiler.record_function("torchpace.forward"))
    register_module_forward_pre_hook(forward.before)
    register_module_forward_hook(forward.after, always_call=True)
    optimizer_labels: list = []

    def before_step(optimizer, args, kwargs):
        label = torch.profiler.record_function("torchpace.optimizer")
        label.__enter__()
        optimizer_labels.append(label)

    def after_step(optimizer, args, kwargs):
        if optimizer_labels:
            optimizer_labels.pop().__exit__(None, None, None)

    register_optimizer_step_pre_hook(before_step)
    register_optimizer_step_post_hook(after_step)


def _excepthook_marks_crash(probe) -> None:
    """An uncaught exception in the script is the script's crash: no partial result is written for it."""
    previous = sys.excepthook

    def excepthook(kind, value, tb):
        probe.finished = True
        previous(kind, value, tb)

    sys.excepthook = excepthook
