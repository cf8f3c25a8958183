"""The argument types of every benchmark: a duration is a finite number of seconds (or minutes) > 0, a
count an integer >= 1, a `--keep DIR` a folder that is or can be made here. Anything else is refused by
argparse (exit 2), naming the option, the value and what is valid, before anything is run. A kept run
writes into a folder of its own inside `--keep DIR` (`new_run_folder`), so a rerun with the same
`--keep` neither reuses nor overwrites an earlier run's studies and files."""

from __future__ import annotations

import argparse
import itertools
import math
import os
from pathlib import Path


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not valid: seconds, a finite number > 0")
    return value


MINUTES_MAX = 60.0  # a time box of an hour or more is a mistake: the checks are sized to minutes


def minutes(text: str) -> float:
    """A time box in minutes: a finite number > 0 and below `MINUTES_MAX`."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 < value < MINUTES_MAX:
        raise argparse.ArgumentTypeError(f"{text!r} is not valid: minutes, a number above 0 and below {MINUTES_MAX:g}")
    return value


def keep_folder(text: str) -> Path:
    """`--keep DIR`: a folder that exists and can be written, or one that can be made (its nearest existing
    parent is a folder that can be written). A file there, or a folder under a file, is refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError("'' is not valid: name a folder to keep the run's files in")
    path = Path(text).expanduser()
    try:
        existing = next(p for p in (path, *path.absolute().parents) if p.exists())
    except OSError as err:  # a name longer than the filesystem allows, a folder that cannot be searched
        raise argparse.ArgumentTypeError(f"{text!r} is not valid: {err.strerror or err}; give a folder you can write") from None
    if not existing.is_dir():
        where = "it is a file" if existing == path else f"{str(existing)!r} is a file, so no folder can be made under it"
        raise argparse.ArgumentTypeError(f"{text!r} is not valid: {where}; give a folder, new or existing")
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "it cannot be written" if existing == path else f"{str(existing)!r} cannot be written, so it cannot be made"
        raise argparse.ArgumentTypeError(f"{text!r} is not valid: {what}; give a folder you can write")
    return path


def next_run_folder(keep: Path) -> Path:
    """The folder `new_run_folder` would make now (`run-1`, `run-2`, ...), without making it."""
    return next(keep / f"run-{n}" for n in itertools.count(1) if not (keep / f"run-{n}").exists())


def new_run_folder(keep: Path) -> Path:
    """A new folder for this run inside `keep` (made with it), `run-1`, `run-2`, ...: each made exclusively, so
    a rerun with the same `--keep`, or a run beside it, never resumes or overwrites an earlier run's studies
    and files. OSError when it cannot be made (the disk is full or read-only)."""
    keep.mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        try:
            (keep / f"run-{n}").mkdir()
            return keep / f"run-{n}"
        except FileExistsError:
            n += 1


def count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not valid: a whole number >= 1")
    return value


BUSY_MAX = 8  # more spinning processes than this only measures the scheduler


def busy(text: str) -> int:
    """`--busy N`: how many processes spin while a benchmark runs (another user's jobs), 0 to BUSY_MAX."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= BUSY_MAX:
        raise argparse.ArgumentTypeError(f"{text!r} is not valid: a whole number from 0 to {BUSY_MAX}")
    return value


class BusyLoops:
    """`with BusyLoops(n):` n processes that spin (`while True: pass`) until the block ends, killed then
    whatever happened inside. They are started detached (their parent exits at once), so they belong to
    no one's process tree, as another user's jobs: torchpace counts them as other processes' load."""

    def __init__(self, n: int):
        self.n = n
        self.pids: list[int] = []

    def __enter__(self):
        import subprocess
        import sys

        for _ in range(self.n):
            started = subprocess.run(["sh", "-c", f'"{sys.executable}" -c "while True: pass" >/dev/null 2>&1 & echo $!'],
                                     capture_output=True, text=True, check=True)
            self.pids.append(int(started.stdout.strip()))
        return self

    def __exit__(self, *exc):
        import os
        import signal

        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue


def fmt(value, pattern: str) -> str:
    """`pattern` of `value`, or "-" when there is none."""
    return "-" if value is None else pattern.format(value)


def show(table, report: dict) -> int:
    """Print a benchmark's table (stdout) and its figures as JSON after it; the exit status."""
    import json

    from rich.console import Console

    Console().print(table)
    print(json.dumps(report, indent=2, default=str))
    return 0
