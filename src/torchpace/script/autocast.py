"""bf16 autocast around the forward of the outermost module an unmodified script calls.

`precision.amp = bf16` reaches a script without a code change through torch's global module hooks:
when a module with parameters is called and no other module's forward is running in this thread, a
`torch.autocast(device_type, bfloat16)` is entered before its forward and exited after it, and its
floating outputs are cast back to float32, so the script's loss and everything after the forward run
as they did. Three hazards shape it:

- autocast state is thread-local, so the depth of nested forwards is kept per thread;
- autocast's cache of bf16 weight copies is cleared only when the outermost autocast exits: this one
  exits at the end of each forward, so `optimizer.step()` never runs inside it and the next forward
  never reads stale weights;
- the exit hook is registered with `always_call=True`, so a forward that raises still exits autocast;
- the hooks return at once while torch.compile traces (the modules inside a compiled forward): the
  outermost module's own call runs them eagerly, and nothing of them enters a graph.

Modules without parameters (a loss module such as `nn.CrossEntropyLoss`) are not wrapped: they are
rarely the model, and autocast runs losses in float32 anyway. fp16 comes with a GradScaler placed from
outside the loop (`torchpace.script.scaler`); where it cannot be placed safely, autocast stops too.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable

_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


class OutermostModule:
    """A pair of global forward hooks that hold a context open around the forward of the outermost
    module with parameters that this thread calls (autocast here; a profiler label in script mode).

    Args:
        make_context: module -> the context manager to enter before its forward.
        finish_output: output -> what the forward returns instead (None: the output as it is).
        transform_args: (module, args) -> the positional arguments its forward gets instead (None
            from it, or no `transform_args`: the arguments as they are); channels_last inputs.
    """

    def __init__(self, make_context: Callable[[Any], Any], finish_output: Callable[[Any], Any] | None = None,
                 transform_args: Callable[[Any, tuple], tuple | None] | None = None):
        import torch

        self.make_context, self.finish_output, self.transform_args = make_context, finish_output, transform_args
        self.local = threading.local()
        self.entered = 0
        self.compiling = torch.compiler.is_compiling

    def before(self, module, args) -> tuple | None:
        if self.compiling():  # a module called inside a compiled forward: nothing to trace into its graph
            return None
        depth = getattr(self.local, "depth", 0)
        self.local.depth = depth + 1
        if depth == 0 and getattr(self.local, "open", None) is None and _device_type(module) is not None:
            context = self.make_context(module)
            context.__enter__()
            self.local.open = (module, context)
            self.entered += 1
            if self.transform_args is not None:
                return self.transform_args(module, args)
        return None

    def after(self, module, args, output) -> Any:
        if self.compiling():
            return None
        self.local.depth = max(0, getattr(self.local, "depth", 1) - 1)
        opened = getattr(self.local, "open", None)
        if opened is None or opened[0] is not module or self.local.depth:
            return None
        self.local.open = None
        opened[1].__exit__(None, None, None)
        if output is None or self.finish_output is None:
            return None
        return self.finish_output(output)


def _device_type(module) -> str | None:
    """The device type of the module's first parameter, or None for a module without parameters."""
    for parameter in module.parameters():
        return parameter.device.type
    return None


def _to_float32(output: Any, dtype) -> Any:
    """`output` with every tensor of `dtype` cast to float32 (tuples, lists and dicts followed)."""
    import torch

    if isinstance(output, torch.Tensor):
        return output.float() if output.dtype == dtype else output
    if isinstance(output, tuple) and hasattr(output, "_fields"):  # namedtuple
        return type(output)(*(_to_float32(o, dtype) for o in output))
    if isinstance(output, (list, tuple)):
        return type(output)(_to_float32(o, dtype) for o in output)
    if isinstance(output, dict):
        return type(output)({k: _to_float32(v, dtype) for k, v in output.items()})
    return output


def install_outermost_autocast(value: str, report, knob_name: str,
                               refused: Callable[[], str | None] = lambda: None) -> OutermostModule:
    """Register the hooks for the rest of the process; `report.reached` gets `knob_name` at the first forward.

    Args:
        refused: why autocast must stop (fp16 whose GradScaler cannot be placed safely), else None.
    """
    import torch
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

    dtype = getattr(torch, _DTYPES[value])

    def autocast_for(module):
        if refused() is not None:
            return contextlib.nullcontext()
        report.reached.add(knob_name)
        return torch.autocast(device_type=_device_type(module), dtype=dtype)

    hooks = OutermostModule(autocast_for, lambda output: _to_float32(output, dtype))
    register_module_forward_pre_hook(hooks.before)
    register_module_forward_hook(hooks.after, always_call=True)
    return hooks
