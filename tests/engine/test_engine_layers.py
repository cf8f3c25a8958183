"""Which layers a model holds, as the convolution knobs ask it."""

import torch
from torch import nn

from torchpace.engine.layers import has_conv


class StandardisedConv2d(nn.Conv2d):
    """A weight-standardised convolution, as timm's StdConv2d: a Conv2d under another class name."""

    def forward(self, x):
        w = self.weight
        w = (w - w.mean(dim=(1, 2, 3), keepdim=True)) / (w.std(dim=(1, 2, 3), keepdim=True) + 1e-5)
        return nn.functional.conv2d(x, w, self.bias, self.stride, self.padding)


def test_a_subclass_of_conv2d_counts_as_a_2d_convolution():
    model = nn.Sequential(StandardisedConv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(2))
    model(torch.randn(1, 3, 8, 8))
    assert has_conv(model, dims=(2,))
    assert not has_conv(model, dims=(1, 3))


def test_1d_and_3d_convolutions_are_not_2d_ones():
    assert has_conv(nn.Conv1d(2, 2, 3)) and not has_conv(nn.Conv1d(2, 2, 3), dims=(2,))
    assert has_conv(nn.ConvTranspose3d(2, 2, 3), dims=(3,)) and not has_conv(nn.Conv3d(2, 2, 3), dims=(2,))


def test_a_model_without_convolutions_has_none():
    assert not has_conv(nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)))
