"""`vision`: a small ResNet-style CNN on real JPEG files, decoded and augmented in the loader.

The images are written once (deterministically) under `$XDG_CACHE_HOME/torchpace/` and read back
from disk every epoch by a `torchpace.data.ImageFolderDataset` (Pillow, random crop + flip +
normalise), so on small hosts this workload is input-bound: the data knobs matter, `data.decoder`
and `data.format` (files or shards) included.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn

from torchpace.data import CropFlipNormalize, ImageFolderDataset
from torchpace.data.cache import cache_root
from torchpace.workload import Workload

N_CLASSES = 10
IMAGES_PER_CLASS = 100
IMAGE_SIZE = 96
CROP_SIZE = 80
_DATASET_VERSION = "vision-jpeg-v1"
_MEAN = (0.5, 0.5, 0.5)
_STD = (0.25, 0.25, 0.25)


def _synthetic_image(label: int, index: int, classes: int = N_CLASSES, height: int = IMAGE_SIZE,
                     width: int = IMAGE_SIZE) -> Image.Image:
    """A class-dependent pattern (oriented stripes in a class colour) with per-image noise."""
    rng = np.random.default_rng(label * 100_003 + index)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    angle = np.pi * label / classes
    phase = rng.uniform(0, 2 * np.pi)
    stripes = np.sin((xx * np.cos(angle) + yy * np.sin(angle)) / 4.0 + phase)
    colour = np.array([(label * 37) % 256, (label * 91) % 256, (label * 53) % 256], dtype=np.float32) / 255
    pixels = 0.5 + 0.35 * stripes[..., None] * colour + rng.normal(0, 0.08, (height, width, 3))
    return Image.fromarray((np.clip(pixels, 0, 1) * 255).astype(np.uint8))


def _image_shape(label: int, index: int, sides: tuple[int, int]) -> tuple[int, int]:
    """(height, width) of one image: each side drawn from `sides` (inclusive), fixed per image."""
    if sides[0] == sides[1]:
        return sides[0], sides[0]
    rng = np.random.default_rng((label, index, 1))  # not the pattern's stream: same-size folders stay as they were
    height, width = rng.integers(sides[0], sides[1] + 1, size=2)
    return int(height), int(width)


def write_jpeg_folder(root: Path, classes: int = N_CLASSES, per_class: int = IMAGES_PER_CLASS,
                      sides: tuple[int, int] = (IMAGE_SIZE, IMAGE_SIZE)) -> Path:
    """Write `root/<class>/<i>.jpg` once; a complete folder is reused. Written to a temp dir and
    renamed into place, so an interrupted write never leaves a half folder under the final name.
    Classes are written in parallel, one process per usable core (a few ms per image).

    Args:
        root: the folder to write.
        classes: class sub-folders (`class_00`, `class_01`, ...).
        per_class: images in each.
        sides: (smallest, largest) side in pixels; each image's height and width are drawn from it,
            as photos come in many sizes (equal: every image is square, of that side).
    """
    if (root / ".complete").exists():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=root.parent))
    digits = max(2, len(str(classes - 1)))
    jobs = [(tmp / f"class_{label:0{digits}d}", label, classes, per_class, sides) for label in range(classes)]
    processes = min(len(jobs), len(os.sched_getaffinity(0)))
    if processes > 1:
        # numpy + Pillow only: fork is safe; each worker dies quietly of the SIGTERM the pool ends it with (a
        # forked copy of a command's stop policy would raise it there, and print a worker's traceback)
        with multiprocessing.get_context("fork").Pool(processes, initializer=_default_stop_signals) as pool:
            pool.starmap(_write_class, jobs)
    else:
        for job in jobs:
            _write_class(*job)
    (tmp / ".complete").touch()
    try:
        tmp.rename(root)
    except OSError:  # another process finished first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def _default_stop_signals() -> None:
    """In a worker of the pool that writes the images: the stop signals do what they do by default."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def _write_class(folder: Path, label: int, classes: int, per_class: int, sides: tuple[int, int]) -> None:
    folder.mkdir()
    for index in range(per_class):
        image = _synthetic_image(label, index, classes, *_image_shape(label, index, sides))
        image.save(folder / f"{index:04d}.jpg", quality=90)


def image_dataset(train: bool = True) -> ImageFolderDataset:
    """The example's JPEG folder as a dataset: random crop + flip when `train`, centre crop otherwise."""
    transform = CropFlipNormalize(CROP_SIZE, _MEAN, _STD, random=train)
    return ImageFolderDataset(image_root(), decoder="pillow", transform=transform)


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class SmallResNet(nn.Module):
    def __init__(self, widths: tuple[int, ...] = (16, 32, 64), classes: int = N_CLASSES):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 2, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        blocks, c_in = [], widths[0]
        for i, width in enumerate(widths):
            blocks.append(BasicBlock(c_in, width, stride=1 if i == 0 else 2))
            c_in = width
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(c_in, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def _cross_entropy(output: torch.Tensor, batch) -> torch.Tensor:
    return nn.functional.cross_entropy(output.float(), batch[1])


def image_root() -> Path:
    """The example's JPEG folder, written on first use."""
    return write_jpeg_folder(cache_root() / _DATASET_VERSION)


def workload() -> Workload:
    torch.manual_seed(0)
    return Workload(
        model=SmallResNet(),
        dataset=image_dataset(train=True),
        loss=_cross_entropy,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
        batch_size=64,
        name="vision",
    )
