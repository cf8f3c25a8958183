"""Input pipelines: image datasets with pluggable decoders, tar shards, and their measurement.

- `ImageFolderDataset(root, decoder=..., transform=..., on_error=...)`: `root/<class>/<image>`;
- `ShardDataset(shard_dir, ...)`: the same samples from WebDataset-compatible tar shards
  (`torchpace shard` writes them; `ImageFolderDataset.as_shards()` makes them in the cache);
- decoders `pillow`, `simplejpeg`, `turbojpeg`, `torchvision`, `torchvision-cuda` (optional extras);
- `CropFlipNormalize`: the random crop + flip + normalise the `vision` example trains with.

The `data.decoder` and `data.format` knobs swap these for a workload built on them, so `torchpace
tune` measures decoders and shards against the real step; `torchpace bench-data` measures the input
pipeline alone.
"""

from torchpace.data.decoders import DECODER_NAMES, DecodeError, Decoder, available_decoders, get_decoder
from torchpace.data.folder import ImageFolderDataset
from torchpace.data.loading import CorruptImageError, SkippedImageWarning
from torchpace.data.scan import FolderError, scan_folder
from torchpace.data.shard_dataset import ShardDataset
from torchpace.data.shards import ShardError, ShardManifest, load_manifest, write_shards
from torchpace.data.transforms import CropFlipNormalize

__all__ = [
    "DECODER_NAMES", "DecodeError", "Decoder", "available_decoders", "get_decoder", "ImageFolderDataset",
    "CorruptImageError", "SkippedImageWarning", "FolderError", "scan_folder", "ShardDataset", "ShardError",
    "ShardManifest", "load_manifest", "write_shards", "CropFlipNormalize",
]
