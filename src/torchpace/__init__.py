"""torchpace: make PyTorch training and inference fast by measuring instead of guessing.

The public API is imported lazily so that `import torchpace` (and `torchpace --help`) does not
import torch:

    import torchpace
    workload = torchpace.load_workload("tabular")
    with torchpace.prepare(workload, "torchpace.toml") as run:
        for batch in run.loader:
            run.step(batch)
"""

from __future__ import annotations

import importlib
from typing import Any

from torchpace._version import __version__

_LAZY = {
    "Workload": "torchpace.workload",
    "load_workload": "torchpace.workload",
    "RunConfig": "torchpace.config",
    "load_config": "torchpace.config",
    "prepare": "torchpace.runtime",
    "Prepared": "torchpace.runtime",
    "Finding": "torchpace.findings",
    "Severity": "torchpace.findings",
    "Remedy": "torchpace.findings",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'torchpace' has no attribute {name!r}")
