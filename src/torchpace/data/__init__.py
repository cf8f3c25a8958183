"""Input pipelines: image datasets with pluggable decoders, tar shards, and their measurement.

- `ImageFolderDataset(root, decoder=..., transform=..., on_error=...)`: `root/<class>/<image>`;
- `ShardDataset(shard_dir, ...)`: the same samples from WebDataset-compatible tar shards
  (`torchpace shard` writes them; `ImageFolderDataset.as_shards()` makes them in the cache);
- decoders `pillow`, `simplejpeg`, `turbojpeg`, `torchvision`, `torchvision-cuda` (optional extras);
- `CropFlipNormalize`: the random crop + flip + normalise the `vision` example trains with;
- `RandomResizedCropFlipNormalize`: torchvision's ImageNet training transform (random resized crop + flip
  + normalise), the `resnet` example's.

The `data.decoder` and `data.format` knobs swap these for a workload built on them, so `torchpace
tune` measures decoders and shards against the real step; `torchpace bench-data` measures the input
pipeline alone.

Importing this package loads nothing heavy: each name is imported from its module when first used,
so `torchpace shard` (scan + tar writing) runs without torch, numpy or Pillow.
"""

from __future__ import annotations

import importlib
from typing import Any

_SOURCES = {  # name -> the module that defines it
    "DECODER_NAMES": "decoders", "DecodeError": "decoders", "Decoder": "decoders", "available_decoders": "decoders",
    "get_decoder": "decoders", "ImageFolderDataset": "folder", "CorruptImageError": "loading",
    "SkippedImageWarning": "loading", "FolderError": "scan", "scan_folder": "scan", "ShardDataset": "shard_dataset",
    "ShardError": "shards", "ShardManifest": "shards", "load_manifest": "shards", "write_shards": "shards",
    "CropFlipNormalize": "transforms", "RandomResizedCropFlipNormalize": "transforms",
}
__all__ = list(_SOURCES)


def __getattr__(name: str) -> Any:
    if name not in _SOURCES:
        raise AttributeError(f"module 'torchpace.data' has no attribute {name!r}")
    return getattr(importlib.import_module(f"torchpace.data.{_SOURCES[name]}"), name)


def __dir__() -> list[str]:
    return sorted(__all__)
