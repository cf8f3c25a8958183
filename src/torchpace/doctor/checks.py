"""Doctor's checks: pure functions ``DoctorFacts -> list[Finding]``.

Each check looks at one thing, holds the measured value against a named threshold and says what it
saw (`evidence`, plus machine-readable `data` with units in the key names) and what to do about it
(`remedy`, with the exact command for this distribution where there is one). A check that does
not apply to this host returns no finding, except that every area says something, so the report
shows it was looked at. `ALL_CHECKS` lists them in display order; `run_checks` runs them all.
"""

from __future__ import annotations

from collections.abc import Callable

from torchpace.allocation import SLURM
from torchpace.doctor import remedies
from torchpace.doctor.facts import DoctorFacts, GpuFacts, ProbeState, RLimit
from torchpace.findings import Finding, Remedy, Severity
from torchpace.measure.render import format_bytes as _format_bytes

OK, INFO, WARN, FAIL = Severity.OK, Severity.INFO, Severity.WARN, Severity.FAIL

# --- thresholds, each with its reason -----------------------------------------------------------
_GPU_TEMP_MARGIN_C = 5  # within 5 °C of the slowdown threshold, the next heavy minute throttles
_GPU_TEMP_WARN_C = 85  # used when NVML gives no slowdown threshold; most boards slow down at 85-90 °C
_GPU_MEMORY_BUSY_FRAC = 0.10  # >10% of a GPU's memory held before training means another process
_NOFILE_FLOOR = 1024  # below this even one DataLoader worker sharing tensors by fd hits EMFILE
_NOFILE_BASE = 1024  # fds a training process holds before loaders: libraries, sockets, files
_FDS_PER_BATCH = 256  # one fd per shared tensor storage in flight (file_descriptor strategy), per batch
_PREFETCH_FACTOR = 2  # DataLoader's default prefetch_factor: batches in flight per worker
_NPROC_BASE = 512  # the user's other processes and threads (shell, editor, other jobs)
_THREADS_PER_WORKER = 8  # a worker process plus its feeder/pin-memory/OpenMP threads
_TYPICAL_BATCH_BYTES = 64 * 3 * 224 * 224 * 4  # an ImageNet-style fp32 batch of 64 (38.5 MB)
_DISK_FREE_MIN_BYTES = 10 * 2**30  # under 10 GiB free, checkpoints and caches start failing
_DISK_FREE_MIN_FRAC = 0.05  # ext4/xfs slow down and reserve blocks when under ~5% free
_SWAP_USED_WARN_BYTES = 2**30  # more than 1 GiB swapped out is no longer incidental
_CGROUP_MEMORY_BUSY_FRAC = 0.90  # over 90% of the cgroup limit used: the next allocation may OOM-kill

