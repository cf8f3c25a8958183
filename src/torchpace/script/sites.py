"""Where in an unmodified script a call came from: the first frame outside torch, torchpace and the
standard library (`file.py:LINE`), as every change the launch hook reports names it."""

from __future__ import annotations

import functools
import os
import sys

import torchpace


def library_prefixes() -> tuple[str, ...]:
    """The folders of torch, torchpace and the standard library (each ending in a separator)."""
    import torch

    return tuple(os.path.dirname(os.path.dirname(m.__file__)) + os.sep for m in (torch, torchpace, functools))


def caller_site() -> str:
    """`file.py:LINE` of the innermost frame outside torch, torchpace and the standard library."""
    skip = library_prefixes()
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(skip) and not filename.startswith("<"):
            shown = os.path.relpath(filename)
            return f"{filename if shown.startswith('..') else shown}:{frame.f_lineno}"
        frame = frame.f_back
    return "unknown"
