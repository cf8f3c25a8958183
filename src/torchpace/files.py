"""Every file torchpace writes is written atomically, through `atomic_output` (or `write_atomic` for a
whole text or bytes at once): a hidden temporary file beside the target (`.NAME.tmp-PID`), flushed to
disk, then renamed over it. A reader never sees half a file, an earlier file is kept until the new one
is complete, and a failed write leaves no temporary file.

A write that fails (a full disk, a quota, a read-only folder) is one `OutputWriteFailed` (exit 1) whose
message names the path, the cause and, for a full disk, the space left on that filesystem. Text is
redacted (`torchpace.redact`) before it is written: no secret reaches a file. Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path
from typing import IO, Any, Iterator

from torchpace.errors import TorchpaceError
from torchpace.redact import redact

TMP_MARK = ".tmp-"  # a temporary file is `.NAME.tmp-PID` beside NAME
_FULL = (errno.ENOSPC, errno.EDQUOT)


class OutputWriteFailed(TorchpaceError):
    """A file torchpace was asked to write could not be written (full disk, quota, permissions). Exit 1.

    Attributes:
        path: the file that was not written.
        figures: what the command measured before the write failed (a result with `to_dict()`), which the
            command prints before the error, or None.
    """

    def __init__(self, path: Path, message: str, figures: Any = None):
        super().__init__(message)
        self.path = path
        self.figures = figures


def temp_path(path: Path) -> Path:
    """Where `path` is written before it is renamed into place."""
    return path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}")


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, mode: str = "wb", encoding: str | None = None) -> Iterator[IO]:
    """Open a temporary file for `path`; on a clean exit it is flushed to disk and renamed over `path`.

    Args:
        path: the file to write.
        mode: "wb" or "w" (text: `encoding`, default UTF-8).

    Raises:
        OutputWriteFailed: writing, flushing or renaming failed (the temporary file is removed).
    """
    path = Path(path)
    tmp = temp_path(path)
    try:
        with open(tmp, mode, encoding=encoding or ("utf-8" if "b" not in mode else None)) as stream:
            yield stream
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(tmp, path)
    except OSError as err:
        raise OutputWriteFailed(path, describe_write_error(path, err)) from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def write_atomic(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write `data` (text is redacted, then UTF-8) to `path` atomically; returns the path.

    Raises:
        OutputWriteFailed: as `atomic_output`.
    """
    if isinstance(data, str):
        data = redact(data).encode("utf-8")
    with atomic_output(path, "wb") as stream:
        stream.write(data)
    return Path(path)


def describe_write_error(path: Path, err: OSError) -> str:
    """One line: the path, the cause, and the free space when the disk (or quota) is full."""
    cause = err.strerror or type(err).__name__
    if err.errno in _FULL:
        free = free_bytes(path)
        left = f"{format_bytes(free)} free on its filesystem" if free is not None else "free space unknown"
        return f"cannot write {str(path)!r}: {cause.lower()} ({left}); free space there or choose another path"
    return f"cannot write {str(path)!r}: {cause.lower() if cause else err}"


def free_bytes(path: Path) -> int | None:
    """Bytes free to this user on the filesystem that holds `path` (or the nearest folder above it)."""
    for folder in (path.parent, *path.parent.parents):
        with contextlib.suppress(OSError):
            return shutil.disk_usage(folder).free
    return None


def format_bytes(count: int) -> str:
    """`0 bytes`, `12 KiB`, `3.4 MiB`, `1.2 GiB`."""
    if count < 1024:
        return f"{count} bytes"
    value, unit = float(count), "bytes"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024:
            break
    return f"{value:.0f} {unit}" if value >= 10 else f"{value:.1f} {unit}"


__all__ = ["OutputWriteFailed", "TMP_MARK", "temp_path", "atomic_output", "write_atomic", "describe_write_error",
           "free_bytes", "format_bytes"]
