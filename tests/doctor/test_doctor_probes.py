"""Probes over fixture trees shaped like real /proc and /sys, the NVML probe over a stand-in NVML,
and the command runner and torch child over real subprocesses."""

from __future__ import annotations

import importlib.metadata
import os
import sys
import time
from pathlib import Path

import pynvml
import pytest
from doctor_canned import A100, FIXTURES, FakeNvml, canned_runner, no_nvml

from torchpace.doctor import probes
from torchpace.doctor.facts import EnvFacts, ProbeState, PythonEnvFacts, RLimit

# ------------------------------------------------------------------------------- fixture: Debian VM


def test_debian_vm_cpu(fixture_root):
    cpu = probes.probe_cpu(fixture_root("debian12-vm"), "/usr/bin:/bin")
    assert cpu.cpu_model == "AMD EPYC"
    assert (cpu.logical_cpus, cpu.affinity_cpus, cpu.cgroup_cpu_quota, cpu.usable_cores) == (2, 2, None, 2)
    assert [n.cpus for n in cpu.numa_nodes] == [(0, 1)]
    assert cpu.governors == () and cpu.scaling_driver is None  # a VM without cpufreq
    assert cpu.native_bf16  # avx512_bf16 in the real flags
    assert cpu.numactl_path is None


def test_debian_vm_memory_with_hybrid_cgroups(fixture_root):
    memory = probes.probe_memory(fixture_root("debian12-vm"))
    assert memory.mem_total_bytes == 24684084 * 1024
    assert (memory.swap_total_bytes, memory.swap_free_bytes) == (0, 0)
    assert (memory.thp_enabled, memory.thp_defrag) == ("madvise", "madvise")
    assert memory.cgroup_memory_limit_bytes is None  # v1 writes "unlimited" as 9223372036854771712
    assert memory.cgroup_memory_usage_bytes == 138608640  # the process's own memory cgroup, deepest first


def test_debian_vm_limits(fixture_root):
    limits = probes.probe_limits(fixture_root("debian12-vm"))
    assert limits.state is ProbeState.OK
    assert limits.nofile == RLimit(20000, 20000) and limits.nproc == RLimit(96365, 96365)


def test_debian_vm_block_device_is_virtio(fixture_root):
    root = fixture_root("debian12-vm")
    mount = probes.find_mount(probes.parse_mountinfo(probes.read_text(root, "proc/self/mountinfo")), "/home/me/data", None)
    assert (mount.mount_point, mount.fstype, mount.source, mount.device) == ("/", "ext4", "/dev/vda", "254:0")
    assert probes.probe_block_device(root, mount.device) == ("vda", True)


# ----------------------------------------------------------------------- fixture: Rocky 9, cgroup v2


def test_rocky_cpu_quota_affinity_numa_governor(fixture_root):
    cpu = probes.probe_cpu(fixture_root("rocky9-numa-cgroup2"), "/usr/bin")
    assert cpu.logical_cpus == 80  # sys/devices/system/cpu/online: 0-79
    assert cpu.affinity_cpus == 32  # Cpus_allowed_list: 0-15,40-55
    assert cpu.cgroup_cpu_quota == 12.0  # cpu.max 1200000 100000 on the service; its parent is unlimited
    assert cpu.usable_cores == 12
    assert len(cpu.numa_nodes) == 2
    assert cpu.governors == (("powersave", 4),) and cpu.scaling_driver == "acpi-cpufreq"
    assert not cpu.native_bf16


def test_rocky_memory_swap_thp_cgroup(fixture_root):
    memory = probes.probe_memory(fixture_root("rocky9-numa-cgroup2"))
    assert memory.swap_total_bytes - memory.swap_free_bytes == (8388604 - 5242876) * 1024
    assert (memory.thp_enabled, memory.thp_defrag) == ("never", "always")
    assert memory.cgroup_memory_limit_bytes == 16 * 2**30
    assert memory.cgroup_memory_usage_bytes == 15 * 2**30


def test_rocky_limits(fixture_root):
    limits = probes.probe_limits(fixture_root("rocky9-numa-cgroup2"))
    assert limits.nofile == RLimit(1024, 524288) and limits.nproc == RLimit(256, 1545567)


