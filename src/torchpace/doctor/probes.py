"""Doctor's probes: the only code in `torchpace.doctor` that touches the world.

Every probe reads through an injectable filesystem `root` (so tests feed fixture trees shaped like
``/proc``, ``/sys`` and ``/etc``) and runs programs through an injectable `Runner` (argv lists,
never a shell). Probes never raise: what could not be read is None, and a probe that could not run
at all says so in its facts' `state`/`error`, distinct from "not installed".

torch is probed in a child process (`_torch_child.py`) with a timeout; NVML is probed in this
process through nvidia-ml-py; both run while the /proc and /sys probes do.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from torchpace.allocation import read_allocation
from torchpace.doctor.facts import (
    AllocationFacts,
    AllocatorFacts,
    CpuFacts,
    CudaToolkitFacts,
    DiskFacts,
    DoctorFacts,
    EnvFacts,
    GpuFacts,
    LimitsFacts,
    MemoryFacts,
    NvmlFacts,
    ProbeState,
    PythonEnvFacts,
    RLimit,
    SmokeFacts,
    TorchFacts,
)
from torchpace.host import (
    DistroInfo,
    cap_cores_by_quota,
    cgroup_dirs,
    parse_proc_cgroup,
    probe_cgroup_cpu_quota,
    parse_cpu_list,
    parse_cpuinfo,
    parse_os_release,
    probe_numa_nodes,
    read_text,
    which,
)
from torchpace.errors import UsageError
from torchpace.process import kill_tree, start_child

_TORCH_TIMEOUT_S = 60.0  # import torch plus a tiny DataLoader take ~3 s here; 60 s only catches a hang
_KILL_GRACE_S = 2.0  # after killing a timed-out child's group, how long to wait for its last output
_SMOKE_WORKERS = 2  # more than one worker exercises start-up and ordering; still fine on one core
_CGROUP_UNLIMITED_BYTES = 1 << 60  # cgroup v1 writes "no limit" as ~2**63 rounded to a page
_STDERR_TAIL_CHARS = 800  # enough of a child's stderr to show the exception, not the whole log


# ---------------------------------------------------------------------------------------- runner


@dataclass(frozen=True)
class CommandResult:
    """How one command went.

    Attributes:
        argv: the command.
        returncode: its exit status; None when it did not finish (timed out or never started).
        stdout: what it printed (what it printed before being killed, on timeout).
        stderr: its error output.
        timed_out: it ran past its time limit and its process group was killed.
        not_found: the program is not installed (distinct from "could not run").
        error: why it could not be started, when it could not.
    """

    argv: tuple[str, ...]
    returncode: int | None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    not_found: bool = False
    error: str | None = None


Runner = Callable[[Sequence[str], float, "Mapping[str, str] | None"], CommandResult]


def run_command(argv: Sequence[str], timeout_s: float, env: Mapping[str, str] | None = None) -> CommandResult:
    """Run `argv` (no shell) in its own process group; kill its whole tree after `timeout_s` seconds.

    The tree kill matters: a hung DataLoader leaves worker processes that hold the output pipes.
    """
    argv = tuple(argv)
    try:
        proc = start_child(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=dict(env) if env is not None else None,
        )
    except FileNotFoundError as err:
        return CommandResult(argv, None, not_found=True, error=str(err))
    except OSError as err:
        return CommandResult(argv, None, error=f"{type(err).__name__}: {err}")
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stdout, stderr = _kill_and_drain(proc)
        return CommandResult(argv, None, stdout, stderr, timed_out=True)
    return CommandResult(argv, proc.returncode, stdout, stderr)


def _kill_and_drain(proc: subprocess.Popen) -> tuple[str, str]:
    """SIGKILL `proc`'s process tree and collect what it had printed."""
    kill_tree(proc.pid)
    try:
        return proc.communicate(timeout=_KILL_GRACE_S)
    except subprocess.TimeoutExpired as err:
        proc.kill()
        return _decode(err.stdout), _decode(err.stderr)


def _decode(data: bytes | str | None) -> str:
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data or ""


