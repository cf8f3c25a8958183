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
