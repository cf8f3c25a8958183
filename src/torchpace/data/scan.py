"""Find the samples of a class-per-sub-folder image tree (`root/<class>/<image>`), as
`torchvision.datasets.ImageFolder` does: classes are the sorted sub-folder names, labels their
index, images sorted by path within each class. Hidden entries (`.name`) are ignored."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from torchpace.errors import UsageError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".bmp", ".webp", ".tif", ".tiff")


class FolderError(UsageError):
    """The folder is not a class-per-sub-folder image tree (missing, empty, or no class folders)."""


@dataclass(frozen=True)
class FolderIndex:
    """The samples found under `root`: `(path, label)` pairs and the class names by label."""

    root: Path
    classes: tuple[str, ...]
    samples: tuple[tuple[str, int], ...]


def _visible_entries(folder: Path) -> list[os.DirEntry]:
    with os.scandir(folder) as entries:
        return sorted((e for e in entries if not e.name.startswith(".")), key=lambda e: e.name)


def scan_folder(root: str | os.PathLike, suffixes: tuple[str, ...] = IMAGE_SUFFIXES) -> FolderIndex:
    """Index `root/<class>/<image>`.

    Args:
        root: the folder holding one sub-folder per class.
        suffixes: image file suffixes to take (case-insensitive).

    Raises:
        FolderError: `root` is not a folder, has no class sub-folders, or they hold no images.
    """
    root = Path(root).expanduser().resolve()
    if not root.is_dir():
        raise FolderError(f"{root} is not a folder; expected a folder with one sub-folder of images per class")
    entries = _visible_entries(root)
    classes = tuple(e.name for e in entries if e.is_dir())
    if not classes:
        loose = sum(1 for e in entries if e.is_file() and e.name.lower().endswith(suffixes))
        what = f"{loose} images directly in it" if loose else "nothing in it" if not entries else "no sub-folders"
        raise FolderError(f"{root} has no class sub-folders ({what}); expected {root}/<class>/<image>, "
                          "one sub-folder per class")
    samples = tuple(
        (e.path, label)
        for label, name in enumerate(classes)
        for e in _visible_entries(root / name)
        if e.is_file() and e.name.lower().endswith(suffixes)
    )
    if not samples:
        raise FolderError(f"{root} has {len(classes)} class sub-folders but no images in them "
                          f"(looked for {', '.join(suffixes)})")
    return FolderIndex(root, classes, samples)
