"""The sizes of the realistic built-in workloads (`resnet`, `gpt`) and the rule that picks one."""

from __future__ import annotations

SMALL, FULL = "small", "full"
SIZES = (SMALL, FULL)


def size_for(cuda_available: bool) -> str:
    """The size a workload runs at when none is named: full where a GPU is (it fills one), small on a
    CPU (a step well under a second on a few cores, so a tune of minutes decides its knobs)."""
    return FULL if cuda_available else SMALL
