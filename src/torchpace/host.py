"""HostFacts: what this machine is (CPU, cores usable, NUMA, distro, GPUs) and the tools it has
(allocator libraries, numactl, a C compiler), shared by doctor, knobs and launch.

Collectors read through an injectable filesystem `root` (so tests feed fixture trees shaped like
`/proc`, `/sys`, `/etc`, `/usr/lib`) and never raise: a value that could not be read is None. GPU facts
come from torch only when the caller asks for them (`with_gpus=True`), since importing torch is slow.
Knobs and the child planner read these facts only; they never search the machine themselves.

`TORCHPACE_HOST_FACTS` (a JSON object, read by `probe_host`) makes the probed facts those of another
host: `{"bf16": false, "usable_cores": 2, "numa_nodes": 1, "gpus": 0}` (any subset). torchpace then
plans, checks and refuses as it would there; what really runs is still this machine (a faked GPU or
NUMA node can be planned for, not used). Counts beyond a real host are refused (exit 2), and so are
GPUs claimed where torch sees none (a process that runs torch work would then try to use them). `override_host_facts` is the same change in-process. The
variable fakes this machine only: a probe of another root (a fixture tree of another host) reads that
host's files as they are.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

from torchpace.errors import UsageError, whole_number_in

_log = logging.getLogger(__name__)

# Shared libraries of each allocator a child can preload, in the order they are looked for.
ALLOCATOR_LIBRARIES = {
    "jemalloc": ("libjemalloc.so.2", "libjemalloc.so"),
    "tcmalloc": ("libtcmalloc.so.4", "libtcmalloc_minimal.so.4", "libtcmalloc.so", "libtcmalloc_minimal.so"),
}
HOST_FACTS_ENV = "TORCHPACE_HOST_FACTS"  # JSON: the facts of another host (see the module docstring)
_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
_FAKED_GPU_BYTES = 16 << 30  # what a faked GPU is said to hold
# the most a faked host may claim: beyond a real machine, a count only makes lists that fill the memory
_MAX_CPUS = 8192  # Linux's largest CONFIG_NR_CPUS
_MAX_NUMA_NODES = 1024  # Linux's MAX_NUMNODES (NODES_SHIFT 10)
_MAX_GPUS = 64  # torch's MAX_CUDA_DEVICES (torch/csrc/cuda/device_set.h)
_SYSTEM_LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")


@dataclass(frozen=True)
class NumaNode:
    """One NUMA node: its id and the logical CPUs on it."""

    id: int
    cpus: tuple[int, ...]


@dataclass(frozen=True)
class GpuInfo:
    """One CUDA device as torch sees it."""

    index: int
    name: str
    memory_bytes: int
    pci_bus_id: str | None = None
    numa_node: int | None = None


@dataclass(frozen=True)
class DistroInfo:
    """From /etc/os-release: `id` (debian, ubuntu, rhel, rocky...) and `id_like`."""

    id: str = "unknown"
    id_like: tuple[str, ...] = ()
    version_id: str = ""
    pretty_name: str = ""

    @property
    def family(self) -> str:
        """`debian`, `rhel` or `unknown`: which package manager family the remedies use."""
        ids = {self.id, *self.id_like}
        if ids & {"debian", "ubuntu"}:
            return "debian"
        if ids & {"rhel", "centos", "fedora", "rocky", "almalinux", "ol", "amzn"}:
            return "rhel"
        return "unknown"


@dataclass(frozen=True)
class HostFacts:
    """What the machine is. Every field is a plain value so it can be hashed and saved.

    The tool fields say what a child process can use: `allocators` holds (name, shared library)
    of each allocator found (jemalloc first), `allocator_dirs` where they were looked for,
    `numactl` numactl's path on PATH (None: not installed), `has_compiler` whether cc or gcc is.
    """

    cpu_model: str = "unknown"
    logical_cpus: int = 1
    usable_cores: int = 1
    cpu_flags: frozenset[str] = frozenset()
    machine: str = ""
    numa_nodes: tuple[NumaNode, ...] = ()
    memory_bytes: int | None = None
    distro: DistroInfo = field(default_factory=DistroInfo)
    torch_version: str | None = None
    cuda_version: str | None = None
    gpus: tuple[GpuInfo, ...] = ()
    has_compiler: bool = False
    allocators: tuple[tuple[str, str], ...] = ()
    allocator_dirs: tuple[str, ...] = ()
    numactl: str | None = None
    overridden: tuple[str, ...] = ()  # the facts `TORCHPACE_HOST_FACTS` (or `override_host_facts`) changed

    def allocator_library(self, name: str) -> str | None:
        """The shared library of allocator `name` (jemalloc/tcmalloc) found here, or None."""
        return dict(self.allocators).get(name)

    @property
    def cuda_available(self) -> bool:
        return bool(self.gpus)

    @property
    def native_bf16(self) -> bool:
        """True when the CPU computes bf16 natively (AVX512-BF16 / AMX on x86, bf16 on Arm)."""
        return bool(self.cpu_flags & _BF16_FLAGS)

    def fingerprint(self) -> str:
        """A short stable id of what affects speed: CPU, cores, GPUs, torch. Same host => same id."""
        parts = [
            self.cpu_model,
            str(self.logical_cpus),
            str(self.usable_cores),
            ",".join(f"{g.name}:{g.memory_bytes}" for g in self.gpus),
            self.torch_version or "",
        ]
        return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]

    def summary(self) -> dict[str, object]:
        """A JSON-able summary for reports and saved configs (`HostSummary`'s fields)."""
        return HostSummary.of(self).to_summary()


@dataclass(frozen=True)
class HostSummary:
    """What results, saved configs and studies record of the host they ran on (`HostFacts.summary`); read
    back with `from_summary` (a field an older summary lacks is None).

    Attributes:
        numa_nodes: how many NUMA nodes.
        distro: the distribution's pretty name (or id).
        gpus: the GPUs' names.
        overridden: the facts `TORCHPACE_HOST_FACTS` changed (written only when some were).
    """

    fingerprint: str | None = None
    cpu_model: str | None = None
    logical_cpus: int | None = None
    usable_cores: int | None = None
    native_bf16: bool | None = None
    numa_nodes: int | None = None
    memory_bytes: int | None = None
    distro: str | None = None
    torch_version: str | None = None
    cuda_version: str | None = None
    gpus: tuple[str, ...] = ()
    overridden: tuple[str, ...] = ()

    @classmethod
    def of(cls, host: HostFacts) -> "HostSummary":
        return cls(host.fingerprint(), host.cpu_model, host.logical_cpus, host.usable_cores, host.native_bf16,
                   len(host.numa_nodes), host.memory_bytes, host.distro.pretty_name or host.distro.id, host.torch_version,
                   host.cuda_version, tuple(g.name for g in host.gpus), tuple(host.overridden))

    def to_summary(self) -> dict[str, object]:
        summary = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "overridden"}
        summary["gpus"] = list(self.gpus)
        return {**summary, **({"overridden": list(self.overridden)} if self.overridden else {})}

    @classmethod
    def from_summary(cls, summary: Mapping[str, Any]) -> "HostSummary":
        """The record of a stored summary (a result's `host`, a study's)."""
        known = {f.name for f in fields(cls)}
        values = {name: value for name, value in summary.items() if name in known}
        return cls(**{**values, "gpus": tuple(values.get("gpus") or ()), "overridden": tuple(values.get("overridden") or ())})


