"""`run_data_bench`: measure the input pipeline alone, without a model (`torchpace bench-data`).

What is measured, for image files and for tar shards:

- **read** (no decoding): files/s and MB/s from disk, *cold* and *warm*. Cold: every file (or shard)
  is evicted from the page cache right before it is read, with `posix_fadvise(POSIX_FADV_DONTNEED)`
  (no root needed; `--cold drop-caches` writes `/proc/sys/vm/drop_caches` instead, as root, before
  the pass and whenever the pass starts over). Warm: the same files read again from the page cache.
  MB/s is files/s times the mean file size (shards: samples/s times the mean sample size).
- **decode**: images/s of each decoder on the same in-memory JPEG bytes (up to 256 files spread
  over the dataset), one thread, no resizing.
- **loader**: images/s through a `torch.utils.data.DataLoader` (shuffled, as training reads, batches
  of `batch_size`, persistent workers) for each decoder and worker count: read + decode, no
  transform, warm cache. The batches the workers prefetched while starting are taken, untimed,
  before the warm-up, so the step times that size the windows are the pipeline's steady pace.

Each figure comes from `torchpace.measure.timing.measure_throughput`: warm-up until two windows agree,
then windows until the 95% CI of the median is within ±2% or the time cap, as `bench` does.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from torchpace.data.cache import cache_root
from torchpace.data.scan import scan_folder
from torchpace.data.shards import MANIFEST_NAME, cached_shard_dir, ensure_cached_shards, iter_tar_samples, load_manifest
from torchpace.errors import UsageError
from torchpace.measure.timing import Clock, Throughput, TimingOptions, measure_throughput

RESULT_KIND = "torchpace.bench-data"
RESULT_SCHEMA_VERSION = 1
COLD_METHODS = ("fadvise", "drop-caches", "none")
_DROP_CACHES = Path("/proc/sys/vm/drop_caches")
_WARMUP_SHARE = 0.3  # of each measurement's time cap
_WINDOWS_PER_MEASUREMENT = 15  # sizes the window from the time cap
_TORCH_PREFETCH_FACTOR = 2  # DataLoader's default batches in flight per worker
_COLD_AS_WARM_FRAC = 0.8  # cold reads above this share of warm ones: the eviction probably did not reach the disk


@dataclass(frozen=True)
class DataBenchOptions:
    """What to measure and for how long.

    Attributes:
        decoders: decoder names; empty means every decoder usable here.
        num_workers: DataLoader worker counts for the loader figures; empty means 0 and the usable cores.
        batch_size: samples per loader batch.
        max_time_s: time cap of each measurement, seconds.
        shards: "auto" (the folder's shards in the cache, written on first use), "none", or a shard folder.
        cold: how files are evicted before cold reads: "fadvise", "drop-caches" (root) or "none".
        decode_images: how many files the decode figures cycle over.
    """

    decoders: tuple[str, ...] = ()
    num_workers: tuple[int, ...] = ()
    batch_size: int = 64
    max_time_s: float = 3.0
    shards: str = "auto"
    cold: str = "fadvise"
    decode_images: int = 256

    def timing(self) -> TimingOptions:
        return TimingOptions(window_s=max(0.05, self.max_time_s / _WINDOWS_PER_MEASUREMENT))


@dataclass(frozen=True)
class Rate:
    """One measured figure: `items_per_s` are files/s (read), images/s (decode, loader) or samples/s
    (shard read); `mb_per_s` is set for reads."""

    stage: str
    format: str
    items_per_s: float
    items_per_s_ci_low: float
    items_per_s_ci_high: float
    noisy: bool
    windows: int
    stopped_by: str
    cache: str | None = None
    decoder: str | None = None
    num_workers: int | None = None
    mb_per_s: float | None = None


@dataclass(frozen=True)
class DataSource:
    """The files and/or shards of PATH."""

    path: str
    files: tuple[str, ...] = ()
    shards_dir: str | None = None
    shard_paths: tuple[str, ...] = ()
    shard_samples: int = 0
    shard_bytes: int = 0
    shards_made: bool = False


@dataclass(frozen=True)
class DataBenchResult:
    """Everything `bench-data` measured; JSON via `to_dict`."""

    path: str
    files: int
    file_bytes: int
    shards: int
    shard_samples: int
    shard_bytes: int
    shards_dir: str | None
    shards_made: bool
    cold_method: str
    cold_note: str | None
    decoders: list[str]
    unavailable_decoders: dict[str, str]
    decode_images: int
    batch_size: int
    max_time_s: float
    rates: list[Rate]
    wall_time_s: float
    host: dict[str, Any] = field(default_factory=dict)
    kind: str = RESULT_KIND
    schema_version: int = RESULT_SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_cold_method(cold: str) -> str:
    """`cold` when it can run here; UsageError otherwise (drop-caches needs root)."""
    if cold not in COLD_METHODS:
        raise UsageError(f"--cold {cold!r} is not valid; valid values: {', '.join(COLD_METHODS)}")
    if cold == "drop-caches" and not os.access(_DROP_CACHES, os.W_OK):
        raise UsageError(f"--cold drop-caches needs root (to write {_DROP_CACHES}); use --cold fadvise, which needs none")
    return cold


def evict_file(path: str) -> None:
    """Drop `path`'s pages from the page cache (`posix_fadvise(..., POSIX_FADV_DONTNEED)`)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def drop_page_cache() -> None:
    """Write back dirty pages and drop the whole page cache (root only)."""
    os.sync()
    _DROP_CACHES.write_text("1\n")


def read_file(path: str) -> int:
    """Read `path` to the end; returns its size in bytes."""
    with open(path, "rb", buffering=0) as stream:
        return len(stream.read())


def _cycle(items: tuple[Any, ...], on_wrap: Callable[[], None] | None = None) -> Iterator[Any]:
    while True:
        if on_wrap is not None:
            on_wrap()
        yield from items


def _no_sync() -> None:
    """Host-side work needs no device synchronisation at window boundaries."""


def _measure(step: Callable[[], int], options: DataBenchOptions, clock: Clock, sync: Callable[[], None] = _no_sync) -> Throughput:
    start = clock()
    warmup_deadline = start + _WARMUP_SHARE * options.max_time_s
    return measure_throughput(step, clock, sync, options.timing(), warmup_deadline, start + options.max_time_s)


def _rate(throughput: Throughput, stage: str, fmt: str, **extra: Any) -> Rate:
    s = throughput.summary
    return Rate(stage, fmt, s.median, s.ci_low, s.ci_high, s.noisy, s.n, throughput.stopped_by, **extra)


def measure_file_reads(files: tuple[str, ...], cold: str, options: DataBenchOptions, clock: Clock) -> Rate:
    """files/s reading whole files (no decoding), each evicted first when `cold` is not "none"."""
    wrap = drop_page_cache if cold == "drop-caches" else None
    paths = _cycle(files, wrap)

    def step() -> int:
        path = next(paths)
        if cold == "fadvise":
            evict_file(path)
        read_file(path)
        return 1

    mean_bytes = sum(os.path.getsize(p) for p in files) / len(files)
    result = _rate(_measure(step, options, clock), "read", "files", cache="cold" if cold != "none" else "warm")
    return replace(result, mb_per_s=result.items_per_s * mean_bytes / 1e6)


def _shard_stream(shard_paths: tuple[str, ...], cold: str) -> Iterator[dict[str, Any]]:
    while True:
        if cold == "drop-caches":
            drop_page_cache()
        for path in shard_paths:
            if cold == "fadvise":
                evict_file(path)
            yield from iter_tar_samples(path)


def measure_shard_reads(source: DataSource, cold: str, options: DataBenchOptions, clock: Clock) -> Rate:
    """samples/s streaming the shards (tar parsing, no decoding), evicted first when `cold` is not "none"."""
    stream = _shard_stream(source.shard_paths, cold)

    def step() -> int:
        next(stream)
        return 1

    result = _rate(_measure(step, options, clock), "read", "shards", cache="cold" if cold != "none" else "warm")
    return replace(result, mb_per_s=result.items_per_s * source.shard_bytes / source.shard_samples / 1e6)


def measure_decode(images: tuple[bytes, ...], decoder_name: str, fmt: str, options: DataBenchOptions, clock: Clock) -> Rate:
    """images/s of one decoder over the same in-memory JPEG bytes."""
    from torchpace.data.decoders import get_decoder

    decoder = get_decoder(decoder_name)
    data = _cycle(images)

    def step() -> int:
        decoder.decode(next(data))
        return 1

    sync = _no_sync
    if decoder.device == "cuda":
        import torch

        sync = torch.cuda.synchronize  # GPU decodes are asynchronous: time them at window ends
    return _rate(_measure(step, options, clock, sync), "decode", fmt, decoder=decoder_name)


def count_batch(batch: list) -> int:
    """Collate that keeps no pixels: images may differ in size, and only the count is needed."""
    return len(batch)


def build_loader(source: DataSource, fmt: str, decoder: str, workers: int, batch_size: int):
    """A shuffled DataLoader over the files or shards of `source`, decoding with `decoder`."""
    import torch

    from torchpace.data import ImageFolderDataset, ShardDataset

    generator = torch.Generator().manual_seed(0)
    if fmt == "files":
        dataset = ImageFolderDataset(source.path, decoder=decoder, on_error="skip")
        shuffle = True
    else:
        dataset = ShardDataset(source.shards_dir, decoder=decoder, on_error="skip", shuffle=True)
        shuffle = False  # the shard dataset shuffles itself
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, num_workers=workers,
                                       collate_fn=count_batch, persistent_workers=workers > 0, generator=generator)


