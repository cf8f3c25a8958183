"""Whole pipeline over fixture hosts: probes read the tree, checks judge it, the report validates."""

from __future__ import annotations

import jsonschema
import pynvml
from doctor_canned import A100, FIXTURES, FakeNvml, canned_runner, no_nvml

from torchpace.doctor import checks, probes, render
from torchpace.doctor.schema import DOCTOR_JSON_SCHEMA


def _severities(findings):
    return {f.id: f.severity.value for f in findings}


def test_rocky_gpu_server_with_many_problems(tmp_path):
    runner = canned_runner(FIXTURES / "torch_child/ubuntu-torch2.4-cu124.jsonl")
    hot = dict(A100, name="NVIDIA A10", temp=88, persistence=0, reasons=0x40, ecc_errors=2)
    environ = {"PATH": "/usr/local/bin:/usr/bin", "LD_LIBRARY_PATH": "/usr/local/cuda-11.8/lib64",
               "CUDA_HOME": "/usr/local/cuda-11.8"}
    facts = probes.collect_facts(root=FIXTURES / "rocky9-numa-cgroup2", runner=runner, environ=environ,
                                 data_dir=str(tmp_path), nvml=FakeNvml([A100, hot]))
    assert facts.probe_errors == ()
    findings = checks.run_checks(facts)
    seen = _severities(findings)
    assert seen["cpu.usable_cores"] == "info"  # 12 of 80
    assert seen["cpu.numa"] == "info" and seen["cpu.governor"] == "warn"
    assert seen["memory.swap"] == "warn" and seen["memory.cgroup"] == "warn" and seen["memory.thp"] == "info"
    assert seen["limits.nofile"] == "warn" and seen["limits.nproc"] == "warn"
    assert seen["torch.cuda_home"] == "warn" and seen["torch.ld_library_path"] == "warn"
    assert seen["gpu.mixed"] == "warn" and seen["gpu.ecc"] == "fail" and seen["gpu.throttle"] == "fail"
    assert seen["gpu.temperature"] == "warn" and seen["gpu.persistence"] == "warn"
    assert seen["allocator.malloc"] == "ok"  # the child process had libjemalloc mapped
    numa = next(f for f in findings if f.id == "cpu.numa")
    assert numa.remedy.command.endswith("dnf install -y numactl")  # sudo-prefixed unless run as root
    report = render.build_report(facts, findings, strict=False, duration_s=1.0)
    jsonschema.validate(report, DOCTOR_JSON_SCHEMA, cls=jsonschema.Draft202012Validator)
    assert report["host"]["package_manager"] == "dnf" and report["exit_code"] == 1


def test_docker_container_on_cgroup_v1():
    runner = canned_runner(FIXTURES / "torch_child/debian12-torch2.13-cpu.jsonl")
    facts = probes.collect_facts(root=FIXTURES / "ubuntu2204-docker-cgroup1", runner=runner,
                                 environ={"PATH": "/usr/bin"}, nvml=no_nvml())
    seen = _severities(checks.run_checks(facts))
    assert facts.cpu.usable_cores == 8 and seen["cpu.usable_cores"] == "info"
    assert seen["memory.cgroup"] == "info"  # 32 GiB limit on a 504 GiB host
    assert seen["gpu.nvml"] == "info" and not any(k.startswith("gpu.") and k != "gpu.nvml" for k in seen)
    assert seen["limits.nofile"] == "ok" and seen["limits.nproc"] == "ok"


def test_driver_not_loaded_host(tmp_path):
    runner = canned_runner(FIXTURES / "torch_child/ubuntu-torch2.4-cu124.jsonl")
    facts = probes.collect_facts(root=FIXTURES / "debian12-vm", runner=runner, environ={"PATH": "/usr/bin"},
                                 nvml=FakeNvml([], init_error=pynvml.NVMLError_DriverNotLoaded()))
    seen = _severities(checks.run_checks(facts))
    assert seen["gpu.nvml"] == "warn"
    assert seen["torch.cuda_driver"] == "info"  # CUDA build, no driver to compare against
