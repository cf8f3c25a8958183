"""What a profiled run already does, read from its trace (pure): knob -> the evidence that its remedy is
already in effect, so the verdict never advises what the run does already.

- `optimizer.impl`: a fused optimizer kernel among the profiled steps' operators (`aten::_fused_adamw_`,
  `aten::_fused_sgd_`...), or multi-tensor (`aten::_foreach_*`) update operators inside the optimizer
  phase (gradient clipping's `_foreach_norm` / `_foreach_mul_` do not count: they are not the update);
- `compile.mode`: compiled regions in the steps (torch.compile's `Torch-Compiled Region` and
  `CompiledFunction` events: the script compiles its model itself, or the config did);
- `precision.amp`: the forward ran under autocast, or the parameters are already bf16/fp16
  (torchpace's metadata block, `run`: `autocast_dtype`, `param_dtype`);
- `data.num_workers` and `data.pin_memory`: the run's DataLoaders already use workers or pinned memory
  (`run`: `num_workers`, `pin_memory`).
"""

from __future__ import annotations

from typing import Mapping

from torchpace.profile.analyzers import innermost_segments
from torchpace.profile.figures import PHASES
from torchpace.profile.trace import LABEL_PREFIX, Trace

_FUSED_PREFIX = "aten::_fused_"
_FOREACH_PREFIX = "aten::_foreach_"
_NOT_AN_UPDATE = ("aten::_foreach_norm", "aten::_foreach_mul_", "aten::_foreach_mul")  # clip_grad_norm_'s
_COMPILED_NAMES = ("Torch-Compiled Region", "CompiledFunction")
_LOW_PRECISION = ("bfloat16", "float16")


def settings_in_effect(trace: Trace) -> dict[str, str]:
    """knob -> why its usual remedy is already in effect in this run (evidence, as a phrase)."""
    effect: dict[str, str] = {}
    in_steps = [e for e in trace.events if any(s.ts_us <= e.ts_us < s.end_us for s in trace.steps)]
    fused = sorted({e.name for e in in_steps if e.cat == "cpu_op" and e.name.startswith(_FUSED_PREFIX)})
    foreach = sorted({e.name for e in _optimizer_ops(trace, in_steps)
                      if e.name.startswith(_FOREACH_PREFIX) and e.name not in _NOT_AN_UPDATE})
    if fused:
        effect["optimizer.impl"] = f"the optimizer already runs fused kernels ({', '.join(fused[:2])} in the operators)"
    elif foreach:
        effect["optimizer.impl"] = f"the optimizer already runs multi-tensor kernels ({', '.join(foreach[:2])} in its step)"
    compiled = sorted({name for e in in_steps for name in _COMPILED_NAMES if name in e.name})
    if compiled:
        effect["compile.mode"] = f"the model already runs compiled ({compiled[0]} in the steps)"
    run: Mapping = trace.metadata.get("run") or {}
    if run.get("autocast_dtype") in _LOW_PRECISION:
        effect["precision.amp"] = f"the forward already runs under {run['autocast_dtype']} autocast"
    elif run.get("param_dtype") in _LOW_PRECISION:
        effect["precision.amp"] = f"the model's parameters are already {run['param_dtype']}"
    if (run.get("num_workers") or 0) > 0:
        effect["data.num_workers"] = f"the DataLoader already loads in {run['num_workers']} worker process(es)"
    if run.get("pin_memory"):
        effect["data.pin_memory"] = "the DataLoader already pins its batches"
    return effect


def _optimizer_ops(trace: Trace, in_steps: list) -> list:
    """The operators whose innermost phase label is the optimizer's (not a closure's forward or backward)."""
    spans = [(e.ts_us, e.end_us, e.name[len(LABEL_PREFIX):]) for e in in_steps
             if e.cat == "user_annotation" and e.name.startswith(LABEL_PREFIX) and e.name[len(LABEL_PREFIX):] in PHASES]
    optimizer = [(start, end) for start, end, phase in innermost_segments(spans) if phase == "optimizer"]
    return [e for e in in_steps if e.cat == "cpu_op" and any(start <= e.ts_us < end for start, end in optimizer)]
