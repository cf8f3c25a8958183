"""DoctorFacts: everything doctor measured about this host, as frozen plain data.

Probes (`torchpace.doctor.probes`) build these; checks (`torchpace.doctor.checks`) read them and
never touch the world. Each group that comes from one probe carries a `ProbeState` and, when the
probe could not run, the reason: "not installed" (`MISSING`) and "could not run" (`FAILED`) are
different answers and the checks report them differently.

Conventions: sizes are bytes (`*_bytes`), durations seconds (`*_s`), temperatures degrees Celsius
(`*_c`); a value the probe could not read is None. Where None would be ambiguous the field's
docstring says what it means.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from torchpace.allocation import Allocation
from torchpace.host import DistroInfo, NumaNode


class ProbeState(str, enum.Enum):
    """How a probe went: it ran, what it looks for is not installed, or it could not run."""

    OK = "ok"
    MISSING = "missing"
    FAILED = "failed"


@dataclass(frozen=True)
class PythonEnvFacts:
    """The interpreter doctor runs in (and the torch child process runs in too).

    Attributes:
        version: e.g. ``3.11.2``.
        executable: `sys.executable`.
        prefix: `sys.prefix`; differs from `base_prefix` inside a venv.
        base_prefix: `sys.base_prefix`.
        conda_prefix: the active conda env (``CONDA_PREFIX``, or `prefix` when it holds ``conda-meta``).
    """

    version: str = ""
    executable: str = ""
    prefix: str = ""
    base_prefix: str = ""
    conda_prefix: str | None = None

    @property
    def in_venv(self) -> bool:
        return self.prefix != self.base_prefix

    @property
    def in_conda(self) -> bool:
        return self.conda_prefix is not None


@dataclass(frozen=True)
class EnvFacts:
    """The environment variables doctor checks, as set for this process (None = not set)."""

    cuda_launch_blocking: str | None = None
    pytorch_cuda_alloc_conf: str | None = None
    pytorch_alloc_conf: str | None = None
    omp_num_threads: str | None = None
    mkl_num_threads: str | None = None
    cuda_home: str | None = None
    ld_library_path: str | None = None
    ld_preload: str | None = None


@dataclass(frozen=True)
class CudaToolkitFacts:
    """CUDA installs the environment points at, outside the one torch brings.

    Attributes:
        cuda_home_exists: whether ``CUDA_HOME``/``CUDA_PATH`` names an existing directory (None: unset).
        cuda_home_version: ``major.minor`` of the toolkit under ``CUDA_HOME``/``CUDA_PATH`` (from its
            ``version.json``/``version.txt``, else its directory name), None when unset or unknown.
        ld_library_cudart: (directory, ``major[.minor]``) for each ``LD_LIBRARY_PATH`` directory that
            holds a ``libcudart.so.*``.
    """

    cuda_home_exists: bool | None = None
    cuda_home_version: str | None = None
    ld_library_cudart: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class TorchFacts:
    """What a fresh Python process sees after ``import torch`` (probed in a child process).

    Attributes:
        state: OK, MISSING (torch is not importable) or FAILED (the child crashed or timed out).
        error: why the probe failed or what the import raised.
        version: ``torch.__version__``.
        cuda_build: CUDA version torch was built with (``torch.version.cuda``), None on a CPU build.
        cudnn_build: cuDNN version torch was compiled against, ``major.minor.patch``.
        cuda_available: ``torch.cuda.is_available()``.
        device_count: CUDA devices torch sees.
        cuda_runtime: version of the libcudart actually loaded, ``major.minor``.
        cudnn_loaded: version of the libcudnn actually loaded, ``major.minor.patch``.
        nccl_loaded: version of the NCCL actually loaded, ``major.minor.patch``.
        mkl: ``torch.backends.mkl.is_available()``.
        mkldnn: ``torch.backends.mkldnn.is_available()`` (oneDNN).
        openmp: ``torch.backends.openmp.is_available()``.
        parallel_backend: ATen's intra-op parallel backend, e.g. ``OpenMP``.
        intra_op_threads: ``torch.get_num_threads()`` in a fresh process.
        loaded_libraries: shared libraries mapped in the child after import (from its /proc/self/maps).
        import_s: seconds ``import torch`` took.
    """

    state: ProbeState = ProbeState.OK
    error: str | None = None
    version: str | None = None
    cuda_build: str | None = None
    cudnn_build: str | None = None
    cuda_available: bool = False
    device_count: int = 0
    cuda_runtime: str | None = None
    cudnn_loaded: str | None = None
    nccl_loaded: str | None = None
    mkl: bool | None = None
    mkldnn: bool | None = None
    openmp: bool | None = None
    parallel_backend: str | None = None
    intra_op_threads: int | None = None
    loaded_libraries: tuple[str, ...] = ()
    import_s: float | None = None


@dataclass(frozen=True)
class SmokeFacts:
    """The DataLoader smoke test: workers (and pinned memory where CUDA exists) produce batches.

    Attributes:
        state: OK when it ran to completion or raised inside torch; FAILED when the child process
            itself crashed or timed out (then `error` says which); MISSING when torch is absent.
        error: the exception or failure text.
        num_workers: DataLoader workers used.
        pin_memory: whether the loader pinned memory.
        batches: batches received.
        expected_batches: batches the loader should have produced.
        pinned: every batch came back pinned (None when pinning was not tried).
        elapsed_s: wall time of the loader run.
        timeout_s: the time limit the child ran under.
    """

    state: ProbeState = ProbeState.OK
    error: str | None = None
    num_workers: int = 0
    pin_memory: bool = False
    batches: int = 0
    expected_batches: int = 0
    pinned: bool | None = None
    elapsed_s: float | None = None
    timeout_s: float | None = None


@dataclass(frozen=True)
class GpuFacts:
    """One NVIDIA GPU as NVML reports it. A field NVML does not support on this board is None.

    Attributes:
        throttle_reasons: names of the current clock-event (throttle) reasons, e.g. ``sw_power_cap``.
        ecc_enabled: ECC mode currently on.
        ecc_uncorrected_volatile: uncorrected ECC errors since the last driver load.
        persistence_mode: driver persistence mode on.
        errors: fields NVML failed to read, as ``field: error``.
    """

    index: int
    name: str
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    temperature_c: int | None = None
    slowdown_temperature_c: int | None = None
    ecc_enabled: bool | None = None
    ecc_uncorrected_volatile: int | None = None
    throttle_reasons: tuple[str, ...] = ()
    persistence_mode: bool | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class NvmlFacts:
    """NVML's view of the NVIDIA driver and GPUs.

    Attributes:
        state: OK; MISSING when the NVML library is not found (no NVIDIA driver); FAILED when NVML
            is there but would not initialise (driver not loaded, no permission...).
        driver_version: e.g. ``550.54.15``.
        cuda_driver_version: highest CUDA the driver supports, ``major.minor``.
        nvidia_smi_path: where ``nvidia-smi`` is on PATH, None when it is not.
    """

    state: ProbeState = ProbeState.MISSING
    error: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    gpus: tuple[GpuFacts, ...] = ()
    nvidia_smi_path: str | None = None


@dataclass(frozen=True)
class CpuFacts:
    """CPUs this process may use and how they are clocked.

    Attributes:
        logical_cpus: ``os.cpu_count()``.
        affinity_cpus: CPUs in this process's affinity mask (``Cpus_allowed_list``).
        cgroup_cpu_quota: CPUs' worth of time the cgroup allows; None when there is no quota.
        usable_cores: min(affinity, ceil(quota)): what worker and thread counts should be sized to.
        governors: (governor, number of CPUs using it), empty when cpufreq is not exposed (VMs).
        scaling_driver: cpufreq driver, e.g. ``intel_pstate``, ``acpi-cpufreq``.
        numactl_path: ``numactl`` on PATH, None when not installed.
    """

    cpu_model: str = "unknown"
    flags: frozenset[str] = frozenset()
    logical_cpus: int = 1
    affinity_cpus: int | None = None
    cgroup_cpu_quota: float | None = None
    usable_cores: int = 1
    numa_nodes: tuple[NumaNode, ...] = ()
    governors: tuple[tuple[str, int], ...] = ()
    scaling_driver: str | None = None
    numactl_path: str | None = None

    @property
    def native_bf16(self) -> bool:
        """True when the CPU computes bf16 natively (AVX512-BF16 / AMX on x86, bf16 on Arm)."""
        return bool(self.flags & {"avx512_bf16", "amx_bf16", "bf16"})


@dataclass(frozen=True)
class MemoryFacts:
    """RAM, swap, transparent huge pages and the cgroup memory limit.

    Attributes:
        thp_enabled: the selected mode in ``transparent_hugepage/enabled`` (always/madvise/never).
        thp_defrag: the selected mode in ``transparent_hugepage/defrag``.
        cgroup_memory_limit_bytes: the tightest memory limit of this process's cgroup and its
            ancestors; None when unlimited.
        cgroup_memory_usage_bytes: the cgroup's current usage, when readable.
    """

    mem_total_bytes: int | None = None
    mem_available_bytes: int | None = None
    swap_total_bytes: int | None = None
    swap_free_bytes: int | None = None
    thp_enabled: str | None = None
    thp_defrag: str | None = None
    cgroup_memory_limit_bytes: int | None = None
    cgroup_memory_usage_bytes: int | None = None


@dataclass(frozen=True)
class RLimit:
    """A soft/hard resource limit pair; None in either means unlimited."""

    soft: int | None
    hard: int | None


@dataclass(frozen=True)
class LimitsFacts:
    """Process limits and shared memory, as DataLoader workers will meet them.

    Attributes:
        state: FAILED when ``/proc/self/limits`` could not be read (then `nofile`/`nproc` are None).
        nofile: ``ulimit -n``.
        nproc: ``ulimit -u``.
        shm_total_bytes: size of ``/dev/shm``; None with `shm_error` when it could not be measured.
        shm_free_bytes: free space on ``/dev/shm``.
    """

    state: ProbeState = ProbeState.OK
    error: str | None = None
    nofile: RLimit | None = None
    nproc: RLimit | None = None
    shm_total_bytes: int | None = None
    shm_free_bytes: int | None = None
    shm_error: str | None = None


@dataclass(frozen=True)
class DiskFacts:
    """The storage behind ``--data-dir``.

    Attributes:
        path: the directory as given.
        mount_point: where its filesystem is mounted.
        fstype: e.g. ``ext4``, ``xfs``, ``nfs4``, ``overlay``.
        device: the block device name in /sys/block, e.g. ``nvme0n1``, ``sda``, ``vda``.
        rotational: the kernel's ``queue/rotational`` flag (True: spinning disk).
        free_bytes: space free to this user.
        total_bytes: size of the filesystem.
    """

    path: str
    state: ProbeState = ProbeState.OK
    error: str | None = None
    mount_point: str | None = None
    fstype: str | None = None
    source: str | None = None
    device: str | None = None
    rotational: bool | None = None
    free_bytes: int | None = None
    total_bytes: int | None = None


@dataclass(frozen=True)
class AllocatorFacts:
    """Alternative malloc libraries: installed where, and preloaded or not.

    Attributes:
        jemalloc_paths: ``libjemalloc.so*`` found in the library directories.
        tcmalloc_paths: ``libtcmalloc*.so*`` found in the library directories.
        ld_preload: ``LD_PRELOAD`` plus ``/etc/ld.so.preload`` entries.
    """

    jemalloc_paths: tuple[str, ...] = ()
    tcmalloc_paths: tuple[str, ...] = ()
    ld_preload: tuple[str, ...] = ()


@dataclass(frozen=True)
class AllocationFacts:
    """The scheduler allocation this process runs in (`torchpace.allocation.read_allocation`).

    Attributes:
        allocation: the record; None outside any scheduler, or when its variables cannot be read.
        error: why the scheduler's variables could not be read (a node list, a count), naming the variable.
    """

    allocation: Allocation | None = None
    error: str | None = None


@dataclass(frozen=True)
class DoctorFacts:
    """Everything doctor measured. Built by `probes.collect_facts`; read by the pure checks.

    Attributes:
        probe_errors: (probe name, error) for each probe that raised where it should not have; its
            facts keep their defaults and a check reports the probe as one that could not run.
    """

    distro: DistroInfo = field(default_factory=DistroInfo)
    euid: int | None = None
    python: PythonEnvFacts = field(default_factory=PythonEnvFacts)
    env: EnvFacts = field(default_factory=EnvFacts)
    cuda_toolkit: CudaToolkitFacts = field(default_factory=CudaToolkitFacts)
    torch: TorchFacts = field(default_factory=TorchFacts)
    smoke: SmokeFacts = field(default_factory=SmokeFacts)
    nvml: NvmlFacts = field(default_factory=NvmlFacts)
    cpu: CpuFacts = field(default_factory=CpuFacts)
    memory: MemoryFacts = field(default_factory=MemoryFacts)
    limits: LimitsFacts = field(default_factory=LimitsFacts)
    disk: DiskFacts | None = None
    allocator: AllocatorFacts = field(default_factory=AllocatorFacts)
    allocation: AllocationFacts = field(default_factory=AllocationFacts)
    probe_errors: tuple[tuple[str, str], ...] = ()
