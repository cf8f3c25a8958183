"""`resnet`: a standard ResNet trained as the ImageNet reference scripts train it, on generated JPEGs.

The model is torchvision's ResNet written here (torchvision is not a dependency): the same modules
under the same names (`conv1`, `bn1`, `relu`, `maxpool`, `layer1`..`layer4`, `avgpool`, `fc`), so its
state_dict has torchvision's keys and shapes and the parameter counts match (ResNet-50: 25,557,032
and ResNet-18: 11,689,512 with 1,000 classes). The data is a folder of JPEG files in ImageFolder
layout, written once under `$XDG_CACHE_HOME/torchpace/` and read back every epoch by a
`torchpace.data.ImageFolderDataset`: decoded, random-resized-cropped, flipped and normalised in the
DataLoader's workers, as torchvision's `ImageFolder` + `RandomResizedCrop` pipeline does.

Two sizes:

| size | model | images (sources) | crop | classes | batch |
|---|---|---|---|---|---|
| `small` | ResNet-18 | 1,600 of 112-128 px | 96 px | 10 | 32 |
| `full` | ResNet-50 | 8,000 of 256-320 px | 224 px | 100 | 256 |

`resnet` picks the size by the device (`size_for`): full where CUDA is available, else small;
`resnet-small` and `resnet-full` name one. The defaults are the reference scripts' (the PyTorch
ImageNet example, torchvision's classification reference): fp32, eager, contiguous NCHW batches,
SGD(momentum=0.9, weight_decay=1e-4) at their lr 0.1 per 256 samples, scaled linearly to the batch
(`scaled_lr`: 0.0125 at small size's 32, as Goyal et al.'s rule; 0.1 at 32 made the loss spike from 2.3
to 14.6 in the first steps, a curve the convergence guard cannot judge), cross-entropy, a DataLoader with
4 workers (`-j 4`) that pins memory where CUDA is present.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from torchpace.data import ImageFolderDataset, RandomResizedCropFlipNormalize
from torchpace.data.cache import cache_root
from torchpace.examples.sizes import FULL, SIZES, SMALL, size_for
from torchpace.examples.vision import write_jpeg_folder
from torchpace.workload import Workload

WORKERS = 4  # the PyTorch ImageNet example's `-j 4`, torchvision's reference `-j`: a few decoding workers
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_DATASET_VERSION = "resnet-jpeg-v1"  # bump when the images written change


@dataclass(frozen=True)
class ResNetSize:
    """One size of the workload: the model, its data and its batch."""

    size: str
    arch: str  # "resnet18" or "resnet50"
    crop: int  # side of the training crop, pixels
    sides: tuple[int, int]  # smallest and largest side of the source images, pixels
    classes: int
    per_class: int  # images per class
    batch_size: int

    @property
    def label(self) -> str:
        return f"resnet ({ARCHS[self.arch][2]}, {self.crop} px, {self.size})"


# ---- the model: torchvision.models.resnet, the same modules under the same names ------------------


def _conv3x3(c_in: int, c_out: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, kernel_size=3, stride=stride, padding=1, bias=False)


def _conv1x1(c_in: int, c_out: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (ResNet-18/34)."""

    expansion = 1

    def __init__(self, c_in: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = _conv3x3(c_in, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + identity)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided, as ResNet v1.5 and torchvision), 1x1 expand by 4, residual (ResNet-50+)."""

    expansion = 4

    def __init__(self, c_in: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = _conv1x1(c_in, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = _conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + identity)


class ResNet(nn.Module):
    """torchvision's `ResNet(block, layers, num_classes)`: a 7x7 stem, max-pool, four stages of blocks
    (64, 128, 256, 512 planes; stride 2 from the second), global average pool, linear classifier.
    Convolutions start Kaiming-normal (fan-out), batch norms at weight 1, bias 0, as torchvision's."""

    def __init__(self, block: type[BasicBlock] | type[Bottleneck], layers: tuple[int, int, int, int],
                 num_classes: int = 1000):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 256, layers[2], stride=2)
        self.layer4 = self._make_layer(block, 512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.constant_(module.weight, 1)
                nn.init.constant_(module.bias, 0)

    def _make_layer(self, block, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(_conv1x1(self.inplanes, planes * block.expansion, stride),
                                       nn.BatchNorm2d(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(num_classes: int = 1000) -> ResNet:
    """ResNet-18: BasicBlock, 2-2-2-2 (11,689,512 parameters with 1,000 classes)."""
    return ResNet(BasicBlock, (2, 2, 2, 2), num_classes)


def resnet50(num_classes: int = 1000) -> ResNet:
    """ResNet-50: Bottleneck, 3-4-6-3 (25,557,032 parameters with 1,000 classes)."""
    return ResNet(Bottleneck, (3, 4, 6, 3), num_classes)


ARCHS: dict[str, tuple[Callable[[int], ResNet], int, str]] = {  # name -> (builder, blocks' expansion, label)
    "resnet18": (resnet18, BasicBlock.expansion, "ResNet-18"),
    "resnet50": (resnet50, Bottleneck.expansion, "ResNet-50"),
}

RESNET_SIZES = {
    # 32 crops of 96 px: well under a second per step on 2 cores (fp32), so a 15-minute tune decides its knobs
    SMALL: ResNetSize(SMALL, "resnet18", crop=96, sides=(112, 128), classes=10, per_class=160, batch_size=32),
    # the reference scripts' 224 px ResNet-50; 256 per step is NVIDIA's and timm's per-GPU batch
    FULL: ResNetSize(FULL, "resnet50", crop=224, sides=(256, 320), classes=100, per_class=80, batch_size=256),
}


# ---- the data -----------------------------------------------------------------------------------


def image_root(size: str) -> Path:
    """The JPEG folder of `size`, written on first use under torchpace's cache."""
    spec = RESNET_SIZES[size]
    return write_jpeg_folder(cache_root() / f"{_DATASET_VERSION}-{size}", classes=spec.classes,
                             per_class=spec.per_class, sides=spec.sides)


def image_dataset(size: str) -> ImageFolderDataset:
    """The training images of `size`: decoded with Pillow, random-resized-cropped, flipped, normalised."""
    spec = RESNET_SIZES[size]
    transform = RandomResizedCropFlipNormalize(spec.crop, IMAGENET_MEAN, IMAGENET_STD)
    return ImageFolderDataset(image_root(size), decoder="pillow", transform=transform)


def build_model(size: str, num_classes: int | None = None) -> ResNet:
    """The model of `size` (its class count unless `num_classes` is given), seeded: the same every call."""
    spec = RESNET_SIZES[size]
    torch.manual_seed(0)
    return ARCHS[spec.arch][0](spec.classes if num_classes is None else num_classes)


_LR_PER_256 = 0.1  # the reference scripts' learning rate for a batch of 256


def scaled_lr(batch_size: int) -> float:
    """The reference learning rate scaled linearly to `batch_size` (0.1 at 256)."""
    return _LR_PER_256 * batch_size / 256


def make_optimizer(params, lr: float = _LR_PER_256) -> torch.optim.SGD:
    """The reference scripts' optimizer: SGD, momentum 0.9, weight decay 1e-4."""
    return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=1e-4)


def _cross_entropy(output: torch.Tensor, batch) -> torch.Tensor:
    return nn.functional.cross_entropy(output.float(), batch[1])


# ---- the workloads ------------------------------------------------------------------------------


def build_workload(size: str) -> Workload:
    """The `resnet` Workload at `size` (`small` or `full`)."""
    if size not in RESNET_SIZES:
        raise ValueError(f"resnet size {size!r} is not one of {', '.join(SIZES)}")
    spec = RESNET_SIZES[size]
    dataset = image_dataset(size)
    return Workload(
        model=build_model(size),
        dataset=dataset,
        loss=_cross_entropy,
        optimizer=lambda params: make_optimizer(params, lr=scaled_lr(spec.batch_size)),
        batch_size=spec.batch_size,
        loader_options={"num_workers": WORKERS, "pin_memory": torch.cuda.is_available()},
        name=spec.label,
    )


def workload() -> Workload:
    """`resnet`: full size where CUDA is available, else small."""
    return build_workload(size_for(torch.cuda.is_available()))


def small() -> Workload:
    """`resnet-small`: ResNet-18 on 96 px crops."""
    return build_workload(SMALL)


def full() -> Workload:
    """`resnet-full`: ResNet-50 on 224 px crops."""
    return build_workload(FULL)
