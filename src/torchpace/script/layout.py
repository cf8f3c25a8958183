"""`model.channels_last` in an unmodified script: the model and its 4-D inputs in channels_last.

The launch hook cannot edit the script, so it finds the model the way bf16 autocast and compile do
(`torchpace.script.autocast.OutermostModule`: a module with parameters called while no other module's
forward runs in this thread). Before the first forward of each such module that holds a 2-D
convolution, the module is converted in place (`module.to(memory_format=torch.channels_last)`: every
parameter keeps its identity, only its data's strides change, so an optimizer built on
`model.parameters()` before goes on updating the same tensors), and at every call its 4-D floating
inputs are given in channels_last (`Tensor.contiguous(memory_format=torch.channels_last)`), as
`prepare()` does for a workload's batches. The script's own code sees the same shapes and values;
only the memory layout changes, and with it which convolution kernels run.

It does not apply, and says why (the trial is then `invalid`, as for a knob that never reached the
script), to a model with no 2-D convolution, and to one the script wrapped in
DistributedDataParallel or FSDP before its first forward (their gradient buckets and shards were laid
out for the old strides: the layout must be set before wrapping, which `torchpace.prepare()` does).
The hooks return at once while torch.compile traces, so a compiled forward (the script's own, or
`compile.mode`'s, which runs after these hooks) sees channels_last weights and inputs.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from torchpace.script.autocast import OutermostModule

_WRAPPERS = ("DistributedDataParallel", "FullyShardedDataParallel")  # layouts fixed at wrap time
_FSDP2_MARK = "FSDPModule"  # fully_shard() makes the module an instance of this class


class ScriptLayout:
    """Converts each outermost model with 2-D convolutions to channels_last before its first forward,
    and its 4-D inputs at every call.

    Attributes:
        converted: class names of the modules converted, in the order the script first called them.
        skipped: module class name -> why it was left as it is.
    """

    def __init__(self, report, knob_name: str):
        self.report, self.knob_name = report, knob_name
        self.seen: set[int] = set()
        self.layout_of: dict[int, bool] = {}  # id(module) -> converted
        self.converted: list[str] = []
        self.skipped: dict[str, str] = {}

    def install(self) -> "ScriptLayout":
        """Register the global forward hooks for the rest of the process."""
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        hooks = OutermostModule(lambda module: contextlib.nullcontext(), transform_args=self.on_call)
        register_module_forward_pre_hook(hooks.before)
        register_module_forward_hook(hooks.after, always_call=True)
        return self

    def on_call(self, module, args: tuple) -> tuple | None:
        """The outermost module is about to run: convert it the first time, then give it its 4-D inputs
        in channels_last (None: the arguments as they are)."""
        key = id(module)
        if key not in self.seen:
            self.seen.add(key)
            self.layout_of[key] = self.convert(module)
        if not self.layout_of[key]:
            return None
        return tuple(channels_last_inputs(arg) for arg in args)

    def convert(self, module) -> bool:
        """Convert `module` in place, or note why not; True when it was converted."""
        import torch

        name = type(module).__name__
        why = layout_reason(module)
        if why is not None:
            self.skipped[name] = why
            if self.knob_name not in self.report.reached:
                self.report.not_applied.setdefault(self.knob_name, why)
            return False
        module.to(memory_format=torch.channels_last)
        self.converted.append(name)
        self.report.reached.add(self.knob_name)
        self.report.not_applied.pop(self.knob_name, None)
        sys.stderr.write(f"torchpace: {name} and its 4-D inputs in channels_last ({self.knob_name} = true)\n")
        return True


def layout_reason(module) -> str | None:
    """None when `module` can be converted to channels_last in place, else why not."""
    name = type(module).__name__
    if name in _WRAPPERS or any(type(m).__name__ == _FSDP2_MARK for m in type(module).__mro__):
        return (f"the model is wrapped in {name} before its first forward, which laid out its gradients for the old "
                "strides: set the layout before wrapping (torchpace.prepare() does)")
    from torchpace.engine.layers import has_conv

    if not has_conv(module, dims=(2,)):
        return f"{name} has no 2-D convolution: channels_last only changes the layout of 4-D convolutions"
    return None


def channels_last_inputs(value: Any) -> Any:
    """`value` with each 4-D floating tensor in channels_last (tuples, lists and dicts followed)."""
    from torchpace.engine.batch import as_channels_last, map_tensors

    return map_tensors(value, as_channels_last)


def install_script_layout(report, knob_name: str) -> ScriptLayout:
    """Put the script's conv model and its 4-D inputs in channels_last; `report` gets what happened."""
    return ScriptLayout(report, knob_name).install()
