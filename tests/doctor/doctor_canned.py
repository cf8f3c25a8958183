"""Canned doctor facts shared by the doctor tests (a module of its own, so tests can import it by name)."""

from __future__ import annotations

from pathlib import Path

from torchpace.doctor.facts import (
    AllocatorFacts,
    CpuFacts,
    DiskFacts,
    DoctorFacts,
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
from torchpace.host import DistroInfo, NumaNode

FIXTURES = Path(__file__).parents[1] / "fixtures" / "doctor"
GiB = 2**30

_SITE = "/home/user/.venv/lib/python3.10/site-packages"


def healthy_gpu(index: int = 0, name: str = "NVIDIA A100-SXM4-80GB") -> GpuFacts:
    """A GPU with nothing wrong: cool, no ECC errors, not throttled, persistence on, full PCIe link."""
    return GpuFacts(
        index=index, name=name, memory_total_bytes=80 * GiB, memory_used_bytes=GiB // 2,
        temperature_c=38, slowdown_temperature_c=90, ecc_enabled=True, ecc_uncorrected_volatile=0,
        throttle_reasons=(), persistence_mode=True, pcie_gen_current=4, pcie_gen_max=4,
        pcie_width_current=16, pcie_width_max=16,
    )


def build_healthy_facts() -> DoctorFacts:
    """Canned facts of a well set-up 2-GPU Ubuntu 22.04 training host."""
    return DoctorFacts(
        distro=DistroInfo(id="ubuntu", id_like=("debian",), version_id="22.04", pretty_name="Ubuntu 22.04.4 LTS"),
        euid=1000,
        python=PythonEnvFacts("3.10.12", "/home/user/.venv/bin/python", "/home/user/.venv", "/usr"),
        torch=TorchFacts(
            version="2.4.1+cu124", cuda_build="12.4", cudnn_build="9.1.0", cuda_available=True, device_count=2,
            cuda_runtime="12.4", cudnn_loaded="9.1.0", nccl_loaded="2.20.5", mkl=True, mkldnn=True, openmp=True,
            parallel_backend="OpenMP", intra_op_threads=32, import_s=2.4,
            loaded_libraries=(f"{_SITE}/nvidia/cuda_runtime/lib/libcudart.so.12", f"{_SITE}/nvidia/cudnn/lib/libcudnn.so.9",
                              f"{_SITE}/nvidia/nccl/lib/libnccl.so.2"),
        ),
        smoke=SmokeFacts(num_workers=2, pin_memory=True, batches=8, expected_batches=8, pinned=True, elapsed_s=0.2,
                         timeout_s=60),
        nvml=NvmlFacts(ProbeState.OK, None, "550.54.15", "12.4", (healthy_gpu(0), healthy_gpu(1)), "/usr/bin/nvidia-smi"),
        cpu=CpuFacts(
            cpu_model="Intel(R) Xeon(R) Platinum 8480+", flags=frozenset({"avx512f", "amx_bf16", "avx512_bf16"}),
            logical_cpus=64, affinity_cpus=64, usable_cores=64, numa_nodes=(NumaNode(0, tuple(range(64))),),
            governors=(("performance", 64),), scaling_driver="intel_pstate", numactl_path="/usr/bin/numactl",
        ),
        memory=MemoryFacts(512 * GiB, 480 * GiB, 0, 0, "madvise", "madvise", None, None),
        limits=LimitsFacts(nofile=RLimit(1048576, 1048576), nproc=RLimit(None, None),
                           shm_total_bytes=256 * GiB, shm_free_bytes=256 * GiB),
        disk=DiskFacts("/data/imagenet", mount_point="/data", fstype="ext4", source="/dev/nvme1n1p1",
                       device="nvme1n1", rotational=False, free_bytes=1024 * GiB, total_bytes=4096 * GiB),
        allocator=AllocatorFacts(jemalloc_paths=("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",),
                                 ld_preload=("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",)),
    )