# --------------------------------------------------------------------------- environment, python


def probe_env(environ: Mapping[str, str]) -> EnvFacts:
    """The environment variables the checks look at, from `environ` (never os.environ directly)."""
    return EnvFacts(
        cuda_launch_blocking=environ.get("CUDA_LAUNCH_BLOCKING"),
        pytorch_cuda_alloc_conf=environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        pytorch_alloc_conf=environ.get("PYTORCH_ALLOC_CONF"),
        omp_num_threads=environ.get("OMP_NUM_THREADS"),
        mkl_num_threads=environ.get("MKL_NUM_THREADS"),
        cuda_home=environ.get("CUDA_HOME") or environ.get("CUDA_PATH"),
        ld_library_path=environ.get("LD_LIBRARY_PATH"),
        ld_preload=environ.get("LD_PRELOAD"),
    )


def probe_python_env(environ: Mapping[str, str]) -> PythonEnvFacts:
    """This interpreter: version, prefixes, and the conda env it runs in, if any."""
    conda_prefix = environ.get("CONDA_PREFIX")
    if conda_prefix is None and Path(sys.prefix, "conda-meta").is_dir():
        conda_prefix = sys.prefix
    return PythonEnvFacts(
        version=".".join(map(str, sys.version_info[:3])),
        executable=sys.executable,
        prefix=sys.prefix,
        base_prefix=sys.base_prefix,
        conda_prefix=conda_prefix,
    )


def parse_cuda_version_file(text: str) -> str | None:
    """``major.minor`` from a CUDA toolkit's ``version.json`` or ``version.txt`` text."""
    try:
        version = json.loads(text)["cuda"]["version"]
    except (ValueError, KeyError, TypeError):
        match = re.search(r"CUDA Version (\d+\.\d+)", text)
        return match.group(1) if match else None
    return ".".join(str(version).split(".")[:2])


def parse_soname_version(filename: str, stem: str) -> str | None:
    """Version in a library file name: ``libcudart.so.12.4.127`` -> ``12.4``; ``.so.12`` -> ``12``.

    A two-part suffix is the soname and says only the major version (CUDA 11's soname is
    ``libcudart.so.11.0`` for every 11.x), so only the major of it is returned.
    """
    match = re.fullmatch(re.escape(stem) + r"\.so\.([\d.]+)", filename)
    if not match:
        return None
    parts = match.group(1).split(".")
    return ".".join(parts[:2]) if len(parts) >= 3 else parts[0]


def probe_cuda_toolkit(root: Path, env: EnvFacts) -> CudaToolkitFacts:
    """CUDA versions under ``CUDA_HOME`` and in ``LD_LIBRARY_PATH`` directories."""
    exists = (root / env.cuda_home.lstrip("/")).is_dir() if env.cuda_home else None
    return CudaToolkitFacts(
        cuda_home_exists=exists,
        cuda_home_version=_cuda_home_version(root, env.cuda_home) if exists else None,
        ld_library_cudart=_ld_library_cudart(root, env.ld_library_path),
    )


def _cuda_home_version(root: Path, cuda_home: str) -> str | None:
    """The toolkit's version from its version file, else from a ``cuda-X.Y`` directory name."""
    for name in ("version.json", "version.txt"):
        text = read_text(root, f"{cuda_home}/{name}")
        version = parse_cuda_version_file(text) if text else None
        if version:
            return version
    match = re.search(r"cuda-(\d+\.\d+)", cuda_home)
    return match.group(1) if match else None


def _ld_library_cudart(root: Path, ld_library_path: str | None) -> tuple[tuple[str, str], ...]:
    """(directory, version) of each ``LD_LIBRARY_PATH`` directory holding a ``libcudart.so.*``."""
    found = []
    for directory in (ld_library_path or "").split(":"):
        versions = [parse_soname_version(p.name, "libcudart") for p in _glob(root, directory, "libcudart.so.*")]
        versions = sorted((v for v in versions if v), key=len)
        if directory and versions:
            found.append((directory, versions[-1]))
    return tuple(found)


