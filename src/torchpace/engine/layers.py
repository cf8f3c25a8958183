"""What a model is made of, as the knobs that depend on its layers ask it."""

from __future__ import annotations

from torch import nn


def has_conv(model: nn.Module, dims: tuple[int, ...] = (1, 2, 3)) -> bool:
    """True when `model` holds a convolution over `dims` spatial dimensions.

    Any subclass of torch's convolutions counts (timm's `StdConv2d` and `Conv2dSame`, a weight-standardised
    or padded Conv2d, transposed convolutions), not only the classes named Conv1d/Conv2d/Conv3d.
    """
    return any(isinstance(m, nn.modules.conv._ConvNd) and len(m.kernel_size) in dims for m in model.modules())
