"""System-stage knobs: threads, allocator, NUMA binding.

They are pure functions of `HostFacts` (which allocators, numactl and cores the host has). Their
process-level settings reach trials, `bench`, `profile` and launched scripts through one planner,
`torchpace.launch.plan.plan_child`, which builds the child's argv and env (never torchpace's own).
"""

from __future__ import annotations

import os
from pathlib import Path

from torchpace.host import ALLOCATOR_LIBRARIES
from torchpace.knobs.base import IntKnob, Knob, Point, Reach


def read_loaded_libraries(maps_path: str = "/proc/self/maps") -> str:
    """The text of this process's memory map (which shared libraries are really loaded)."""
    try:
        return Path(maps_path).read_text()
    except OSError:
        return ""


class IntraOpThreadsKnob(IntKnob):
    name = "threads.intra_op"
    script_reach = Reach.PROCESS
    stage = "system"
    shares_cores = True
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

    def apply(self, value, target, ctx):
        if value != "auto":
            from torchpace.runtime.state import torch_threads

            target.enter_context(torch_threads(int(value)))
        return target


class AllocatorKnob(Knob):
    name = "system.allocator"
    script_reach = Reach.PROCESS
    stage = "system"
    point = Point.ENV
    default = "system"
    choices = ("system", "jemalloc", "tcmalloc")
    help = "malloc implementation preloaded into the process (LD_PRELOAD)."

    def value_applies(self, value, host, workload):
        if value != "system" and host.allocator_library(value) is None:
            return f"{value} not found in {', '.join(host.allocator_dirs) or 'the library directories'}"
        return None

    def applies(self, host, workload):
        if all(self.value_applies(v, host, workload) for v in ("jemalloc", "tcmalloc")):
            return "neither jemalloc nor tcmalloc is installed (torchpace doctor gives the install command)"
        return None

    def in_effect(self, value, host):
        if value == "system":
            return True
        return any(lib in maps for maps in [read_loaded_libraries()] for lib in ALLOCATOR_LIBRARIES[str(value)])


class NumaKnob(Knob):
    name = "system.numa"
    script_reach = Reach.PROCESS
    stage = "system"
    point = Point.ENV
    default = "off"
    choices = ("off", "bind")
    help = ("bind each process's CPUs and memory to one NUMA node with numactl (its GPU's node; "
            "several processes get disjoint CPU slices).")

    def applies(self, host, workload):
        if len(host.numa_nodes) < 2:
            return f"this host has {len(host.numa_nodes) or 1} NUMA node; binding needs 2 or more"
        if host.numactl is None:
            return "numactl is not installed"
        return None

    def in_effect(self, value, host):
        if value != "bind" or not host.numa_nodes:
            return True
        allowed = set(os.sched_getaffinity(0))
        return any(allowed <= set(node.cpus) for node in host.numa_nodes)


KNOBS = [IntraOpThreadsKnob(), AllocatorKnob(), NumaKnob()]