def _glob(root: Path, directory: str, pattern: str) -> list[Path]:
    """`pattern` matches in `root/directory`; empty when the directory is missing or unreadable."""
    if not directory:
        return []
    try:
        return sorted((root / directory.lstrip("/")).glob(pattern))
    except OSError:
        return []


# ------------------------------------------------------------------------------------ torch child


def probe_torch(
    runner: Runner, python: str, environ: Mapping[str, str], timeout_s: float = _TORCH_TIMEOUT_S
) -> tuple[TorchFacts, SmokeFacts]:
    """Import torch and run the DataLoader smoke test in a child process of `python`.

    Args:
        runner: runs the child (argv, timeout in seconds, env).
        python: the interpreter to probe, normally `sys.executable`.
        environ: the child's environment (the user's, unchanged: their OMP/CUDA variables apply).
        timeout_s: seconds before the child's whole process group is killed.
    """
    script = (Path(__file__).with_name("_torch_child.py")).read_text()
    result = runner([python, "-c", script, str(_SMOKE_WORKERS)], timeout_s, dict(environ))
    return parse_torch_child_output(result, timeout_s)


def parse_torch_child_output(result: CommandResult, timeout_s: float) -> tuple[TorchFacts, SmokeFacts]:
    """TorchFacts and SmokeFacts from the child's JSON lines, or from how it failed."""
    records = {}
    for line in result.stdout.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a library printed a line of its own on stdout
        if isinstance(record, dict) and "kind" in record:
            records[record.pop("kind")] = record
    failure = _child_failure(result, timeout_s)
    torch = _torch_facts(records.get("torch"), failure)
    if torch.state is ProbeState.MISSING:
        return torch, SmokeFacts(state=ProbeState.MISSING, error="torch is not installed", timeout_s=timeout_s)
    return torch, _smoke_facts(records.get("smoke"), failure or torch.error, timeout_s)


def _child_failure(result: CommandResult, timeout_s: float) -> str | None:
    """Why the child did not finish cleanly, or None when it did."""
    tail = result.stderr.strip()[-_STDERR_TAIL_CHARS:]
    if result.timed_out:
        return f"timed out after {timeout_s:g} s and was killed" + (f"; stderr: {tail}" if tail else "")
    if result.returncode is None:
        return f"could not start {result.argv[0]}: {result.error}"
    if result.returncode != 0:
        how = f"signal {-result.returncode}" if result.returncode < 0 else f"exit status {result.returncode}"
        return f"crashed ({how})" + (f"; stderr: {tail}" if tail else "")
    return None


def _torch_facts(record: dict | None, failure: str | None) -> TorchFacts:
    if record is None:
        return TorchFacts(state=ProbeState.FAILED, error=f"the torch probe {failure or 'printed nothing'}")
    if "missing" in record:
        state = ProbeState.MISSING if record["missing"] else ProbeState.FAILED
        return TorchFacts(state=state, error=record.get("error"))
    errors = record.get("errors") or []
    return TorchFacts(
        state=ProbeState.OK,
        error="; ".join(errors) or None,
        version=record.get("version"),
        cuda_build=record.get("cuda_build"),
        cudnn_build=record.get("cudnn_build"),
        cuda_available=bool(record.get("cuda_available")),
        device_count=int(record.get("device_count") or 0),
        cuda_runtime=record.get("cuda_runtime"),
        cudnn_loaded=record.get("cudnn_loaded"),
        nccl_loaded=record.get("nccl_loaded"),
        mkl=record.get("mkl"),
        mkldnn=record.get("mkldnn"),
        openmp=record.get("openmp"),
        parallel_backend=record.get("parallel_backend"),
        intra_op_threads=record.get("intra_op_threads"),
        loaded_libraries=tuple(record.get("loaded_libraries") or ()),
        import_s=record.get("import_s"),
    )


