"""`inference`: the vision model in eval mode (no loss), for latency/throughput tuning."""

from __future__ import annotations

import torch

from torchpace.examples.vision import SmallResNet, image_dataset
from torchpace.workload import Workload


def workload() -> Workload:
    torch.manual_seed(0)
    return Workload(
        model=SmallResNet().eval(),
        dataset=image_dataset(train=False),
        loss=None,
        batch_size=64,
        shuffle=False,
        name="inference",
    )