def measure_loader(source: DataSource, fmt: str, decoder: str, workers: int, options: DataBenchOptions, clock: Clock) -> Rate:
    """images/s through a DataLoader (read + decode) with `workers` worker processes."""
    from torchpace.engine.loader import LoaderCycle

    cycle = LoaderCycle(build_loader(source, fmt, decoder, workers, options.batch_size))
    try:
        for _ in range(workers * _TORCH_PREFETCH_FACTOR + 1):
            cycle.next()  # drain what the workers prefetched while starting: those batches come back at once
        throughput = _measure(cycle.next, options, clock)
    finally:
        cycle.close()
    return _rate(throughput, "loader", fmt, decoder=decoder, num_workers=workers)


def pick_spread(items: tuple[Any, ...], count: int) -> tuple[Any, ...]:
    """Up to `count` items spread evenly over `items` (all of them when there are fewer)."""
    if len(items) <= count:
        return items
    return tuple(items[i * len(items) // count] for i in range(count))


@dataclass(frozen=True)
class Measurement:
    """One figure to measure (see `plan_measurements`)."""

    stage: str
    format: str
    cache: str | None = None
    decoder: str | None = None
    num_workers: int | None = None

    @property
    def label(self) -> str:
        details = [d for d in (self.cache, self.decoder) if d] + ([f"{self.num_workers} workers"] if self.num_workers is not None else [])
        return f"{self.stage} {self.format}" + (f" ({', '.join(details)})" if details else "")


def plan_measurements(formats: tuple[str, ...], decoders: tuple[str, ...], workers: tuple[int, ...],
                      cold: str) -> list[Measurement]:
    """Every figure, in the order measured: reads (cold, warm), decodes, then loaders.

    Args:
        formats: "files" and/or "shards", the ones PATH has.
        decoders: decoder names to measure.
        workers: DataLoader worker counts.
        cold: the eviction method; "none" measures no cold reads.
    """
    caches = ("warm",) if cold == "none" else ("cold", "warm")
    plan = [Measurement("read", fmt, cache=c) for fmt in formats for c in caches]
    plan += [Measurement("decode", formats[0], decoder=d) for d in decoders]
    plan += [Measurement("loader", fmt, decoder=d, num_workers=w) for fmt in formats for d in decoders for w in workers
             if not (d == "torchvision-cuda" and w > 0)]  # CUDA cannot be used in forked worker processes
    return plan


def resolve_source(path: str | os.PathLike, shards: str, cache_dir: Path | None = None) -> DataSource:
    """The files and shards to measure: PATH is an image folder (its shards per `shards`) or a shard folder.

    Raises:
        FolderError / ShardError: PATH is neither an image folder nor a shard folder.
    """
    root = Path(path).expanduser().resolve()
    if (root / MANIFEST_NAME).is_file():
        return _with_shards(DataSource(str(root)), root, made=False)
    index = scan_folder(root)
    source = DataSource(str(root), files=tuple(p for p, _ in index.samples))
    if shards == "none":
        return source
    if shards == "auto":
        cache_dir = cache_dir or cache_root()
        made = not (cached_shard_dir(index, cache_dir) / MANIFEST_NAME).exists()
        return _with_shards(source, ensure_cached_shards(index, cache_dir), made=made)
    return _with_shards(source, Path(shards).expanduser().resolve(), made=False)


def _with_shards(source: DataSource, shard_dir: Path, made: bool) -> DataSource:
    manifest = load_manifest(shard_dir)
    return replace(source, shards_dir=str(shard_dir), shard_paths=tuple(str(shard_dir / s.name) for s in manifest.shards),
                   shard_samples=manifest.samples, shard_bytes=manifest.size_bytes, shards_made=made)


def load_decode_set(source: DataSource, count: int) -> tuple[bytes, ...]:
    """Up to `count` JPEG images' bytes spread over the files (or the shards), leaving out any
    Pillow cannot decode, so every decoder works on the same valid images."""
    from torchpace.data.decoders import JPEG_SUFFIXES, DecodeError, PillowDecoder

    if source.files:
        jpegs = tuple(p for p in source.files if Path(p).suffix.lower() in JPEG_SUFFIXES)
        images = [Path(p).read_bytes() for p in pick_spread(jpegs, count)]
    else:
        images = _shard_jpegs(source, count)
    pillow, valid = PillowDecoder(), []
    for data in images:
        try:
            pillow.decode(data)
        except DecodeError:
            continue
        valid.append(data)
    return tuple(valid)


def _shard_jpegs(source: DataSource, count: int) -> list[bytes]:
    images: list[bytes] = []
    for path in source.shard_paths:
        images += [s[f] for s in iter_tar_samples(path) for f in ("jpg", "jpeg") if f in s]
        if len(images) >= count:
            break
    return list(pick_spread(tuple(images), count))


def prewarm(files: tuple[str, ...], budget_s: float, clock: Clock) -> tuple[str, ...]:
    """Read files into the page cache until `budget_s` passes; returns those read (the warm set)."""
    start, done = clock(), []
    for path in files:
        read_file(path)
        done.append(path)
        if clock() - start > budget_s:
            break
    return tuple(done)


def choose_decoders(names: tuple[str, ...]) -> tuple[tuple[str, ...], dict[str, str]]:
    """(decoders to measure, {unavailable decoder: why}); all usable ones when `names` is empty.

    Raises:
        UsageError: a named decoder is unknown or cannot be used here (with its install command).
    """
    from torchpace.data.decoders import DECODER_NAMES, decoder_unavailable_reason, get_decoder

    for name in names:
        get_decoder(name)  # unknown name: UsageError listing the valid ones
    reasons = {n: decoder_unavailable_reason(n) for n in DECODER_NAMES}
    unavailable = {n: r for n, r in reasons.items() if r is not None}
    for name in names:
        if name in unavailable:
            raise UsageError(f"decoder {name!r} cannot be used here: {unavailable[name]}")
    chosen = tuple(dict.fromkeys(names)) or tuple(n for n in DECODER_NAMES if n not in unavailable)
    return chosen, unavailable


def default_workers() -> tuple[int, ...]:
    """0 (loading in the main process) and one worker per usable core."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return (0, cores)


class _Runner:
    """Runs the planned measurements over one source (keeps the warm sets between them)."""

    def __init__(self, source: DataSource, images: tuple[bytes, ...], cold: str, options: DataBenchOptions, clock: Clock):
        self.source, self.images, self.cold, self.options, self.clock = source, images, cold, options, clock

    def run(self, m: Measurement) -> Rate:
        if m.stage == "decode":
            return measure_decode(self.images, m.decoder, m.format, self.options, self.clock)
        if m.stage == "loader":
            return measure_loader(self.source, m.format, m.decoder, m.num_workers, self.options, self.clock)
        cold = self.cold if m.cache == "cold" else "none"
        if m.format == "shards":
            if cold == "none":
                prewarm(self.source.shard_paths, self.options.max_time_s, self.clock)
            return measure_shard_reads(self.source, cold, self.options, self.clock)
        files = self.source.files if cold != "none" else prewarm(self.source.files, self.options.max_time_s, self.clock)
        return measure_file_reads(files, cold, self.options, self.clock)


def build_cold_note(rates: list[Rate]) -> str | None:
    """A note when cold reads ran nearly as fast as warm ones (the eviction probably did not reach the disk)."""
    notes = []
    for fmt in ("files", "shards"):
        by_cache = {r.cache: r.items_per_s for r in rates if r.stage == "read" and r.format == fmt}
        if "cold" in by_cache and by_cache.get("warm") and by_cache["cold"] > _COLD_AS_WARM_FRAC * by_cache["warm"]:
            notes.append(f"{fmt}: cold reads ran at {by_cache['cold'] / by_cache['warm']:.0%} of warm ones")
    if not notes:
        return None
    return ("; ".join(notes) + ": the data may live in memory (tmpfs) or in a cache below this machine "
            "(a VM host's), which evicting the page cache cannot reach")


ProgressCallback = Callable[[int, int, str], None]  # (measurements done, total, the next one's label)


def run_data_bench(path: str | os.PathLike, options: DataBenchOptions = DataBenchOptions(), *,
                   clock: Clock = time.perf_counter, on_progress: ProgressCallback | None = None,
                   cache_dir: Path | None = None, host: dict[str, Any] | None = None) -> DataBenchResult:
    """Measure the input pipeline of PATH (an image folder or a shard folder); see the module docstring.

    Args:
        path: a class-per-sub-folder image folder, or a shard folder written by `torchpace shard`.
        options: what to measure and for how long.
        clock: seconds, monotonic (injected in tests).
        on_progress: called before each measurement and once at the end.
        cache_dir: cache root for `shards="auto"` (default `$XDG_CACHE_HOME/torchpace`).
        host: the host summary to record in the result.

    Raises:
        UsageError: bad options, PATH not an image or shard folder, a decoder not usable here.
    """
    start = clock()
    cold = check_cold_method(options.cold)
    decoders, unavailable = choose_decoders(options.decoders)
    source = resolve_source(path, options.shards, cache_dir)
    formats = tuple(f for f, present in (("files", source.files), ("shards", source.shard_paths)) if present)
    plan = plan_measurements(formats, decoders, options.num_workers or default_workers(), cold)
    images = load_decode_set(source, options.decode_images)
    runner, rates = _Runner(source, images, cold, options, clock), []
    for done, measurement in enumerate(plan):
        if on_progress is not None:
            on_progress(done, len(plan), measurement.label)
        rates.append(runner.run(measurement))
    if on_progress is not None:
        on_progress(len(plan), len(plan), "done")
    return DataBenchResult(
        path=source.path, files=len(source.files), file_bytes=sum(os.path.getsize(p) for p in source.files),
        shards=len(source.shard_paths), shard_samples=source.shard_samples, shard_bytes=source.shard_bytes,
        shards_dir=source.shards_dir, shards_made=source.shards_made, cold_method=cold,
        cold_note=build_cold_note(rates), decoders=list(decoders),
        unavailable_decoders={n: r for n, r in unavailable.items() if n not in decoders}, decode_images=len(images),
        batch_size=options.batch_size, max_time_s=options.max_time_s, rates=rates, wall_time_s=clock() - start,
        host=host or {})