@pytest.mark.parametrize("path, mount_point, fstype, device, rotational", [
    ("/data/imagenet", "/data", "ext4", "sdb", True),  # a partition: rotational comes from its disk
    ("/home/me/data", "/", "xfs", "nvme0n1", False),
    ("/mnt/datasets/coco", "/mnt/datasets", "nfs4", None, None),
    ("/mnt/my bucket/x", "/mnt/my bucket", "fuse.s3fs", None, None),  # \040 in mountinfo is a space
    ("/database", "/", "xfs", "nvme0n1", False),  # "/data" is not a prefix of "/database"
])
def test_rocky_mounts_and_block_devices(fixture_root, path, mount_point, fstype, device, rotational):
    root = fixture_root("rocky9-numa-cgroup2")
    mount = probes.find_mount(probes.parse_mountinfo(probes.read_text(root, "proc/self/mountinfo")), path, None)
    assert (mount.mount_point, mount.fstype) == (mount_point, fstype)
    assert probes.probe_block_device(root, mount.device) == (device, rotational)


def test_find_mount_prefers_the_device_of_the_path():
    entries = [probes.MountEntry("8:1", "/", "ext4", "/dev/sda1"), probes.MountEntry("0:40", "/", "overlay", "overlay")]
    assert probes.find_mount(entries, "/x", "8:1").fstype == "ext4"
    assert probes.find_mount(entries, "/x", "9:9").fstype == "overlay"  # longest, last wins on a tie


def test_rocky_allocator_and_preload(fixture_root):
    root = fixture_root("rocky9-numa-cgroup2")
    facts = probes.probe_allocator(root, EnvFacts(ld_preload="/opt/x/libtcmalloc.so.4 /y/libfoo.so"),
                                   PythonEnvFacts(prefix="/nonexistent"))
    assert facts.jemalloc_paths == ("/usr/lib64/libjemalloc.so.2",)
    assert facts.tcmalloc_paths == ("/usr/lib64/libtcmalloc_minimal.so.4",)
    assert facts.ld_preload == ("/opt/x/libtcmalloc.so.4", "/y/libfoo.so")  # comment line of ld.so.preload skipped


def test_rocky_cuda_toolkit(fixture_root):
    root = fixture_root("rocky9-numa-cgroup2")
    env = EnvFacts(cuda_home="/usr/local/cuda-11.8", ld_library_path="/usr/local/cuda-11.8/lib64::/missing")
    facts = probes.probe_cuda_toolkit(root, env)
    assert facts.cuda_home_exists and facts.cuda_home_version == "11.8"
    assert facts.ld_library_cudart == (("/usr/local/cuda-11.8/lib64", "11.8"),)
    missing = probes.probe_cuda_toolkit(root, EnvFacts(cuda_home="/opt/cuda-12.1"))
    assert (missing.cuda_home_exists, missing.cuda_home_version) == (False, None)
    assert probes.probe_cuda_toolkit(root, EnvFacts()).cuda_home_exists is None


def test_rocky_distro_and_which(fixture_root):
    root = fixture_root("rocky9-numa-cgroup2")
    assert probes._probe_distro(root).family == "rhel"
    assert probes.which(root, "nvidia-smi", "/usr/local/bin:/usr/bin") == "/usr/bin/nvidia-smi"
    assert probes.which(root, "numactl", "/usr/local/bin:/usr/bin") is None


# ------------------------------------------------------------------- fixture: Docker on cgroup v1


def test_docker_cgroup_v1_quota_found_at_the_mount_root(fixture_root):
    """/proc/self/cgroup names /docker/<id>, but the container sees its own cgroup as the mount root."""
    root = fixture_root("ubuntu2204-docker-cgroup1")
    cpu = probes.probe_cpu(root, "/usr/bin")
    assert (cpu.logical_cpus, cpu.affinity_cpus, cpu.cgroup_cpu_quota, cpu.usable_cores) == (64, 64, 8.0, 8)
    memory = probes.probe_memory(root)
    assert memory.cgroup_memory_limit_bytes == 32 * 2**30
    assert probes.probe_limits(root).nproc == RLimit(None, None)


def test_docker_bind_mounted_dataset(fixture_root):
    root = fixture_root("ubuntu2204-docker-cgroup1")
    entries = probes.parse_mountinfo(probes.read_text(root, "proc/self/mountinfo"))
    data = probes.find_mount(entries, "/workspace/data/train", None)
    assert (data.fstype, data.source) == ("ext4", "/dev/sda1")
    assert probes.probe_block_device(root, data.device) == ("sda", False)
    assert probes.find_mount(entries, "/app", None).fstype == "overlay"


# ------------------------------------------------------------------------------------- parsers


