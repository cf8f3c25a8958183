"""Inside an unmodified script's process: count its steps, measure them, write the result, end it.

Installed by the launch hook when the script imports torch and `MEASURE_ENV` is set (after the
config's knobs are applied by `torchpace.script.inprocess`). What it observes, with torch's own hooks:

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
with one device sync per window. When it is done the result is written and the process ends as a
program ends, its own `finally` blocks, context managers and exit handlers run, within a bound
(`torchpace.script.ending`; the parent ends the rest of the tree). A script that finishes first leaves the windows
it had, marked `script-ended`; one that shows no step within `no_step_timeout_s` leaves a `timeout`
naming what was looked for; one that stops stepping (`ScriptProbe.check_stall`) leaves what was measured,
marked `script-stalled`, or a `timeout` naming the stall; time spent in torch.compile is no stall
(`watch_compiles`), and a compile is waited for within the trial's compile allowance.

Every process of the script's tree that imports torch gets these hooks (a launcher's ranks, ranks the script
spawns, spawned DataLoader workers): which of them measures is decided at its first step
(`torchpace.script.probe`); the ranks of a job measure it together (`torchpace.script.job`), and a process
that never trains never measures.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import random
import sys
import threading

from torchpace.script import ending
from torchpace.script.autocast import OutermostModule
from torchpace.script.inprocess import HookReport
from torchpace.script.probe import ScriptProbe
from torchpace.script.profile import ScriptProfiler
from torchpace.script.spec import ScriptMeasure


# ---- installing the hooks ---------------------------------------------------------------------------

def install(spec: ScriptMeasure, report: HookReport) -> ScriptProbe:
    """Seed the RNGs and register every hook for `spec` in this process; `report` is what the config's
    knobs did in it (`torchpace.script.inprocess.apply_launch_config`), which the result carries."""
    import torch

    if spec.seed is not None:
        seed_everything(spec.seed)
    if spec.mode == "profile":
        probe = ScriptProfiler(spec, report)
        _label_forward_and_optimizer(torch)
        _note_precision(torch, probe)
    else:
        probe = ScriptProbe(spec, report)
    _hook_optimizers(torch, probe)
    _hook_backward(torch, probe)
    _hook_loader(probe)
    watch_compiles(probe)
    ending.install()  # before the probe's exit handler: the ending's runs after every other one
    atexit.register(_own, probe, probe.on_exit)
    _excepthook_marks_crash(probe)
    if not spec.descendant:  # the process torchpace started watches for a tree that never steps
        watchdog = threading.Timer(spec.no_step_timeout_s, _own, (probe, probe.on_no_step))
        watchdog.daemon = True
        watchdog.start()
    return probe


def install_from_json(raw: str, report: HookReport) -> ScriptProbe:
    """`install` with the spec the parent passed in `MEASURE_ENV` (the processes the script starts inherit it as
    descendants, `ScriptMeasure.for_descendants`: one that trains may be a rank of the job)."""
    return install(ScriptMeasure.from_json(raw), report)


def seed_everything(seed: int) -> None:
    """Seed torch, `random` and (when the script already loaded it) numpy."""
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
        _own(probe, probe.on_optimizer_built)
        original(self, *args, **kwargs)

    torch.optim.Optimizer.__init__ = __init__
    register_optimizer_step_post_hook(lambda optimizer, args, kwargs: _own(probe, probe.on_optimizer_step, optimizer))


def _hook_backward(torch, probe) -> None:
    original = torch.autograd.backward
    clock = probe.clock

    @functools.wraps(original)
    def backward(tensors, *args, **kwargs):
        start = clock()
        with _phase(probe, "torchpace.backward"):
            result = original(tensors, *args, **kwargs)
        _own(probe, probe.on_backward, tensors, clock() - start)
        return result

    torch.autograd.backward = backward


def watch_compiles(probe):
    """Tell the probe when torch.compile starts and ends compiling in this process (torch's compile
    callbacks: a frame dynamo traces, a backward compiled when first called), so the stall watchdog never
    takes a compile for a stall. Returns the call that stops it, or None where this torch has no such
    callbacks (`compile.mode`'s own compile is still known to the probe: `ScriptProbe.compiling_for`)."""
    try:
        from torch._dynamo.callback import callback_handler
    except ImportError:
        return None

    def started(*args):
        _own(probe, probe.on_compile_start)

    def ended(*args):
        _own(probe, probe.on_compile_end)

    callback_handler.register_start_callback(started)
    callback_handler.register_end_callback(ended)

    def unwatch() -> None:
        with contextlib.suppress(ValueError):  # torch._dynamo.reset() drops them too
            callback_handler.remove_start_callback(started)
            callback_handler.remove_end_callback(ended)

    return unwatch


def _hook_loader(probe) -> None:
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    original = _BaseDataLoaderIter.__next__
    clock = probe.clock

    @functools.wraps(original)
    def __next__(self):
        start = clock()
        with _phase(probe, "torchpace.input_wait"):
            batch = original(self)
        _own(probe, probe.on_batch, batch, clock() - start, self)
        return batch

    _BaseDataLoaderIter.__next__ = __next__


def _own(probe, event, *args):
    """Call `event(*args)`: torchpace's own code, run inside one of the script's calls (its optimizer's
    step, its backward(), its DataLoader) or at its exit. An exception from it is torchpace's failure, not
    the script's: the probe records it as such and ends the process (`ScriptProbe.fail_own`), so it never
    reaches the script as if the script had raised it."""
    try:
        return event(*args)
    except Exception as exc:
        probe.fail_own(exc)
        raise


def _phase(probe, name: str):
    """A `record_function` label in profile mode, nothing otherwise."""
    if not probe.label_phases:
        return contextlib.nullcontext()
    import torch

    return torch.profiler.record_function(name)


def _label_forward_and_optimizer(torch) -> None:
    """Profile mode: `torchpace.forward` around the outermost module with parameters (and around an
    optimizer's closure), and `torchpace.optimizer` around each optimizer step (global module and
    optimizer hooks)."""
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    forward = OutermostModule(lambda module: torch.profiler.record_function("torchpace.forward"))
    register_module_forward_pre_hook(forward.before)
    register_module_forward_hook(forward.after, always_call=True)
    optimizer_labels: list = []

    def before_step(optimizer, args, kwargs):
        label = torch.profiler.record_function("torchpace.optimizer")
        label.__enter__()
        optimizer_labels.append(label)
        return _label_closure(torch, args, kwargs)

    def after_step(optimizer, args, kwargs):
        if optimizer_labels:
            optimizer_labels.pop().__exit__(None, None, None)

    register_optimizer_step_pre_hook(before_step)
    register_optimizer_step_post_hook(after_step)


def _label_closure(torch, args, kwargs):
    """`optimizer.step(closure)` (Lightning's automatic optimization): the closure runs the training step
    (forward, loss), zero_grad and backward inside the optimizer's step, so it is labelled
    `torchpace.forward`, and the backward inside it keeps its own label (the innermost label counts):
    the optimizer phase is then the update alone. Returns the (args, kwargs) to step with, or None."""
    closure = kwargs.get("closure", args[0] if args else None)
    if not callable(closure):
        return None

    def labelled():
        with torch.profiler.record_function("torchpace.forward"):
            return closure()

    if "closure" in kwargs:
        return args, {**kwargs, "closure": labelled}
    return (labelled, *args[1:]), kwargs


def _note_precision(torch, probe) -> None:
    """Profile mode: note, until the first step ends, whether the script's modules run under autocast
    (also one a library enters inside the model's forward, as accelerate's mixed precision does) and the
    dtype of the outermost model's parameters; the profile offers no precision change already in effect."""
    from torch.nn.modules.module import register_module_forward_pre_hook

    def note(module, args):
        if torch.compiler.is_compiling():
            return
        if probe.steps:
            handle.remove()
            return
        for parameter in module.parameters():
            probe.run_facts.setdefault("param_dtype", str(parameter.dtype).replace("torch.", ""))
            device = parameter.device.type
            if torch.is_autocast_enabled(device):
                probe.run_facts["autocast_dtype"] = str(torch.get_autocast_dtype(device)).replace("torch.", "")
            break

    handle = register_module_forward_pre_hook(note)


def _excepthook_marks_crash(probe) -> None:
    """An uncaught exception in the script is the script's crash: no partial result is written for it."""
    previous = sys.excepthook

    def excepthook(kind, value, tb):
        probe.script_raised(value)
        previous(kind, value, tb)

    sys.excepthook = excepthook
