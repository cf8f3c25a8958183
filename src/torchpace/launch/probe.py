"""Collectors for the child planner: this process's interpreter, limits and CPUs, and the host facts
(with the allocators and numactl a child would find).

These touch the machine and return frozen data; `plan_child` stays pure.
"""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path
from typing import Mapping

from torchpace.host import HostFacts, probe_host
from torchpace.launch.plan import LaunchFacts
from torchpace.script.spec import HOOK_DIR


def probe_launch_facts() -> LaunchFacts:
    """This interpreter, the open-files limits, this process's CPUs, whether it runs as root."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return LaunchFacts(
        python=sys.executable,
        nofile_soft=None if soft == resource.RLIM_INFINITY else soft,
        nofile_hard=None if hard == resource.RLIM_INFINITY else hard,
        allowed_cpus=frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        is_root=os.geteuid() == 0,
        hook_dir=str(HOOK_DIR),
    )


def probe_launch_host(root: str | Path = "/", env: Mapping[str, str] | None = None) -> HostFacts:
    """HostFacts for planning; asks torch about GPUs only when a GPU driver is loaded.

    Without a driver there can be no CUDA (or ROCm) device, so the launcher skips importing torch.
    `env` is the environment the child starts from (its PATH finds numactl, its CONDA_PREFIX allocators).
    """
    root = Path(root)
    driver = (root / "proc/driver/nvidia/gpus").is_dir() or (root / "dev/kfd").exists()
    return probe_host(root, with_gpus=driver, env=env)