def _smoke_facts(record: dict | None, failure: str | None, timeout_s: float) -> SmokeFacts:
    if record is None:
        return SmokeFacts(state=ProbeState.FAILED, error=f"the smoke test {failure or 'printed nothing'}", timeout_s=timeout_s)
    return SmokeFacts(
        state=ProbeState.OK,
        error=record.get("error"),
        num_workers=int(record.get("num_workers") or 0),
        pin_memory=bool(record.get("pin_memory")),
        batches=int(record.get("batches") or 0),
        expected_batches=int(record.get("expected_batches") or 0),
        pinned=record.get("pinned"),
        elapsed_s=record.get("elapsed_s"),
        timeout_s=timeout_s,
    )


# ------------------------------------------------------------------------------------------- NVML

# Clock-event ("throttle") reason bits, from nvml.h (nvmlClocksEventReason*).
_THROTTLE_REASON_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def parse_throttle_reasons(mask: int) -> tuple[str, ...]:
    """Names of the reasons set in an NVML clock-event bitmask."""
    return tuple(name for bit, name in _THROTTLE_REASON_BITS.items() if mask & bit)


def probe_nvml(root: Path, path_env: str | None, nvml=None) -> NvmlFacts:
    """Driver and per-GPU facts from NVML. "NVML library not found" is MISSING, not a failure.

    Args:
        root: filesystem root, for finding ``nvidia-smi`` on `path_env`.
        path_env: the PATH to search.
        nvml: the ``pynvml`` module (tests pass a stand-in); imported when None.
    """
    smi = which(root, "nvidia-smi", path_env)
    try:
        nvml = nvml or importlib.import_module("pynvml")
    except ImportError as err:
        return NvmlFacts(ProbeState.MISSING, f"nvidia-ml-py is not installed ({err})", nvidia_smi_path=smi)
    try:
        nvml.nvmlInit()
    except nvml.NVMLError_LibraryNotFound:
        return NvmlFacts(ProbeState.MISSING, "NVML library not found (no NVIDIA driver)", nvidia_smi_path=smi)
    except nvml.NVMLError as err:
        return NvmlFacts(ProbeState.FAILED, f"NVML did not initialise: {err}", nvidia_smi_path=smi)
    try:
        return _probe_nvml_devices(nvml, smi)
    finally:
        _nvml_shutdown(nvml)


def _nvml_shutdown(nvml) -> None:
    try:
        nvml.nvmlShutdown()
    except nvml.NVMLError:
        pass  # shutting down a session that already broke: the facts are collected either way


def _probe_nvml_devices(nvml, smi: str | None) -> NvmlFacts:
    errors: list[str] = []
    driver = _nvml_value(nvml, errors, "driver_version", nvml.nvmlSystemGetDriverVersion)
    cuda = _nvml_value(nvml, errors, "cuda_driver_version", nvml.nvmlSystemGetCudaDriverVersion)
    try:
        count = nvml.nvmlDeviceGetCount()
    except nvml.NVMLError as err:
        return NvmlFacts(ProbeState.FAILED, f"NVML could not count GPUs: {err}", nvidia_smi_path=smi)
    return NvmlFacts(
        state=ProbeState.OK,
        error="; ".join(errors) or None,
        driver_version=_text(driver),
        cuda_driver_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None,
        gpus=tuple(_probe_gpu(nvml, index) for index in range(count)),
        nvidia_smi_path=smi,
    )


def _nvml_value(nvml, errors: list[str], name: str, fn, *args):
    """`fn(*args)`, or None: silently when the board does not support it, noted in `errors` otherwise."""
    try:
        return fn(*args)
    except nvml.NVMLError_NotSupported:
        return None
    except nvml.NVMLError as err:
        errors.append(f"{name}: {err}")
        return None


