"""Fixtures for the launch tests: system packages, a clean child environment, running the CLI.

The launcher is tested with real processes: `torchpace launch` in a subprocess, real torchrun, real
numactl and allocators. jemalloc, tcmalloc-minimal and numactl come from apt (the session fixture
`system_packages` in tests/conftest.py installs them where the tests run as root with apt-get, which is
how they get onto CI); elsewhere the tests that need them skip with the reason.
"""

from __future__ import annotations

import os
import subprocess

import pytest


# Variables the launcher decides on; the tests start children without them so "auto" is what they see.
_DECIDED = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "LD_PRELOAD", "MALLOC_CONF", "GOMP_CPU_AFFINITY", "KMP_AFFINITY",
            "PYTHONPATH", "TORCHPACE_LAUNCH_CONFIG", "TORCHPACE_LAUNCH_BINDINGS", "TORCH_NCCL_ASYNC_ERROR_HANDLING")


@pytest.fixture
def child_env() -> dict[str, str]:
    """The environment to launch from: ours without the variables the launcher decides on."""
    return {k: v for k, v in os.environ.items() if k not in _DECIDED}
