"""Input-pipeline knobs: which JPEG decoder, and files or tar shards (DATASET point).

They apply to workloads whose dataset is a `torchpace.data.ImageFolderDataset` (both knobs) or a
`ShardDataset` (`data.decoder`), such as the built-in `vision` and `inference`: `apply` returns the
equivalent dataset read another way, so `tune` measures it against the real step. Nothing heavy is
imported here: `torchpace.data` (torch) is imported when a knob is asked about a workload.
"""

from __future__ import annotations

import importlib.util

from torchpace.knobs.base import Knob, Point

# the same names as torchpace.data.decoders.DECODER_NAMES (kept here so the registry stays light)
_DECODERS = ("pillow", "simplejpeg", "turbojpeg", "torchvision", "torchvision-cuda")
_NOT_OURS = ("only for workloads whose dataset is a torchpace.data.ImageFolderDataset{}; "
             "this workload's dataset is a {}")


def _dataset_type_reason(workload, shards_too: bool) -> str | None:
    # torch: the datasets import it
    from torchpace.data import ImageFolderDataset, ShardDataset

    accepted = (ImageFolderDataset, ShardDataset) if shards_too else (ImageFolderDataset,)
    if isinstance(workload.dataset, accepted):
        return None
    return _NOT_OURS.format(" or ShardDataset" if shards_too else "", type(workload.dataset).__name__)


class DecoderKnob(Knob):
    name = "data.decoder"
    stage = "data"
    point = Point.DATASET
    default = "auto"
    choices = ("auto", *_DECODERS)
    apply_order = 60  # after data.format: the shard dataset gets the decoder too
    help = ("JPEG decoder of a torchpace.data dataset: auto keeps the one the workload built it with; "
            "pillow, simplejpeg, turbojpeg (libjpeg-turbo), torchvision, torchvision-cuda (nvJPEG).")

    def applies(self, host, workload):
        return _dataset_type_reason(workload, shards_too=True)

    def candidates(self, host, workload):
        built_with = getattr(getattr(workload.dataset, "decoder", None), "name", None)
        return [self.default] + [v for v in _DECODERS
                                 if v != built_with and self.value_applies(v, host, workload) is None]

    def value_applies(self, value, host, workload):
        if value == self.default:
            return None
        if value == "torchvision-cuda" and not host.cuda_available:
            return "decoding on the GPU needs a CUDA device; none here"
        from torchpace.data.decoders import decoder_unavailable_reason

        return decoder_unavailable_reason(value)

    def conflicts(self, values):
        if values.get(self.name) != "torchvision-cuda":
            return None
        if values.get("data.num_workers", 0):
            return "torchvision-cuda decodes on the GPU, which DataLoader worker processes cannot use: set data.num_workers = 0"
        if values.get("data.pin_memory"):
            return "torchvision-cuda batches are already on the GPU: data.pin_memory must be false"
        return None

    def apply(self, value, target, ctx):
        if value == self.default or target.decoder.name == value:
            return target
        return target.with_decoder(value)


class FormatKnob(Knob):
    name = "data.format"
    stage = "data"
    point = Point.DATASET
    default = "files"
    choices = ("files", "shards")
    apply_order = 40
    help = ("read a torchpace.data.ImageFolderDataset as its image files, or as WebDataset tar shards "
            "written once into the cache (sequential reads; shards split across loader workers).")

    def applies(self, host, workload):
        return _dataset_type_reason(workload, shards_too=False)

    def value_applies(self, value, host, workload):
        if value == "shards" and importlib.util.find_spec("webdataset") is None:
            return "writing the shards needs the webdataset package; install: pip install webdataset"
        return None

    def apply(self, value, target, ctx):
        if value == "files":
            return target
        return target.as_shards(shuffle=ctx.workload.shuffle, seed=ctx.workload.seed)


KNOBS = [FormatKnob(), DecoderKnob()]