def _text(value) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _probe_gpu(nvml, index: int) -> GpuFacts:
    """One GPU's facts; every field is read on its own so one unsupported query loses only itself."""
    errors: list[str] = []
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except nvml.NVMLError as err:
        return GpuFacts(index=index, name="unknown", errors=(f"handle: {err}",))

    def get(name, fn, *args):
        return _nvml_value(nvml, errors, name, fn, handle, *args)

    memory = get("memory", nvml.nvmlDeviceGetMemoryInfo)
    ecc = get("ecc_mode", nvml.nvmlDeviceGetEccMode)
    return GpuFacts(
        index=index,
        name=_text(get("name", nvml.nvmlDeviceGetName)) or "unknown",
        memory_total_bytes=int(memory.total) if memory is not None else None,
        memory_used_bytes=int(memory.used) if memory is not None else None,
        temperature_c=get("temperature", nvml.nvmlDeviceGetTemperature, nvml.NVML_TEMPERATURE_GPU),
        slowdown_temperature_c=get(
            "slowdown_temperature", nvml.nvmlDeviceGetTemperatureThreshold, nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
        ),
        ecc_enabled=bool(ecc[0] == nvml.NVML_FEATURE_ENABLED) if ecc is not None else None,
        ecc_uncorrected_volatile=get(
            "ecc_errors", nvml.nvmlDeviceGetTotalEccErrors, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
        ) if ecc is not None and ecc[0] == nvml.NVML_FEATURE_ENABLED else None,
        throttle_reasons=parse_throttle_reasons(get("throttle_reasons", _clock_reasons_fn(nvml)) or 0),
        persistence_mode=_flag(nvml, get("persistence_mode", nvml.nvmlDeviceGetPersistenceMode)),
        pcie_gen_current=get("pcie_gen", nvml.nvmlDeviceGetCurrPcieLinkGeneration),
        pcie_gen_max=get("pcie_gen_max", nvml.nvmlDeviceGetMaxPcieLinkGeneration),
        pcie_width_current=get("pcie_width", nvml.nvmlDeviceGetCurrPcieLinkWidth),
        pcie_width_max=get("pcie_width_max", nvml.nvmlDeviceGetMaxPcieLinkWidth),
        errors=tuple(errors),
    )


def _clock_reasons_fn(nvml):
    """The clock-event reasons query: the new name where nvidia-ml-py has it, the old one otherwise."""
    return getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or nvml.nvmlDeviceGetCurrentClocksThrottleReasons


def _flag(nvml, value) -> bool | None:
    return None if value is None else value == nvml.NVML_FEATURE_ENABLED


# ------------------------------------------------------------------------------------ CPU, cgroup


def parse_proc_status_cpus(text: str) -> int | None:
    """Number of CPUs in ``Cpus_allowed_list`` of /proc/<pid>/status text."""
    for line in text.splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return len(parse_cpu_list(line.split(":", 1)[1]))
    return None


def probe_cgroup_memory(root: Path, proc_cgroup: dict[str, str]) -> tuple[int | None, int | None]:
    """(tightest cgroup memory limit, current usage of this process's own cgroup) in bytes."""
    limits, usage = [], None
    for directory in cgroup_dirs(root, proc_cgroup, "memory"):
        for name in ("memory.max", "memory.limit_in_bytes"):
            value = (read_text(root, f"{directory}/{name}") or "").strip()
            if value.isdigit() and int(value) < _CGROUP_UNLIMITED_BYTES:
                limits.append(int(value))
        for name in ("memory.current", "memory.usage_in_bytes"):
            value = (read_text(root, f"{directory}/{name}") or "").strip()
            if usage is None and value.isdigit():
                usage = int(value)
    return (min(limits) if limits else None), usage