# what each field of a stored host summary (`HostFacts.summary`) holds: a reader checks a summary read back from a
# study or a result with `host_summary_problem`; a field an older torchpace did not write is simply absent
_SUMMARY_FIELDS: dict[str, tuple[str, Any]] = {
    "fingerprint": ("a string", lambda v: isinstance(v, str)),
    "cpu_model": ("a string", lambda v: isinstance(v, str)),
    "logical_cpus": ("a whole number >= 1", lambda v: whole_number_in(v, 1)),
    "usable_cores": ("a whole number >= 1", lambda v: whole_number_in(v, 1)),
    "native_bf16": ("true or false", lambda v: isinstance(v, bool)),
    "numa_nodes": ("a whole number >= 0", lambda v: whole_number_in(v, 0)),
    "memory_bytes": ("a whole number >= 0 or null", lambda v: v is None or whole_number_in(v, 0)),
    "distro": ("a string", lambda v: isinstance(v, str)),
    "torch_version": ("a string or null", lambda v: v is None or isinstance(v, str)),
    "cuda_version": ("a string or null", lambda v: v is None or isinstance(v, str)),
    "gpus": ("a list of GPU names", lambda v: isinstance(v, list) and all(isinstance(g, str) for g in v)),
    "overridden": ("a list of fact names", lambda v: isinstance(v, list) and all(isinstance(g, str) for g in v)),
}


