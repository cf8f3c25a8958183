"""Real JPEG files for the data tests: RGB, grayscale, CMYK, truncated and not-a-JPEG ones."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

SIZE = (40, 56)  # (height, width): not square, so a transposed decode would show


def photo_like(seed: int, size: tuple[int, int] = SIZE) -> Image.Image:
    """A smooth gradient plus noise: JPEG-typical content (pure noise would stress the codec)."""
    rng = np.random.default_rng(seed)
    height, width = size
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([xx / width, yy / height, (xx + yy) / (width + height)], axis=-1)
    pixels = np.clip(base * 200 + rng.normal(0, 12, (height, width, 3)) + seed % 40, 0, 255)
    return Image.fromarray(pixels.astype(np.uint8))


def jpeg_bytes(image: Image.Image, quality: int = 90) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=quality)
    return buffer.getvalue()


def rgb_jpeg(seed: int = 0) -> bytes:
    return jpeg_bytes(photo_like(seed))


def gray_jpeg(seed: int = 1) -> bytes:
    return jpeg_bytes(photo_like(seed).convert("L"))


def cmyk_jpeg(seed: int = 2) -> bytes:
    """A CMYK JPEG as Pillow writes it (Adobe marker, inverted samples), as print workflows produce."""
    return jpeg_bytes(photo_like(seed).convert("CMYK"))


def truncated_jpeg(seed: int = 3) -> bytes:
    """A JPEG cut short, as an interrupted download leaves it."""
    data = rgb_jpeg(seed)
    return data[: len(data) * 2 // 3]


def write_folder(root: Path, classes: int = 3, per_class: int = 8, size: tuple[int, int] = SIZE) -> Path:
    """`root/class_<c>/<i>.jpg` of valid RGB JPEGs; returns `root`."""
    for label in range(classes):
        folder = root / f"class_{label}"
        folder.mkdir(parents=True)
        for index in range(per_class):
            (folder / f"{index:03d}.jpg").write_bytes(jpeg_bytes(photo_like(label * 1000 + index, size)))
    return root


def snapshot(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """(size, mtime_ns, bytes) of every file under `root`: equal snapshots mean nothing was touched."""
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(root.rglob("*")) if p.is_file()}
