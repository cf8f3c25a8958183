"""`inference`: the vision model in eval mode (no loss), for latency/throughput tuning."""

from __future__ import annotations

import torch

from torchpace.examples.vision import JpegFolder, SmallResNet, image_root
from torchpace.workload import Workload


def workload() -> Workload:
    torch.manual_seed(0)
    return Workload(
        model=SmallResNet().eval(),
        dataset=JpegFolder(image_root(), train=False),
        loss=None,
        batch_size=64,
        shuffle=False,
        name="inference",
    )