def probe_cpu(root: Path, path_env: str | None) -> CpuFacts:
    """CPU model and flags, cores usable by this process, NUMA layout, frequency governors."""
    model, flags = parse_cpuinfo(read_text(root, "proc/cpuinfo") or "")
    online = read_text(root, "sys/devices/system/cpu/online")
    if str(root) == "/" or not online:
        logical = os.cpu_count() or 1
    else:
        logical = len(parse_cpu_list(online))
    affinity = parse_proc_status_cpus(read_text(root, "proc/self/status") or "")
    quota = probe_cgroup_cpu_quota(root, parse_proc_cgroup(read_text(root, "proc/self/cgroup") or ""))
    usable = cap_cores_by_quota(affinity or logical, quota)
    governors = Counter(
        (read_text(root, str(p.relative_to(root))) or "").strip()
        for p in _glob(root, "sys/devices/system/cpu", "cpu[0-9]*/cpufreq/scaling_governor")
    )
    return CpuFacts(
        cpu_model=model,
        flags=flags,
        logical_cpus=logical,
        affinity_cpus=affinity,
        cgroup_cpu_quota=quota,
        usable_cores=usable,
        numa_nodes=probe_numa_nodes(root),
        governors=tuple(sorted((g, n) for g, n in governors.items() if g)),
        scaling_driver=(read_text(root, "sys/devices/system/cpu/cpu0/cpufreq/scaling_driver") or "").strip() or None,
        numactl_path=which(root, "numactl", path_env),
    )