def test_parsers_on_edge_input():
    assert probes.parse_proc_cgroup("0::/\n1:name=systemd:/a\nbad line") == {"": "/", "name=systemd": "/a"}
    assert probes.parse_selected_mode("always [madvise] never") == "madvise"
    assert probes.parse_selected_mode(None) is None
    assert probes.parse_meminfo("MemTotal: 10 kB\nHugePages_Total: 5\n") == {"MemTotal": 10240, "HugePages_Total": 5}
    assert probes.parse_proc_status_cpus("Cpus_allowed_list:\t0-3,8\n") == 5
    assert probes.parse_cuda_version_file("CUDA Version 10.2.89\n") == "10.2"
    assert probes.parse_cuda_version_file('{"cuda": {"version": "12.4.1"}}') == "12.4"
    assert probes.parse_cuda_version_file("garbage") is None
    assert probes.parse_soname_version("libcudart.so.12", "libcudart") == "12"
    assert probes.parse_soname_version("libcudart.so.11.0", "libcudart") == "11"  # CUDA 11's soname
    assert probes.parse_soname_version("libcudart.so.12.4.127", "libcudart") == "12.4"
    assert probes.parse_soname_version("libcudart_static.a", "libcudart") is None
    assert probes.parse_throttle_reasons(0x1 | 0x4 | 0x40) == ("gpu_idle", "sw_power_cap", "hw_thermal_slowdown")


def test_missing_tree_gives_unknowns_not_errors(tmp_path):
    assert probes.probe_limits(tmp_path).state is ProbeState.FAILED
    memory = probes.probe_memory(tmp_path)
    assert memory.mem_total_bytes is None and memory.thp_enabled is None
    assert probes.probe_cpu(tmp_path, None).numa_nodes == ()


def test_collect_facts_turns_a_raising_probe_into_a_recorded_error(fixture_root, tmp_path):
    """A sysfs file in a format nobody foresaw must not crash doctor."""
    (tmp_path / "sys/devices/system/node/node0").mkdir(parents=True)
    (tmp_path / "sys/devices/system/node/node0/cpulist").write_text("zero-one\n")
    runner = canned_runner(FIXTURES / "torch_child/debian12-torch2.13-cpu.jsonl")
    facts = probes.collect_facts(root=tmp_path, runner=runner, environ={"PATH": "/usr/bin"}, nvml=no_nvml())
    assert [name for name, _ in facts.probe_errors] == ["cpu"]
    assert "ValueError" in facts.probe_errors[0][1]


# ------------------------------------------------------------------------------------------ NVML


def test_nvml_reads_every_field(tmp_path):
    consumer = dict(A100, name=b"NVIDIA GeForce RTX 4090", ecc=pynvml.NVMLError_NotSupported(), reasons=0x4 | 0x20,
                    persistence=0, gen=1, width=8)
    nvml = FakeNvml([A100, consumer])
    facts = probes.probe_nvml(tmp_path, "/usr/bin", nvml)
    assert nvml.shut_down
    assert (facts.state, facts.driver_version, facts.cuda_driver_version) == (ProbeState.OK, "550.54.15", "12.4")
    a100, rtx = facts.gpus
    assert (a100.name, a100.memory_total_bytes, a100.temperature_c, a100.slowdown_temperature_c) == (
        "NVIDIA A100-SXM4-80GB", 80 * 2**30, 41, 90)
    assert (a100.ecc_enabled, a100.ecc_uncorrected_volatile, a100.throttle_reasons, a100.persistence_mode) == (
        True, 0, ("gpu_idle",), True)
    assert rtx.name == "NVIDIA GeForce RTX 4090"  # bytes from old nvidia-ml-py decoded
    assert (rtx.ecc_enabled, rtx.ecc_uncorrected_volatile) == (None, None)  # not supported: silently None
    assert rtx.throttle_reasons == ("sw_power_cap", "sw_thermal_slowdown")
    assert (rtx.persistence_mode, rtx.pcie_gen_current, rtx.pcie_width_current) == (False, 1, 8)
    assert rtx.errors == ()


def test_nvml_field_error_is_recorded_not_raised(tmp_path):
    facts = probes.probe_nvml(tmp_path, None, FakeNvml([dict(A100, temp=pynvml.NVMLError_Unknown())]))
    assert facts.gpus[0].temperature_c is None
    assert facts.gpus[0].errors == ("temperature: Unknown Error",)


def test_nvml_library_not_found_is_missing_and_driver_not_loaded_is_failed(tmp_path):
    missing = probes.probe_nvml(tmp_path, None, no_nvml())
    assert missing.state is ProbeState.MISSING and "NVML library not found" in missing.error
    failed = probes.probe_nvml(tmp_path, None, FakeNvml([], init_error=pynvml.NVMLError_DriverNotLoaded()))
    assert failed.state is ProbeState.FAILED and "Driver Not Loaded" in failed.error


