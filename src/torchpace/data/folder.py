"""`ImageFolderDataset`: a drop-in for `torchvision.datasets.ImageFolder` with a pluggable decoder.

`root/<class>/<image>` -> `(transform(image), label)`, where `image` is a `(3, H, W)` uint8 RGB
tensor from the chosen decoder and `label` the class's index in the sorted class names. The same
data can be read as tar shards: `as_shards()` writes them once into the cache (see `shards.py`) and
returns the equivalent `ShardDataset`, which is how the `data.format` knob swaps it.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, Callable

import torch

from torchpace.data.cache import cache_root
from torchpace.data.decoders import PILLOW, Decoder
from torchpace.data.loading import CorruptImageError, check_on_error, decode_image, resolve_decoder, warn_skipped
from torchpace.data.scan import IMAGE_SUFFIXES, scan_folder
from torchpace.data.shards import ensure_cached_shards
from torchpace.errors import UsageError

Transform = Callable[[torch.Tensor], Any]


class ImageFolderDataset(torch.utils.data.Dataset):
    """Images in class sub-folders, decoded by a pluggable decoder.

    Args:
        root: folder with one sub-folder per class (`root/<class>/<image>`).
        decoder: `pillow` (default), `simplejpeg`, `turbojpeg`, `torchvision`, `torchvision-cuda`,
            or a `Decoder` object.
        transform: applied to the `(3, H, W)` uint8 tensor (e.g. `CropFlipNormalize`); None
            returns the uint8 tensor.
        on_error: `"raise"` a `CorruptImageError` naming the file, or `"skip"` it: a warning names
            the file and the next readable image (by index, wrapping) is returned in its place, so
            the length and the batch shapes stay the same.
        suffixes: image file suffixes to take (case-insensitive).
        shard_cache_dir: cache root for `as_shards()` (default `$XDG_CACHE_HOME/torchpace`).

    Raises:
        FolderError (a UsageError): `root` is missing, empty, or has no class sub-folders.
        UsageError: unknown or uninstalled decoder (with its install command), bad `on_error`, or a
            JPEG-only decoder over non-JPEG files.
    """

    def __init__(self, root: str | os.PathLike, decoder: "str | Decoder" = PILLOW, transform: Transform | None = None,
                 on_error: str = "raise", suffixes: tuple[str, ...] = IMAGE_SUFFIXES,
                 shard_cache_dir: str | os.PathLike | None = None):
        self.index = scan_folder(root, suffixes)
        self.on_error = check_on_error(on_error)
        self.transform = transform
        self.shard_cache_dir = Path(shard_cache_dir) if shard_cache_dir is not None else None
        self.decoder = self._checked_decoder(decoder)

    @property
    def root(self) -> Path:
        return self.index.root

    @property
    def classes(self) -> tuple[str, ...]:
        return self.index.classes

    @property
    def samples(self) -> tuple[tuple[str, int], ...]:
        """`(path, label)` per sample, in index order (torchvision's `samples`)."""
        return self.index.samples

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Class name -> label, as torchvision's ImageFolder has it."""
        return {name: label for label, name in enumerate(self.classes)}

    @property
    def targets(self) -> list[int]:
        """The label of every sample, in index order (torchvision's `targets`)."""
        return [label for _, label in self.samples]

    def _checked_decoder(self, decoder: "str | Decoder") -> Decoder:
        resolved = resolve_decoder(decoder)
        unreadable = [path for path, _ in self.samples if not resolved.reads(Path(path).suffix)]
        if unreadable:
            raise UsageError(f"the {resolved.name} decoder reads JPEG only, but {len(unreadable)} files under "
                             f"{self.root} are not JPEG (e.g. {unreadable[0]}); use decoder='pillow'")
        return resolved

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        for offset in range(len(self)):
            try:
                return self.load((index + offset) % len(self))
            except CorruptImageError as err:
                if self.on_error == "raise":
                    raise
                warn_skipped(err)
        raise CorruptImageError(f"no image under {self.root} could be decoded with the {self.decoder.name} decoder")

    def load(self, index: int) -> tuple[Any, int]:
        """Sample `index`, whatever `on_error` says: CorruptImageError naming the file when it fails."""
        path, label = self.samples[index]
        try:
            with open(path, "rb") as stream:
                data = stream.read()
        except OSError as err:
            raise CorruptImageError(f"cannot read {path}: {err.strerror or err}") from err
        image = decode_image(self.decoder, data, path)
        return (self.transform(image) if self.transform is not None else image), label

    def with_decoder(self, decoder: "str | Decoder") -> "ImageFolderDataset":
        """The same dataset read with another decoder (this one is unchanged)."""
        other = copy.copy(self)
        other.decoder = other._checked_decoder(decoder)
        return other

    def as_shards(self, *, shuffle: bool = True, seed: int = 0, shuffle_buffer: int = 1000):
        """The same samples read from tar shards: made once in the cache (atomically), then reused.

        Args:
            shuffle: shuffle shard order and samples (through a buffer) each epoch.
            seed: seeds the shuffles.
            shuffle_buffer: samples held for shuffling (encoded bytes, a few KB each).

        Returns:
            ShardDataset with this dataset's decoder, transform and on_error.
        """
        from torchpace.data.shard_dataset import ShardDataset

        shard_dir = ensure_cached_shards(self.index, self.shard_cache_dir or cache_root())
        return ShardDataset(shard_dir, decoder=self.decoder, transform=self.transform, on_error=self.on_error,
                            shuffle=shuffle, seed=seed, shuffle_buffer=shuffle_buffer)

    def __repr__(self) -> str:
        return (f"ImageFolderDataset({str(self.root)!r}, samples={len(self)}, classes={len(self.classes)}, "
                f"decoder={self.decoder.name!r}, on_error={self.on_error!r})")
