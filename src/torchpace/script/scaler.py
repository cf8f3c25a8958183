"""`precision.amp = fp16` in an unmodified script: a GradScaler placed from outside the training loop.

fp16 gradients underflow without loss scaling, so fp16 autocast (`torchpace.script.autocast`, as for
bf16) comes with the steps of `torch.amp.GradScaler`'s recipe, each placed where the script already
calls torch:

- **scale**: every `backward()` (`torch.autograd.backward`, which `Tensor.backward` calls) of a loss
  while an optimizer exists gets the loss times the scale (`GradScaler.scale`);
- **unscale, check, step**: every optimizer's `step()` becomes `GradScaler.step(optimizer)`: gradients
  unscaled in place, the step skipped when one is inf or NaN. An `optimizer.step(closure)` (Lightning's
  automatic optimization) runs the closure first, as Lightning's own mixed precision does, then the
  scaler's step;
- **clip the true gradients**: `torch.nn.utils.clip_grad_norm_` / `clip_grad_value_` unscale the
  gradients of the optimizers owning the clipped parameters first (`GradScaler.unscale_`), as the
  recipe says, so a script clips what it would clip in fp32;
- **update**: once per iteration, before the first scaled `backward()` after a step (so with several
  optimizers every one of them steps with the scale its gradients were made with).

Where that cannot be done safely it does not apply, and says why (the trial is then `invalid`; under
`launch` the script goes on in fp32, autocast off, and says so): the script builds its own enabled
GradScaler (the loss would be scaled twice), an optimizer whose `step()` requires a closure it may call
several times (L-BFGS), or two optimizers sharing a parameter (a wrapper optimizer built on another's
parameters: they would be unscaled twice).
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
from typing import Any

from torchpace.script.sites import caller_site

_PATCHED = "__torchpace_fp16_scaler__"


class ScriptScaler:
    """The GradScaler of one script process and where its steps were placed.

    Attributes:
        refused: why fp16 cannot run safely in this script (None while it can).
        optimizers: the optimizers built so far, each with its `step` placed under the scaler.
    """

    def __init__(self, report, knob_name: str):
        self.report, self.knob_name = report, knob_name
        self.scaler = None  # made with the first optimizer, on its parameters' device
        self.refused: str | None = None
        self.optimizers: list = []
        self.owner: dict[int, Any] = {}  # id(parameter) -> the optimizer that updates it
        self.scaled = False  # a backward() was scaled since the last update()
        self.stepped: set[int] = set()  # optimizers stepped by the scaler since the last update()
        self.unscaled: set[int] = set()  # optimizers unscaled (for clipping) since the last update()
        self._making = False  # constructing our own GradScaler
        self._local = threading.local()  # inside a scaler step (nested steps of a wrapper run as they are)

    # ---- refusing -------------------------------------------------------------------------------------
    def refuse(self, why: str) -> None:
        """fp16 cannot run safely here: stop scaling, say why (the autocast stops too)."""
        if self.refused is None:
            self.refused = why
            self.report.reached.discard(self.knob_name)
            self.report.not_applied[self.knob_name] = why
            sys.stderr.write(f"torchpace: {self.knob_name} = fp16 not applied: {why}; the script runs in float32\n")

    # ---- the hooks -----------------------------------------------------------------------------------
    def install(self) -> "ScriptScaler":
        """Wrap optimizer construction, backward(), gradient clipping and GradScaler construction."""
        import torch
        import torch.nn.utils.clip_grad as clip_grad

        original_init = torch.optim.Optimizer.__init__

        @functools.wraps(original_init)
        def __init__(optimizer, *args, **kwargs):
            original_init(optimizer, *args, **kwargs)
            self.on_optimizer(optimizer)

        torch.optim.Optimizer.__init__ = __init__
        original_backward = torch.autograd.backward

        @functools.wraps(original_backward)
        def backward(tensors, grad_tensors=None, *args, **kwargs):
            tensors, grad_tensors = self.scale_backward(tensors, grad_tensors)
            return original_backward(tensors, grad_tensors, *args, **kwargs)

        torch.autograd.backward = backward
        for name in ("clip_grad_norm_", "clip_grad_value_"):
            wrapped = self._unscaling_first(getattr(clip_grad, name))
            setattr(clip_grad, name, wrapped)
            setattr(torch.nn.utils, name, wrapped)
        self._watch_script_scalers(torch.amp.GradScaler)
        return self

    def _watch_script_scalers(self, scaler_cls) -> None:
        original = scaler_cls.__init__

        @functools.wraps(original)
        def __init__(scaler, *args, **kwargs):
            original(scaler, *args, **kwargs)
            if not self._making and scaler.is_enabled():
                self.refuse(f"the script builds its own GradScaler ({caller_site()}): the loss would be scaled twice; "
                            "use the script's own fp16 option instead")

        scaler_cls.__init__ = __init__

    def on_optimizer(self, optimizer) -> None:
        """A torch.optim optimizer was built: place its step under the scaler (or refuse why it cannot be)."""
        if getattr(optimizer, _PATCHED, False) or self.refused:
            return
        params = [p for group in optimizer.param_groups for p in group["params"]]
        shared = next((self.owner[id(p)] for p in params if id(p) in self.owner), None)
        step_params = inspect.signature(type(optimizer).step).parameters
        closure = step_params.get("closure")
        if closure is not None and closure.default is inspect.Parameter.empty:
            return self.refuse(f"{type(optimizer).__name__}.step() requires a closure, which it may evaluate several "
                               "times per step: a GradScaler cannot check and skip such a step")
        if shared is not None:
            return self.refuse(f"{type(optimizer).__name__} updates parameters that {type(shared).__name__} also "
                               "updates: their gradients would be unscaled twice")
        self.owner.update((id(p), optimizer) for p in params)
        if self.scaler is None and params:
            self._make_scaler(params[0].device.type)
        self.optimizers.append(optimizer)
        original_step = optimizer.step

        @functools.wraps(original_step)
        def step(*args, **kwargs):
            return self.step(optimizer, original_step, *args, **kwargs)

        optimizer.step = step
        setattr(optimizer, _PATCHED, True)

    def _make_scaler(self, device_type: str) -> None:
        import torch

        self._making = True
        try:
            self.scaler = torch.amp.GradScaler(device_type)
        finally:
            self._making = False

    # ---- scale ---------------------------------------------------------------------------------------
    def scale_backward(self, tensors, grad_tensors):
        """(tensors, grad_tensors) to backward with: the loss times the scale while an optimizer exists."""
        if self.refused or self.scaler is None or getattr(self._local, "inside", False):
            return tensors, grad_tensors
        if self.stepped:  # a new iteration: the scale of the last one is updated before anything is scaled
            self.update()
        self.scaled = True
        if grad_tensors is None:
            return self.scaler.scale(tensors), None
        return tensors, self.scaler.scale(grad_tensors)

    # ---- unscale, check, step ------------------------------------------------------------------------
    def step(self, optimizer, original_step, *args, **kwargs):
        """`GradScaler.step(optimizer)` for a script's `optimizer.step(...)`; a closure runs first."""
        import torch

        if self.refused or self.scaler is None or getattr(self._local, "inside", False):
            return original_step(*args, **kwargs)
        closure = kwargs.pop("closure", None)
        if closure is None and args:
            closure, args = args[0], args[1:]
        result = None
        if closure is not None:  # its backward() is scaled as any other
            with torch.enable_grad():
                result = closure()
        has_grads = any(p.grad is not None for group in optimizer.param_groups for p in group["params"])
        if not self.scaled or id(optimizer) in self.stepped or not has_grads:
            stepped = original_step(*args, **kwargs)  # nothing scaled, or unscaled by a step already: as it is
        else:
            self._local.inside = True
            try:
                stepped = self.scaler.step(optimizer, *args, **kwargs)
            finally:
                self._local.inside = False
            self.stepped.add(id(optimizer))
        return result if closure is not None else stepped

    def update(self) -> None:
        """`GradScaler.update()`: the scale for the next iteration, from the inf checks of this one."""
        self.scaler.update()
        self.stepped.clear()
        self.unscaled.clear()
        self.scaled = False

    # ---- clip the true gradients ---------------------------------------------------------------------
    def _unscaling_first(self, clip):
        @functools.wraps(clip)
        def clip_unscaled(parameters, *args, **kwargs):
            import torch

            parameters = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
            self.unscale_owners(parameters)
            return clip(parameters, *args, **kwargs)

        return clip_unscaled

    def unscale_owners(self, parameters) -> None:
        """Unscale the gradients of the optimizers owning `parameters` (once per iteration each)."""
        if self.refused or not self.scaled:
            return
        for parameter in parameters:
            optimizer = self.owner.get(id(parameter))
            if optimizer is not None and id(optimizer) not in self.unscaled and id(optimizer) not in self.stepped:
                self.scaler.unscale_(optimizer)
                self.unscaled.add(id(optimizer))

    def summary(self) -> dict[str, Any]:
        """What the scaler did: its scale now (one host sync), the optimizers it steps, or why it did not apply."""
        scale = float(self.scaler.get_scale()) if self.scaler is not None and self.scaler.is_enabled() else None
        return {"scale": scale, "optimizers": len(self.optimizers), "refused": self.refused}


def install_script_scaler(report, knob_name: str) -> ScriptScaler:
    """Place a GradScaler's steps around the script's backward() and optimizer steps for the rest of the process."""
    return ScriptScaler(report, knob_name).install()
