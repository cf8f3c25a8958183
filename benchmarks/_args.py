"""The argument types of every benchmark: a duration is a finite number of seconds > 0, a count an
integer >= 1. Anything else is refused by argparse (exit 2), naming the option, the value and what is
valid, before anything is run."""

from __future__ import annotations

import argparse
import math


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not valid: seconds, a finite number > 0")
    return value


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
