"""Fixtures for the launch tests: system packages, a clean child environment, running the CLI.

The launcher is tested with real processes: `torchpace launch` in a subprocess, real torchrun, real
numactl and allocators. jemalloc, tcmalloc-minimal and numactl come from apt (the session fixture
`system_packages` installs them where the tests run as root with apt-get, which is how they get onto
CI); elsewhere the tests that need them skip with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from torchpace.knobs.system import allocator_search_dirs, find_allocator

_APT_PACKAGES = ("libjemalloc2", "libtcmalloc-minimal4", "numactl")
_APT_TIMEOUT_S = 300
# Variables the launcher decides on; the tests start children without them so "auto" is what they see.
_DECIDED = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "LD_PRELOAD", "MALLOC_CONF", "GOMP_CPU_AFFINITY", "KMP_AFFINITY",
            "PYTHONPATH", "TORCHPACE_LAUNCH_CONFIG", "TORCHPACE_LAUNCH_BINDINGS", "TORCH_NCCL_ASYNC_ERROR_HANDLING")


def _tools_present() -> bool:
    dirs = allocator_search_dirs()
    return all(find_allocator(name, dirs) for name in ("jemalloc", "tcmalloc")) and shutil.which("numactl") is not None


def _apt_get(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run(["apt-get", *args], env=env, capture_output=True, text=True, timeout=_APT_TIMEOUT_S)


@pytest.fixture(scope="session")
def system_packages() -> None:
    """jemalloc, tcmalloc-minimal and numactl installed, or the test skipped with the reason."""
    if _tools_present():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip(f"needs {', '.join(_APT_PACKAGES)}: install them, or run as root where apt-get is available")
    result = _apt_get("install", "-y", "--no-install-recommends", *_APT_PACKAGES)
    if result.returncode != 0:  # a fresh image has no package lists yet
        _apt_get("update")
        result = _apt_get("install", "-y", "--no-install-recommends", *_APT_PACKAGES)
    if result.returncode != 0 or not _tools_present():
        pytest.skip(f"apt-get install {' '.join(_APT_PACKAGES)} failed: {result.stderr.strip()[-500:]}")


@pytest.fixture
def child_env() -> dict[str, str]:
    """The environment to launch from: ours without the variables the launcher decides on."""
    return {k: v for k, v in os.environ.items() if k not in _DECIDED}