# ----------------------------------------------------------------------------------------- memory


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo fields in bytes (the file says kB; it means KiB)."""
    values = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            values[key.strip()] = int(fields[0]) * (1024 if fields[1:] == ["kB"] else 1)
    return values


def parse_selected_mode(text: str | None) -> str | None:
    """The bracketed choice in a sysfs mode file: ``always [madvise] never`` -> ``madvise``."""
    match = re.search(r"\[([^\]]+)\]", text or "")
    return match.group(1) if match else None


def probe_memory(root: Path) -> MemoryFacts:
    """RAM and swap (/proc/meminfo), transparent huge pages, the cgroup memory limit."""
    meminfo = parse_meminfo(read_text(root, "proc/meminfo") or "")
    limit, usage = probe_cgroup_memory(root, parse_proc_cgroup(read_text(root, "proc/self/cgroup") or ""))
    return MemoryFacts(
        mem_total_bytes=meminfo.get("MemTotal"),
        mem_available_bytes=meminfo.get("MemAvailable"),
        swap_total_bytes=meminfo.get("SwapTotal"),
        swap_free_bytes=meminfo.get("SwapFree"),
        thp_enabled=parse_selected_mode(read_text(root, "sys/kernel/mm/transparent_hugepage/enabled")),
        thp_defrag=parse_selected_mode(read_text(root, "sys/kernel/mm/transparent_hugepage/defrag")),
        cgroup_memory_limit_bytes=limit,
        cgroup_memory_usage_bytes=usage,
    )


# ---------------------------------------------------------------------------------------- limits


def parse_proc_limits(text: str) -> dict[str, RLimit]:
    """Rows of /proc/<pid>/limits by name (``Max open files``...); ``unlimited`` is None."""
    limits = {}
    for line in text.splitlines():
        match = re.match(r"(Max [A-Za-z ]+?)\s{2,}(\S+)\s+(\S+)", line)
        if match:
            soft, hard = (None if v == "unlimited" else int(v) for v in match.group(2, 3))
            limits[match.group(1)] = RLimit(soft, hard)
    return limits


def probe_limits(root: Path) -> LimitsFacts:
    """``ulimit -n`` and ``-u`` (from /proc/self/limits) and the size of /dev/shm."""
    total = free = shm_error = None
    try:
        stat = os.statvfs(root / "dev/shm")
        total, free = stat.f_blocks * stat.f_frsize, stat.f_bavail * stat.f_frsize
    except OSError as err:
        shm_error = f"{type(err).__name__}: {err}"
    text = read_text(root, "proc/self/limits")
    if text is None:
        return LimitsFacts(ProbeState.FAILED, "could not read /proc/self/limits",
                           shm_total_bytes=total, shm_free_bytes=free, shm_error=shm_error)
    limits = parse_proc_limits(text)
    return LimitsFacts(
        nofile=limits.get("Max open files"),
        nproc=limits.get("Max processes"),
        shm_total_bytes=total,
        shm_free_bytes=free,
        shm_error=shm_error,
    )


# ---------------------------------------------------------------------------------------- storage


@dataclass(frozen=True)
class MountEntry:
    """One line of /proc/<pid>/mountinfo."""

    device: str  # "major:minor"
    mount_point: str
    fstype: str
    source: str


def parse_mountinfo(text: str) -> list[MountEntry]:
    """Mount entries from /proc/<pid>/mountinfo text (octal escapes in paths decoded)."""
    entries = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if sep and len(fields) >= 5 and len(tail) >= 2:
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            entries.append(MountEntry(fields[2], point, tail[0], tail[1]))
    return entries


def find_mount(entries: list[MountEntry], path: str, device: str | None) -> MountEntry | None:
    """The mount holding `path`: the longest mount point above it, preferring the one on `device`.

    Of several mounts on one point the last listed is the one on top, the one `path` reaches.
    """
    def above(entry: MountEntry) -> bool:
        point = entry.mount_point.rstrip("/")
        return path == point or path.startswith(point + "/") or point == ""

    candidates = [e for e in entries if above(e)]
    on_device = [e for e in candidates if e.device == device]
    best = on_device or candidates
    return max(reversed(best), key=lambda e: len(e.mount_point)) if best else None


def probe_block_device(root: Path, device: str) -> tuple[str | None, bool | None]:
    """(disk name, rotational) for a ``major:minor`` block device, via /sys/dev/block.

    A partition's ``queue/rotational`` lives on its parent disk, one directory up.
    """
    link = root / "sys/dev/block" / device
    try:
        resolved = link.resolve(strict=True)
    except OSError:
        return None, None
    disk = resolved.parent if (resolved / "partition").exists() else resolved
    flag = read_text(root, str(disk.relative_to(root.resolve()) / "queue/rotational"))
    return disk.name, (flag.strip() == "1") if flag is not None else None


def probe_disk(root: Path, data_dir: str) -> DiskFacts:
    """Filesystem, device type and free space of the storage behind `data_dir`."""
    path = os.path.realpath(data_dir)
    try:
        stat, vfs = os.stat(path), os.statvfs(path)
    except OSError as err:
        return DiskFacts(path=data_dir, state=ProbeState.FAILED, error=f"{type(err).__name__}: {err}")
    device = f"{os.major(stat.st_dev)}:{os.minor(stat.st_dev)}"
    mount = find_mount(parse_mountinfo(read_text(root, "proc/self/mountinfo") or ""), path, device)
    name, rotational = probe_block_device(root, mount.device if mount else device)
    return DiskFacts(
        path=data_dir,
        error=None if mount else "not found in /proc/self/mountinfo",
        mount_point=mount.mount_point if mount else None,
        fstype=mount.fstype if mount else None,
        source=mount.source if mount else None,
        device=name,
        rotational=rotational,
        free_bytes=vfs.f_bavail * vfs.f_frsize,
        total_bytes=vfs.f_blocks * vfs.f_frsize,
    )


# -------------------------------------------------------------------------------------- allocator

_LIBRARY_DIRS = ("usr/lib/*-linux-gnu", "lib/*-linux-gnu", "usr/lib64", "usr/lib", "usr/local/lib", "usr/local/lib64")


def probe_allocator(root: Path, env: EnvFacts, python: PythonEnvFacts) -> AllocatorFacts:
    """jemalloc / tcmalloc libraries in the system and environment library dirs, and what is preloaded."""
    dirs = [str(p.relative_to(root)) for pattern in _LIBRARY_DIRS for p in _glob(root, ".", pattern) if p.is_dir()]
    dirs += [f"{prefix}/lib" for prefix in {python.prefix, python.conda_prefix} if prefix]
    jemalloc = [str(Path("/", d, p.name)) for d in dirs for p in _glob(root, d, "libjemalloc.so*")]
    tcmalloc = [str(Path("/", d, p.name)) for d in dirs for p in _glob(root, d, "libtcmalloc*.so*")]
    preload = re.split(r"[\s:]+", env.ld_preload or "")
    preload += [line.strip() for line in (read_text(root, "etc/ld.so.preload") or "").splitlines()]
    return AllocatorFacts(
        jemalloc_paths=tuple(dict.fromkeys(jemalloc)),
        tcmalloc_paths=tuple(dict.fromkeys(tcmalloc)),
        ld_preload=tuple(p for p in preload if p and not p.startswith("#")),
    )


# ------------------------------------------------------------------------------------------- all


def collect_facts(
    root: str | Path = "/",
    runner: Runner = run_command,
    environ: Mapping[str, str] | None = None,
    data_dir: str | None = None,
    nvml=None,
    torch_timeout_s: float = _TORCH_TIMEOUT_S,
) -> DoctorFacts:
    """Run every probe and return the facts. Never raises.

    The torch child process and NVML run on threads while the /proc and /sys probes run here,
    so doctor takes about as long as one ``import torch``.

    Args:
        root: re-roots /proc, /sys and /etc (tests pass fixture trees).
        runner: runs the torch child process.
        environ: the environment to examine and to give the child; a copy of os.environ when None.
        data_dir: the directory training data is read from, for the storage check.
        nvml: a ``pynvml`` stand-in for tests.
        torch_timeout_s: seconds before the torch child is killed.
    """
    root = Path(root)
    environ = dict(os.environ) if environ is None else dict(environ)
    errors: list[tuple[str, str]] = []
    env = _guarded(errors, "env", EnvFacts, probe_env, environ)
    python = _guarded(errors, "python", PythonEnvFacts, probe_python_env, environ)
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="torchpace-doctor") as pool:
        torch_future = pool.submit(
            _guarded, errors, "torch", lambda: (TorchFacts(ProbeState.FAILED), SmokeFacts(ProbeState.FAILED)),
            probe_torch, runner, python.executable or sys.executable, environ, torch_timeout_s,
        )
        nvml_future = pool.submit(_guarded, errors, "nvml", NvmlFacts, probe_nvml, root, environ.get("PATH"), nvml)
        facts = dict(
            distro=_guarded(errors, "distro", DistroInfo, _probe_distro, root),
            euid=os.geteuid() if hasattr(os, "geteuid") else None,
            python=python,
            env=env,
            cuda_toolkit=_guarded(errors, "cuda_toolkit", CudaToolkitFacts, probe_cuda_toolkit, root, env),
            cpu=_guarded(errors, "cpu", CpuFacts, probe_cpu, root, environ.get("PATH")),
            memory=_guarded(errors, "memory", MemoryFacts, probe_memory, root),
            limits=_guarded(errors, "limits", lambda: LimitsFacts(ProbeState.FAILED), probe_limits, root),
            disk=None if data_dir is None else _guarded(
                errors, "disk", lambda: DiskFacts(data_dir, ProbeState.FAILED), probe_disk, root, data_dir
            ),
            allocator=_guarded(errors, "allocator", AllocatorFacts, probe_allocator, root, env, python),
            allocation=_guarded(errors, "allocation", AllocationFacts, probe_allocation, environ),
        )
        torch, smoke = torch_future.result()
        nvml_facts = nvml_future.result()
    return DoctorFacts(torch=torch, smoke=smoke, nvml=nvml_facts, probe_errors=tuple(errors), **facts)


def probe_allocation(environ: Mapping[str, str]) -> AllocationFacts:
    """The scheduler allocation `environ` describes (SLURM, torchelastic, Kubeflow, LSF), or why it cannot be read."""
    try:
        return AllocationFacts(read_allocation(environ))
    except UsageError as err:
        return AllocationFacts(None, str(err))


def _probe_distro(root: Path) -> DistroInfo:
    return parse_os_release(read_text(root, "etc/os-release") or "")


def _guarded(errors: list[tuple[str, str]], name: str, default: Callable[[], object], probe, *args):
    """`probe(*args)`; if it raises, note it in `errors` and return `default()`, so doctor carries on.

    Probes are written not to raise; this is the backstop for input nobody foresaw (a sysfs file
    in a format no fixture had), turning it into a finding instead of a traceback.
    """
    try:
        return probe(*args)
    except Exception as err:  # noqa: BLE001 - recorded and reported as a finding, never swallowed
        errors.append((name, f"{type(err).__name__}: {err}"))
        return default()
