"""Each check with good facts (a healthy GPU host) and bad ones (one fact changed at a time)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from doctor_canned import GiB, healthy_gpu

from torchpace.doctor import checks
from torchpace.doctor.facts import (
    CudaToolkitFacts,
    DiskFacts,
    EnvFacts,
    LimitsFacts,
    NvmlFacts,
    ProbeState,
    PythonEnvFacts,
    RLimit,
    SmokeFacts,
    TorchFacts,
)
from torchpace.findings import Severity
from torchpace.host import DistroInfo, NumaNode

OK, INFO, WARN, FAIL = Severity.OK, Severity.INFO, Severity.WARN, Severity.FAIL


def worst(findings):
    assert findings, "expected at least one finding"
    return max((f.severity for f in findings), key=lambda s: s.rank)


def test_healthy_host_has_nothing_to_fix(healthy):
    findings = checks.run_checks(healthy)
    assert [f.id for f in findings if f.severity.rank >= WARN.rank] == []
    assert all(f.area for f in findings)
    assert len({f.area for f in findings}) == 9  # every area says something


@pytest.mark.parametrize("check", checks.ALL_CHECKS, ids=lambda c: c.__name__)
def test_every_check_is_pure_and_returns_findings(check, healthy):
    first, second = check(healthy), check(healthy)
    assert first == second
    assert all(f.severity in Severity for f in first)


# ------------------------------------------------------------------------------------------ torch


def test_torch_missing_fails_with_pip_command(healthy):
    facts = replace(healthy, torch=TorchFacts(ProbeState.MISSING, "ModuleNotFoundError: No module named 'torch'"))
    [finding] = checks.check_torch_install(facts)
    assert finding.severity is FAIL and "not installed" in finding.title
    assert finding.remedy.command == "/home/user/.venv/bin/python -m pip install torch"


def test_torch_probe_that_could_not_run_is_not_reported_as_missing(healthy):
    facts = replace(healthy, torch=TorchFacts(ProbeState.FAILED, "the torch probe timed out after 60 s and was killed"))
    [finding] = checks.check_torch_install(facts)
    assert finding.severity is FAIL
    assert "could not run" in finding.title and "timed out" in finding.evidence


def test_driver_older_than_build_major_fails(healthy):
    facts = replace(healthy, nvml=replace(healthy.nvml, cuda_driver_version="11.8", driver_version="520.61.05"))
    [finding] = checks.check_cuda_driver(facts)
    assert finding.severity is FAIL
    assert "11.8" in finding.evidence and "12.4" in finding.evidence


def test_driver_older_minor_warns(healthy):
    facts = replace(healthy, nvml=replace(healthy.nvml, cuda_driver_version="12.2"))
    assert worst(checks.check_cuda_driver(facts)) is WARN


def test_cpu_torch_on_gpu_host_fails(healthy):
    facts = replace(healthy, torch=replace(healthy.torch, cuda_build=None, version="2.4.1+cpu"))
    assert worst(checks.check_cuda_driver(facts)) is FAIL


def test_cpu_torch_without_gpus_is_fine(healthy):
    facts = replace(healthy, torch=replace(healthy.torch, cuda_build=None), nvml=NvmlFacts(ProbeState.MISSING, "no NVML"))
    assert worst(checks.check_cuda_driver(facts)) is OK
    assert checks.check_cuda_runtime(facts) == [] and checks.check_cudnn(facts) == [] and checks.check_nccl(facts) == []


def test_loaded_cuda_runtime_of_other_major_fails(healthy):
    facts = replace(healthy, torch=replace(healthy.torch, cuda_runtime="11.8"))
    assert worst(checks.check_cuda_runtime(facts)) is FAIL


def test_torch_not_seeing_gpus_fails(healthy):
    facts = replace(healthy, torch=replace(healthy.torch, cuda_available=False, device_count=0))
    assert any(f.id == "torch.cuda_available" and f.severity is FAIL for f in checks.check_cuda_runtime(facts))


@pytest.mark.parametrize("loaded, severity", [("9.1.0", OK), ("9.3.0", OK), ("9.0.0", FAIL), ("8.9.7", FAIL), (None, WARN)])
def test_cudnn_loaded_against_compiled(healthy, loaded, severity):
    facts = replace(healthy, torch=replace(healthy.torch, cudnn_loaded=loaded))
    [finding] = checks.check_cudnn(facts)
    assert finding.severity is severity
    if loaded:
        assert finding.data["path"].endswith("libcudnn.so.9")


def test_nccl_missing_on_multi_gpu_warns(healthy):
    facts = replace(healthy, torch=replace(healthy.torch, nccl_loaded=None))
    assert worst(checks.check_nccl(facts)) is WARN
    assert "2.20.5" in checks.check_nccl(healthy)[0].title


def test_cpu_backends(healthy):
    assert worst(checks.check_cpu_backends(replace(healthy, torch=replace(healthy.torch, mkldnn=False)))) is WARN
    assert worst(checks.check_cpu_backends(replace(healthy, torch=replace(healthy.torch, mkl=False)))) is INFO


def test_python_env_outside_venv_suggests_venv_with_distro_package(healthy):
    facts = replace(healthy, python=PythonEnvFacts("3.10.12", "/usr/bin/python3", "/usr", "/usr"))
    [finding] = checks.check_python_env(facts)
    assert finding.severity is INFO
    assert finding.remedy.command == "sudo apt-get install -y python3-venv"
    conda = replace(facts, python=replace(facts.python, conda_prefix="/opt/conda/envs/train"))
    assert checks.check_python_env(conda)[0].severity is OK


def test_cuda_home_of_other_major_warns(healthy):
    facts = replace(healthy, env=EnvFacts(cuda_home="/usr/local/cuda-11.8"),
                    cuda_toolkit=CudaToolkitFacts(cuda_home_exists=True, cuda_home_version="11.8"))
    [finding] = checks.check_cuda_home(facts)
    assert finding.severity is WARN and "11.8" in finding.evidence


def test_cuda_home_other_minor_informs_and_same_is_ok(healthy):
    minor = replace(healthy, env=EnvFacts(cuda_home="/usr/local/cuda-12.1"),
                    cuda_toolkit=CudaToolkitFacts(cuda_home_exists=True, cuda_home_version="12.1"))
    assert worst(checks.check_cuda_home(minor)) is INFO
    same = replace(minor, cuda_toolkit=CudaToolkitFacts(cuda_home_exists=True, cuda_home_version="12.4"))
    assert worst(checks.check_cuda_home(same)) is OK
    assert checks.check_cuda_home(healthy) == []


def test_cuda_home_missing_directory_warns(healthy):
    facts = replace(healthy, env=EnvFacts(cuda_home="/opt/cuda"), cuda_toolkit=CudaToolkitFacts(cuda_home_exists=False))
    assert worst(checks.check_cuda_home(facts)) is WARN


def test_ld_library_path_with_other_cuda_warns(healthy):
    facts = replace(healthy, cuda_toolkit=CudaToolkitFacts(ld_library_cudart=(("/usr/local/cuda-11.8/lib64", "11.8"),)))
    [finding] = checks.check_ld_library_path(facts)
    assert finding.severity is WARN and finding.data["directory"] == "/usr/local/cuda-11.8/lib64"
    same = replace(healthy, cuda_toolkit=CudaToolkitFacts(ld_library_cudart=(("/usr/local/cuda/lib64", "12"),)))
    assert worst(checks.check_ld_library_path(same)) is OK


@pytest.mark.parametrize("value, severity", [("1", WARN), (" 1 ", WARN), ("0", OK), (None, OK)])
def test_cuda_launch_blocking(healthy, value, severity):
    facts = replace(healthy, env=EnvFacts(cuda_launch_blocking=value))
    assert worst(checks.check_cuda_launch_blocking(facts)) is severity


@pytest.mark.parametrize("value, severity", [
    ("expandable_segments:True", INFO),
    ("max_split_size_mb:128,garbage_collection_threshold:0.8", INFO),
    ("expandable_segments", WARN),
    ("max_split_size_mb:128,not_a_key:1", INFO),
])
def test_alloc_conf(healthy, value, severity):
    facts = replace(healthy, env=EnvFacts(pytorch_cuda_alloc_conf=value))
    [finding] = checks.check_alloc_conf(facts)
    assert finding.severity is severity and value in finding.evidence


def test_parse_alloc_conf():
    assert checks.parse_alloc_conf("a:1, b:2") == ({"a": "1", "b": "2"}, [])
    assert checks.parse_alloc_conf("a:1,bad,:x") == ({"a": "1"}, ["bad", ":x"])


# ------------------------------------------------------------------------------------------- GPUs


def test_nvml_library_not_found_is_one_info_line(healthy):
    facts = replace(healthy, nvml=NvmlFacts(ProbeState.MISSING, "NVML library not found (no NVIDIA driver)"))
    gpu_findings = [f for check in checks.ALL_CHECKS for f in check(facts) if f.area == "gpu"]
    assert len(gpu_findings) == 1
    assert gpu_findings[0].severity is INFO and "NVML library not found" in gpu_findings[0].evidence


def test_nvml_that_could_not_run_warns(healthy):
    facts = replace(healthy, nvml=NvmlFacts(ProbeState.FAILED, "NVML did not initialise: Driver Not Loaded"))
    assert worst(checks.check_nvml(facts)) is WARN


def _with_gpu(healthy, **changes):
    return replace(healthy, nvml=replace(healthy.nvml, gpus=(healthy_gpu(0), replace(healthy_gpu(1), **changes))))


def test_hot_gpu_warns_near_its_slowdown_threshold(healthy):
    [finding] = checks.check_gpu_temperature(_with_gpu(healthy, temperature_c=87))
    assert finding.severity is WARN and finding.data == {"gpu_index": 1, "temperature_c": 87, "threshold_c": 85}
    assert worst(checks.check_gpu_temperature(_with_gpu(healthy, temperature_c=84))) is OK
    no_threshold = _with_gpu(healthy, temperature_c=86, slowdown_temperature_c=None)
    assert worst(checks.check_gpu_temperature(no_threshold)) is WARN


def test_uncorrected_ecc_errors_fail(healthy):
    [finding] = checks.check_gpu_ecc(_with_gpu(healthy, ecc_uncorrected_volatile=3))
    assert finding.severity is FAIL and finding.remedy.command == "sudo nvidia-smi --gpu-reset -i 1"


@pytest.mark.parametrize("reasons, severity", [
    (("gpu_idle",), OK),
    (("sw_power_cap",), INFO),
    (("sw_thermal_slowdown",), WARN),
    (("hw_slowdown", "sw_power_cap"), FAIL),
])
def test_throttle_reasons(healthy, reasons, severity):
    assert worst(checks.check_gpu_throttle(_with_gpu(healthy, throttle_reasons=reasons))) is severity


def test_persistence_mode_off_warns(healthy):
    [finding] = checks.check_gpu_persistence(_with_gpu(healthy, persistence_mode=False))
    assert finding.severity is WARN and finding.remedy.command == "sudo nvidia-smi -pm 1"
    assert worst(checks.check_gpu_persistence(_with_gpu(healthy, persistence_mode=None))) is OK  # not supported


def test_pcie_link(healthy):
    assert worst(checks.check_gpu_pcie(_with_gpu(healthy, pcie_width_current=8))) is WARN
    assert worst(checks.check_gpu_pcie(_with_gpu(healthy, pcie_gen_current=1))) is WARN
    idle = _with_gpu(healthy, pcie_gen_current=1, throttle_reasons=("gpu_idle",))
    assert worst(checks.check_gpu_pcie(idle)) is INFO


def test_gpu_memory_held_by_another_process_warns(healthy):
    assert worst(checks.check_gpu_memory_in_use(_with_gpu(healthy, memory_used_bytes=40 * GiB))) is WARN


def test_mixed_gpu_models_warn(healthy):
    facts = replace(healthy, nvml=replace(healthy.nvml, gpus=(healthy_gpu(0), healthy_gpu(1, "NVIDIA A10"))))
    [finding] = checks.check_gpu_mixed(facts)
    assert finding.severity is WARN and finding.data["models"] == ["NVIDIA A10", "NVIDIA A100-SXM4-80GB"]
    assert checks.check_gpu_mixed(healthy) == []


def test_missing_nvidia_smi_gives_the_distro_package(healthy):
    facts = replace(healthy, nvml=replace(healthy.nvml, nvidia_smi_path=None))
    [finding] = checks.check_nvidia_smi(facts)
    assert finding.severity is INFO
    assert finding.remedy.command == "sudo apt-get install -y nvidia-utils-550"
    rocky = replace(facts, distro=DistroInfo(id="rocky", id_like=("rhel", "centos", "fedora"), version_id="9.3"))
    assert checks.check_nvidia_smi(rocky)[0].remedy.command == "sudo dnf install -y nvidia-driver-cuda"


# -------------------------------------------------------------------------------------------- CPU


def test_usable_cores_below_cpu_count_informs(healthy):
    facts = replace(healthy, cpu=replace(healthy.cpu, affinity_cpus=64, cgroup_cpu_quota=8.0, usable_cores=8))
    [finding] = checks.check_usable_cores(facts)
    assert finding.severity is INFO
    assert finding.data["usable_cores"] == 8 and finding.data["logical_cpus"] == 64


@pytest.mark.parametrize("omp, mkl, severity", [
    (None, None, OK), ("8", None, OK), ("64", "64", OK), ("65", None, WARN), (None, "128", WARN), ("abc", None, WARN),
    ("0", None, WARN),
])
def test_thread_env_against_usable_cores(healthy, omp, mkl, severity):
    facts = replace(healthy, env=EnvFacts(omp_num_threads=omp, mkl_num_threads=mkl))
    assert worst(checks.check_thread_env(facts)) is severity


def test_numa_nodes_suggest_numactl(healthy):
    two = (NumaNode(0, tuple(range(32))), NumaNode(1, tuple(range(32, 64))))
    facts = replace(healthy, cpu=replace(healthy.cpu, numa_nodes=two, numactl_path=None))
    [finding] = checks.check_numa(facts)
    assert finding.severity is INFO and finding.remedy.command == "sudo apt-get install -y numactl"


@pytest.mark.parametrize("governors, driver, severity", [
    ((("performance", 64),), "intel_pstate", OK),
    ((("powersave", 64),), "acpi-cpufreq", WARN),
    ((("powersave", 64),), "intel_pstate", INFO),
    ((("schedutil", 64),), "acpi-cpufreq", INFO),
    ((), None, INFO),
])
def test_governor(healthy, governors, driver, severity):
    facts = replace(healthy, cpu=replace(healthy.cpu, governors=governors, scaling_driver=driver))
    assert worst(checks.check_governor(facts)) is severity


def test_governor_remedy_installs_cpupower_for_the_distro(healthy):
    facts = replace(healthy, euid=0, cpu=replace(healthy.cpu, governors=(("powersave", 4),), scaling_driver="acpi-cpufreq"),
                    distro=DistroInfo(id="debian", version_id="12"))
    command = checks.check_governor(facts)[0].remedy.command
    assert command == "apt-get install -y linux-cpupower && cpupower frequency-set -g performance"


def test_bf16(healthy):
    assert worst(checks.check_bf16(healthy)) is OK
    assert worst(checks.check_bf16(replace(healthy, cpu=replace(healthy.cpu, flags=frozenset({"avx2"}))))) is INFO


# ----------------------------------------------------------------------------------------- memory


@pytest.mark.parametrize("enabled, defrag, severity", [
    ("madvise", "madvise", OK), ("always", "madvise", OK), ("never", "madvise", INFO), ("always", "always", INFO),
    (None, None, INFO),
])
def test_thp(healthy, enabled, defrag, severity):
    facts = replace(healthy, memory=replace(healthy.memory, thp_enabled=enabled, thp_defrag=defrag))
    assert worst(checks.check_thp(facts)) is severity


@pytest.mark.parametrize("total, free, severity", [(0, 0, OK), (8 * GiB, 8 * GiB - 2**20, INFO), (8 * GiB, 5 * GiB, WARN)])
def test_swap(healthy, total, free, severity):
    facts = replace(healthy, memory=replace(healthy.memory, swap_total_bytes=total, swap_free_bytes=free))
    assert worst(checks.check_swap(facts)) is severity


@pytest.mark.parametrize("limit, usage, severity", [
    (None, None, OK), (32 * GiB, 2 * GiB, INFO), (16 * GiB, 15 * GiB, WARN), (1024 * GiB, GiB, OK),
])
def test_cgroup_memory(healthy, limit, usage, severity):
    facts = replace(healthy, memory=replace(healthy.memory, cgroup_memory_limit_bytes=limit, cgroup_memory_usage_bytes=usage))
    assert worst(checks.check_cgroup_memory(facts)) is severity


# ----------------------------------------------------------------------------------------- limits


@pytest.mark.parametrize("soft, hard, severity", [
    (1048576, 1048576, OK), (None, None, OK), (4096, 4096, WARN), (256, 256, FAIL), (1024, 524288, WARN),
])
def test_nofile_against_worker_needs(healthy, soft, hard, severity):
    facts = replace(healthy, limits=replace(healthy.limits, nofile=RLimit(soft, hard)))
    [finding] = checks.check_nofile(facts)
    assert finding.severity is severity
    assert finding.data["needed"] == checks.nofile_needed(64)


def test_nofile_remedy_depends_on_the_hard_limit(healthy):
    raisable = replace(healthy, limits=replace(healthy.limits, nofile=RLimit(1024, 524288)))
    assert checks.check_nofile(raisable)[0].remedy.command == f"ulimit -n {checks.nofile_needed(64)}"
    capped = replace(healthy, limits=replace(healthy.limits, nofile=RLimit(256, 256)))
    remedy = checks.check_nofile(capped)[0].remedy
    assert remedy.command is None and "limits.conf" in remedy.text


def test_unreadable_limits_say_so(healthy):
    facts = replace(healthy, limits=LimitsFacts(ProbeState.FAILED, "could not read /proc/self/limits"))
    assert worst(checks.check_nofile(facts)) is WARN
    assert "could not read" in checks.check_nofile(facts)[0].evidence


def test_nproc(healthy):
    low = replace(healthy, limits=replace(healthy.limits, nproc=RLimit(256, 4096)))
    assert worst(checks.check_nproc(low)) is WARN


def test_shm_against_workers_times_batches(healthy):
    small = replace(healthy, limits=replace(healthy.limits, shm_total_bytes=64 * 2**20, shm_free_bytes=64 * 2**20))
    [finding] = checks.check_shm(small)
    assert finding.severity is FAIL
    assert finding.data["needed_bytes"] == checks.shm_needed_bytes(64) == 64 * 2 * 64 * 3 * 224 * 224 * 4
    assert "--shm-size" in finding.remedy.text
    missing = replace(healthy, limits=replace(healthy.limits, shm_total_bytes=None, shm_free_bytes=None,
                                              shm_error="FileNotFoundError: /dev/shm"))
    assert worst(checks.check_shm(missing)) is FAIL


# ---------------------------------------------------------------------------------------- storage


@pytest.mark.parametrize("fstype, device, rotational, severity, kind", [
    ("ext4", "nvme1n1", False, OK, "nvme"),
    ("xfs", "sda", False, OK, "ssd"),
    ("ext4", "sdb", True, WARN, "hdd"),
    ("nfs4", None, None, WARN, "network"),
    ("fuse.s3fs", None, None, WARN, "network"),
    ("ext4", "vda", True, INFO, "virtual"),
    ("overlay", None, None, OK, "overlay"),
    ("tmpfs", None, None, OK, "memory"),
])
def test_data_dir_disk_kind(healthy, fstype, device, rotational, severity, kind):
    facts = replace(healthy, disk=replace(healthy.disk, fstype=fstype, device=device, rotational=rotational))
    [finding] = checks.check_data_dir(facts)
    assert finding.severity is severity and finding.data["kind"] == kind


def test_no_data_dir_and_failed_probe(healthy):
    assert worst(checks.check_data_dir(replace(healthy, disk=None))) is INFO
    assert checks.check_disk_free(replace(healthy, disk=None)) == []
    failed = replace(healthy, disk=DiskFacts("/data", ProbeState.FAILED, "PermissionError: denied"))
    assert worst(checks.check_data_dir(failed)) is WARN


@pytest.mark.parametrize("free, total, severity", [(1024 * GiB, 4096 * GiB, OK), (5 * GiB, 100 * GiB, WARN),
                                                   (100 * GiB, 4096 * GiB, WARN)])
def test_disk_free(healthy, free, total, severity):
    facts = replace(healthy, disk=replace(healthy.disk, free_bytes=free, total_bytes=total))
    assert worst(checks.check_disk_free(facts)) is severity


# -------------------------------------------------------------------------------------- allocator


def test_allocator_preloaded_installed_or_missing(healthy):
    assert worst(checks.check_allocator(healthy)) is OK
    installed = replace(healthy, allocator=replace(healthy.allocator, ld_preload=()),
                        torch=replace(healthy.torch, loaded_libraries=()))
    [finding] = checks.check_allocator(installed)
    assert finding.severity is INFO and finding.remedy.command.startswith("export LD_PRELOAD=")
    none = replace(installed, allocator=replace(installed.allocator, jemalloc_paths=()))
    assert checks.check_allocator(none)[0].remedy.command == "sudo apt-get install -y libjemalloc2"
    rocky = replace(none, euid=0, distro=DistroInfo(id="rocky", id_like=("rhel",), version_id="9.3"))
    assert checks.check_allocator(rocky)[0].remedy.command == "dnf install -y jemalloc"


# ------------------------------------------------------------------------------------------ smoke


def test_smoke_failures(healthy):
    assert worst(checks.check_dataloader_smoke(healthy)) is OK
    short = replace(healthy, smoke=replace(healthy.smoke, batches=3, error="RuntimeError: DataLoader worker exited"))
    assert worst(checks.check_dataloader_smoke(short)) is FAIL
    unpinned = replace(healthy, smoke=replace(healthy.smoke, pinned=False))
    assert worst(checks.check_dataloader_smoke(unpinned)) is FAIL
    hung = replace(healthy, smoke=SmokeFacts(ProbeState.FAILED, "the smoke test timed out after 60 s", timeout_s=60))
    [finding] = checks.check_dataloader_smoke(hung)
    assert finding.severity is FAIL and "timed out" in finding.evidence
    assert checks.check_dataloader_smoke(replace(healthy, smoke=SmokeFacts(ProbeState.MISSING))) == []


def test_probe_errors_become_findings(healthy):
    facts = replace(healthy, probe_errors=(("cpu", "ValueError: invalid literal for int()"),))
    [finding] = checks.check_probe_errors(facts)
    assert finding.id == "doctor.probe.cpu" and finding.severity is WARN


def test_format_bytes():
    assert checks.format_bytes(None) == "unknown"
    assert checks.format_bytes(512) == "512 B"
    assert checks.format_bytes(3 * GiB) == "3.0 GiB"


def test_allocator_evidence_names_one_path_per_library_and_the_json_keeps_them_all(healthy):
    jemalloc = ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "/lib/x86_64-linux-gnu/libjemalloc.so.2")
    tcmalloc = tuple(f"/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.{n}" for n in range(9))
    facts = replace(healthy, allocator=replace(healthy.allocator, ld_preload=(), jemalloc_paths=jemalloc,
                                               tcmalloc_paths=tcmalloc), torch=replace(healthy.torch, loaded_libraries=()))
    [finding] = checks.check_allocator(facts)
    assert finding.evidence == f"jemalloc: {jemalloc[0]} (+1 more); tcmalloc: {tcmalloc[0]} (+8 more)"
    assert finding.data["installed"] == [*jemalloc, *tcmalloc]


# ---- the scheduler allocation ---------------------------------------------------------------------------------

def _in_allocation(facts, env):
    from torchpace.doctor.probes import probe_allocation

    return replace(facts, allocation=probe_allocation(env))


def test_no_allocation_is_said_so(healthy):
    findings = checks.check_allocation(_in_allocation(healthy, {}))
    assert [(f.id, f.severity) for f in findings] == [("cluster.allocation", OK)]
    assert "Not in a scheduler allocation" in findings[0].title


def test_a_step_that_fits_its_allocation_has_only_the_record(healthy):
    gpus = ",".join(str(i) for i in range(len(healthy.nvml.gpus)))
    env = {"SLURM_JOB_ID": "12", "SLURM_JOB_NAME": "train", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "n1",
           "SLURM_CPUS_PER_TASK": "64", "SLURM_STEP_GPUS": gpus, "SLURM_STEP_ID": "0"}
    findings = checks.check_allocation(_in_allocation(healthy, env))
    assert [(f.id, f.severity) for f in findings] == [("cluster.allocation", OK)]
    assert "slurm job 12 (train): 1 node(s)" in findings[0].evidence and findings[0].data["master_addr"] == "n1"


def test_what_does_not_fit_the_allocation_is_named(healthy):
    env = {"SLURM_JOB_ID": "12", "SLURM_JOB_NAME": "bash", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "n[1-2]",
           "SLURM_CPUS_PER_TASK": "1", "SLURM_STEP_GPUS": "0"}
    facts = _in_allocation(replace(healthy, env=replace(healthy.env, omp_num_threads="8")), env)
    found = {f.id: f for f in checks.check_allocation(facts)}
    assert found["cluster.threads"].severity == WARN and "OMP_NUM_THREADS=8 > SLURM_CPUS_PER_TASK=1" in found["cluster.threads"].evidence
    assert found["cluster.srun"].severity == WARN and "no SLURM_STEP_ID" in found["cluster.srun"].evidence
    assert found["cluster.interactive"].severity == INFO
    assert len(healthy.nvml.gpus) > 1  # the canned host's GPUs are all visible; the step was given one
    assert found["cluster.gpus"].severity == WARN and found["cluster.gpus"].data["step_gpus"] == ["0"]


def test_variables_that_cannot_be_read_are_a_warning_naming_them(healthy):
    findings = checks.check_allocation(_in_allocation(healthy, {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n[1-"}))
    assert [(f.id, f.severity) for f in findings] == [("cluster.allocation", WARN)]
    assert "cannot read the SLURM node list 'n[1-'" in findings[0].evidence