def host_summary_problem(summary: Any) -> str | None:
    """Why `summary` is not a host summary as `HostFacts.summary` writes it, naming the field, what it holds
    and what it should (pure); None when it is one. None and {} (no host recorded) are fine, and so are
    fields this torchpace does not know (a newer one wrote them)."""
    if summary is None:
        return None
    if not isinstance(summary, Mapping):
        return f"host: expected an object of the host's facts, found {_shown_value(summary)}"
    for name, (expected, ok) in _SUMMARY_FIELDS.items():
        if name in summary and not ok(summary[name]):
            return f"host.{name}: expected {expected}, found {_shown_value(summary[name])}"
    return None


def _shown_value(value: Any) -> str:
    text = json.dumps(value, default=repr)
    return text if len(text) <= 60 else text[:57] + "..."


def read_text(root: Path, rel: str) -> str | None:
    """Contents of `root/rel`, or None when it is missing or unreadable."""
    try:
        return (root / rel.lstrip("/")).read_text()
    except OSError:
        return None


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """Parse a kernel CPU list such as ``0-3,8,10-11`` into sorted CPU ids."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            cpus.extend(range(int(lo), int(hi) + 1))
        else:
            cpus.append(int(part))
    return tuple(sorted(set(cpus)))


def parse_cpuinfo(text: str) -> tuple[str, frozenset[str]]:
    """Model name and feature flags from /proc/cpuinfo text (x86 `flags`, Arm `Features`)."""
    model, flags = "unknown", frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "Model", "cpu model") and model == "unknown":
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = frozenset(value.split())
    return model, flags


def parse_os_release(text: str) -> DistroInfo:
    """DistroInfo from /etc/os-release text."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip().strip('"').strip("'")
    return DistroInfo(
        id=values.get("ID", "unknown").lower(),
        id_like=tuple(values.get("ID_LIKE", "").lower().split()),
        version_id=values.get("VERSION_ID", ""),
        pretty_name=values.get("PRETTY_NAME", ""),
    )


def parse_cgroup_cpu_quota(cpu_max: str | None, v1_quota: str | None, v1_period: str | None) -> float | None:
    """CPUs allowed by the cgroup quota (cgroup v2 `cpu.max`, or v1 cfs files); None if unlimited."""
    if cpu_max:
        quota, _, period = cpu_max.strip().partition(" ")
        if quota != "max" and period:
            return int(quota) / int(period)
        return None
    if v1_quota and v1_period and int(v1_quota) > 0:
        return int(v1_quota) / int(v1_period)
    return None


