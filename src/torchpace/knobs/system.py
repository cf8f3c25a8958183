"""System-stage knobs: threads, allocator, NUMA binding.

They are pure functions of `HostFacts` (which allocators, numactl and cores the host has); only
`fix_glibc_thresholds` acts on this process, for a workload measured in it. Their
process-level settings reach trials, `bench`, `profile` and launched scripts through one planner,
`torchpace.launch.plan.plan_child`, which builds the child's argv and env (never torchpace's own)
from each knob's own part (`plan_child` here: OMP_NUM_THREADS, LD_PRELOAD, glibc malloc's thresholds,
each rank's NUMA binding).
"""

from __future__ import annotations

import ctypes
import os
import platform
from pathlib import Path
from typing import Mapping, Sequence

from torchpace.errors import UsageError
from torchpace.host import ALLOCATOR_LIBRARIES, HostFacts, NumaNode
from torchpace.knobs.base import IntKnob, Knob, LaunchFlag, Point, Reach
from torchpace.knobs.child import (KEPT, ChildPart, ChildRequest, RankBinding, Setting, Source, env_part, format_cpu_list,
                                   merge_parts)

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # OpenMP's and MKL's thread counts, read at start-up
ALLOCATORS = ("jemalloc", "tcmalloc")  # in the order `auto` prefers them
NUMA_MODES = ("auto", "off", "node")  # the cli's --numa
# jemalloc's settings from the PyTorch CPU tuning guide: background purging, no eager decay.
JEMALLOC_CONF = "oversize_threshold:1,background_thread:true,metadata_thp:auto,dirty_decay_ms:-1,muzzy_decay_ms:-1"
# glibc malloc's two thresholds, fixed for every process that runs on the system malloc. Left to glibc,
# they move with each process's history of frees, so two processes of one config serve a step's large
# blocks differently (fresh mmap'd pages, or heap kept from the last step) and run at different speeds
# for their whole life (docs/method.md, "What the CI covers"). 32 MiB is glibc's own ceiling for its
# moving mmap threshold on 64-bit, and the most every glibc accepts: blocks up to it come from the
# heap from the first step, larger ones are mmap'd as glibc always does. The heap is trimmed once 1 GiB
# is free at its top, so a step's freed memory is not given back and faulted in again every step.
# Both fit mallopt's int, so this process (`fix_glibc_thresholds`) uses the same values as its children.
GLIBC_THRESHOLDS = {"MALLOC_MMAP_THRESHOLD_": 32 << 20, "MALLOC_TRIM_THRESHOLD_": 1 << 30}
_MALLOPT_PARAMS = {"MALLOC_TRIM_THRESHOLD_": -1, "MALLOC_MMAP_THRESHOLD_": -3}  # M_TRIM_THRESHOLD, M_MMAP_THRESHOLD
# Variables by which a user already fixes glibc's thresholds (mallopt(3): setting any one of them stops
# the moving thresholds).
_GLIBC_THRESHOLD_VARS = (*GLIBC_THRESHOLDS, "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
_GLIBC_THRESHOLD_TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold", "glibc.malloc.top_pad",
                             "glibc.malloc.mmap_max")


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
    plan_order = 30  # after the processes and their NUMA binding, which set the auto count
    launch_flag = LaunchFlag("--omp-threads", "OMP_NUM_THREADS per rank (auto: usable cores / ranks).  [default: auto without "
                             "--config; with one, as its trials ran]", or_auto=True, metavar="auto|N")
    script_guard = "also over the script's own torch.set_num_threads() calls (each change is reported)"

    def host_limit(self, host):
        cores = max(1, host.usable_cores)
        return cores, f"one thread per usable core; more only contend for {cores} core(s)"

    def candidates(self, host, workload):
        counts = sorted({1, max(1, host.usable_cores // 2), host.usable_cores})
        return ["auto", *counts]

    def apply(self, value, target, ctx):
        if value != "auto":
            from torchpace.engine.state import torch_threads

            target.enter_context(torch_threads(int(value)))
        return target

    def apply_in_script(self, value, hook):
        """The count reached the process through OMP_NUM_THREADS; a set one also holds over the script's
        own `torch.set_num_threads()` calls."""
        if value != self.default:
            hook.hold_threads(self, int(value))

    def plan_child(self, value, given, request, draft):
        """OMP_NUM_THREADS and MKL_NUM_THREADS: explicit under torchrun (which would force 1) and when
        bound; otherwise set only by the cli, the config or an asked-for auto choice."""
        configured = self.default if value is None else value
        base_env = request.base_env
        over_env = configured != "auto" and request.config_over_env
        if isinstance(given, int):
            threads, source, reason = given, Source.CLI, f"--omp-threads {given}"
        elif "OMP_NUM_THREADS" in base_env and not over_env:
            part = env_part({"OMP_NUM_THREADS": base_env["OMP_NUM_THREADS"]}, Source.ENV, "", base_env)
            if configured != "auto" and str(configured) != base_env["OMP_NUM_THREADS"]:
                part.notes.append(request.env_wins_note(f"OMP_NUM_THREADS={base_env['OMP_NUM_THREADS']}",
                                                        f"{self.name} = {configured}", "OMP_NUM_THREADS"))
            return part
        elif configured != "auto":
            threads, source, reason = int(configured), Source.CONFIG, f"{self.name} = {configured} in {request.config_name}"
        elif request.wants_auto(given) or draft.ranks > 1 or draft.bindings:
            threads, reason = _auto_threads(request.host, draft.ranks, draft.bindings)
            source = Source.AUTO
        else:
            why = f"left unset: torch picks its thread count ({self.name} is auto in {request.config_name})"
            return ChildPart([Setting(name, None, Source.DEFAULT, why) for name in THREAD_VARS])
        return env_part(dict.fromkeys(THREAD_VARS, str(threads)), source, reason, base_env, over_env)


def _auto_threads(host: HostFacts, nproc: int, bindings: Sequence[RankBinding]) -> tuple[int, str]:
    """Threads per rank: the rank's CPU slice when bound, else usable cores shared among the ranks."""
    if bindings:
        size = len(bindings[0].cpus)
        return size, f"each rank is bound to {size} CPU(s) of its NUMA node"
    threads = max(1, host.usable_cores // nproc)
    reason = f"{host.usable_cores} usable core(s) / {nproc} rank(s) on this node"
    if nproc > host.usable_cores:
        reason += " (more ranks than cores: the ranks share cores)"
    return threads, reason


class AllocatorKnob(Knob):
    name = "system.allocator"
    script_reach = Reach.PROCESS
    stage = "system"
    point = Point.ENV
    default = "system"
    choices = ("system", "jemalloc", "tcmalloc")
    help = "malloc implementation preloaded into the process (LD_PRELOAD)."
    plan_order = 40
    launch_flag = LaunchFlag("--allocator", "malloc to preload (auto: jemalloc, else tcmalloc, when installed).  [default: "
                             "auto without --config; with one, as its trials ran]", choices=("auto", "jemalloc", "tcmalloc", "system"))

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

    def plan_child(self, value, given, request, draft):
        """LD_PRELOAD of jemalloc (with MALLOC_CONF) or tcmalloc, or the system's malloc with its
        thresholds fixed (`GLIBC_THRESHOLDS`), and why."""
        part = self._plan_library(value, given, request)
        if next(s.value for s in part.settings if s.name == "allocator") != "system":
            return part
        return merge_parts(part, glibc_thresholds_part(request.base_env))

    def _plan_library(self, value, given, request: ChildRequest) -> ChildPart:
        base_env, host = request.base_env, request.host
        preloaded = preloaded_allocator(base_env.get("LD_PRELOAD", ""))
        configured = value is not None
        if given not in (None, "auto"):
            wanted, source, asked = str(given), Source.CLI, f"--allocator {given}"
        elif preloaded is not None and not (configured and request.config_over_env):
            part = ChildPart([Setting("allocator", preloaded, Source.ENV, "LD_PRELOAD in your environment already preloads it")])
            if configured and value != preloaded:
                part.notes.append(request.env_wins_note(f"LD_PRELOAD with {preloaded}", f"{self.name} = {value}",
                                                        "LD_PRELOAD"))
            return part
        elif configured:
            wanted, source, asked = str(value), Source.CONFIG, f"{self.name} = {value} in {request.config_name}"
        elif request.wants_auto(given):
            return _auto_allocator(request)
        else:
            return ChildPart([Setting("allocator", "system", Source.DEFAULT,
                                      f"nothing preloaded: {request.config_name} does not set {self.name}")])
        if wanted == "system":
            return _system_allocator(base_env, source, asked)
        library = host.allocator_library(wanted)
        if library is None:
            raise UsageError(f"{wanted} was asked for ({asked}) but is not installed in {', '.join(host.allocator_dirs)}; "
                             f"install it with: {request.install_command(wanted)}")
        return _preload(wanted, library, _without_allocators(base_env), source, asked)


def _auto_allocator(request: ChildRequest) -> ChildPart:
    for name in ALLOCATORS:
        library = request.host.allocator_library(name)
        if library is not None:
            return _preload(name, library, request.base_env, Source.AUTO, f"{name} found")
    command = request.install_command("jemalloc")
    part = ChildPart([Setting("allocator", "system", Source.AUTO, f"neither jemalloc nor tcmalloc is installed ({command})")])
    part.notes.append(f"no jemalloc or tcmalloc found, so the script keeps the system malloc; install jemalloc with: {command}")
    return part


def allocator_env(name: str, library: str, env: Mapping[str, str]) -> dict[str, str]:
    """The env vars that preload allocator `name` from `library` for a child whose env is `env`.

    `library` goes first in LD_PRELOAD, ahead of what `env` already preloads; jemalloc also gets
    JEMALLOC_CONF as MALLOC_CONF unless `env` sets MALLOC_CONF. Pure: returns the changes only.
    """
    changes = {"LD_PRELOAD": ":".join(p for p in (library, env.get("LD_PRELOAD", "")) if p)}
    if name == "jemalloc" and "MALLOC_CONF" not in env:
        changes["MALLOC_CONF"] = JEMALLOC_CONF
    return changes


def _preload(name: str, library: str, env: Mapping[str, str], source: Source, why: str) -> ChildPart:
    """Preload `library`; jemalloc gets MALLOC_CONF unless the user's environment sets one."""
    changes = allocator_env(name, library, env)
    part = ChildPart([Setting("allocator", name, source, f"{why}: {library}"),
                      Setting("LD_PRELOAD", changes["LD_PRELOAD"], source, f"preload {name} ({why})")], env=dict(changes))
    if "MALLOC_CONF" in changes:
        part.settings.append(Setting("MALLOC_CONF", changes["MALLOC_CONF"], source,
                                     "jemalloc settings from the PyTorch CPU tuning guide"))
    elif name == "jemalloc":
        part.settings.append(Setting("MALLOC_CONF", env["MALLOC_CONF"], Source.ENV, KEPT))
    return part


def _system_allocator(base_env: Mapping[str, str], source: Source, asked: str) -> ChildPart:
    part = ChildPart([Setting("allocator", "system", source, f"{asked}: the C library's malloc")])
    if preloaded_allocator(base_env.get("LD_PRELOAD", "")) is not None:
        stripped = _without_allocators(base_env).get("LD_PRELOAD")
        part.env["LD_PRELOAD"] = stripped
        part.settings.append(Setting("LD_PRELOAD", stripped, source, f"{asked}: allocators removed from your LD_PRELOAD"))
    return part


def user_glibc_threshold(env: Mapping[str, str]) -> str | None:
    """The variable (or GLIBC_TUNABLES entry) by which `env` already fixes glibc malloc's thresholds, or None."""
    for name in _GLIBC_THRESHOLD_VARS:
        if name in env:
            return f"{name}={env[name]}"
    for entry in env.get("GLIBC_TUNABLES", "").split(":"):
        if entry.partition("=")[0] in _GLIBC_THRESHOLD_TUNABLES:
            return f"GLIBC_TUNABLES {entry}"
    return None


def glibc_thresholds_part(env: Mapping[str, str]) -> ChildPart:
    """The child's glibc malloc thresholds: `GLIBC_THRESHOLDS`, unless `env` already fixes them (the user's
    own values then stand, whatever the source of the rest: both arms of a comparison and the launch
    inherit them alike). Other C libraries ignore the variables."""
    users = user_glibc_threshold(env)
    if users is not None:
        return ChildPart([Setting(name, env.get(name), Source.ENV, f"glibc's thresholds are set in your environment "
                                  f"({users}); left as they are") for name in GLIBC_THRESHOLDS])
    reason = ("glibc malloc's thresholds fixed, so that every process of one config runs at one speed "
              "(left to glibc they move with each process's history)")
    return env_part({name: str(value) for name, value in GLIBC_THRESHOLDS.items()}, Source.AUTO, reason, env)


def fix_glibc_thresholds(env: Mapping[str, str] | None = None) -> bool:
    """Give this process the thresholds its children get (`GLIBC_THRESHOLDS`, by mallopt), for a
    workload measured in this process. Nothing is done when `env` (default: os.environ) already fixes
    them, when jemalloc or tcmalloc is preloaded, or off glibc. True when they were set."""
    env = os.environ if env is None else env
    if platform.libc_ver()[0] != "glibc" or user_glibc_threshold(env) is not None:
        return False
    if preloaded_allocator(env.get("LD_PRELOAD", "")) is not None:
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return all(mallopt(_MALLOPT_PARAMS[name], value) == 1 for name, value in GLIBC_THRESHOLDS.items())


def preloaded_allocator(ld_preload: str) -> str | None:
    """The allocator (jemalloc/tcmalloc) an LD_PRELOAD value already loads, or None."""
    for entry in ld_preload.replace(" ", ":").split(":"):
        base = os.path.basename(entry)
        for name, libraries in ALLOCATOR_LIBRARIES.items():
            if base in libraries or base.startswith(f"lib{name}"):
                return name
    return None


def _without_allocators(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with jemalloc/tcmalloc taken out of LD_PRELOAD (the var removed when nothing is left)."""
    kept = [e for e in env.get("LD_PRELOAD", "").replace(" ", ":").split(":") if e and preloaded_allocator(e) is None]
    stripped = {k: v for k, v in env.items() if k != "LD_PRELOAD"}
    if kept:
        stripped["LD_PRELOAD"] = ":".join(kept)
    return stripped


class NumaKnob(Knob):
    name = "system.numa"
    script_reach = Reach.PROCESS
    stage = "system"
    point = Point.ENV
    default = "off"
    choices = ("off", "bind")
    help = ("bind each process's CPUs and memory to one NUMA node with numactl (its GPU's node; "
            "several processes get disjoint CPU slices).")
    plan_order = 20  # after the processes (one slice per rank); the threads follow the slices
    launch_flag = LaunchFlag("--numa", "Bind each rank's CPUs and memory to a NUMA node (auto: when there are several).  "
                             "[default: auto without --config; with one, as its trials ran]", choices=("auto", "off", "node"))

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

    def plan_child(self, value, given, request, draft):
        """Bind each rank's CPUs and memory to a NUMA node (with GPUs: its GPU's node), or say why not;
        the bindings go on `draft` (the planner turns them into numactl commands)."""
        mode, source, asked = self._mode(value, given, request)
        host, nproc = request.host, draft.nproc
        nodes = _usable_nodes(host, request.allowed_cpus)
        if mode == "off":
            return ChildPart([Setting("numa", "off", source, asked or "binding is off")])
        if draft.launcher is not None:  # its ranks are the launcher's: torchpace cannot put numactl before each
            if mode == "node":
                raise UsageError(f"NUMA binding was asked for ({asked}), and the command's own {draft.launcher} starts "
                                 "the ranks: give it its own binding option (torchrun --numa-binding=node)")
            return ChildPart([Setting("numa", None, Source.AUTO, f"the ranks are started by the command's own "
                                                               f"{draft.launcher}: its options bind them")])
        if host.numactl is None and mode == "node":
            raise UsageError(f"NUMA binding was asked for ({asked}) but numactl is not installed; "
                             f"install it with: {request.install_command('numactl')}")
        why_not = _why_not_bind(host, nodes, nproc) if mode == "auto" else None
        if why_not is not None:
            part = ChildPart([Setting("numa", None, Source.AUTO, why_not)])
            if host.numactl is None and len(nodes) > 1:
                part.notes.append(f"numactl not found, so ranks are not NUMA-bound; install it with: "
                                  f"{request.install_command('numactl')}")
            return part
        draft.bindings = bindings = plan_rank_bindings(host, nodes, nproc)
        where = "; ".join(f"rank {b.local_rank}: node {b.node}, cpus {format_cpu_list(b.cpus)}" for b in bindings)
        reason = asked or (f"{len(nodes)} NUMA nodes" + (", each rank on its GPU's node" if host.gpus else ""))
        return ChildPart([Setting("numa", "node", Source.AUTO if mode == "auto" else source, f"{reason} ({where})")])

    def _mode(self, value, given, request: ChildRequest) -> tuple[str, Source, str]:
        """(auto/off/node, its source, how it was asked for: empty for auto)."""
        if given is not None and given != "auto":
            if given not in NUMA_MODES:
                raise UsageError(f"--numa {given!r} is not valid; valid values: {', '.join(NUMA_MODES)}")
            return str(given), Source.CLI, f"--numa {given}"
        if value is not None:
            return ("node" if value == "bind" else "off"), Source.CONFIG, f"{self.name} = {value} in {request.config_name}"
        if request.wants_auto(given):
            return "auto", Source.AUTO, ""
        return "off", Source.DEFAULT, f"not bound: {request.config_name} does not set {self.name}"


def _why_not_bind(host: HostFacts, nodes: Sequence[NumaNode], nproc: int) -> str | None:
    """None when `auto` binds, else the reason it does not."""
    if len(nodes) < 2:
        return f"{len(nodes) or 1} NUMA node: nothing to bind"
    if host.numactl is None:
        return f"{len(nodes)} NUMA nodes, but numactl is not installed"
    if not host.gpus and nproc < len(nodes):
        return (f"{nproc} rank(s) on {len(nodes)} NUMA nodes: binding would leave nodes idle "
                "(--numa node binds anyway)")
    return None


def _usable_nodes(host: HostFacts, allowed_cpus: frozenset[int] | None) -> tuple[NumaNode, ...]:
    """NUMA nodes with the CPUs this process may use (one node of all CPUs when the kernel shows none)."""
    nodes = host.numa_nodes or (NumaNode(0, tuple(range(host.logical_cpus))),)
    if allowed_cpus is None:
        return nodes
    kept = (NumaNode(n.id, tuple(c for c in n.cpus if c in allowed_cpus)) for n in nodes)
    return tuple(n for n in kept if n.cpus) or (NumaNode(nodes[0].id, tuple(sorted(allowed_cpus))),)


def plan_rank_bindings(host: HostFacts, nodes: Sequence[NumaNode], nproc: int) -> tuple[RankBinding, ...]:
    """Each local rank's node and CPU slice: ranks on one node get disjoint, equal slices of it.

    With GPUs, rank i runs on GPU i's NUMA node; without, ranks are spread over the nodes in
    contiguous blocks (4 ranks on 2 nodes: 0,1 -> node 0; 2,3 -> node 1).
    """
    by_id = {n.id: n for n in nodes}
    node_of = [_rank_node(host, nodes, rank, nproc) for rank in range(nproc)]
    counts = {node: node_of.count(node) for node in node_of}
    size = max(1, min(len(by_id[node].cpus) // count for node, count in counts.items()))
    size = min(size, max(1, host.usable_cores // nproc))
    seen: dict[int, int] = {}
    bindings = []
    for rank, node in enumerate(node_of):
        cpus = by_id[node].cpus
        start = (seen.get(node, 0) * size) % len(cpus)
        seen[node] = seen.get(node, 0) + 1
        bindings.append(RankBinding(rank, node, tuple(cpus[start:start + size])))
    return tuple(bindings)


def _rank_node(host: HostFacts, nodes: Sequence[NumaNode], rank: int, nproc: int) -> int:
    if host.gpus:
        gpu = host.gpus[rank % len(host.gpus)]
        if gpu.numa_node is not None and gpu.numa_node in {n.id for n in nodes}:
            return gpu.numa_node
    return nodes[rank * len(nodes) // nproc].id


KNOBS = [IntraOpThreadsKnob(), AllocatorKnob(), NumaKnob()]
