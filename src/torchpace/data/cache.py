"""Where torchpace keeps data it derives from the user's: `$XDG_CACHE_HOME/torchpace`.

Derived data (the `vision` example's JPEG folder, shards made from a folder for `data.format=shards`)
is keyed by what it was made from, so a changed source never reuses stale shards.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Iterable, Mapping

SHARD_CACHE_VERSION = "shards-v1"  # bump when the shard layout or key changes


def cache_root(env: Mapping[str, str] | None = None) -> Path:
    """`$XDG_CACHE_HOME/torchpace` (default `~/.cache/torchpace`).

    Args:
        env: the environment to read (default `os.environ`); tests pass their own.
    """
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "torchpace"


def build_shard_cache_key(root: Path, files: Iterable[tuple[str, int, int, int]], shard_size: int, seed: int) -> str:
    """A 16-hex-digit key for shards made from `root`.

    Args:
        root: the source folder (resolved).
        files: one `(relative path, label, size_bytes, mtime_ns)` per sample, in dataset order.
        shard_size: samples per shard.
        seed: the seed the samples were shuffled with when sharding.
    """
    digest = hashlib.sha256(f"{SHARD_CACHE_VERSION}\0{root}\0{shard_size}\0{seed}\n".encode())
    for rel, label, size_bytes, mtime_ns in files:
        digest.update(f"{rel}\0{label}\0{size_bytes}\0{mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def shard_cache_dir(cache_dir: Path, root: Path, key: str) -> Path:
    """`<cache_dir>/shards/<folder name>-<key>`: where the shards of folder `root` live."""
    return cache_dir / "shards" / f"{root.name}-{key}"
