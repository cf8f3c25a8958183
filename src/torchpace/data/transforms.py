"""Small reusable image transforms for the datasets (uint8 `(3, H, W)` tensors in)."""

from __future__ import annotations

from typing import Sequence

import torch


class CropFlipNormalize:
    """Crop to `crop_size` (random position and a random horizontal flip when `random`, else the
    centre), then scale to [0, 1] and normalise per channel: `(x / 255 - mean) / std`.

    Cropping happens on the uint8 image, before the float conversion, so only the kept pixels are
    converted. Random draws use torch's global generator (seeded per DataLoader worker by torch).

    Args:
        crop_size: side of the square crop, pixels.
        mean: per-channel mean of the [0, 1]-scaled pixels.
        std: per-channel standard deviation of the [0, 1]-scaled pixels.
        random: random crop + flip (training) when True, centre crop (evaluation) when False.
    """

    def __init__(self, crop_size: int, mean: Sequence[float], std: Sequence[float], random: bool = True):
        self.crop_size = crop_size
        self.mean = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)
        self.random = random

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        height, width = image.shape[-2:]
        if height < self.crop_size or width < self.crop_size:
            raise ValueError(f"image of {height}x{width} pixels is smaller than the {self.crop_size}-pixel crop")
        rows, cols = height - self.crop_size + 1, width - self.crop_size + 1
        if self.random and rows == cols:  # one draw for both: the random stream the vision example always used
            top, left = (int(v) for v in torch.randint(0, rows, (2,)))
        elif self.random:
            top, left = int(torch.randint(0, rows, ())), int(torch.randint(0, cols, ()))
        else:
            top, left = (height - self.crop_size) // 2, (width - self.crop_size) // 2
        crop = image[:, top:top + self.crop_size, left:left + self.crop_size]
        if self.random and torch.rand(()) < 0.5:
            crop = crop.flip(2)
        return (crop.float().div_(255) - self.mean.to(crop.device)) / self.std.to(crop.device)

    def __repr__(self) -> str:
        return f"CropFlipNormalize(crop_size={self.crop_size}, random={self.random})"
