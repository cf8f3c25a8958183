"""System-stage knobs: threads, allocator, NUMA binding. Process-level settings reach trials and
launched scripts through the child's environment (`child_env`), never torchpace's own."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Iterable, Mapping

from torchpace.knobs.base import IntKnob, Knob, Point

ALLOCATOR_LIBRARIES = {
    "jemalloc": ("libjemalloc.so.2", "libjemalloc.so"),
    "tcmalloc": ("libtcmalloc.so.4", "libtcmalloc_minimal.so.4", "libtcmalloc.so", "libtcmalloc_minimal.so"),
}
# jemalloc's settings from the PyTorch CPU tuning guide: background purging, no eager decay.
JEMALLOC_CONF = "oversize_threshold:1,background_thread:true,metadata_thp:auto,dirty_decay_ms:-1,muzzy_decay_ms:-1"


def allocator_search_dirs(env: dict[str, str] | None = None, prefix: str | None = None) -> list[Path]:
    """Library directories where an allocator may live: the system's, conda's and the venv's."""
    env = os.environ if env is None else env
    dirs = [Path(d) for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")]
    for root in (env.get("CONDA_PREFIX"), prefix or sys.prefix):
        if root:
            dirs.append(Path(root) / "lib")
    return dirs


def find_allocator(name: str, dirs: Iterable[Path]) -> Path | None:
    """The first shared library of allocator `name` (jemalloc/tcmalloc) found in `dirs`, or None."""
    for directory in dirs:
        for lib in ALLOCATOR_LIBRARIES.get(name, ()):
            candidate = directory / lib
            if candidate.exists():
                return candidate
    return None


def allocator_env(name: str, library: Path | str, env: Mapping[str, str]) -> dict[str, str]:
    """The env vars that preload allocator `name` from `library` for a child whose env is `env`.

    `library` goes first in LD_PRELOAD, ahead of what `env` already preloads; jemalloc also gets
    JEMALLOC_CONF as MALLOC_CONF unless `env` sets MALLOC_CONF. Pure: returns the changes only.
    """
    changes = {"LD_PRELOAD": ":".join(p for p in (str(library), env.get("LD_PRELOAD", "")) if p)}
    if name == "jemalloc" and "MALLOC_CONF" not in env:
        changes["MALLOC_CONF"] = JEMALLOC_CONF
    return changes


def read_loaded_libraries(maps_path: str = "/proc/self/maps") -> str:
    """The text of this process's memory map (which shared libraries are really loaded)."""
    try:
        return Path(maps_path).read_text()
    except OSError:
        return ""


class IntraOpThreadsKnob(IntKnob):
    name = "threads.intra_op"
    stage = "system"
    point = Point.GLOBAL
    default = "auto"
    named = ("auto",)
    minimum = 1
    help = "torch intra-op threads (torch.set_num_threads; OMP_NUM_THREADS for child processes)."

    def host_limit(self, host):
        cores = max(1, host.usable_cores)
        return cores, f"one thread per usable core; more only contend for {cores} core(s)"

    def candidates(self, host, workload):
        counts = sorted({1, max(1, host.usable_cores // 2), host.usable_cores})
        return ["auto", *counts]

    def child_env(self, value, host, env):
        if value != "auto":
            env["OMP_NUM_THREADS"] = str(value)
            env["MKL_NUM_THREADS"] = str(value)

    def apply(self, value, target, ctx):
        if value != "auto":
            from torchpace.runtime.state import torch_threads

            target.enter_context(torch_threads(int(value)))
        return target


class AllocatorKnob(Knob):
    name = "system.allocator"
    stage = "system"
    point = Point.ENV
    default = "system"
    choices = ("system", "jemalloc", "tcmalloc")
    help = "malloc implementation preloaded into the process (LD_PRELOAD)."

    def value_applies(self, value, host, workload):
        if value != "system" and find_allocator(value, allocator_search_dirs()) is None:
            return f"{value} not found in {', '.join(map(str, allocator_search_dirs()))}"
        return None

    def applies(self, host, workload):
        if all(self.value_applies(v, host, workload) for v in ("jemalloc", "tcmalloc")):
            return "neither jemalloc nor tcmalloc is installed (torchpace doctor gives the install command)"
        return None

    def in_effect(self, value, host):
        if value == "system":
            return True
        return any(lib in maps for maps in [read_loaded_libraries()] for lib in ALLOCATOR_LIBRARIES[str(value)])

    def child_env(self, value, host, env):
        if value == "system":
            return
        lib = find_allocator(str(value), allocator_search_dirs(env))
        if lib is not None:
            env.update(allocator_env(str(value), lib, env))


class NumaKnob(Knob):
    name = "system.numa"
    stage = "system"
    point = Point.ENV
    default = "off"
    choices = ("off", "bind")
    help = "bind the process's CPUs and memory to one NUMA node with numactl."

    def applies(self, host, workload):
        if len(host.numa_nodes) < 2:
            return f"this host has {len(host.numa_nodes) or 1} NUMA node; binding needs 2 or more"
        if shutil.which("numactl") is None:
            return "numactl is not installed"
        return None

    def in_effect(self, value, host):
        if value != "bind" or not host.numa_nodes:
            return True
        return set(os.sched_getaffinity(0)) <= set(host.numa_nodes[0].cpus)

    def child_command_prefix(self, value, host):
        if value == "bind":
            node = host.numa_nodes[0].id
            return ["numactl", f"--cpunodebind={node}", f"--membind={node}"]
        return []


KNOBS = [IntraOpThreadsKnob(), AllocatorKnob(), NumaKnob()]
