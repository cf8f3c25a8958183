"""Compute-stage knobs: autocast precision, TF32 matmuls, cuDNN autotune, channels_last,
torch.compile and the optimizer implementation."""

from __future__ import annotations

import inspect

from torchpace.knobs.base import Knob, Point, Reach


def _cuda_bf16_supported() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


class AmpKnob(Knob):
    name = "precision.amp"
    script_reach = Reach.AUTOCAST
    stage = "compute"
    point = Point.STEP
    default = "off"
    choices = ("off", "bf16", "fp16")
    help = "autocast forward and loss in bf16 or fp16 (fp16 with a GradScaler)."

    def host_reason(self, value, host):
        if value == "fp16" and not host.cuda_available:
            return "fp16 autocast with GradScaler needs CUDA; this host has no CUDA device"
        if value == "bf16":
            if host.cuda_available and not _cuda_bf16_supported():
                return "this GPU has no native bf16"
            if not host.cuda_available and not host.native_bf16:
                return "this CPU has no native bf16 (needs AVX512-BF16 or AMX)"
        return None

    def applies(self, host, workload):
        if self.host_reason("bf16", host) and self.host_reason("fp16", host):
            return self.host_reason("bf16", host)
        return None

    def apply(self, value, target, ctx):
        import torch

        if value != "off":
            target.amp_dtype = torch.bfloat16 if value == "bf16" else torch.float16
            target.grad_scaler = value == "fp16" and ctx.workload.is_training
        return target


class MatmulPrecisionKnob(Knob):
    name = "precision.matmul"
    script_reach = Reach.GLOBAL
    stage = "compute"
    point = Point.GLOBAL
    default = "highest"
    choices = ("highest", "high", "medium")
    help = "float32 matmul precision: 'high' allows TF32 tensor cores (torch.set_float32_matmul_precision)."

    def applies(self, host, workload):
        if not host.cuda_available:
            return "TF32 matmuls need a CUDA device (Ampere or newer)"
        return None

    def apply(self, value, target, ctx):
        from torchpace.engine.state import matmul_precision

        target.enter_context(matmul_precision(str(value)))
        return target


class CudnnBenchmarkKnob(Knob):
    name = "backends.cudnn_benchmark"
    script_reach = Reach.GLOBAL
    stage = "compute"
    point = Point.GLOBAL
    default = False
    choices = (False, True)
    help = "let cuDNN time its convolution algorithms and keep the fastest."

    def applies(self, host, workload):
        if not host.cuda_available:
            return "cuDNN autotuning needs a CUDA device"
        from torchpace.engine.layers import has_conv

        if workload.model is not None and not has_conv(workload.model):
            return "the model has no convolution layers"
        return None

    def apply(self, value, target, ctx):
        from torchpace.engine.state import cudnn_benchmark

        target.enter_context(cudnn_benchmark(bool(value)))
        return target


class ChannelsLastKnob(Knob):
    name = "model.channels_last"
    script_reach = Reach.LAYOUT
    stage = "compute"
    point = Point.MODEL
    default = False
    choices = (False, True)
    help = "NHWC memory format for conv weights and 4-D inputs."

    def applies(self, host, workload):
        # a script's model is known only once it runs: the launch hook checks it then (script/layout.py)
        from torchpace.engine.layers import has_conv

        if workload.model is not None and not has_conv(workload.model, dims=(2,)):
            return "the model has no Conv2d layers; channels_last only changes 4-D conv layouts"
        return None

    def apply(self, value, target, ctx):
        import torch

        if value:
            target = target.to(memory_format=torch.channels_last)
        return target

    def configure_step(self, value, options, ctx):
        options.channels_last_inputs = bool(value)  # 4-D inputs in the layout the weights use


class CompileKnob(Knob):
    name = "compile.mode"
    script_reach = Reach.COMPILE
    stage = "compute"
    point = Point.MODEL
    default = "off"
    choices = ("off", "default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")
    help = ("torch.compile the model with this mode (first steps compile: excluded as warm-up); reduce-overhead "
            "replays CUDA graphs (a step bound by kernel launches), max-autotune-no-cudagraphs autotunes kernels.")
    apply_order = 90  # after every other model change, so the compiled graph sees them

    def applies(self, host, workload):
        if not host.cuda_available and not host.has_compiler:
            return "torch.compile on CPU needs a C compiler (gcc or clang); none found"
        return None

    def host_reason(self, value, host):
        if value == "reduce-overhead" and not host.cuda_available:
            return "reduce-overhead records CUDA graphs; no CUDA device here"
        return None

    def candidates(self, host, workload):
        # on a GPU, CUDA graphs and autotuned kernels are each a mode of their own; max-autotune (both, and
        # minutes of autotuning) stays a value a user may set. On a CPU, autotuning gains little for its time.
        values = ["off", "default"]
        if host.cuda_available:
            values += ["reduce-overhead", "max-autotune-no-cudagraphs"]
        return values

    def apply(self, value, target, ctx):
        from torchpace.engine.compile import compile_model

        return target if value == "off" else compile_model(target, str(value))

    def configure_step(self, value, options, ctx):
        from torchpace.engine.compile import uses_cuda_graphs

        options.cuda_graph_steps = uses_cuda_graphs(str(value))  # each step a new CUDA-graph iteration


class OptimizerImplKnob(Knob):
    name = "optimizer.impl"
    script_reach = Reach.OPTIMIZER
    stage = "compute"
    point = Point.OPTIMIZER
    default = "default"
    choices = ("default", "foreach", "fused")
    help = "optimizer kernels: per-parameter loop, foreach (multi-tensor) or fused."
    training_only = True

    def value_applies(self, value, host, workload):
        if value == "default":
            return None
        cls = _optimizer_class(workload)
        if value not in inspect.signature(cls.__init__).parameters:
            return f"{cls.__name__} has no {value!r} implementation"
        return _try_build(cls, value, "cuda" if host.cuda_available else "cpu")

    def script_value(self, arguments):
        fused, foreach = arguments.get("fused"), arguments.get("foreach")
        if fused:
            return "fused"
        if foreach:
            return "foreach"
        # neither given: torch's own choice; `foreach=False` (the per-parameter loop) is none of this knob's values
        return "default" if fused is None and foreach is None else None

    def apply(self, value, target, ctx):
        if value == "default":
            return target
        cls = type(target)
        flags = {"foreach": value == "foreach", "fused": value == "fused"}
        accepted = inspect.signature(cls.__init__).parameters
        groups = [dict(group, **flags) for group in target.param_groups]
        defaults = {k: v for k, v in dict(target.defaults, **flags).items() if k in accepted}
        return cls(groups, **defaults)


def _optimizer_class(workload) -> type:
    """The optimizer class the workload's factory builds (probed on one dummy parameter)."""
    import torch

    factory = workload.optimizer or (lambda params: torch.optim.AdamW(params, lr=1e-3))
    return type(factory([torch.nn.Parameter(torch.zeros(1))]))


def _try_build(cls: type, impl: str, device: str) -> str | None:
    """None when `cls(..., impl=True)` builds on `device`, else the optimizer's own error."""
    import torch

    try:
        cls([torch.nn.Parameter(torch.zeros(1, device=device))], **{impl: True})
    except (RuntimeError, ValueError, TypeError) as err:
        return f"{cls.__name__}({impl}=True) is not supported here: {err}"
    return None


KNOBS = [AmpKnob(), MatmulPrecisionKnob(), CudnnBenchmarkKnob(), ChannelsLastKnob(), CompileKnob(), OptimizerImplKnob()]
