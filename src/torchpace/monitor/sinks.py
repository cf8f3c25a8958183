"""Sinks: where samples are logged besides the screen — a CSV file and TensorBoard scalars.

Both are opened before CMD starts, so a path that cannot be written (or TensorBoard not being
installed) stops `torchpace monitor` with exit code 2 before anything runs, and a full disk there with
exit 1 (`torchpace.files.OutputWriteFailed`: one line naming the path and the space left). The CSV
columns and their units are `torchpace.monitor.samples.HOST_COLUMNS` / `GPU_COLUMNS`.
"""

from __future__ import annotations

import contextlib
import csv
import errno
from pathlib import Path
from typing import Any, Protocol

from torchpace.errors import TorchpaceError, UsageError
from torchpace.files import OutputWriteFailed, describe_write_error, open_fresh
from torchpace.monitor.samples import Value

_TENSORBOARD_MISSING = (
    "--tensorboard needs the `tensorboard` package, which is not installed here. "
    "Install it with: pip install 'torchpace[tensorboard]'"
)


class Sink(Protocol):
    """Receives every sample's row (`flatten_sample`) in order; `close` is called once at the end."""

    def write(self, row: dict[str, Value]) -> None: ...

    def close(self) -> None: ...


def format_csv_value(value: Value) -> str:
    """A CSV cell: empty for not measured, integers as integers, floats to 4 decimals."""
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(round(value, 4))
    return str(value)


class CsvSink:
    """One CSV row per sample, header first, flushed after every row so the file can be tailed.

    Args:
        path: file to create (truncated if it exists).
        columns: header, from `build_column_names`.
    """

    def __init__(self, path: Path, columns: list[str]):
        self.path = Path(path)
        try:
            self._file = open_fresh(self.path, "w", newline="", encoding="utf-8")  # never through a link at its name
        except OSError as err:
            raise _open_failed("--csv", self.path, err, "give a file path in a writable directory") from None
        self._writer = csv.DictWriter(self._file, fieldnames=columns, extrasaction="ignore", restval="")
        try:
            self._writer.writeheader()
            self._file.flush()
        except OSError as err:  # created, but not even the header fits: nothing of it is kept
            with contextlib.suppress(OSError):
                self._file.close()
            with contextlib.suppress(OSError):
                self.path.unlink()
            raise _open_failed("--csv", self.path, err, "give a file path in a writable directory") from None

    def write(self, row: dict[str, Value]) -> None:
        self._writer.writerow({name: format_csv_value(value) for name, value in row.items()})
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def load_summary_writer() -> Any:
    """`torch.utils.tensorboard.SummaryWriter`, imported only now (it imports torch).

    Raises:
        UsageError: when the tensorboard package is missing, saying how to install it.
    """
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as err:
        raise UsageError(_TENSORBOARD_MISSING) from err
    return SummaryWriter


def build_scalar_tag(column: str) -> str | None:
    """TensorBoard tag of a CSV column (``gpu0_util_pct`` -> ``gpu0/util_pct``); None for columns not logged.

    Time columns are the step and wall time themselves; per-core columns stay in the CSV only.
    """
    if column in ("t_s", "unix_time_s", "interval_s") or (column.startswith("cpu") and column[3:4].isdigit()):
        return None
    if column.startswith("gpu") and "_" in column:
        gpu, _, rest = column.partition("_")
        return f"{gpu}/{rest}"
    if column.startswith("tree_"):
        return "tree/" + column.removeprefix("tree_")
    return "host/" + column


class TensorBoardSink:
    """Every numeric column as a TensorBoard scalar; the step is the sample number.

    Args:
        log_dir: TensorBoard log directory (created if missing).
    """

    def __init__(self, log_dir: Path):
        writer_cls = load_summary_writer()
        self.log_dir = Path(log_dir)
        self._step = 0
        try:
            self._writer = writer_cls(log_dir=str(log_dir))
        except OSError as err:
            raise _open_failed("--tensorboard", self.log_dir, err, "give a writable directory") from None

    def write(self, row: dict[str, Value]) -> None:
        walltime = row.get("unix_time_s")
        for name, value in row.items():
            tag = build_scalar_tag(name)
            if tag is not None and isinstance(value, (int, float)):
                self._writer.add_scalar(tag, value, global_step=self._step, walltime=walltime)
        self._step += 1

    def close(self) -> None:
        self._writer.close()


def open_sinks(csv_path: Path | None, tensorboard_dir: Path | None, columns: list[str]) -> list[Sink]:
    """Open the sinks asked for; raises UsageError, or OutputWriteFailed for a full disk (closing any already
    open), when one cannot be."""
    sinks: list[Sink] = []
    try:
        if csv_path is not None:
            sinks.append(CsvSink(csv_path, columns))
        if tensorboard_dir is not None:
            sinks.append(TensorBoardSink(tensorboard_dir))
    except TorchpaceError:
        for sink in sinks:
            with contextlib.suppress(OSError):
                sink.close()
        raise
    return sinks


def _open_failed(option: str, path: Path, err: OSError, remedy: str) -> TorchpaceError:
    """A sink that cannot be opened: a full disk (or quota) is `OutputWriteFailed` (exit 1, naming the
    space left), anything else a usage error (exit 2)."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return OutputWriteFailed(path, f"{option}: {describe_write_error(path, err)}")
    return UsageError(f"cannot write {option} {str(path)!r}: {err.strerror or err}; {remedy}")