def test_real_nvml_on_this_host(tmp_path):
    """Whatever this host has, the real pynvml path answers without raising."""
    facts = probes.probe_nvml(Path("/"), os.environ.get("PATH"))
    assert facts.state in set(ProbeState)
    if facts.state is ProbeState.OK:
        assert all(g.name for g in facts.gpus)


# ------------------------------------------------------------------------------ runner, real


def test_run_command_output_and_status():
    result = probes.run_command([sys.executable, "-c", "import sys; print('hi'); sys.exit(3)"], 30)
    assert (result.returncode, result.stdout, result.timed_out) == (3, "hi\n", False)


def test_run_command_not_found_is_distinct():
    result = probes.run_command(["/nonexistent/program"], 5)
    assert result.not_found and result.returncode is None


def test_run_command_timeout_kills_the_group_and_keeps_partial_output():
    """A child that forks a grandchild holding the pipe, then hangs: both die, output so far survives."""
    script = ("import subprocess, sys, time\n"
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
              "print('first line', flush=True)\n"
              "time.sleep(60)\n")
    start = time.monotonic()
    result = probes.run_command([sys.executable, "-c", script], 2)
    assert time.monotonic() - start < 15
    assert result.timed_out and result.returncode is None
    assert result.stdout == "first line\n"


# ------------------------------------------------------------------------------ torch child


def test_torch_child_fixture_output_parses(fixture_root):
    runner = canned_runner(FIXTURES / "torch_child/ubuntu-torch2.4-cu124.jsonl")
    torch, smoke = probes.probe_torch(runner, "python", {})
    assert (torch.state, torch.version, torch.cuda_build, torch.cuda_runtime) == (ProbeState.OK, "2.4.1+cu124", "12.4", "12.4")
    assert (torch.cudnn_build, torch.cudnn_loaded, torch.nccl_loaded) == ("9.1.0", "9.1.0", "2.20.5")
    assert any(p.endswith("libcudnn.so.9") for p in torch.loaded_libraries)
    assert (smoke.state, smoke.batches, smoke.pin_memory, smoke.pinned) == (ProbeState.OK, 8, True, True)


def test_torch_child_timeout_keeps_torch_facts_and_fails_smoke():
    first_line = (FIXTURES / "torch_child/debian12-torch2.13-cpu.jsonl").read_text().splitlines()[0] + "\n"
    result = probes.CommandResult(("python",), None, first_line, "", timed_out=True)
    torch, smoke = probes.parse_torch_child_output(result, 60)
    assert torch.state is ProbeState.OK and torch.version == "2.13.0+cpu"
    assert smoke.state is ProbeState.FAILED and "timed out after 60 s" in smoke.error


def test_torch_child_crash_is_failed_with_stderr():
    result = probes.CommandResult(("python",), -11, "", "Fatal Python error: Segmentation fault")
    torch, smoke = probes.parse_torch_child_output(result, 60)
    assert torch.state is ProbeState.FAILED
    assert "signal 11" in torch.error and "Segmentation fault" in torch.error
    assert smoke.state is ProbeState.FAILED


def test_real_torch_child_on_this_host():
    torch, smoke = probes.probe_torch(probes.run_command, sys.executable, dict(os.environ))
    assert torch.state is ProbeState.OK, torch.error
    assert torch.version == importlib.metadata.version("torch")
    assert any("libtorch" in p for p in torch.loaded_libraries)
    assert smoke.state is ProbeState.OK and smoke.error is None
    assert smoke.batches == smoke.expected_batches > 0 and smoke.num_workers == 2


def test_real_interpreter_without_torch_is_missing_not_failed():
    """`python -S` skips site-packages, so torch is really not importable there."""
    def without_site(argv, timeout_s, env):
        return probes.run_command([argv[0], "-S", *argv[1:]], timeout_s, env)

    torch, smoke = probes.probe_torch(without_site, sys.executable, dict(os.environ))
    assert torch.state is ProbeState.MISSING and "No module named 'torch'" in torch.error
    assert smoke.state is ProbeState.MISSING


def test_real_torch_child_that_hangs_is_killed(tmp_path):
    """A sitecustomize that hangs before torch imports: the timeout fires and the probe says so."""
    (tmp_path / "sitecustomize.py").write_text("import time\ntime.sleep(60)\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    start = time.monotonic()
    torch, smoke = probes.probe_torch(probes.run_command, sys.executable, env, timeout_s=3)
    assert time.monotonic() - start < 20
    assert torch.state is ProbeState.FAILED and "timed out after 3 s" in torch.error
    assert smoke.state is ProbeState.FAILED
