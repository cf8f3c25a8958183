"""`RandomResizedCropFlipNormalize`: torchvision's ImageNet training transform without torchvision."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from torchpace.data import RandomResizedCropFlipNormalize

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _gradient(height: int, width: int) -> torch.Tensor:
    """A `(3, H, W)` uint8 image that grows left to right (so a flip is visible), channels apart."""
    columns = np.linspace(0, 255, width, dtype=np.float32)
    pixels = np.stack([np.broadcast_to(columns * f, (height, width)) for f in (1.0, 0.5, 0.25)], axis=-1)
    return torch.from_numpy(pixels.astype(np.uint8)).permute(2, 0, 1)  # channels-last memory, as the decoders give


def test_the_output_is_a_normalised_contiguous_square_of_the_asked_size():
    torch.manual_seed(0)
    out = RandomResizedCropFlipNormalize(48, MEAN, STD)(_gradient(60, 90))
    assert out.shape == (3, 48, 48) and out.dtype == torch.float32 and out.is_contiguous()
    grey = torch.full((3, 40, 40), 128, dtype=torch.uint8)
    flat = RandomResizedCropFlipNormalize(16, MEAN, STD)(grey)
    expected = (128 / 255 - torch.tensor(MEAN)) / torch.tensor(STD)
    assert torch.allclose(flat, expected.view(3, 1, 1).expand(3, 16, 16), atol=1e-6)


def test_crop_boxes_have_torchvisions_area_and_aspect_ranges_and_lie_inside_the_image():
    transform = RandomResizedCropFlipNormalize(32, MEAN, STD)
    torch.manual_seed(1)
    height, width = 120, 160
    areas, aspects = [], []
    for _ in range(400):
        top, left, box_h, box_w = transform.crop_box(height, width)
        assert 0 <= top and top + box_h <= height and 0 <= left and left + box_w <= width
        areas.append(box_h * box_w / (height * width))
        aspects.append(box_w / box_h)
    rounding = 0.15  # sides are rounded to whole pixels: small boxes stray a little beyond the ranges
    assert 0.08 * (1 - rounding) <= min(areas) and max(areas) <= 1.0
    assert min(aspects) >= 3 / 4 * (1 - rounding) and max(aspects) <= 4 / 3 * (1 + rounding)
    assert max(areas) - min(areas) > 0.5 and max(aspects) / min(aspects) > 1.5  # the whole ranges are drawn


@pytest.mark.parametrize("height, width, expected", [
    (10, 100, (0, 43, 10, 13)),  # wider than 4:3: the full height, 4:3 of it wide, centred
    (100, 10, (43, 0, 13, 10)),  # taller than 3:4: the full width, centred
])
def test_an_image_no_try_fits_gets_the_centre_crop_within_the_ratio(height, width, expected):
    transform = RandomResizedCropFlipNormalize(8, MEAN, STD, scale=(1.0, 1.0))
    assert transform.crop_box(height, width) == expected


def test_whole_image_crops_are_resized_with_pillows_bilinear_filter_and_flipped_half_the_time():
    image = _gradient(64, 64)
    transform = RandomResizedCropFlipNormalize(32, MEAN, STD, scale=(1.0, 1.0), ratio=(1.0, 1.0))
    resized = np.array(Image.fromarray(image.permute(1, 2, 0).numpy().copy()).resize((32, 32), Image.Resampling.BILINEAR))
    plain = (torch.from_numpy(resized).permute(2, 0, 1).float() / 255 - torch.tensor(MEAN).view(3, 1, 1)) \
        / torch.tensor(STD).view(3, 1, 1)
    torch.manual_seed(2)
    outputs = [transform(image) for _ in range(40)]
    flipped = [torch.allclose(out, plain.flip(2), atol=1e-6) for out in outputs]
    assert all(torch.allclose(out, plain, atol=1e-6) or f for out, f in zip(outputs, flipped))
    assert 5 <= sum(flipped) <= 35


def test_the_same_seed_gives_the_same_sample():
    transform = RandomResizedCropFlipNormalize(24, MEAN, STD)
    image = _gradient(50, 70)
    torch.manual_seed(3)
    first = transform(image)
    torch.manual_seed(3)
    assert torch.equal(first, transform(image))


@pytest.mark.parametrize("scale, ratio", [((0.5, 0.1), (0.75, 1.33)), ((0.0, 1.0), (0.75, 1.33)),
                                          ((0.08, 1.0), (1.5, 1.0))])
def test_scale_and_ratio_ranges_that_cannot_be_drawn_from_are_refused(scale, ratio):
    with pytest.raises(ValueError, match="scale .* must be 0 < low <= high <= 1"):
        RandomResizedCropFlipNormalize(8, MEAN, STD, scale=scale, ratio=ratio)


def test_crop_boxes_are_torchvisions_for_the_same_random_stream():
    transforms = pytest.importorskip("torchvision.transforms", reason="torchvision is not installed: its "
                                     "RandomResizedCrop is the reference this transform's boxes are compared with")
    ours = RandomResizedCropFlipNormalize(32, MEAN, STD)
    reference = transforms.RandomResizedCrop(32)
    image = torch.zeros(3, 120, 160, dtype=torch.uint8)
    for seed in range(50):
        torch.manual_seed(seed)
        expected = reference.get_params(image, list(reference.scale), list(reference.ratio))
        torch.manual_seed(seed)
        assert ours.crop_box(120, 160) == tuple(expected), seed
    assert math.isclose(reference.ratio[0], 3 / 4) and reference.scale == (0.08, 1.0)
