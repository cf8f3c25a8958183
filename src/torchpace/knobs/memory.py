"""Memory-stage knobs: activation checkpointing and micro-batches with gradient accumulation."""

from __future__ import annotations

from torchpace.errors import UsageError
from torchpace.knobs.base import IntKnob, Knob, Point


class ActivationCheckpointingKnob(Knob):
    name = "model.activation_checkpointing"
    stage = "memory"
    point = Point.MODEL
    default = False
    choices = (False, True)
    help = "recompute each block's activations in backward instead of storing them (less memory, more compute)."
    training_only = True

    def applies(self, host, workload):
        reason = super().applies(host, workload)
        if reason is not None:
            return reason
        from torchpace.engine.checkpointing import find_block_container  # torch: imports it (the model is one already)

        if find_block_container(workload.model) is None:
            return "no ModuleList/Sequential of two or more parameterised blocks to checkpoint"
        return None

    def apply(self, value, target, ctx):
        if value:
            from torchpace.engine.checkpointing import find_block_container, wrap_blocks  # torch: imports it

            wrap_blocks(find_block_container(target))
        return target


class MicroBatchKnob(IntKnob):
    name = "data.micro_batch_size"
    stage = "memory"
    point = Point.STEP
    default = "full"
    named = ("full",)
    minimum = 1
    training_only = True
    help = ("split each step's batch into micro-batches and accumulate gradients "
            "(train.grad_accumulation = batch_size / micro_batch_size; the global batch is unchanged).")

    def candidates(self, host, workload):
        halves = [workload.batch_size // d for d in (2, 4) if workload.batch_size % d == 0]
        return ["full", *[h for h in halves if h >= 1]]

    def value_applies(self, value, host, workload):
        if value != "full" and (value > workload.batch_size or workload.batch_size % value):
            return f"micro_batch_size {value} must divide the batch size {workload.batch_size}"
        return None

    def apply(self, value, target, ctx):
        reason = self.value_applies(value, ctx.host, ctx.workload)
        if reason:
            raise UsageError(f"knob {self.name!r}: {reason}")
        target.micro_batch_size = None if value == "full" else int(value)
        return target


KNOBS = [ActivationCheckpointingKnob(), MicroBatchKnob()]
