"""WebDataset-compatible tar shards: plan, write (atomically), verify, read back.

A shard is a plain tar file `shard-NNNNNN.tar` (written as `webdataset.TarWriter` writes one, with
the standard library's `tarfile`, so writing loads neither torch nor webdataset). Each sample is
a group of consecutive members sharing a key: `<key>.jpg` (the image bytes, unchanged; the member's
extension is the source file's), `<key>.cls` (the label as decimal text) and `<key>.path.txt` (the
source path relative to the source folder). Keys are the sample's index in the source folder,
zero-padded, so they are unique and contain no dot. `manifest.json` beside the shards lists them,
their sample counts and the class names; `torchpace.data.ShardDataset` reads it.

Writing never leaves a half-written shard under a final name: each shard is written to a hidden
temporary file, flushed to disk, then renamed into place; the manifest is written last the same way.
A run that is interrupted removes its temporary file; one killed outright leaves only hidden
`.shard-*.tmp-PID-RANDOM` files, which the next run into that folder removes. The source files are only
ever opened for reading.
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import tarfile
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

from torchpace.data.cache import build_shard_cache_key, shard_cache_dir
from torchpace.data.scan import FolderIndex
from torchpace.errors import TorchpaceError, UsageError
from torchpace.files import atomic_output, write_atomic

SHARD_NAME = "shard-{:06d}.tar"
MANIFEST_NAME = "manifest.json"
MANIFEST_KIND = "torchpace.shards"
MANIFEST_SCHEMA_VERSION = 1
LABEL_FIELD = "cls"
PATH_FIELD = "path.txt"
IMAGE_FIELDS = ("jpg", "jpeg", "jpe", "jfif", "png", "bmp", "webp", "tif", "tiff")
_TAR_BLOCK = 512
_TAR_OWNER = "bigdata"  # user and group of every member, as webdataset writes them
_ZERO_BLOCK = bytes(_TAR_BLOCK)
_OCTAL_DIGITS = frozenset(b"01234567")
_READ_BUFFER_BYTES = 1 << 20  # shards are read front to back: large buffered reads
_TMP_PREFIX = "."  # the temporary files of `torchpace.files.atomic_output`: `.NAME.tmp-PID-RANDOM`
_TMP_MARK = ".tmp-"
_CACHE_SHARDS = 16  # the cache splits a folder into about this many shards, so up to 16 loader workers each get one
_CACHE_MAX_SHARD_SIZE = 1000
_CACHE_SEED = 0


class ShardError(TorchpaceError):
    """A shard folder or file is missing, unreadable, or does not hold what its manifest says."""


class NotAShardFolder(ShardError, UsageError):
    """The folder given as shards holds no manifest: bad input (exit 2), not a failure while reading."""


@dataclass(frozen=True)
class ShardInfo:
    """One shard file: its name in the shard folder, samples and size."""

    name: str
    samples: int
    size_bytes: int


@dataclass(frozen=True)
class ShardManifest:
    """What a shard folder holds (saved as `manifest.json`)."""

    source: str
    classes: tuple[str, ...]
    shards: tuple[ShardInfo, ...]
    shard_size: int
    shuffled: bool
    seed: int
    kind: str = MANIFEST_KIND
    schema_version: int = MANIFEST_SCHEMA_VERSION

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.shards)

    @property
    def size_bytes(self) -> int:
        return sum(s.size_bytes for s in self.shards)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "samples": self.samples}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ShardManifest":
        if data.get("kind") != MANIFEST_KIND or data.get("schema_version") != MANIFEST_SCHEMA_VERSION:
            raise ValueError(f"not a {MANIFEST_KIND} v{MANIFEST_SCHEMA_VERSION} manifest")
        shards = tuple(ShardInfo(**s) for s in data["shards"])
        return cls(data["source"], tuple(data["classes"]), shards, data["shard_size"], data["shuffled"], data["seed"])


def plan_shards(n_samples: int, shard_size: int, shuffle: bool, seed: int) -> list[list[int]]:
    """Sample indices per shard: `shard_size` each (the last may hold fewer), optionally shuffled.

    Args:
        n_samples: samples in the source.
        shard_size: samples per shard (>= 1).
        shuffle: shuffle the samples across shards (seeded), so each shard mixes the classes.
        seed: seeds the shuffle.
    """
    if shard_size < 1:
        raise UsageError(f"shard size must be >= 1 sample, got {shard_size}")
    order = list(range(n_samples))
    if shuffle:
        random.Random(seed).shuffle(order)
    return [order[i:i + shard_size] for i in range(0, n_samples, shard_size)]


def build_sample(index: FolderIndex, position: int, data: bytes) -> dict[str, Any]:
    """The WebDataset sample for source sample `position` with its image bytes `data`."""
    path, label = index.samples[position]
    field = Path(path).suffix.lower().lstrip(".") or "jpg"
    return {"__key__": f"{position:08d}", field: data, LABEL_FIELD: str(label).encode(),
            PATH_FIELD: os.path.relpath(path, index.root).encode()}


def _write_tar_sample(tar: tarfile.TarFile, sample: dict[str, Any]) -> None:
    """Append one sample's members `<key>.<field>` (fields sorted, read-only, mtime 0: the same input
    gives the same bytes), as `webdataset.TarWriter(encoder=False, mtime=0)` does."""
    key = sample["__key__"]
    for name in sorted(k for k in sample if k != "__key__"):
        info = tarfile.TarInfo(f"{key}.{name}")
        info.size, info.mtime, info.mode = len(sample[name]), 0, 0o444
        info.uname = info.gname = _TAR_OWNER
        tar.addfile(info, io.BytesIO(sample[name]))


def _write_shard(path: Path, samples: Iterator[dict[str, Any]]) -> int:
    """Write `samples` to `path` atomically (`torchpace.files`: hidden temp file, fsync, rename); returns
    its size in bytes."""
    with atomic_output(path, "wb") as stream:
        with tarfile.open(fileobj=stream, mode="w|") as tar:
            for sample in samples:
                _write_tar_sample(tar, sample)
    return path.stat().st_size


def _write_json_atomically(path: Path, payload: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(payload, indent=2))


def remove_stale_temp_files(out_dir: Path) -> list[Path]:
    """Remove the hidden temporary files a killed run left in `out_dir`; returns them."""
    stale = [p for p in out_dir.glob(f"{_TMP_PREFIX}*{_TMP_MARK}*") if p.is_file()]
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def check_out_dir(root: Path, out_dir: Path, overwrite: bool) -> None:
    """UsageError when `out_dir` is inside the source, or already holds shards (unless `overwrite`)."""
    out = out_dir.expanduser().resolve()
    if out == root or root in out.parents:
        raise UsageError(f"--out {out} is inside the source folder {root}; shards go elsewhere (the source is never written to)")
    existing = sorted(out.glob("shard-*.tar")) + sorted(out.glob(MANIFEST_NAME)) if out.is_dir() else []
    if existing and not overwrite:
        raise UsageError(f"--out {out} already holds shards ({existing[0].name}, ...); choose another folder "
                         "or pass --overwrite")


ProgressCallback = Callable[[int, int], None]  # (samples done, bytes done)


def write_shards(index: FolderIndex, out_dir: str | os.PathLike, shard_size: int = 1000, shuffle: bool = False,
                 seed: int = 0, overwrite: bool = False, on_progress: ProgressCallback | None = None) -> ShardManifest:
    """Write the samples of `index` as tar shards in `out_dir`, then verify them and write the manifest.

    Args:
        index: the source folder's samples (`scan_folder`).
        out_dir: where the shards go (created; must not be inside the source folder).
        shard_size: samples per shard.
        shuffle: shuffle samples across shards (seeded by `seed`).
        overwrite: replace shards already in `out_dir`.
        on_progress: called after each sample with (samples written, bytes read).

    Returns:
        The manifest, as saved in `out_dir/manifest.json`.

    Raises:
        UsageError: bad `out_dir` or shard size.
        ShardError: a source file cannot be read, or a shard does not read back with its sample count.
    """
    out = Path(out_dir).expanduser().resolve()
    check_out_dir(index.root, out, overwrite)
    plan = plan_shards(len(index.samples), shard_size, shuffle, seed)
    out.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_files(out)
    for old in [*out.glob("shard-*.tar"), out / MANIFEST_NAME] if overwrite else []:
        old.unlink(missing_ok=True)
    progress = _Progress(on_progress)
    shards = tuple(_write_planned_shard(index, out, number, positions, progress) for number, positions in enumerate(plan))
    manifest = ShardManifest(str(index.root), index.classes, shards, shard_size, shuffle, seed)
    verify_shards(out, manifest, expected_samples=len(index.samples))
    _write_json_atomically(out / MANIFEST_NAME, manifest.to_dict())
    return manifest


class _Progress:
    """Counts samples and bytes for the progress callback."""

    def __init__(self, callback: ProgressCallback | None):
        self.callback, self.samples, self.bytes = callback, 0, 0

    def add(self, size_bytes: int) -> None:
        self.samples += 1
        self.bytes += size_bytes
        if self.callback is not None:
            self.callback(self.samples, self.bytes)


def _write_planned_shard(index: FolderIndex, out: Path, number: int, positions: list[int], progress: _Progress) -> ShardInfo:
    def samples() -> Iterator[dict[str, Any]]:
        for position in positions:
            data = _read_source(index.samples[position][0])
            yield build_sample(index, position, data)
            progress.add(len(data))

    name = SHARD_NAME.format(number)
    return ShardInfo(name, len(positions), _write_shard(out / name, samples()))


def _read_source(path: str) -> bytes:
    try:
        with open(path, "rb") as stream:  # read only: the source is never modified
            return stream.read()
    except OSError as err:
        raise ShardError(f"cannot read source file {path}: {err.strerror or err}") from err


def verify_shards(shard_dir: Path, manifest: ShardManifest, expected_samples: int | None = None) -> None:
    """Read every shard back and check its sample count against the manifest (and the source's).

    Raises:
        ShardError: a shard is missing, is not a readable tar, or holds another number of samples.
    """
    if expected_samples is not None and manifest.samples != expected_samples:
        raise ShardError(f"the shards hold {manifest.samples} samples but the source has {expected_samples}")
    for info in manifest.shards:
        found = sum(1 for _ in iter_tar_samples(shard_dir / info.name))
        if found != info.samples:
            raise ShardError(f"{shard_dir / info.name} holds {found} samples; {info.samples} were written")


def split_member_name(name: str) -> tuple[str, str]:
    """`dir/key.field.ext` -> (`dir/key`, `field.ext`): WebDataset's rule (the first dot of the basename)."""
    folder, _, base = name.rpartition("/")
    key, _, field = base.partition(".")
    return (f"{folder}/{key}" if folder else key), field


def iter_tar_samples(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """Samples of one tar shard, in order: `{"__key__": key, field: bytes, ...}` per key.

    Raises:
        ShardError: the file is missing, truncated or not a tar (naming the file).
    """
    sample: dict[str, Any] = {}
    try:
        with open(path, "rb", buffering=_READ_BUFFER_BYTES) as stream:
            for name, data in iter_tar_members(stream):
                key, field = split_member_name(name)
                if sample and sample["__key__"] != key:
                    yield sample
                    sample = {}
                sample["__key__"] = key
                sample[field] = data
    except (OSError, ValueError) as err:
        raise ShardError(f"cannot read shard {path}: {err}") from err
    if sample:
        yield sample


def iter_tar_members(stream: BinaryIO) -> Iterator[tuple[str, bytes]]:
    """(name, bytes) of each regular file in a tar stream, in order.

    A small reader for what WebDataset shards hold (ustar, GNU long names, pax `path`), about ten
    times faster than `tarfile`'s stream mode on small members. Each header's checksum is checked,
    and the archive must end with its end-of-archive (zero) block, so a shard cut short between
    members is an error too, not a quietly shorter shard.

    Raises:
        ValueError: a bad header checksum, a truncated member, or no end-of-archive block.
    """
    long_name = None
    while True:
        header = stream.read(_TAR_BLOCK)
        if header == _ZERO_BLOCK:
            return
        if len(header) < _TAR_BLOCK:
            raise ValueError("truncated: the archive ends without its end-of-archive marker")
        _check_tar_header(header)
        size = int(header[124:136].rstrip(b"\0 ") or b"0", 8)
        data = stream.read(size)
        if len(data) < size or len(stream.read(-size % _TAR_BLOCK)) < -size % _TAR_BLOCK:
            raise ValueError(f"member {_ustar_name(header)!r} is truncated ({len(data)} of {size} bytes)")
        kind = header[156:157]
        if kind in (b"L", b"x"):
            long_name = data.rstrip(b"\0").decode() if kind == b"L" else _pax_path(data) or long_name
        elif kind in (b"0", b"\0", b"7"):
            yield long_name or _ustar_name(header), data
            long_name = None
        else:
            long_name = None  # directories, links: no sample data


def _check_tar_header(header: bytes) -> None:
    stored = header[148:156].strip(b"\0 ")
    computed = sum(header[:148]) + sum(header[156:]) + 8 * 0x20  # the checksum field counts as spaces
    if not stored or not set(stored) <= _OCTAL_DIGITS or int(stored, 8) != computed:
        raise ValueError("not a tar file, or a corrupt tar header (checksum mismatch)")


def _ustar_name(header: bytes) -> str:
    name = header[:100].rstrip(b"\0").decode()
    prefix = header[345:500].rstrip(b"\0").decode() if header[257:262] == b"ustar" else ""
    return f"{prefix}/{name}" if prefix else name


def _pax_path(data: bytes) -> str | None:
    """The `path` record of a pax extended header (`<length> path=<name>\\n` records)."""
    for record in data.decode(errors="replace").split("\n"):
        _, _, keyword_value = record.partition(" ")
        if keyword_value.startswith("path="):
            return keyword_value[len("path="):]
    return None


def load_manifest(shard_dir: str | os.PathLike) -> ShardManifest:
    """The manifest of a shard folder written by `torchpace shard` (or `write_shards`).

    Raises:
        ShardError: no folder, no manifest, or a manifest of another kind.
    """
    path = Path(shard_dir).expanduser() / MANIFEST_NAME
    try:
        return ShardManifest.from_dict(json.loads(path.read_text()))
    except FileNotFoundError:
        raise NotAShardFolder(f"{path.parent} is not a shard folder (no {MANIFEST_NAME}); "
                         f"make one with: torchpace shard SRC_DIR --out {path.parent}") from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ShardError(f"cannot read {path}: {err}") from err


def cache_shard_size(n_samples: int) -> int:
    """Samples per shard for cached shards: about `_CACHE_SHARDS` shards, at most 1000 samples each."""
    return max(1, min(_CACHE_MAX_SHARD_SIZE, -(-n_samples // _CACHE_SHARDS)))


def cached_shard_dir(index: FolderIndex, cache_dir: Path) -> Path:
    """Where the cached shards of `index`'s folder live (they may not exist yet).

    The folder's name carries a key over the source's paths, labels, sizes and mtimes, so a changed
    source gets new shards.
    """
    shard_size = cache_shard_size(len(index.samples))
    files = ((os.path.relpath(p, index.root), label, *_size_and_mtime(p)) for p, label in index.samples)
    return shard_cache_dir(cache_dir, index.root, build_shard_cache_key(index.root, files, shard_size, _CACHE_SEED))


def ensure_cached_shards(index: FolderIndex, cache_dir: Path) -> Path:
    """The cached shard folder of `index`'s folder, written first when missing (shuffled, seeded).

    It is built in a temporary folder and renamed into place: concurrent trial processes each build
    one and the first rename wins; an interrupted build leaves no folder under the final name.
    """
    final = cached_shard_dir(index, cache_dir)
    if (final / MANIFEST_NAME).exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        write_shards(index, tmp, shard_size=cache_shard_size(len(index.samples)), shuffle=True, seed=_CACHE_SEED,
                     overwrite=True)
        tmp.rename(final)
    except OSError:
        if not (final / MANIFEST_NAME).exists():  # not "another process finished first"
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _size_and_mtime(path: str) -> tuple[int, int]:
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns
