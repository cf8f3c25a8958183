"""Inference-stage knobs: grad-free mode, dynamic int8 quantization, export format, batch size.

They apply to inference workloads only (`loss=None`); `compile.mode`, `precision.amp`,
`model.channels_last` (compute stage) and `threads.intra_op` (system stage) apply to inference too.
"""

from __future__ import annotations

from torchpace.knobs.base import IntKnob, Knob, Point

_INFERENCE_ONLY = "only for inference workloads (this workload has a loss: it trains)"


class _InferenceKnob(Knob):
    """A knob that means something only when the workload has no loss."""

    def applies(self, host, workload):
        return _INFERENCE_ONLY if workload.is_training else None


class InferenceModeKnob(_InferenceKnob):
    name = "inference.mode"
    stage = "inference"
    point = Point.STEP
    default = "no_grad"
    choices = ("no_grad", "inference_mode")
    help = "run inference under torch.no_grad() or torch.inference_mode() (no version counters or view tracking)."

    def apply(self, value, target, ctx):
        target.inference_mode = value == "inference_mode"
        return target


class QuantizeKnob(_InferenceKnob):
    name = "inference.quantize"
    stage = "inference"
    point = Point.MODEL
    default = "off"
    choices = ("off", "dynamic_int8")
    help = "dynamic int8 quantization of Linear/LSTM/GRU layers (int8 weights, activations quantized per call; CPU)."
    apply_order = 60  # after channels_last, before export and compile

    def applies(self, host, workload):
        from torchpace.inference.quantize import cpu_quantized_engine, quantizable_layers

        reason = super().applies(host, workload)
        if reason is None and host.cuda_available:
            reason = "dynamic int8 quantized kernels run on the CPU only; this host runs workloads on CUDA"
        if reason is None and cpu_quantized_engine() is None:
            reason = "this torch build has no CPU quantized engine (fbgemm/x86/onednn/qnnpack)"
        if reason is None and not quantizable_layers(workload.model):
            reason = "the model has no Linear, LSTM or GRU layers to quantize"
        return reason

    def conflicts(self, values):
        if values.get(self.name) == "dynamic_int8" and values.get("precision.amp", "off") != "off":
            return "dynamic int8 layers take float32 inputs; autocast (precision.amp) would feed them bf16/fp16"
        return None

    def apply(self, value, target, ctx):
        if value == "dynamic_int8":
            from torchpace.inference.quantize import quantize_dynamic_int8

            target = quantize_dynamic_int8(target)
        return target


class ExportKnob(_InferenceKnob):
    name = "inference.export"
    stage = "inference"
    point = Point.MODEL
    default = "none"
    choices = ("none", "torch_export", "torchscript")
    help = "run the model as captured by torch.export (ExportedProgram) or TorchScript trace + freeze."
    apply_order = 85  # after every other model change (the capture sees them), before compile

    def applies(self, host, workload):
        reason = super().applies(host, workload)
        if reason is None and workload.forward is not None:
            reason = "the workload has a custom forward(model, batch): the model's inputs are not known"
        return reason

    def conflicts(self, values):
        if values.get(self.name) == "torchscript" and values.get("compile.mode", "off") != "off":
            return "a TorchScript module runs in the TorchScript interpreter: it cannot also be torch.compile'd"
        return None

    def apply(self, value, target, ctx):
        if value == "none":
            return target
        from torchpace.inference.capture import example_input, export_module

        example = example_input(ctx.workload, ctx.workload.dataset, ctx.device, bool(ctx.values.get("model.channels_last")))
        return export_module(target, str(value), example)


class BatchSizeKnob(IntKnob):
    name = "inference.batch_size"
    stage = "inference"
    point = Point.LOADER
    default = "workload"
    named = ("workload",)
    minimum = 1
    help = "samples per inference batch (throughput); 'workload' keeps the workload's batch_size."

    def applies(self, host, workload):
        return _INFERENCE_ONLY if workload.is_training else None

    def candidates(self, host, workload):
        sizes = [workload.batch_size // 2, workload.batch_size * 2, workload.batch_size * 4]
        return ["workload", *[s for s in dict.fromkeys(sizes) if s >= 1 and s != workload.batch_size
                              and self.value_applies(s, host, workload) is None]]

    def value_applies(self, value, host, workload):
        """A batch no larger than the dataset: a larger one would be measured as the dataset's size, and its
        figures divided by a batch that never ran."""
        try:
            samples = len(workload.dataset) if workload.dataset is not None else None
        except TypeError:  # an iterable dataset has no length: nothing to check against
            samples = None
        if value != "workload" and samples is not None and value > samples:
            return f"batch_size {value} is more than the workload's dataset holds ({samples} samples)"
        return None

    def apply(self, value, target, ctx):
        if value != "workload":
            target["batch_size"] = int(value)
        return target


KNOBS = [InferenceModeKnob(), QuantizeKnob(), ExportKnob(), BatchSizeKnob()]
