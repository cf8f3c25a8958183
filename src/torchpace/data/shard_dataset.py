"""`ShardDataset`: the samples of tar shards (see `shards.py`), decoded by a pluggable decoder.

It is an `IterableDataset` that splits itself across DataLoader workers and distributed ranks
(`shards_across_workers = True`): with at least as many shards as readers (workers x ranks), each
reader takes every n-th shard, so no shard is read twice; with fewer shards, every reader streams
all shards and keeps every n-th sample, so the work is still split evenly. Either way each sample is
yielded by exactly one reader per epoch.

Shuffling (`shuffle=True`) is the WebDataset way: the shard order is shuffled per epoch (the same
order in every reader, so their shard sets stay disjoint), then samples pass through a shuffle
buffer of `shuffle_buffer` encoded samples; decoding happens after the buffer. Seeds come from
`seed` and the epoch in the main process, and from the DataLoader's per-epoch base seed in
workers (seeded when the DataLoader has a seeded generator, as in `torchpace.prepare`).
"""

from __future__ import annotations

import copy
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch

from torchpace.data.decoders import PILLOW, Decoder
from torchpace.data.loading import CorruptImageError, check_on_error, decode_image, resolve_decoder, warn_skipped
from torchpace.data.shards import (IMAGE_FIELDS, LABEL_FIELD, PATH_FIELD, ShardError, iter_tar_samples,
                                   load_manifest)


@dataclass(frozen=True)
class ReadPlan:
    """What one reader reads in one epoch: these shards, and of their samples every `stride`-th
    starting at `offset` (stride 1 when the shards themselves are split)."""

    shards: tuple[int, ...]
    offset: int
    stride: int


def plan_reading(shard_order: Sequence[int], reader: int, readers: int) -> ReadPlan:
    """Split an epoch's shard order between `readers`; `reader` is this one's index (0-based)."""
    if len(shard_order) >= readers:
        return ReadPlan(tuple(shard_order[reader::readers]), 0, 1)
    return ReadPlan(tuple(shard_order), reader, readers)


def shuffle_buffered(items: Iterable[Any], size: int, rng: random.Random) -> Iterator[Any]:
    """Yield `items` in a shuffled order using a buffer of `size` items (WebDataset's method)."""
    buffer: list[Any] = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        slot = rng.randrange(len(buffer))
        buffer[slot], item = item, buffer[slot]
        yield item
    rng.shuffle(buffer)
    yield from buffer


def _reader_position() -> tuple[int, int, int | None]:
    """(this reader's index, number of readers, DataLoader base seed or None) over workers and ranks."""
    info = torch.utils.data.get_worker_info()
    worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
    rank, world = 0, 1
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    base_seed = info.seed - info.id if info is not None else None
    return rank * workers + worker, world * workers, base_seed


class ShardDataset(torch.utils.data.IterableDataset):
    """Samples of WebDataset-style tar shards as `(transform(image), label)`.

    Args:
        source: a shard folder with `manifest.json` (from `torchpace shard`), or a list of tar paths.
        decoder: as for `ImageFolderDataset`.
        transform: applied to the `(3, H, W)` uint8 tensor; None returns it as is.
        on_error: `"raise"` a `CorruptImageError` naming the shard, key and source file, or `"skip"`
            the sample with a warning.
        shuffle: shuffle shard order and samples each epoch.
        seed: seeds the shuffles (with the epoch).
        shuffle_buffer: samples held by the shuffle buffer.

    Raises:
        ShardError: no manifest in `source`, or a listed tar cannot be read.
        UsageError: unknown or uninstalled decoder, bad `on_error`.
    """

    shards_across_workers = True  # each DataLoader worker reads its own part (see the module docstring)

    def __init__(self, source: "str | os.PathLike | Sequence[str | os.PathLike]", decoder: "str | Decoder" = PILLOW,
                 transform: Callable[[torch.Tensor], Any] | None = None, on_error: str = "raise",
                 shuffle: bool = False, seed: int = 0, shuffle_buffer: int = 1000):
        self.shards, self.shard_samples, self.classes = _locate(source)
        self.decoder = resolve_decoder(decoder)
        self.transform = transform
        self.on_error = check_on_error(on_error)
        self.shuffle, self.seed, self.shuffle_buffer = shuffle, seed, max(1, shuffle_buffer)
        self._epoch = 0

    def __len__(self) -> int:
        return sum(self.shard_samples)

    def with_decoder(self, decoder: "str | Decoder") -> "ShardDataset":
        """The same shards read with another decoder (this one is unchanged)."""
        other = copy.copy(self)
        other.decoder = resolve_decoder(decoder)
        return other

    def __iter__(self) -> Iterator[tuple[Any, int]]:
        reader, readers, base_seed = _reader_position()
        epoch_seed = f"{self.seed if base_seed is None else base_seed}:{self._epoch}"
        self._epoch += 1
        order = list(range(len(self.shards)))
        if self.shuffle:
            random.Random(epoch_seed).shuffle(order)
        plan = plan_reading(order, reader, readers)
        samples = self._encoded_samples(plan)
        if self.shuffle:
            samples = shuffle_buffered(samples, self.shuffle_buffer, random.Random(f"{epoch_seed}:{reader}"))
        for shard, sample in samples:
            try:
                yield self._decode(shard, sample)
            except CorruptImageError as err:
                if self.on_error == "raise":
                    raise
                warn_skipped(err)

    def _encoded_samples(self, plan: ReadPlan) -> Iterator[tuple[Path, dict[str, Any]]]:
        position = 0
        for shard_index in plan.shards:
            for sample in iter_tar_samples(self.shards[shard_index]):
                if position % plan.stride == plan.offset:
                    yield self.shards[shard_index], sample
                position += 1

    def _decode(self, shard: Path, sample: dict[str, Any]) -> tuple[Any, int]:
        where = f"{shard}:{sample['__key__']}"
        if PATH_FIELD in sample:
            where += f" (source {sample[PATH_FIELD].decode(errors='replace')})"
        field = next((f for f in IMAGE_FIELDS if f in sample), None)
        if field is None or LABEL_FIELD not in sample:
            raise CorruptImageError(f"{where} has no image ({'/'.join(IMAGE_FIELDS)}) or no {LABEL_FIELD} member")
        try:
            label = int(sample[LABEL_FIELD])
        except ValueError:
            raise CorruptImageError(f"{where} has a label that is not an integer: {sample[LABEL_FIELD][:20]!r}") from None
        image = decode_image(self.decoder, sample[field], where)
        return (self.transform(image) if self.transform is not None else image), label

    def __repr__(self) -> str:
        return (f"ShardDataset(shards={len(self.shards)}, samples={len(self)}, decoder={self.decoder.name!r}, "
                f"shuffle={self.shuffle}, on_error={self.on_error!r})")


def _locate(source) -> tuple[list[Path], list[int], tuple[str, ...]]:
    """(shard paths, samples per shard, class names) of a shard folder or a list of tar files."""
    if isinstance(source, (str, os.PathLike)):
        folder = Path(source).expanduser()
        manifest = load_manifest(folder)
        return [folder / s.name for s in manifest.shards], [s.samples for s in manifest.shards], manifest.classes
    paths = [Path(p).expanduser() for p in source]
    if not paths:
        raise ShardError("no shards given: pass a shard folder or a non-empty list of .tar files")
    return paths, [sum(1 for _ in iter_tar_samples(p)) for p in paths], ()
