"""The script's own steps, from the events torchpace's hooks see in its process (`torchpace.script.hook`): which
call ends a step, the samples of each step, the time spent waiting on its DataLoaders, and each step's loss.

`StepEvents` only counts: it takes no decision and measures nothing; the probe (`torchpace.script.probe`) reads
it at each step it reports.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from torchpace.engine.batch import batch_len


class StepEvents:
    """Steps, samples, input wait and losses of the script's process.

    A step is one optimizer step (of the first optimizer that steps) when the script built a `torch.optim`
    optimizer, else one `backward()`. `on_optimizer_step` and `on_backward` return True when the event ended a
    step; the caller then calls `close_step`, which returns the step's samples.

    Attributes:
        steps: steps so far.
        optimizer_built: the script built a `torch.optim` optimizer (its steps are the steps).
        losses: each step's loss (the mean of the tensors its backward() calls were given), detached tensors.
        backwards_per_step: backward() calls of each step.
        wait_s: seconds spent inside DataLoader iterators' `__next__` so far.
        backward_s: seconds spent inside `backward()` so far (on a CPU, DDP's all-reduce waits there for the
            slowest rank).
        batches_seen: DataLoader batches read that had a batch dimension.
        last_step_samples: the samples of the latest step that had any.
        device: the device of the latest loss.
    """

    def __init__(self, samples_per_step: int | None = None, report: Any = None):
        self.samples_per_step, self.report = samples_per_step, report
        self.steps = 0
        self.optimizer_built = False
        self.lead_optimizer: int | None = None
        self.step_losses: list = []
        self.losses: list = []
        self.backwards_per_step: list[int] = []
        self.fetched: deque[int] = deque()  # sizes of the batches read and not yet counted in a step
        self.batches_seen = 0
        self.last_step_samples: int | None = None
        self.wait_s = 0.0
        self.backward_s = 0.0
        self.device = None

    def on_optimizer_built(self) -> None:
        self.optimizer_built = True

    def on_optimizer_step(self, optimizer: Any) -> bool:
        """An optimizer stepped: True when it is the step's (the first optimizer that stepped)."""
        if self.lead_optimizer is None:
            self.lead_optimizer = id(optimizer)
            if self.report is not None:  # the script's own optimizer arguments: the baseline's
                self.report.note_script_settings(optimizer)
        return id(optimizer) == self.lead_optimizer

    def on_backward(self, tensors: Any, took_s: float = 0.0) -> bool:
        """backward() returned after `took_s`: True when it ends a step (a script that built no optimizer)."""
        self.backward_s += took_s
        loss = loss_tensor(tensors)
        if loss is not None:
            self.step_losses.append(loss)
        return not self.optimizer_built

    def on_batch(self, batch: Any, waited_s: float, loader_iter: Any = None) -> None:
        if not self.batches_seen and loader_iter is not None and self.report is not None:
            self.report.note_script_settings(loader_iter)  # the first loader read: its own settings, the baseline's
        self.wait_s += waited_s
        try:
            size = batch_len(batch)
        except ValueError:  # no tensor with a batch dimension: the samples stay unknown
            return
        self.fetched.append(size)
        self.batches_seen += 1

    def close_step(self) -> int:
        """A step ended: count it, keep its loss, and return its samples (see `step_samples`)."""
        self._close_step_loss()
        self.steps += 1
        return self.step_samples()

    def step_samples(self) -> int:
        """The samples of the step that just ended: the batches its backward passes consumed, one batch each, in
        the order they were read.

        A loader wrapper may read one batch ahead of the script to know where an epoch ends (accelerate's
        `DataLoaderShard`, under every Hugging Face Trainer, does): the batches read since the last step are
        then one more than the step used at an epoch's first step and one fewer at its last. Counted as
        read, a window that held one of those steps and not the other was off by a batch. One batch read
        ahead is carried to the next step; more than that (batches with no backward of their own:
        validation, a second loader) is counted in this step, as is every batch of a step without a
        backward the probe saw."""
        backwards = self.backwards_per_step[-1] if self.backwards_per_step else 0
        read = len(self.fetched)
        take = read if not backwards else min(read, max(backwards, read - 1))
        samples = sum(self.fetched.popleft() for _ in range(take))
        if self.samples_per_step:
            samples = self.samples_per_step
        if samples:
            self.last_step_samples = samples
        return samples

    def _close_step_loss(self) -> None:
        import torch

        self.backwards_per_step.append(len(self.step_losses))
        if self.step_losses:
            losses, self.step_losses = self.step_losses, []
            loss = losses[0] if len(losses) == 1 else torch.stack([l.float() for l in losses]).mean()
            self.losses.append(loss)
            self.device = loss.device

    @property
    def samples_known(self) -> bool:
        """The samples of a step are known: given, or read from the script's DataLoader batches."""
        return bool(self.samples_per_step) or self.batches_seen > 0

    @property
    def step_source(self) -> str:
        return "optimizer" if self.optimizer_built else "backward"

    @property
    def samples_source(self) -> str | None:
        return "--samples-per-step" if self.samples_per_step else "dataloader" if self.samples_known else None

    def typical_backwards(self) -> int:
        """The median number of backward() calls of a step that had any (1 when none had)."""
        per_step = sorted(n for n in self.backwards_per_step if n)
        return per_step[len(per_step) // 2] if per_step else 1


def loss_tensor(tensors: Any):
    """The scalar tensor `backward()` was called on (the first one of a sequence), detached; else None."""
    import torch

    first = tensors[0] if isinstance(tensors, (list, tuple)) and tensors else tensors
    if isinstance(first, torch.Tensor) and first.numel() == 1:
        return first.detach().reshape(())
    return None


def read_losses(losses: list) -> list[float]:
    """Step losses (detached tensors) as floats, read from the device once."""
    import torch

    if not losses:
        return []
    return [float(v) for v in torch.stack([l.float().to(losses[0].device) for l in losses]).tolist()]
