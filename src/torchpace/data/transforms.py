"""Small reusable image transforms for the datasets (uint8 `(3, H, W)` tensors in): `CropFlipNormalize`
(the `vision` example's) and `RandomResizedCropFlipNormalize` (torchvision's ImageNet training transform,
the `resnet` example's)."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
from PIL import Image


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


class RandomResizedCropFlipNormalize:
    """torchvision's ImageNet training transform without torchvision: `RandomResizedCrop(size,
    scale, ratio)` + `RandomHorizontalFlip()` + `Normalize(mean, std)` on a `(3, H, W)` uint8 image.

    The crop box is drawn as torchvision's `RandomResizedCrop.get_params` draws it: up to 10 tries of an
    area fraction uniform in `scale` and an aspect ratio log-uniform in `ratio` that fits the image, else
    the centre crop of the largest box within `ratio`. The box is resized to `size` x `size` with
    Pillow's bilinear filter (what torchvision uses for a PIL image), flipped left-right with probability
    1/2, then scaled to [0, 1] and normalised per channel. Random draws use torch's global generator
    (seeded per DataLoader worker by torch). The result is a contiguous float32 `(3, size, size)` tensor.

    Args:
        size: side of the square output, pixels.
        mean: per-channel mean of the [0, 1]-scaled pixels.
        std: per-channel standard deviation of the [0, 1]-scaled pixels.
        scale: range of the crop's area as a fraction of the image's (torchvision: (0.08, 1.0)).
        ratio: range of the crop's width / height (torchvision: (3/4, 4/3)).
    """

    _TRIES = 10  # torchvision's RandomResizedCrop.get_params

    def __init__(self, size: int, mean: Sequence[float], std: Sequence[float],
                 scale: tuple[float, float] = (0.08, 1.0), ratio: tuple[float, float] = (3 / 4, 4 / 3)):
        if not (0 < scale[0] <= scale[1] <= 1) or not (0 < ratio[0] <= ratio[1]):
            raise ValueError(f"scale {scale} must be 0 < low <= high <= 1 and ratio {ratio} 0 < low <= high")
        self.size = size
        self.mean = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)
        self.scale, self.ratio = scale, ratio

    def crop_box(self, height: int, width: int) -> tuple[int, int, int, int]:
        """`(top, left, box_height, box_width)` of a random crop of a `height` x `width` image."""
        area = height * width
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(self._TRIES):
            target_area = area * float(torch.empty(1).uniform_(self.scale[0], self.scale[1]))
            aspect = math.exp(float(torch.empty(1).uniform_(log_ratio[0], log_ratio[1])))
            box_w = int(round(math.sqrt(target_area * aspect)))
            box_h = int(round(math.sqrt(target_area / aspect)))
            if 0 < box_w <= width and 0 < box_h <= height:
                top = int(torch.randint(0, height - box_h + 1, size=(1,)))
                left = int(torch.randint(0, width - box_w + 1, size=(1,)))
                return top, left, box_h, box_w
        in_ratio = width / height  # no try fitted: the centre crop of the largest box within `ratio`
        if in_ratio < self.ratio[0]:
            box_w, box_h = width, int(round(width / self.ratio[0]))
        elif in_ratio > self.ratio[1]:
            box_h, box_w = height, int(round(height * self.ratio[1]))
        else:
            box_w, box_h = width, height
        return (height - box_h) // 2, (width - box_w) // 2, box_h, box_w

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        top, left, box_h, box_w = self.crop_box(*image.shape[-2:])
        region = image[:, top:top + box_h, left:left + box_w].permute(1, 2, 0).numpy()  # (h, w, 3) view
        resized = np.array(Image.fromarray(np.ascontiguousarray(region)).resize(
            (self.size, self.size), Image.Resampling.BILINEAR))  # a writable copy: torch.from_numpy takes it as it is
        if torch.rand(()) < 0.5:
            resized = resized[:, ::-1]
        pixels = torch.from_numpy(np.ascontiguousarray(resized)).permute(2, 0, 1).contiguous()
        return (pixels.float().div_(255) - self.mean) / self.std

    def __repr__(self) -> str:
        return f"RandomResizedCropFlipNormalize(size={self.size}, scale={self.scale}, ratio={self.ratio})"