_NETWORK_FILESYSTEMS = {"nfs", "nfs4", "cifs", "smb3", "ceph", "glusterfs", "lustre", "gpfs", "beegfs", "9p"}
_VIRTUAL_DISK_PREFIXES = ("vd", "xvd")  # virtio/Xen disks: the rotational flag is the hypervisor's guess
_BENIGN_THROTTLE = {"gpu_idle", "applications_clocks_setting", "sync_boost", "display_clock_setting"}
_HW_THROTTLE = {"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
_ALLOC_CONF_KEYS = {
    "backend", "max_split_size_mb", "roundup_power2_divisions", "max_non_split_rounding_mb",
    "garbage_collection_threshold", "expandable_segments", "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register", "pinned_num_register_threads", "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb", "per_process_memory_fraction", "graph_capture_record_stream_reuse",
}
_KIND_LABELS = {"nvme": "NVMe", "ssd": "an SSD", "memory": "tmpfs (RAM)"}
_HWP_DRIVERS = {"intel_pstate", "amd-pstate", "amd-pstate-epp"}  # "powersave" here is still dynamic


def _finding(area: str, id: str, severity: Severity, title: str, evidence: str = "",
             remedy: Remedy | None = None, **data) -> Finding:
    return Finding(id=id, severity=severity, title=title, evidence=evidence, remedy=remedy, area=area, data=data)


def format_bytes(n: int | None) -> str:
    """``25276502016`` -> ``23.5 GiB``; ``unknown`` for None."""
    return _format_bytes(n, missing="unknown")


def _install(facts: DoctorFacts, key: str, text: str) -> Remedy:
    """A remedy that installs package `key` with this distribution's command."""
    command = remedies.install_command(facts.distro, key, facts.euid == 0)
    if command is None:
        text = f"{text} (packages: {remedies.install_hint(key)})"
    return Remedy(text, command)


def _admin(facts: DoctorFacts, text: str, command: str) -> Remedy:
    return Remedy(text, remedies.as_admin(command, facts.euid == 0))


def _major_minor(version: str | None) -> tuple[int, ...]:
    """``"12.4.1"`` -> ``(12, 4)``; ``()`` when unparseable."""
    try:
        return tuple(int(p) for p in (version or "").split(".")[:2])
    except ValueError:
        return ()


def _library(facts: DoctorFacts, stem: str) -> str | None:
    """Path of the loaded library whose file name starts with `stem` (e.g. ``libcudnn.so``)."""
    return next((p for p in facts.torch.loaded_libraries if p.rsplit("/", 1)[-1].startswith(stem)), None)


# ================================================================================== PyTorch build


def check_torch_install(facts: DoctorFacts) -> list[Finding]:
    """torch importable in this interpreter, and which build."""
    t = facts.torch
    if t.state is ProbeState.MISSING:
        return [_finding("torch", "torch.install", FAIL, "torch is not installed in this Python",
                         f"{facts.python.executable}: {t.error}",
                         Remedy("Install PyTorch into this environment.", f"{facts.python.executable} -m pip install torch"))]
    if t.state is ProbeState.FAILED:
        return [_finding("torch", "torch.install", FAIL, "Could not import torch (the probe could not run)",
                         t.error or "", Remedy("Run `python -c 'import torch'` to see the full error."))]
    build = f"CUDA {t.cuda_build}" if t.cuda_build else "CPU-only"
    findings = [_finding("torch", "torch.install", OK, f"torch {t.version} ({build} build)",
                         f"import torch took {t.import_s or 0:.1f} s", version=t.version,
                         cuda_build=t.cuda_build, import_s=t.import_s)]
    if t.error:
        findings.append(_finding("torch", "torch.probe", WARN, "Some torch facts could not be read", t.error))
    return findings


def check_cuda_driver(facts: DoctorFacts) -> list[Finding]:
    """torch's CUDA build against the driver's CUDA: the driver must support the build's major version."""
    t, nvml = facts.torch, facts.nvml
    if t.state is not ProbeState.OK:
        return []
    if not t.cuda_build:
        if nvml.gpus:
            return [_finding("torch", "torch.cuda_driver", FAIL, "CPU-only torch on a host with NVIDIA GPUs",
                             f"torch {t.version} has no CUDA; {len(nvml.gpus)} GPU(s), driver CUDA {nvml.cuda_driver_version}",
                             Remedy(f"Install a CUDA build of torch for CUDA <= {nvml.cuda_driver_version} "
                                    "from https://pytorch.org/get-started/locally/"))]
        return [_finding("torch", "torch.cuda_driver", OK, "CPU-only torch build, and no NVIDIA GPU on this host")]
    if not nvml.cuda_driver_version:
        return [_finding("torch", "torch.cuda_driver", INFO, "CUDA build of torch, but no NVIDIA driver found",
                         f"built for CUDA {t.cuda_build}; NVML: {nvml.error}", cuda_build=t.cuda_build)]
    build, driver = _major_minor(t.cuda_build), _major_minor(nvml.cuda_driver_version)
    evidence = f"torch built for CUDA {t.cuda_build}; driver {nvml.driver_version} supports CUDA {nvml.cuda_driver_version}"
    data = {"cuda_build": t.cuda_build, "cuda_driver": nvml.cuda_driver_version}
    upgrade = Remedy(f"Upgrade the NVIDIA driver to one supporting CUDA {t.cuda_build}, or install a torch "
                     f"build for CUDA <= {nvml.cuda_driver_version}.")
    if driver[:1] < build[:1]:
        return [_finding("torch", "torch.cuda_driver", FAIL, "NVIDIA driver too old for this torch build", evidence, upgrade, **data)]
    if driver < build:
        return [_finding("torch", "torch.cuda_driver", WARN, "Driver older than torch's CUDA minor version",
                         evidence + " (minor-version compatibility: PTX JIT and newest features fail)", upgrade, **data)]
    return [_finding("torch", "torch.cuda_driver", OK, "Driver supports torch's CUDA version", evidence, **data)]


def check_cuda_runtime(facts: DoctorFacts) -> list[Finding]:
    """The libcudart actually loaded against the CUDA torch was built with, and torch seeing the GPUs."""
    t = facts.torch
    if t.state is not ProbeState.OK or not t.cuda_build:
        return []
    findings = []
    path = _library(facts, "libcudart.so")
    evidence = f"built for {t.cuda_build}; loaded libcudart {t.cuda_runtime or 'unknown'} from {path or 'unknown'}"
    if t.cuda_runtime and _major_minor(t.cuda_runtime)[:1] != _major_minor(t.cuda_build)[:1]:
        findings.append(_finding("torch", "torch.cuda_runtime", FAIL, "Loaded CUDA runtime is another major version",
                                 evidence, Remedy("Remove the other CUDA from LD_LIBRARY_PATH so torch loads its own."),
                                 cuda_runtime=t.cuda_runtime, cuda_build=t.cuda_build))
    else:
        findings.append(_finding("torch", "torch.cuda_runtime", OK, "CUDA runtime matches the build", evidence,
                                 cuda_runtime=t.cuda_runtime, cuda_build=t.cuda_build))
    if facts.nvml.gpus and not t.cuda_available:
        findings.append(_finding("torch", "torch.cuda_available", FAIL, "torch cannot use the GPUs",
                                 f"torch.cuda.is_available() is False with {len(facts.nvml.gpus)} GPU(s) visible to NVML",
                                 Remedy("Check CUDA_VISIBLE_DEVICES and the driver/torch CUDA versions above.")))
    return findings


def check_cudnn(facts: DoctorFacts) -> list[Finding]:
    """The cuDNN actually loaded: same major as compiled against, minor not older (torch's own rule)."""
    t = facts.torch
    if t.state is not ProbeState.OK or not t.cuda_build:
        return []
    path = _library(facts, "libcudnn.so")
    evidence = f"compiled against {t.cudnn_build or 'unknown'}; loaded {t.cudnn_loaded or 'none'} from {path or 'unknown'}"
    data = {"cudnn_build": t.cudnn_build, "cudnn_loaded": t.cudnn_loaded, "path": path}
    if not t.cudnn_loaded:
        return [_finding("torch", "torch.cudnn", WARN, "cuDNN is not loaded", evidence,
                         Remedy("Reinstall torch so its bundled cuDNN (nvidia-cudnn-cu*) is present."), **data)]
    build, loaded = _major_minor(t.cudnn_build), _major_minor(t.cudnn_loaded)
    if build and (loaded[:1] != build[:1] or loaded < build):
        return [_finding("torch", "torch.cudnn", FAIL, "Loaded cuDNN is incompatible with torch's", evidence,
                         Remedy("Remove other cuDNN copies from LD_LIBRARY_PATH so torch loads the one it ships with."), **data)]
    return [_finding("torch", "torch.cudnn", OK, f"cuDNN {t.cudnn_loaded} loaded", evidence, **data)]


def check_nccl(facts: DoctorFacts) -> list[Finding]:
    """The NCCL actually loaded (multi-GPU communication)."""
    t = facts.torch
    if t.state is not ProbeState.OK or not t.cuda_build:
        return []
    path = _library(facts, "libnccl.so")
    if not t.nccl_loaded:
        severity = WARN if len(facts.nvml.gpus) > 1 else INFO
        return [_finding("torch", "torch.nccl", severity, "NCCL is not available",
                         f"{len(facts.nvml.gpus)} GPU(s); multi-GPU training needs NCCL",
                         Remedy("Install a torch build with NCCL (the pytorch.org Linux CUDA wheels have it)."))]
    return [_finding("torch", "torch.nccl", OK, f"NCCL {t.nccl_loaded} loaded", f"from {path or 'unknown'}",
                     nccl_loaded=t.nccl_loaded, path=path)]


def check_cpu_backends(facts: DoctorFacts) -> list[Finding]:
    """MKL, oneDNN (mkldnn) and OpenMP compiled into torch."""
    t = facts.torch
    if t.state is not ProbeState.OK:
        return []
    have = {"MKL": t.mkl, "oneDNN": t.mkldnn, "OpenMP": t.openmp}
    evidence = ", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in have.items())
    evidence += f"; parallel backend {t.parallel_backend}, {t.intra_op_threads} intra-op threads"
    data = {"mkl": t.mkl, "mkldnn": t.mkldnn, "openmp": t.openmp, "intra_op_threads": t.intra_op_threads}
    if not t.mkldnn or not t.openmp:
        return [_finding("torch", "torch.cpu_backends", WARN, "torch lacks oneDNN or OpenMP: slow CPU kernels",
                         evidence, Remedy("Install the official torch wheel, which has both."), **data)]
    if not t.mkl:
        return [_finding("torch", "torch.cpu_backends", INFO, "torch has no MKL (normal on Arm)", evidence, **data)]
    return [_finding("torch", "torch.cpu_backends", OK, "MKL, oneDNN and OpenMP available", evidence, **data)]


def check_python_env(facts: DoctorFacts) -> list[Finding]:
    """Running inside a venv or conda env, so torch's dependencies do not clash with the system's."""
    p = facts.python
    if p.in_conda:
        return [_finding("torch", "torch.python_env", OK, "Running in a conda env", f"{p.conda_prefix} (Python {p.version})")]
    if p.in_venv:
        return [_finding("torch", "torch.python_env", OK, "Running in a virtual env", f"{p.prefix} (Python {p.version})")]
    remedy = Remedy("Create a venv: python3 -m venv .venv && .venv/bin/pip install torch",
                    remedies.install_command(facts.distro, "python-venv", facts.euid == 0))
    return [_finding("torch", "torch.python_env", INFO, "Not in a venv or conda env",
                     f"{p.executable} (prefix {p.prefix}): packages share the system's site-packages", remedy)]


def check_cuda_home(facts: DoctorFacts) -> list[Finding]:
    """``CUDA_HOME``/``CUDA_PATH``: an existing toolkit of torch's CUDA version (extensions build with it)."""
    env, tk, build = facts.env, facts.cuda_toolkit, facts.torch.cuda_build
    if not env.cuda_home:
        return []
    if tk.cuda_home_exists is False:
        return [_finding("torch", "torch.cuda_home", WARN, "CUDA_HOME points at a missing directory",
                         f"CUDA_HOME={env.cuda_home} does not exist",
                         Remedy("Unset CUDA_HOME or point it at an installed CUDA toolkit.", "unset CUDA_HOME"),
                         cuda_home=env.cuda_home)]
    evidence = f"CUDA_HOME={env.cuda_home} is CUDA {tk.cuda_home_version or 'unknown'}; torch built for {build or 'CPU only'}"
    data = {"cuda_home": env.cuda_home, "cuda_home_version": tk.cuda_home_version, "cuda_build": build}
    home, built = _major_minor(tk.cuda_home_version), _major_minor(build)
    if home and built and home != built:
        severity = WARN if home[:1] != built[:1] else INFO
        return [_finding("torch", "torch.cuda_home", severity, "CUDA_HOME is a different CUDA than torch's", evidence,
                         Remedy(f"Point CUDA_HOME at a CUDA {build} toolkit (C++/CUDA extensions build against it)."),
                         **data)]
    return [_finding("torch", "torch.cuda_home", OK, "CUDA_HOME agrees with torch", evidence, **data)]


def check_ld_library_path(facts: DoctorFacts) -> list[Finding]:
    """``LD_LIBRARY_PATH`` directories with a CUDA runtime of another major version than torch's."""
    build = _major_minor(facts.torch.cuda_build)
    findings = [
        _finding("torch", "torch.ld_library_path", WARN, "LD_LIBRARY_PATH holds another CUDA runtime",
                 f"{directory} has libcudart {version}; torch built for {facts.torch.cuda_build}",
                 Remedy(f"Remove {directory} from LD_LIBRARY_PATH; torch's wheels bring their own CUDA libraries."),
                 directory=directory, version=version)
        for directory, version in facts.cuda_toolkit.ld_library_cudart
        if build and _major_minor(version)[:1] != build[:1]
    ]
    if not findings and facts.cuda_toolkit.ld_library_cudart:
        dirs = ", ".join(f"{d} ({v})" for d, v in facts.cuda_toolkit.ld_library_cudart)
        findings.append(_finding("torch", "torch.ld_library_path", OK, "CUDA in LD_LIBRARY_PATH agrees with torch", dirs))
    return findings


def check_cuda_launch_blocking(facts: DoctorFacts) -> list[Finding]:
    """``CUDA_LAUNCH_BLOCKING=1`` makes every kernel launch synchronous: a debugging switch."""
    value = facts.env.cuda_launch_blocking
    if value is not None and value.strip() == "1":
        return [_finding("torch", "torch.cuda_launch_blocking", WARN, "CUDA_LAUNCH_BLOCKING=1 is set",
                         "every CUDA kernel launch waits for the kernel to finish (a debugging setting; "
                         "GPU runs lose the CPU/GPU overlap)",
                         Remedy("Unset it outside debugging sessions.", "unset CUDA_LAUNCH_BLOCKING"), value=value)]
    return [_finding("torch", "torch.cuda_launch_blocking", OK, "CUDA_LAUNCH_BLOCKING not set",
                     f"CUDA_LAUNCH_BLOCKING={value}" if value is not None else "", value=value)]


def parse_alloc_conf(text: str) -> tuple[dict[str, str], list[str]]:
    """``key:value,key:value`` -> (settings, malformed entries)."""
    settings, malformed = {}, []
    for entry in (e.strip() for e in text.replace(" ", ",").split(",")):
        key, sep, value = entry.partition(":")
        if not entry:
            continue
        if not sep or not key or not value:
            malformed.append(entry)
        else:
            settings[key.strip()] = value.strip()
    return settings, malformed


def check_alloc_conf(facts: DoctorFacts) -> list[Finding]:
    """``PYTORCH_CUDA_ALLOC_CONF`` / ``PYTORCH_ALLOC_CONF``: well-formed, known keys, and what they change."""
    findings = []
    for name, value in (("PYTORCH_CUDA_ALLOC_CONF", facts.env.pytorch_cuda_alloc_conf),
                        ("PYTORCH_ALLOC_CONF", facts.env.pytorch_alloc_conf)):
        if value is None:
            continue
        settings, malformed = parse_alloc_conf(value)
        unknown = sorted(set(settings) - _ALLOC_CONF_KEYS)
        if malformed:
            findings.append(_finding("torch", "torch.alloc_conf", WARN, f"{name} is malformed",
                                     f"{name}={value}: entries without key:value: {', '.join(malformed)}",
                                     Remedy("Write it as key:value pairs separated by commas."), value=value))
        elif unknown:
            findings.append(_finding("torch", "torch.alloc_conf", INFO, f"{name} has keys doctor does not know",
                                     f"{name}={value}: {', '.join(unknown)} (torch rejects unknown keys at the first allocation)",
                                     value=value))
        else:
            findings.append(_finding("torch", "torch.alloc_conf", INFO, f"{name} changes the caching allocator",
                                     f"{name}={value}", value=value, settings=settings))
    return findings or [_finding("torch", "torch.alloc_conf", OK, "Caching allocator at its defaults",
                                 "PYTORCH_CUDA_ALLOC_CONF and PYTORCH_ALLOC_CONF not set")]


# ========================================================================================== GPUs


def check_nvml(facts: DoctorFacts) -> list[Finding]:
    """NVML present; the GPU inventory (count, model, memory, driver)."""
    nvml = facts.nvml
    if nvml.state is ProbeState.MISSING:
        return [_finding("gpu", "gpu.nvml", INFO, "No NVIDIA GPU driver: GPU checks skipped", nvml.error or "")]
    if nvml.state is ProbeState.FAILED:
        return [_finding("gpu", "gpu.nvml", WARN, "NVML is installed but could not be queried", nvml.error or "",
                         Remedy("Check the driver with `nvidia-smi`; a reboot after a driver update often fixes this."))]
    if not nvml.gpus:
        return [_finding("gpu", "gpu.nvml", INFO, "NVIDIA driver loaded but no GPU visible",
                         f"driver {nvml.driver_version}", driver_version=nvml.driver_version)]
    models = ", ".join(f"{g.index}: {g.name} {format_bytes(g.memory_total_bytes)}" for g in nvml.gpus)
    return [_finding("gpu", "gpu.nvml", OK, f"{len(nvml.gpus)} GPU(s), driver {nvml.driver_version} (CUDA {nvml.cuda_driver_version})",
                     models, gpu_count=len(nvml.gpus), driver_version=nvml.driver_version,
                     cuda_driver_version=nvml.cuda_driver_version,
                     gpus=[{"index": g.index, "name": g.name, "memory_total_bytes": g.memory_total_bytes} for g in nvml.gpus])]


def _per_gpu(facts: DoctorFacts, id: str, ok_title: str, check: Callable[[DoctorFacts, GpuFacts], Finding | None]) -> list[Finding]:
    """Run a per-GPU check; one OK finding when no GPU has a problem; nothing without GPUs."""
    if facts.nvml.state is not ProbeState.OK or not facts.nvml.gpus:
        return []
    findings = [f for f in (check(facts, g) for g in facts.nvml.gpus) if f is not None]
    return findings or [_finding("gpu", id, OK, ok_title, f"{len(facts.nvml.gpus)} GPU(s)")]


def check_gpu_temperature(facts: DoctorFacts) -> list[Finding]:
    """GPU temperature against its slowdown threshold."""
    def one(facts: DoctorFacts, g: GpuFacts) -> Finding | None:
        limit = g.slowdown_temperature_c - _GPU_TEMP_MARGIN_C if g.slowdown_temperature_c else _GPU_TEMP_WARN_C
        if g.temperature_c is None or g.temperature_c < limit:
            return None
        return _finding("gpu", "gpu.temperature", WARN, f"GPU {g.index} is running hot",
                        f"{g.temperature_c} °C, warn at {limit} °C (slowdown at {g.slowdown_temperature_c or 'unknown'} °C)",
                        Remedy("Check airflow and fan speeds; hot GPUs lower their clocks."),
                        gpu_index=g.index, temperature_c=g.temperature_c, threshold_c=limit)
    return _per_gpu(facts, "gpu.temperature", "GPU temperatures below their slowdown thresholds", one)


def check_gpu_ecc(facts: DoctorFacts) -> list[Finding]:
    """Uncorrected ECC errors since the driver loaded: the GPU's memory returned bad data."""
    def one(facts: DoctorFacts, g: GpuFacts) -> Finding | None:
        if not g.ecc_uncorrected_volatile:
            return None
        return _finding("gpu", "gpu.ecc", FAIL, f"GPU {g.index} has uncorrected ECC errors",
                        f"{g.ecc_uncorrected_volatile} uncorrected (volatile) errors, threshold 0",
                        _admin(facts, "Drain the GPU and reset it; if errors recur, have it replaced.",
                               f"nvidia-smi --gpu-reset -i {g.index}"),
                        gpu_index=g.index, ecc_uncorrected_volatile=g.ecc_uncorrected_volatile)
    return _per_gpu(facts, "gpu.ecc", "No uncorrected ECC errors", one)


def check_gpu_throttle(facts: DoctorFacts) -> list[Finding]:
    """Current clock-event reasons: hardware slowdowns fail, thermal slowdown warns, power cap informs."""
    def one(facts: DoctorFacts, g: GpuFacts) -> Finding | None:
        reasons = set(g.throttle_reasons) - _BENIGN_THROTTLE
        if not reasons:
            return None
        severity = FAIL if reasons & _HW_THROTTLE else WARN if "sw_thermal_slowdown" in reasons else INFO
        return _finding("gpu", "gpu.throttle", severity, f"GPU {g.index} clocks are being held down",
                        f"throttle reasons: {', '.join(sorted(reasons))}",
                        Remedy("Check cooling, power supply and `nvidia-smi -q -d PERFORMANCE`; a power cap under full "
                               "load is normal."), gpu_index=g.index, throttle_reasons=sorted(reasons))
    return _per_gpu(facts, "gpu.throttle", "No GPU is throttled", one)


def check_gpu_persistence(facts: DoctorFacts) -> list[Finding]:
    """Persistence mode off: the driver unloads between jobs and every CUDA start pays to reload it."""
    def one(facts: DoctorFacts, g: GpuFacts) -> Finding | None:
        if g.persistence_mode is not False:
            return None
        return _finding("gpu", "gpu.persistence", WARN, f"GPU {g.index} persistence mode is off",
                        "every process start re-initialises the driver (seconds per start)",
                        _admin(facts, "Enable persistence mode (or run nvidia-persistenced).", "nvidia-smi -pm 1"),
                        gpu_index=g.index)
    return _per_gpu(facts, "gpu.persistence", "Persistence mode on", one)


def check_gpu_pcie(facts: DoctorFacts) -> list[Finding]:
    """PCIe link width and generation against the maximum this GPU and slot support."""
    def one(facts: DoctorFacts, g: GpuFacts) -> Finding | None:
        evidence = f"gen {g.pcie_gen_current}/{g.pcie_gen_max}, x{g.pcie_width_current}/x{g.pcie_width_max} (current/max)"
        data = {"gpu_index": g.index, "pcie_gen": g.pcie_gen_current, "pcie_gen_max": g.pcie_gen_max,
                "pcie_width": g.pcie_width_current, "pcie_width_max": g.pcie_width_max}
        if g.pcie_width_current and g.pcie_width_max and g.pcie_width_current < g.pcie_width_max:
            return _finding("gpu", "gpu.pcie", WARN, f"GPU {g.index} PCIe link is narrower than it can be", evidence,
                            Remedy("Reseat the card or move it to a full-width slot; check riser cables."), **data)
        if g.pcie_gen_current and g.pcie_gen_max and g.pcie_gen_current < g.pcie_gen_max:
            if "gpu_idle" in g.throttle_reasons:
                return _finding("gpu", "gpu.pcie", INFO, f"GPU {g.index} PCIe link downshifted while idle",
                                evidence + "; idle GPUs lower the link speed to save power, re-check under load", **data)
            return _finding("gpu", "gpu.pcie", WARN, f"GPU {g.index} PCIe link runs below its generation", evidence,
                            Remedy("Check the BIOS PCIe speed setting and the slot."), **data)
        return None
    return _per_gpu(facts, "gpu.pcie", "PCIe links at full width and generation", one)


def check_gpu_memory_in_use(facts: DoctorFacts) -> list[Finding]:
    """GPU memory already held by other processes before training starts."""
    def one(facts: DoctorFacts, g: GpuFacts) -> Finding | None:
        if not g.memory_total_bytes or g.memory_used_bytes is None:
            return None
        frac = g.memory_used_bytes / g.memory_total_bytes
        if frac <= _GPU_MEMORY_BUSY_FRAC:
            return None
        return _finding("gpu", "gpu.memory_in_use", WARN, f"GPU {g.index} memory is already in use",
                        f"{format_bytes(g.memory_used_bytes)} of {format_bytes(g.memory_total_bytes)} used "
                        f"({frac:.0%}, threshold {_GPU_MEMORY_BUSY_FRAC:.0%})",
                        Remedy("See which processes hold it with `nvidia-smi`."),
                        gpu_index=g.index, memory_used_bytes=g.memory_used_bytes, used_frac=frac)
    return _per_gpu(facts, "gpu.memory_in_use", "GPU memory free", one)


def check_gpu_mixed(facts: DoctorFacts) -> list[Finding]:
    """Different GPU models on one host: data-parallel training runs at the slowest one's pace."""
    names = sorted({g.name for g in facts.nvml.gpus})
    if len(names) < 2:
        return []
    return [_finding("gpu", "gpu.mixed", WARN, "Mixed GPU models on this host", ", ".join(names),
                     Remedy("Restrict a job to one model with CUDA_VISIBLE_DEVICES."), models=names)]


def check_nvidia_smi(facts: DoctorFacts) -> list[Finding]:
    """``nvidia-smi`` on PATH where there are GPUs (the first tool anyone reaches for)."""
    nvml = facts.nvml
    if not nvml.gpus:
        return []
    if nvml.nvidia_smi_path:
        return [_finding("gpu", "gpu.nvidia_smi", OK, "nvidia-smi available", nvml.nvidia_smi_path)]
    command = remedies.nvidia_smi_install_command(facts.distro, nvml.driver_version, facts.euid == 0)
    return [_finding("gpu", "gpu.nvidia_smi", INFO, "nvidia-smi is not on PATH", "NVML works but the CLI is missing",
                     Remedy("Install the NVIDIA utilities matching the driver.", command))]


# ===================================================================================== CPU


def check_usable_cores(facts: DoctorFacts) -> list[Finding]:
    """Cores this process may use (affinity, cgroup quota) against ``os.cpu_count()``."""
    c = facts.cpu
    quota = f"{c.cgroup_cpu_quota:g}" if c.cgroup_cpu_quota is not None else "none"
    evidence = f"usable {c.usable_cores} of os.cpu_count()={c.logical_cpus} (affinity {c.affinity_cpus}, cgroup quota {quota})"
    data = {"usable_cores": c.usable_cores, "logical_cpus": c.logical_cpus, "affinity_cpus": c.affinity_cpus,
            "cgroup_cpu_quota": c.cgroup_cpu_quota}
    if c.usable_cores < c.logical_cpus:
        return [_finding("cpu", "cpu.usable_cores", INFO, f"This process may use {c.usable_cores} of {c.logical_cpus} CPUs",
                         evidence + "; size DataLoader workers and threads by the usable count, not os.cpu_count()",
                         **data)]
    return [_finding("cpu", "cpu.usable_cores", OK, f"{c.usable_cores} usable cores", evidence, **data)]


def check_thread_env(facts: DoctorFacts) -> list[Finding]:
    """``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` against the usable cores."""
    usable = facts.cpu.usable_cores
    findings = []
    for name, value in (("OMP_NUM_THREADS", facts.env.omp_num_threads), ("MKL_NUM_THREADS", facts.env.mkl_num_threads)):
        if value is None:
            continue
        if not value.strip().isdigit() or int(value) == 0:
            findings.append(_finding("cpu", "cpu.threads", WARN, f"{name} is not a positive integer",
                                     f"{name}={value!r}", Remedy(f"Set {name} to a number of threads, e.g. {usable}."),
                                     variable=name, value=value))
        elif int(value) > usable:
            findings.append(_finding("cpu", "cpu.threads", WARN, f"{name} oversubscribes the usable cores",
                                     f"{name}={value} > {usable} usable cores: threads fight for cores",
                                     Remedy(f"Set {name} to at most {usable}.", f"export {name}={usable}"),
                                     variable=name, threads=int(value), usable_cores=usable))
    if not findings:
        threads = facts.torch.intra_op_threads
        set_to = ", ".join(f"{n}={v}" for n, v in (("OMP_NUM_THREADS", facts.env.omp_num_threads),
                                                    ("MKL_NUM_THREADS", facts.env.mkl_num_threads)) if v) or "not set"
        findings.append(_finding("cpu", "cpu.threads", OK, "Thread counts fit the usable cores",
                                 f"{set_to}; torch uses {threads} intra-op threads on {usable} usable cores",
                                 intra_op_threads=threads, usable_cores=usable))
    return findings


def check_numa(facts: DoctorFacts) -> list[Finding]:
    """NUMA layout: on several nodes, bind each rank's threads and memory to one node."""
    nodes = facts.cpu.numa_nodes
    layout = "; ".join(f"node {n.id}: {len(n.cpus)} CPUs" for n in nodes) or "no NUMA nodes exposed"
    if len(nodes) <= 1:
        return [_finding("cpu", "cpu.numa", OK, "Single NUMA node", layout, numa_nodes=len(nodes))]
    text = "Bind each training process to one node (torchpace launch --numa auto, or numactl --cpunodebind)."
    remedy = Remedy(text) if facts.cpu.numactl_path else _install(facts, "numactl", text + " Install numactl first.")
    return [_finding("cpu", "cpu.numa", INFO, f"{len(nodes)} NUMA nodes", layout, remedy, numa_nodes=len(nodes))]


def check_governor(facts: DoctorFacts) -> list[Finding]:
    """CPU frequency governor: ``performance`` keeps clocks up between bursts of data loading."""
    c = facts.cpu
    if not c.governors:
        return [_finding("cpu", "cpu.governor", INFO, "CPU frequency scaling not exposed",
                         "no /sys/devices/system/cpu/cpu*/cpufreq (common in VMs and containers)")]
    seen = ", ".join(f"{g} on {n} CPUs" for g, n in c.governors)
    evidence = f"{seen}; driver {c.scaling_driver}"
    governors = {g for g, _ in c.governors}
    remedy = _performance_governor_remedy(facts)
    if governors == {"performance"}:
        return [_finding("cpu", "cpu.governor", OK, "performance governor", evidence, governors=sorted(governors))]
    if "powersave" in governors and c.scaling_driver not in _HWP_DRIVERS:
        return [_finding("cpu", "cpu.governor", WARN, "powersave governor pins CPUs to low clocks", evidence, remedy,
                         governors=sorted(governors))]
    return [_finding("cpu", "cpu.governor", INFO, "Dynamic frequency governor", evidence + "; clocks ramp on demand",
                     remedy, governors=sorted(governors))]


def _performance_governor_remedy(facts: DoctorFacts) -> Remedy:
    """Install cpupower (this distribution's package) and switch every CPU to ``performance``."""
    install = _install(facts, "cpupower", "Set the performance governor (needs cpupower).")
    switch = remedies.as_admin("cpupower frequency-set -g performance", facts.euid == 0)
    return Remedy(install.text, f"{install.command} && {switch}" if install.command else switch)


def check_bf16(facts: DoctorFacts) -> list[Finding]:
    """Native bf16 on the CPU (AVX512-BF16 / AMX / Arm bf16): CPU bf16 autocast pays off only with it."""
    if facts.cpu.native_bf16:
        flags = ", ".join(sorted(facts.cpu.flags & {"avx512_bf16", "amx_bf16", "bf16"}))
        return [_finding("cpu", "cpu.bf16", OK, "CPU computes bf16 natively", f"{facts.cpu.cpu_model} ({flags})",
                         native_bf16=True)]
    return [_finding("cpu", "cpu.bf16", INFO, "No native bf16 on this CPU",
                     f"{facts.cpu.cpu_model}: bf16 autocast on CPU is emulated and usually slower than fp32",
                     native_bf16=False)]


# ================================================================================== memory


def check_thp(facts: DoctorFacts) -> list[Finding]:
    """Transparent huge pages: ``never`` denies torch's large CPU tensors huge pages."""
    m = facts.memory
    evidence = f"enabled={m.thp_enabled}, defrag={m.thp_defrag}"
    if m.thp_enabled is None:
        return [_finding("memory", "memory.thp", INFO, "Transparent huge pages not exposed", evidence)]
    if m.thp_enabled == "never":
        return [_finding("memory", "memory.thp", INFO, "Transparent huge pages disabled", evidence,
                         _admin(facts, "Allow them on request (madvise).",
                                "sh -c 'echo madvise > /sys/kernel/mm/transparent_hugepage/enabled'"), thp_enabled=m.thp_enabled)]
    if m.thp_defrag == "always":
        return [_finding("memory", "memory.thp", INFO, "THP defrag=always can stall allocations", evidence,
                         _admin(facts, "Defragment only on request.",
                                "sh -c 'echo madvise > /sys/kernel/mm/transparent_hugepage/defrag'"), thp_enabled=m.thp_enabled)]
    return [_finding("memory", "memory.thp", OK, f"Transparent huge pages: {m.thp_enabled}", evidence, thp_enabled=m.thp_enabled)]


def check_swap(facts: DoctorFacts) -> list[Finding]:
    """Swap in use: pages of the training process or its data may be on disk."""
    m = facts.memory
    if m.swap_total_bytes is None or m.swap_free_bytes is None:
        return [_finding("memory", "memory.swap", INFO, "Swap usage unknown", "/proc/meminfo has no Swap fields")]
    used = m.swap_total_bytes - m.swap_free_bytes
    evidence = f"{format_bytes(used)} of {format_bytes(m.swap_total_bytes)} swap used (warn above {format_bytes(_SWAP_USED_WARN_BYTES)})"
    if used > _SWAP_USED_WARN_BYTES:
        return [_finding("memory", "memory.swap", WARN, "Swap is in use", evidence,
                         Remedy("Free memory (fewer workers, smaller caches) so training does not page."), swap_used_bytes=used)]
    if used > 0:
        return [_finding("memory", "memory.swap", INFO, "A little swap is in use", evidence, swap_used_bytes=used)]
    return [_finding("memory", "memory.swap", OK, "No swap in use", evidence, swap_used_bytes=used)]


def check_cgroup_memory(facts: DoctorFacts) -> list[Finding]:
    """The cgroup memory limit (containers, systemd slices, batch schedulers) and how full it is."""
    m = facts.memory
    limit, usage = m.cgroup_memory_limit_bytes, m.cgroup_memory_usage_bytes
    if limit is None:
        return [_finding("memory", "memory.cgroup", OK, "No cgroup memory limit",
                         f"RAM {format_bytes(m.mem_total_bytes)}, available {format_bytes(m.mem_available_bytes)}",
                         mem_total_bytes=m.mem_total_bytes, mem_available_bytes=m.mem_available_bytes)]
    evidence = f"limit {format_bytes(limit)}, in use {format_bytes(usage)}; RAM {format_bytes(m.mem_total_bytes)}"
    data = {"limit_bytes": limit, "usage_bytes": usage, "mem_total_bytes": m.mem_total_bytes}
    if usage is not None and usage > _CGROUP_MEMORY_BUSY_FRAC * limit:
        return [_finding("memory", "memory.cgroup", WARN, "Close to the cgroup memory limit",
                         evidence + f" (warn above {_CGROUP_MEMORY_BUSY_FRAC:.0%})",
                         Remedy("Raise the container's memory limit or use fewer/lighter DataLoader workers."), **data)]
    if m.mem_total_bytes is not None and limit < m.mem_total_bytes:
        return [_finding("memory", "memory.cgroup", INFO, f"Memory limited to {format_bytes(limit)} by the cgroup",
                         evidence + "; the OOM killer acts at the limit, not at RAM", **data)]
    return [_finding("memory", "memory.cgroup", OK, "cgroup memory limit above RAM", evidence, **data)]


# ================================================================================== limits


def _workers(facts: DoctorFacts) -> int:
    """The DataLoader workers a host like this typically runs: one per usable core."""
    return max(1, facts.cpu.usable_cores)


def nofile_needed(workers: int) -> int:
    """Open files a training process with `workers` DataLoader workers may need."""
    return _NOFILE_BASE + workers * _PREFETCH_FACTOR * _FDS_PER_BATCH


def _raise_limit_remedy(facts: DoctorFacts, flag: str, item: str, limit: RLimit, needed: int) -> Remedy:
    if limit.hard is None or limit.hard >= needed or facts.euid == 0:
        return Remedy("Raise the limit in the shell that starts training (for open files, torchpace launch "
                      "--nofile does it for you).", f"ulimit {flag} {needed}")
    return Remedy(f"The hard limit is {limit.hard}: raise it for the user in /etc/security/limits.conf "
                  f"(`* hard {item} {needed}`), or with --ulimit in docker run, then log in again.")


def check_nofile(facts: DoctorFacts) -> list[Finding]:
    """``ulimit -n`` against what DataLoader workers sharing tensors by file descriptor need."""
    limit = facts.limits.nofile
    if limit is None:
        return [_finding("limits", "limits.nofile", WARN, "Could not read the open-files limit", facts.limits.error or "")]
    needed = nofile_needed(_workers(facts))
    data = {"soft": limit.soft, "hard": limit.hard, "needed": needed, "workers": _workers(facts)}
    soft = "unlimited" if limit.soft is None else str(limit.soft)
    evidence = f"ulimit -n = {soft} (hard {limit.hard if limit.hard is not None else 'unlimited'}); " \
               f"{_workers(facts)} workers need about {needed}"
    if limit.soft is not None and limit.soft < _NOFILE_FLOOR:
        return [_finding("limits", "limits.nofile", FAIL, "Open-files limit too low for DataLoader workers",
                         evidence + f" (fails below {_NOFILE_FLOOR})",
                         _raise_limit_remedy(facts, "-n", "nofile", limit, needed), **data)]
    if limit.soft is not None and limit.soft < needed:
        return [_finding("limits", "limits.nofile", WARN, "Open-files limit below what workers may need", evidence,
                         _raise_limit_remedy(facts, "-n", "nofile", limit, needed), **data)]
    return [_finding("limits", "limits.nofile", OK, "Open-files limit is enough", evidence, **data)]


def check_nproc(facts: DoctorFacts) -> list[Finding]:
    """``ulimit -u``: processes and threads of this user, DataLoader workers and their threads included."""
    limit = facts.limits.nproc
    if limit is None:
        return [_finding("limits", "limits.nproc", WARN, "Could not read the process limit", facts.limits.error or "")]
    needed = _NPROC_BASE + _workers(facts) * _THREADS_PER_WORKER
    soft = "unlimited" if limit.soft is None else str(limit.soft)
    evidence = f"ulimit -u = {soft}; {_workers(facts)} workers and their threads need about {needed}"
    data = {"soft": limit.soft, "hard": limit.hard, "needed": needed}
    if limit.soft is not None and limit.soft < needed:
        note = " (root is exempt)" if facts.euid == 0 else ""
        return [_finding("limits", "limits.nproc", WARN, "Process limit below what workers may need", evidence + note,
                         _raise_limit_remedy(facts, "-u", "nproc", limit, needed), **data)]
    return [_finding("limits", "limits.nproc", OK, "Process limit is enough", evidence, **data)]


def shm_needed_bytes(workers: int, batch_bytes: int = _TYPICAL_BATCH_BYTES) -> int:
    """Shared memory DataLoader workers hold: `workers` × prefetch factor × batch bytes."""
    return workers * _PREFETCH_FACTOR * batch_bytes


def check_shm(facts: DoctorFacts) -> list[Finding]:
    """``/dev/shm`` size: worker batches travel through it; too small and workers die with SIGBUS."""
    lim = facts.limits
    if lim.shm_total_bytes is None:
        return [_finding("limits", "limits.shm", FAIL, "/dev/shm is missing or unreadable", lim.shm_error or "",
                         Remedy("Mount a tmpfs at /dev/shm (docker: --shm-size=8g, or --ipc=host)."))]
    needed = shm_needed_bytes(_workers(facts))
    evidence = (f"/dev/shm {format_bytes(lim.shm_total_bytes)}, {format_bytes(lim.shm_free_bytes)} free; "
                f"{_workers(facts)} workers × {_PREFETCH_FACTOR} batches × {format_bytes(_TYPICAL_BATCH_BYTES)} "
                f"(an ImageNet-style batch of 64) = {format_bytes(needed)}")
    data = {"shm_total_bytes": lim.shm_total_bytes, "shm_free_bytes": lim.shm_free_bytes, "needed_bytes": needed}
    if (lim.shm_free_bytes or 0) < needed:
        size_gib = max(1, -(-needed // 2**30) * 2)
        return [_finding("limits", "limits.shm", FAIL, "/dev/shm too small for DataLoader workers", evidence,
                         _admin(facts, f"Enlarge /dev/shm (docker: --shm-size={size_gib}g or --ipc=host).",
                                f"mount -o remount,size={size_gib}G /dev/shm"), **data)]
    return [_finding("limits", "limits.shm", OK, "/dev/shm is large enough", evidence, **data)]


# ================================================================================= storage


def check_data_dir(facts: DoctorFacts) -> list[Finding]:
    """The disk behind ``--data-dir``: network, spinning, SSD or NVMe."""
    d = facts.disk
    if d is None:
        return [_finding("storage", "storage.data_dir", INFO, "No --data-dir given: storage not checked",
                         "run `torchpace doctor --data-dir PATH` with the directory your training data is read from")]
    if d.state is ProbeState.FAILED:
        return [_finding("storage", "storage.data_dir", WARN, f"Could not inspect {d.path}", d.error or "")]
    kind = _disk_kind(d.fstype, d.device, d.rotational)
    evidence = f"{d.path} on {d.mount_point} ({d.fstype}, {d.source}), device {d.device or 'none'}: {kind}"
    data = {"path": d.path, "fstype": d.fstype, "device": d.device, "rotational": d.rotational, "kind": kind}
    severity, title, remedy = {
        "network": (WARN, "Training data on a network filesystem",
                    Remedy("Copy the dataset to a local SSD/NVMe, or cache it there on first epoch.")),
        "hdd": (WARN, "Training data on a spinning disk",
                Remedy("Move the dataset to an SSD/NVMe; random reads of many small files are slow on HDDs.")),
        "virtual": (INFO, "Training data on a virtual disk", None),
    }.get(kind, (OK, f"Training data on {_KIND_LABELS.get(kind, kind)}", None))
    if kind == "virtual":
        evidence += " (the rotational flag of a virtio/Xen disk is the hypervisor's guess)"
    return [_finding("storage", "storage.data_dir", severity, title, evidence, remedy, **data)]


def _disk_kind(fstype: str | None, device: str | None, rotational: bool | None) -> str:
    """``network``, ``nvme``, ``ssd``, ``hdd``, ``virtual``, ``memory`` (tmpfs) or the filesystem type."""
    base = (fstype or "").split(".")[0]
    if base in _NETWORK_FILESYSTEMS or (fstype or "").startswith("fuse."):
        return "network"
    if base in {"tmpfs", "ramfs"}:
        return "memory"
    if device is None:
        return fstype or "unknown"
    if device.startswith("nvme"):
        return "nvme"
    if device.startswith(_VIRTUAL_DISK_PREFIXES):
        return "virtual"
    return {True: "hdd", False: "ssd"}.get(rotational, "unknown")


def check_disk_free(facts: DoctorFacts) -> list[Finding]:
    """Free space on the data filesystem: checkpoints, caches and logs land there too."""
    d = facts.disk
    if d is None or d.free_bytes is None or not d.total_bytes:
        return []
    frac = d.free_bytes / d.total_bytes
    evidence = (f"{format_bytes(d.free_bytes)} free of {format_bytes(d.total_bytes)} ({frac:.0%}); "
                f"warn under {format_bytes(_DISK_FREE_MIN_BYTES)} or {_DISK_FREE_MIN_FRAC:.0%}")
    data = {"free_bytes": d.free_bytes, "total_bytes": d.total_bytes, "free_frac": frac}
    if d.free_bytes < _DISK_FREE_MIN_BYTES or frac < _DISK_FREE_MIN_FRAC:
        return [_finding("storage", "storage.free_space", WARN, "Little free space on the data filesystem", evidence,
                         Remedy("Free space or move checkpoints elsewhere."), **data)]
    return [_finding("storage", "storage.free_space", OK, "Enough free space", evidence, **data)]


# =============================================================================== allocator


def check_allocator(facts: DoctorFacts) -> list[Finding]:
    """jemalloc / tcmalloc: installed, and preloaded (``LD_PRELOAD`` or /etc/ld.so.preload)?"""
    a = facts.allocator
    in_use = [p for p in (*a.ld_preload, *facts.torch.loaded_libraries) if "jemalloc" in p or "tcmalloc" in p]
    if in_use:
        return [_finding("allocator", "allocator.malloc", OK, "Alternative malloc preloaded", in_use[0], preloaded=in_use[0])]
    installed = a.jemalloc_paths + a.tcmalloc_paths
    if installed:
        name = "jemalloc" if a.jemalloc_paths else "tcmalloc"
        return [_finding("allocator", "allocator.malloc", INFO, f"{name} installed but not preloaded", _one_per_library(a),
                         Remedy(f"Let the tuner measure it (torchpace launch --allocator {name}), or preload it.",
                                f"export LD_PRELOAD={installed[0]}"), installed=list(installed))]
    return [_finding("allocator", "allocator.malloc", INFO, "No jemalloc or tcmalloc installed",
                     "glibc malloc returns memory slowly under many-threaded CPU training and data loading",
                     _install(facts, "jemalloc", "Install jemalloc so the tuner can measure it."), installed=[])]


def _one_per_library(a) -> str:
    """`jemalloc: PATH; tcmalloc: PATH` with the first path of each installed library (the JSON
    `installed` field keeps them all: the same library is often found under several names and dirs)."""
    firsts = [f"{name}: {paths[0]}" + (f" (+{len(paths) - 1} more)" if len(paths) > 1 else "")
              for name, paths in (("jemalloc", a.jemalloc_paths), ("tcmalloc", a.tcmalloc_paths)) if paths]
    return "; ".join(firsts)


# =================================================================================== smoke


def check_dataloader_smoke(facts: DoctorFacts) -> list[Finding]:
    """A DataLoader with workers (and pin_memory where CUDA exists) produced its batches."""
    s = facts.smoke
    if s.state is ProbeState.MISSING:
        return []
    what = f"{s.num_workers} workers" + (", pin_memory" if s.pin_memory else "")
    if s.state is ProbeState.FAILED:
        return [_finding("smoke", "smoke.dataloader", FAIL, "DataLoader smoke test could not run", s.error or "",
                         Remedy("Run a DataLoader with num_workers=2 by hand to see the error; check /dev/shm and ulimit -n."),
                         timeout_s=s.timeout_s)]
    evidence = f"{what}: {s.batches}/{s.expected_batches} batches in {s.elapsed_s or 0:.2f} s"
    data = {"num_workers": s.num_workers, "pin_memory": s.pin_memory, "batches": s.batches,
            "expected_batches": s.expected_batches, "elapsed_s": s.elapsed_s}
    if s.error or s.batches < s.expected_batches:
        return [_finding("smoke", "smoke.dataloader", FAIL, "DataLoader workers failed", f"{evidence}; {s.error or ''}",
                         Remedy("Check /dev/shm size and ulimit -n above; workers share batches through them."), **data)]
    if s.pin_memory and s.pinned is False:
        return [_finding("smoke", "smoke.dataloader", FAIL, "pin_memory produced unpinned batches", evidence, **data)]
    return [_finding("smoke", "smoke.dataloader", OK, "DataLoader workers produce batches", evidence, **data)]


# ===================================================================================== cluster


def check_allocation(facts: DoctorFacts) -> list[Finding]:
    """The scheduler allocation (`torchpace.allocation`): what the job step was given, and what does not fit it."""
    found = facts.allocation
    if found.error:
        return [_finding("cluster", "cluster.allocation", WARN, "The scheduler's variables cannot be read", found.error,
                         Remedy("Run under the scheduler's own launcher (srun, the PyTorchJob pod), or unset the "
                                "variable copied from another job."))]
    a = found.allocation
    if a is None:
        return [_finding("cluster", "cluster.allocation", OK, "Not in a scheduler allocation",
                         "no SLURM, torchelastic, Kubeflow or LSF variables in the environment")]
    where = (f"{a.scheduler} job {a.job_id or '?'}" + (f" ({a.job_name})" if a.job_name else "")
             + f": {a.nodes or '?'} node(s)" + (f", this one #{a.node_index}" if a.node_index is not None else "")
             + (f", {a.tasks} task(s)" if a.tasks else "") + (f", rank {a.rank}" if a.rank is not None else "")
             + (f", {a.cpus_per_task} CPUs per task" if a.cpus_per_task else "")
             + (f", GPUs {','.join(a.gpus) or 'none'}" if a.gpus is not None else "")
             + (f", {format_bytes(a.memory_limit_bytes)} per node" if a.memory_limit_bytes else "")
             + (f"; rendezvous {a.master_addr}:{a.master_port}" if a.master_addr else ""))
    findings = [_finding("cluster", "cluster.allocation", OK, f"In a {a.scheduler} allocation", where, **a.to_dict())]
    findings += _allocation_verdicts(facts, a)
    return findings


def _allocation_verdicts(facts: DoctorFacts, a) -> list[Finding]:
    findings = []
    threads = facts.env.omp_num_threads
    if a.cpus_per_task and threads and threads.strip().isdigit() and int(threads) > a.cpus_per_task:
        findings.append(_finding("cluster", "cluster.threads", WARN, "OMP_NUM_THREADS is over the step's cores per task",
                                 f"OMP_NUM_THREADS={threads} > SLURM_CPUS_PER_TASK={a.cpus_per_task}",
                                 Remedy(f"Set OMP_NUM_THREADS to at most {a.cpus_per_task}.",
                                        f"export OMP_NUM_THREADS={a.cpus_per_task}"),
                                 threads=int(threads), cpus_per_task=a.cpus_per_task))
    visible = len(facts.nvml.gpus)
    if a.gpus is not None and visible > len(a.gpus):
        findings.append(_finding("cluster", "cluster.gpus", WARN, "GPUs are visible that the job step was not given",
                                 f"{visible} GPUs visible, the step was given {len(a.gpus)} ({','.join(a.gpus) or 'none'})",
                                 Remedy("Ask for the GPUs (--gpus-per-task / --gres=gpu:N) or let the scheduler bind "
                                        "CUDA_VISIBLE_DEVICES; other jobs may be using the rest."),
                                 visible_gpus=visible, step_gpus=list(a.gpus)))
    if a.scheduler == SLURM and (a.nodes or 1) > 1 and not a.under_srun:
        findings.append(_finding("cluster", "cluster.srun", WARN, "A job of several nodes runs outside srun",
                                 f"{a.nodes} nodes, but no SLURM_STEP_ID: this process is the batch script on the "
                                 "first node only", Remedy("Start the training with srun, one task per node, each "
                                                           "running torchpace launch (or torchrun)."), nodes=a.nodes))
    if a.interactive:
        findings.append(_finding("cluster", "cluster.interactive", INFO, "An interactive job",
                                 f"the job is named {a.job_name!r}: a shell inside an allocation, whose time limit ends "
                                 "the training with it", job_name=a.job_name))
    return findings


def check_probe_errors(facts: DoctorFacts) -> list[Finding]:
    """Probes that raised: their facts are missing, and the report says so instead of guessing."""
    return [_finding("doctor", f"doctor.probe.{name}", WARN, f"The {name} probe could not run", error,
                     Remedy("Please report this with the error text at the torchpace issue tracker."), probe=name)
            for name, error in facts.probe_errors]


ALL_CHECKS: tuple[Callable[[DoctorFacts], list[Finding]], ...] = (
    check_torch_install, check_cuda_driver, check_cuda_runtime, check_cudnn, check_nccl, check_cpu_backends,
    check_python_env, check_cuda_home, check_ld_library_path, check_cuda_launch_blocking, check_alloc_conf,
    check_nvml, check_gpu_temperature, check_gpu_ecc, check_gpu_throttle, check_gpu_persistence, check_gpu_pcie,
    check_gpu_memory_in_use, check_gpu_mixed, check_nvidia_smi,
    check_usable_cores, check_thread_env, check_numa, check_governor, check_bf16,
    check_thp, check_swap, check_cgroup_memory,
    check_nofile, check_nproc, check_shm,
    check_data_dir, check_disk_free,
    check_allocator,
    check_allocation,
    check_dataloader_smoke,
    check_probe_errors,
)


def run_checks(facts: DoctorFacts) -> list[Finding]:
    """Every check's findings, in display order."""
    return [finding for check in ALL_CHECKS for finding in check(facts)]
