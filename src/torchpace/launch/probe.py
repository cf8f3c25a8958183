"""Collectors for the launch planner: what this machine has (allocators, numactl, limits, CPUs).

These touch the machine and return frozen data; `plan_launch` stays pure.
"""

from __future__ import annotations

import os
import resource
import shutil
import sys
from pathlib import Path
from typing import Mapping

from torchpace.host import HostFacts, probe_host
from torchpace.knobs.system import allocator_search_dirs, find_allocator
from torchpace.launch.plan import ALLOCATORS, LaunchFacts

HOOK_DIR = Path(__file__).resolve().parent / "hook"


def probe_launch_facts(base_env: Mapping[str, str]) -> LaunchFacts:
    """Allocators and numactl as the child would find them, limits, this process's CPUs."""
    dirs = allocator_search_dirs(dict(base_env))
    found = {name: find_allocator(name, dirs) for name in ALLOCATORS}
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return LaunchFacts(
        python=sys.executable,
        allocators={name: str(lib) for name, lib in found.items() if lib is not None},
        allocator_dirs=tuple(str(d) for d in dirs),
        numactl=shutil.which("numactl", path=base_env.get("PATH", os.defpath)),
        nofile_soft=None if soft == resource.RLIM_INFINITY else soft,
        nofile_hard=None if hard == resource.RLIM_INFINITY else hard,
        allowed_cpus=frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        is_root=os.geteuid() == 0,
        hook_dir=str(HOOK_DIR),
    )


def probe_launch_host(root: str | Path = "/") -> HostFacts:
    """HostFacts for planning; asks torch about GPUs only when a GPU driver is loaded.

    Without a driver there can be no CUDA (or ROCm) device, so the launcher skips importing torch.
    """
    root = Path(root)
    driver = (root / "proc/driver/nvidia/gpus").is_dir() or (root / "dev/kfd").exists()
    return probe_host(root, with_gpus=driver)
