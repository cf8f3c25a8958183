"""Every file torchpace writes is written atomically, through `atomic_output` (or `write_atomic` for a
whole text or bytes at once): a hidden temporary file beside the target (`.NAME.tmp-PID-RANDOM`, created
new: `O_EXCL`, never through a symlink), flushed to disk, then renamed over it. A reader never sees half a
file, an earlier file is kept until the new one is complete, and a failed write leaves no temporary file.
The file keeps the permissions of the one it replaces (a new one gets the umask's).

Nothing torchpace writes follows a link it did not make. A symlink (or hard link) at an output's name is
replaced, never written through; a file written as it grows (a script's log, `monitor --csv`) is opened
with `open_fresh`, which does the same; torchpace's own folder in the working folder (`.torchpace/...`,
`own_folder`) must be real folders, not links to somewhere else.

A write that fails (a full disk, a quota, a read-only folder) is one `OutputWriteFailed` (exit 1) whose
message names the path, the cause and, for a full disk, the space left on that filesystem. Text is
redacted (`torchpace.redact`) before it is written: no secret reaches a file. Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import IO, Any, Iterable, Iterator

from torchpace.errors import TorchpaceError, UsageError
from torchpace.redact import redact

TMP_MARK = ".tmp-"  # a temporary file is `.NAME.tmp-PID-RANDOM` beside NAME
_FULL = (errno.ENOSPC, errno.EDQUOT)
_FRESH_TRIES = 8  # a name re-planted between removing it and creating the file anew this often: give up


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


def temp_prefix(path: Path) -> str:
    """The start of the name `path` is written under before it is renamed into place (a random part follows)."""
    return f".{path.name}{TMP_MARK}{os.getpid()}-"


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, mode: str = "wb", encoding: str | None = None) -> Iterator[IO]:
    """Open a new temporary file for `path`; on a clean exit it is flushed to disk and renamed over `path`.

    The temporary file is created new with an unpredictable name (`tempfile.mkstemp`: `O_EXCL`, so nothing
    planted at a name is followed), and takes the permissions of the file it replaces (else the umask's).

    Args:
        path: the file to write.
        mode: "wb" or "w" (text: `encoding`, default UTF-8).

    Raises:
        OutputWriteFailed: writing, flushing or renaming failed (the temporary file is removed).
    """
    path = Path(path)
    tmp: Path | None = None
    try:
        fd, name = tempfile.mkstemp(prefix=temp_prefix(path), dir=path.parent)
        tmp = Path(name)
        os.fchmod(fd, _mode_to_keep(path))
        with open(fd, mode, encoding=encoding or ("utf-8" if "b" not in mode else None)) as stream:
            yield stream
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(tmp, path)
    except OSError as err:
        raise OutputWriteFailed(path, describe_write_error(path, err)) from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink()


def open_fresh(path: str | os.PathLike, mode: str = "wb", **text: Any) -> IO:
    """Open `path` to write it from its start, as a file torchpace creates: whatever is at the name (a
    symlink, a hard link, a fifo, a file) is removed and a new file made (`O_EXCL | O_NOFOLLOW`), so
    nothing planted there is followed or written through. A regular file replaced keeps its permissions.
    For files written as they grow (a script's log, `monitor --csv`); whole outputs use `atomic_output`.

    Args:
        mode: "wb", or "w" with `open`'s text arguments (`encoding`, `newline`).

    Raises:
        OSError: the file cannot be made (a folder at the name, permissions, a full disk).
    """
    path = Path(path)
    for _ in range(_FRESH_TRIES):
        keep = _mode_to_keep(path)
        try:
            if stat.S_ISDIR(os.lstat(path).st_mode):
                raise IsADirectoryError(errno.EISDIR, "is a folder", str(path))
            path.unlink()  # the name only: never what a link points to
        except FileNotFoundError:
            pass
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileExistsError:  # made again between the two calls: look again
            continue
        os.fchmod(fd, keep)
        return open(fd, mode, **text)
    raise FileExistsError(errno.EEXIST, f"something keeps re-creating {str(path)!r}", str(path))


def own_folder(folder: Path, root: Path | None = None) -> Path:
    """Make torchpace's own `folder` (e.g. `.torchpace/logs/STUDY`, relative to `root`, default the working
    folder) and each folder on the way, refusing any that is a symlink or not a folder: a project folder
    from someone else cannot send what torchpace writes there somewhere else. An absolute `folder` without
    `root` is the caller's choice (a path the user named), made as it is. Returns `root / folder`.

    Raises:
        UsageError: a part of `folder` is a symlink or not a folder (exit 2, naming it).
    """
    folder = Path(folder)
    if folder.is_absolute() and root is None:
        folder.mkdir(parents=True, exist_ok=True)
        return folder
    here = Path(root) if root is not None else Path()
    for part in folder.parts:
        here = here / part
        try:
            here.mkdir()
        except FileExistsError:
            pass
        except OSError as err:
            raise cannot_keep_own_files(here, err) from None
        check_not_a_link(here, "a real folder of the working folder")
        if not here.is_dir():
            raise UsageError(f"{str(here)!r} is not a folder: torchpace keeps its own files there; move it away")
    if not os.access(here, os.W_OK | os.X_OK):
        raise cannot_keep_own_files(here, PermissionError(errno.EACCES, os.strerror(errno.EACCES)))
    return here


def cannot_keep_own_files(folder: Path, err: OSError) -> TorchpaceError:
    """The error for a folder of torchpace's own (`.torchpace/...`) that cannot be made or written: a full disk
    (or quota) is `OutputWriteFailed` (exit 1, the space left), a read-only or forbidden one a `UsageError`
    (exit 2), torchpace's own error either way, never the script's."""
    if err.errno in _FULL:
        return OutputWriteFailed(folder, describe_write_error(folder, err))
    cause = (err.strerror or str(err)).lower()
    return UsageError(f"cannot write in {str(folder)!r} ({cause}): torchpace keeps its own files there (a script's "
                      "output log, the default study); run from a folder you can write to")


@contextlib.contextmanager
def writing(path: str | os.PathLike) -> Iterator[None]:
    """Within the block, an `OSError` (torchpace writing `path`: a full disk, a read-only folder) is one
    `OutputWriteFailed` naming the path and the cause (exit 1), never a traceback."""
    try:
        yield
    except OSError as err:
        raise OutputWriteFailed(Path(path), describe_write_error(Path(path), err)) from None


def check_disk_left(paths: Iterable[Path], what: str) -> None:
    """`OutputWriteFailed` (exit 1) when the filesystem of one of `paths` has no space left for this user: what
    was written there (`what`: a script's output log, a trial's result) was cut short by the disk, not by the
    program that wrote it; called when a run failed, to say so instead of blaming the run."""
    for path in paths:
        if free_bytes(Path(path)) == 0:
            full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            raise OutputWriteFailed(Path(path), f"{describe_write_error(Path(path), full)} ({what} ended when the disk "
                                                "filled: the run's failure is the disk's, not the script's)")


def check_not_a_link(path: Path, what: str) -> None:
    """UsageError (exit 2) when `path`, a name torchpace owns, is a symlink: what it writes there goes only
    into `what`, never where a link planted at its name points."""
    if Path(path).is_symlink():
        raise UsageError(f"{str(path)!r} is a symlink (to {os.readlink(path)!r}): torchpace writes there only into "
                         f"{what}; remove the link (or run elsewhere)")


def open_lock(path: str | os.PathLike) -> IO:
    """Open (create) a lock file for `flock`: never through a symlink at its name (that link is removed;
    a regular file is shared, never truncated)."""
    for _ in range(_FRESH_TRIES):
        try:
            return open(os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, _mode_to_keep(Path(path))), "r+b")
        except OSError as err:
            if err.errno != errno.ELOOP:
                raise
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    raise FileExistsError(errno.EEXIST, f"something keeps re-creating {str(path)!r} as a link", str(path))


def _mode_to_keep(path: Path) -> int:
    """The permissions a file written at `path` gets: those of the file there now (through a symlink too:
    its target's mode, read only), else what the umask leaves of 0666."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return 0o666 & ~_umask()


def _umask() -> int:
    """This process's umask, read without changing it where Linux shows it (`/proc/self/status`)."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


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


__all__ = ["OutputWriteFailed", "TMP_MARK", "temp_prefix", "atomic_output", "open_fresh", "own_folder", "check_not_a_link",
           "cannot_keep_own_files", "writing", "check_disk_left",
           "open_lock", "write_atomic",
           "describe_write_error", "free_bytes", "format_bytes"]