def cap_cores_by_quota(cores: int, quota: float | None) -> int:
    """`cores`, capped by a cgroup CPU quota in CPUs (rounded up; at least 1)."""
    if quota is not None:
        cores = min(cores, max(1, int(-(-quota // 1))))
    return max(1, cores)


def probe_usable_cores(root: Path, logical_cpus: int, affinity: set[int] | None) -> int:
    """Cores this process may use: CPU affinity, capped by the tightest CPU quota of its cgroup."""
    proc_cgroup = parse_proc_cgroup(read_text(root, "proc/self/cgroup") or "")
    return cap_cores_by_quota(len(affinity) if affinity else logical_cpus, probe_cgroup_cpu_quota(root, proc_cgroup))


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """Controller -> cgroup path from /proc/<pid>/cgroup text; the v2 hierarchy is under key ``""``."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(",") if parts[1] else [""]:
            paths[controller] = parts[2]
    return paths


def cgroup_dirs(root: Path, proc_cgroup: dict[str, str], controller: str) -> list[str]:
    """Directories (relative to `root`) of this process's cgroup for `controller` and its ancestors.

    Deepest first; both the v1 hierarchy mounted for `controller` and the v2 hierarchy are tried,
    and only directories that exist are returned. Inside a container, /proc/self/cgroup may name a
    host path that is not mounted; walking up to the mount's root finds the container's own limits.
    """
    bases = []
    if controller in proc_cgroup:
        bases += [(d, proc_cgroup[controller]) for d in _v1_mounts(root, controller)]
    if "" in proc_cgroup:
        v2 = "sys/fs/cgroup" if (root / "sys/fs/cgroup/cgroup.controllers").exists() else "sys/fs/cgroup/unified"
        bases.append((v2, proc_cgroup[""]))
    dirs = []
    for base, path in bases:
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), -1, -1):
            candidate = "/".join([base, *parts[:depth]])
            if (root / candidate).is_dir():
                dirs.append(candidate)
    return dirs


def _v1_mounts(root: Path, controller: str) -> list[str]:
    """cgroup v1 mount directories under /sys/fs/cgroup that carry `controller` (``cpu,cpuacct``...)."""
    try:
        names = sorted(p.name for p in (root / "sys/fs/cgroup").iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return []
    return [f"sys/fs/cgroup/{name}" for name in names if controller in name.split(",")]


def probe_cgroup_cpu_quota(root: Path, proc_cgroup: dict[str, str]) -> float | None:
    """CPUs' worth of time the tightest cgroup CPU quota on this process allows; None if unlimited."""
    quotas = []
    for directory in cgroup_dirs(root, proc_cgroup, "cpu"):
        try:
            quota = parse_cgroup_cpu_quota(
                read_text(root, f"{directory}/cpu.max"),
                read_text(root, f"{directory}/cpu.cfs_quota_us"),
                read_text(root, f"{directory}/cpu.cfs_period_us"),
            )
        except ValueError:
            continue  # a malformed file is no quota we can honour
        if quota is not None:
            quotas.append(quota)
    return min(quotas) if quotas else None


def probe_numa_nodes(root: Path) -> tuple[NumaNode, ...]:
    """NUMA nodes from /sys/devices/system/node/node*/cpulist (empty when the kernel shows none)."""
    base = root / "sys/devices/system/node"
    nodes = []
    try:
        entries = sorted(base.glob("node[0-9]*"), key=lambda p: int(p.name[4:]))
    except OSError:
        return ()
    for entry in entries:
        cpulist = read_text(root, str(entry.relative_to(root) / "cpulist"))
        if cpulist is not None:
            nodes.append(NumaNode(int(entry.name[4:]), parse_cpu_list(cpulist)))
    return tuple(nodes)


def probe_memory_bytes(root: Path) -> int | None:
    """MemTotal from /proc/meminfo in bytes."""
    text = read_text(root, "proc/meminfo") or ""
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return None


def probe_gpus(root: Path) -> tuple[str | None, tuple[GpuInfo, ...]]:
    """(CUDA version torch was built with, the visible CUDA devices). Imports torch."""
    import torch

    cuda_version = torch.version.cuda
    if not torch.cuda.is_available():
        return cuda_version, ()
    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        bus_id = _pci_bus_id(props)
        numa = read_text(root, f"sys/bus/pci/devices/{bus_id}/numa_node") if bus_id else None
        numa_node = int(numa) if numa is not None and int(numa) >= 0 else None
        gpus.append(GpuInfo(index, props.name, int(props.total_memory), bus_id, numa_node))
    return cuda_version, tuple(gpus)


def _pci_bus_id(props) -> str | None:
    """`0000:3b:00.0`-style PCI address of a CUDA device, from torch's device properties."""
    domain, bus, device = (getattr(props, f"pci_{k}_id", None) for k in ("domain", "bus", "device"))
    if bus is None:
        return None
    return f"{domain or 0:04x}:{bus:02x}:{device or 0:02x}.0"


def allocator_search_dirs(env: Mapping[str, str] | None = None, prefix: str | None = None) -> list[Path]:
    """Library directories where an allocator may live: the system's, conda's and the venv's."""
    env = os.environ if env is None else env
    dirs = [Path(d) for d in _SYSTEM_LIBRARY_DIRS]
    for root in (env.get("CONDA_PREFIX"), prefix or sys.prefix):
        if root:
            dirs.append(Path(root) / "lib")
    return dirs


def find_allocator(name: str, dirs: Iterable[Path], root: Path = Path("/")) -> Path | None:
    """The first shared library of allocator `name` (jemalloc/tcmalloc) in `dirs` (read through
    `root`), as the path the child will load; None when there is none."""
    for directory in dirs:
        for lib in ALLOCATOR_LIBRARIES.get(name, ()):
            if (root / str(directory).lstrip("/") / lib).exists():
                return Path(directory) / lib
    return None


def which(root: Path, name: str, path_env: str | None) -> str | None:
    """Like ``shutil.which`` but through `root`: the first executable `name` on `path_env`."""
    for directory in (path_env or "").split(":"):
        candidate = root / directory.lstrip("/") / name
        if directory and candidate.is_file() and os.access(candidate, os.X_OK):
            return str(Path(directory) / name)
    return None


def probe_tools(root: Path, env: Mapping[str, str]) -> dict[str, object]:
    """HostFacts' tool fields: allocator libraries, numactl and a C compiler, as a child with `env`
    would find them (its PATH, its CONDA_PREFIX)."""
    dirs = allocator_search_dirs(env)
    found = ((name, find_allocator(name, dirs, root)) for name in ALLOCATOR_LIBRARIES)
    path_env = env.get("PATH", os.defpath)
    return {
        "allocators": tuple((name, str(lib)) for name, lib in found if lib is not None),
        "allocator_dirs": tuple(str(d) for d in dirs),
        "numactl": which(root, "numactl", path_env),
        "has_compiler": any(which(root, cc, path_env) for cc in ("cc", "gcc")),
    }


def override_host_facts(facts: HostFacts, overrides: Mapping[str, Any], source: str = "host facts") -> HostFacts:
    """`facts` as another host would show them (pure).

    Args:
        facts: the probed facts.
        overrides: any of `bf16` (bool: the CPU computes bf16 natively), `usable_cores` (int, 1 to 8192),
            `numa_nodes` (int from 0 to the logical CPUs, at most 1024: the logical CPUs split evenly into
            that many nodes), `gpus` (int, 0 to 64: that many CUDA devices; 0 hides the real ones).
        source: where the overrides came from, for error messages.

    Raises:
        UsageError: an unknown fact, or a value of the wrong type or range.
    """
    def count(name: str, least: int, most: int, why: str) -> int:
        value = overrides[name]
        if not whole_number_in(value, least):
            raise UsageError(f"{source}: {name} = {value!r}; expected a whole number >= {least}")
        if value > most:
            raise UsageError(f"{source}: {name} = {value!r} is more than a host has: at most {most} ({why})")
        return value

    unknown = sorted(set(overrides) - {"bf16", "usable_cores", "numa_nodes", "gpus"})
    if unknown:
        raise UsageError(f"{source}: unknown fact(s) {unknown}; valid: bf16, usable_cores, numa_nodes, gpus")
    changes: dict[str, Any] = {}
    if "bf16" in overrides:
        if not isinstance(overrides["bf16"], bool):
            raise UsageError(f"{source}: bf16 = {overrides['bf16']!r}; expected true or false")
        flags = facts.cpu_flags - _BF16_FLAGS
        changes["cpu_flags"] = flags | {"avx512_bf16"} if overrides["bf16"] else flags
    if "usable_cores" in overrides:
        changes["usable_cores"] = count("usable_cores", 1, _MAX_CPUS, "Linux runs on at most 8192 CPUs")
        changes["logical_cpus"] = max(facts.logical_cpus, changes["usable_cores"])
    if "numa_nodes" in overrides:
        cpus = changes.get("logical_cpus", facts.logical_cpus)
        nodes = count("numa_nodes", 0, min(cpus, _MAX_NUMA_NODES), f"a faked node holds at least one of the {cpus} "
                      f"logical CPUs, and Linux has at most {_MAX_NUMA_NODES} nodes")
        changes["numa_nodes"] = tuple(NumaNode(i, tuple(range(i * cpus // nodes, (i + 1) * cpus // nodes)))
                                      for i in range(nodes))
    if "gpus" in overrides:
        gpus = count("gpus", 0, _MAX_GPUS, f"torch handles at most {_MAX_GPUS} CUDA devices in a process")
        changes["gpus"] = tuple(GpuInfo(i, "faked GPU", _FAKED_GPU_BYTES) for i in range(gpus))
    return replace(facts, **changes, overridden=tuple(sorted({*facts.overridden, *overrides})))


def host_overrides_from_env(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The facts `TORCHPACE_HOST_FACTS` overrides (empty when it is unset); UsageError when it is not a JSON object."""
    raw = (os.environ if env is None else env).get(HOST_FACTS_ENV, "").strip()
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as err:
        raise UsageError(f"{HOST_FACTS_ENV} is not JSON ({err}); e.g. '{{\"bf16\": false, \"numa_nodes\": 1}}'") from None
    if not isinstance(value, dict):
        raise UsageError(f"{HOST_FACTS_ENV} = {raw!r}: expected a JSON object of facts, e.g. '{{\"bf16\": false}}'")
    return value


def check_faked_gpus(overrides: Mapping[str, Any], real: tuple[GpuInfo, ...], torch_version: str | None,
                     cuda_version: str | None) -> None:
    """UsageError when `TORCHPACE_HOST_FACTS` claims GPUs where torch sees none (pure): a process that runs
    torch work would plan for a CUDA device, then fail to use it. Hiding GPUs (`gpus: 0`) is always allowed,
    and so is planning for GPUs without torch (`launch`, which probes without it)."""
    claimed = overrides.get("gpus")
    if not whole_number_in(claimed, 1) or real:
        return
    build = f"a CUDA {cuda_version} build with no device visible" if cuda_version else "a CPU-only build"
    raise UsageError(f"{HOST_FACTS_ENV}: gpus = {claimed!r}, but torch {torch_version} here is {build}: it cannot run "
                     "on a faked GPU; valid here: gpus = 0 (faked facts change what is planned, not what torch can use)")


def probe_host(root: str | Path = "/", with_gpus: bool = True, env: Mapping[str, str] | None = None) -> HostFacts:
    """Collect HostFacts. `root` re-roots /proc, /sys, /etc and the library and PATH directories for
    tests; `env` is the environment a child would get (default: ours), for PATH and CONDA_PREFIX.
    The facts `TORCHPACE_HOST_FACTS` names (in our environment) replace what was probed of this machine
    (`root` "/"; another root is another host's files, read as they are)."""
    root = Path(root)
    model, flags = parse_cpuinfo(read_text(root, "proc/cpuinfo") or "")
    logical = os.cpu_count() or 1
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") and str(root) == "/" else None
    torch_version = cuda_version = None
    gpus: tuple[GpuInfo, ...] = ()
    if with_gpus:
        import torch

        torch_version = torch.__version__
        cuda_version, gpus = probe_gpus(root)
    facts = HostFacts(
        cpu_model=model,
        logical_cpus=logical,
        usable_cores=probe_usable_cores(root, logical, affinity),
        cpu_flags=flags,
        machine=platform.machine(),
        numa_nodes=probe_numa_nodes(root),
        memory_bytes=probe_memory_bytes(root),
        distro=parse_os_release(read_text(root, "etc/os-release") or ""),
        torch_version=torch_version,
        cuda_version=cuda_version,
        gpus=gpus,
        **probe_tools(root, os.environ if env is None else env),
    )
    overrides = host_overrides_from_env() if str(root) == "/" else {}
    if overrides:
        if with_gpus:
            check_faked_gpus(overrides, gpus, torch_version, cuda_version)
        facts = override_host_facts(facts, overrides, HOST_FACTS_ENV)
    if _log.isEnabledFor(logging.DEBUG):
        _log.debug("host facts (root %s): %s; allocators %s, numactl %s, C compiler %s", root, facts.summary(),
                   facts.allocators, facts.numactl, facts.has_compiler)
    return facts
