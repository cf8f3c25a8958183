"""Canned doctor facts shared by the doctor tests (a module of its own, so tests can import it by name)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pynvml

from torchpace.doctor import probes
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


# ------------------------------------------------------------------ stand-ins for the world


def canned_runner(path: Path, **changes):
    def runner(argv, timeout_s, env):
        assert argv[1] == "-c" and "import torch" in argv[2]
        fields = dict(returncode=0, stdout=path.read_text(), stderr="")
        fields.update(changes)
        return probes.CommandResult(tuple(argv), **fields)

    return runner


class FakeNvml:
    """Stands in for the pynvml module: same error classes and constants, canned device answers."""

    NVMLError = pynvml.NVMLError
    NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC
    NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED

    def __init__(self, devices, init_error=None):
        self.devices, self.init_error, self.shut_down = devices, init_error, False

    def _answer(self, handle, key):
        value = self.devices[handle][key]
        if isinstance(value, Exception):
            raise value
        return value

    def nvmlInit(self):
        if self.init_error:
            raise self.init_error

    def nvmlShutdown(self):
        self.shut_down = True

    def nvmlSystemGetDriverVersion(self):
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self):
        return 12040

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetName(self, h):
        return self._answer(h, "name")

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=self._answer(h, "total"), used=self._answer(h, "used"), free=0)

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == self.NVML_TEMPERATURE_GPU
        return self._answer(h, "temp")

    def nvmlDeviceGetTemperatureThreshold(self, h, kind):
        return self._answer(h, "slowdown")

    def nvmlDeviceGetEccMode(self, h):
        return self._answer(h, "ecc")

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter):
        assert (error_type, counter) == (self.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, self.NVML_VOLATILE_ECC)
        return self._answer(h, "ecc_errors")

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._answer(h, "reasons")

    def nvmlDeviceGetPersistenceMode(self, h):
        return self._answer(h, "persistence")

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return self._answer(h, "gen")

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return self._answer(h, "gen_max")

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return self._answer(h, "width")

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return self._answer(h, "width_max")


A100 = dict(name="NVIDIA A100-SXM4-80GB", total=80 * 2**30, used=2**29, temp=41, slowdown=90, ecc=[1, 1],
             ecc_errors=0, reasons=0x1, persistence=1, gen=4, gen_max=4, width=16, width_max=16)


def no_nvml():
    return FakeNvml([], init_error=pynvml.NVMLError_LibraryNotFound())
