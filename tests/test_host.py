"""Host facts' tools, read through an injected filesystem root: allocator libraries, numactl, a compiler."""

from __future__ import annotations

from pathlib import Path

from torchpace.errors import UsageError
from torchpace.host import probe_host, probe_tools, which

FIXTURES = Path(__file__).parent / "fixtures" / "doctor"


def _executable(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)


def test_tools_are_found_through_the_root_as_the_childs_env_would_find_them(tmp_path):
    libs = tmp_path / "usr/lib/x86_64-linux-gnu"
    libs.mkdir(parents=True)
    (libs / "libtcmalloc_minimal.so.4").write_text("")
    (tmp_path / "opt/conda/lib").mkdir(parents=True)
    (tmp_path / "opt/conda/lib/libjemalloc.so.2").write_text("")
    _executable(tmp_path / "usr/bin/numactl")
    _executable(tmp_path / "usr/bin/gcc")
    tools = probe_tools(tmp_path, {"PATH": "/usr/local/bin:/usr/bin", "CONDA_PREFIX": "/opt/conda"})
    assert tools["allocators"] == (("jemalloc", "/opt/conda/lib/libjemalloc.so.2"),
                                   ("tcmalloc", "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"))
    assert "/opt/conda/lib" in tools["allocator_dirs"]
    assert tools["numactl"] == "/usr/bin/numactl" and tools["has_compiler"] is True


def test_a_bare_root_has_no_tools(tmp_path):
    tools = probe_tools(tmp_path, {"PATH": "/usr/bin"})
    assert tools["allocators"] == () and tools["numactl"] is None and tools["has_compiler"] is False
    assert which(tmp_path, "numactl", None) is None


def test_probe_host_fills_the_tool_fields_from_the_env_it_is_given(tmp_path):
    _executable(tmp_path / "tools/numactl")
    host = probe_host(tmp_path, with_gpus=False, env={"PATH": "/tools"})
    assert host.numactl == "/tools/numactl" and host.allocator_library("jemalloc") is None
    assert probe_host(tmp_path, with_gpus=False, env={"PATH": "/elsewhere"}).numactl is None


# ---- faked host facts (TORCHPACE_HOST_FACTS / override_host_facts) ------------------------------------

def test_host_facts_can_be_those_of_another_host():
    import pytest

    from torchpace.host import HostFacts, override_host_facts

    real = HostFacts(cpu_model="x", logical_cpus=4, usable_cores=4, cpu_flags=frozenset({"avx2", "avx512_bf16"}))
    faked = override_host_facts(real, {"bf16": False, "usable_cores": 2, "numa_nodes": 2, "gpus": 1})
    assert not faked.native_bf16 and "avx2" in faked.cpu_flags and faked.usable_cores == 2
    assert [node.cpus for node in faked.numa_nodes] == [(0, 1), (2, 3)]
    assert faked.cuda_available and len(faked.gpus) == 1
    assert faked.summary()["overridden"] == ["bf16", "gpus", "numa_nodes", "usable_cores"]
    assert override_host_facts(faked, {"bf16": True, "gpus": 0}).native_bf16
    assert "overridden" not in real.summary()
    for bad, named in (({"cores": 2}, "unknown fact"), ({"bf16": "no"}, "bf16 = 'no'"), ({"numa_nodes": -1}, "numa_nodes"),
                       ({"usable_cores": True}, "usable_cores")):
        with pytest.raises(UsageError, match=named):
            override_host_facts(real, bad)


def test_faked_counts_beyond_a_real_host_and_gpus_torch_cannot_see_are_refused():
    import pytest

    from torchpace.host import GpuInfo, HostFacts, check_faked_gpus, override_host_facts

    real = HostFacts(cpu_model="x", logical_cpus=4, usable_cores=4)
    for bad, named in (({"usable_cores": 8193}, "usable_cores = 8193 is more than a host has: at most 8192"),
                       ({"numa_nodes": 5}, "numa_nodes = 5 is more than a host has: at most 4"),
                       ({"numa_nodes": 10**8, "usable_cores": 8192}, "at most 1024"),
                       ({"gpus": 65}, "gpus = 65 is more than a host has: at most 64")):
        with pytest.raises(UsageError, match=named):
            override_host_facts(real, bad)
    assert len(override_host_facts(real, {"usable_cores": 8192, "numa_nodes": 1024, "gpus": 64}).numa_nodes) == 1024
    with pytest.raises(UsageError, match="gpus = 2, but torch 2.9.0[+]cpu here is a CPU-only build"):
        check_faked_gpus({"gpus": 2}, (), "2.9.0+cpu", None)
    with pytest.raises(UsageError, match="a CUDA 12.8 build with no device visible"):
        check_faked_gpus({"gpus": 1}, (), "2.9.0", "12.8")
    check_faked_gpus({"gpus": 0}, (), "2.9.0+cpu", None)  # hiding GPUs: always
    check_faked_gpus({"gpus": 4}, (GpuInfo(0, "H100", 80 << 30),), "2.9.0", "12.8")  # planning for more where one runs


def test_probe_host_takes_the_facts_the_environment_names(monkeypatch):
    import json

    import pytest

    from torchpace.host import HOST_FACTS_ENV

    monkeypatch.setenv(HOST_FACTS_ENV, json.dumps({"bf16": False, "numa_nodes": 1, "usable_cores": 1}))
    host = probe_host(with_gpus=False)
    assert not host.native_bf16 and len(host.numa_nodes) == 1 and host.usable_cores == 1
    monkeypatch.setenv(HOST_FACTS_ENV, json.dumps({"bf16": True}))
    assert probe_host(with_gpus=False).native_bf16
    monkeypatch.setenv(HOST_FACTS_ENV, "[1]")
    with pytest.raises(UsageError, match=HOST_FACTS_ENV):
        probe_host(with_gpus=False)


def test_faked_facts_fake_this_machine_not_a_fixture_host(monkeypatch):
    import json

    from torchpace.host import HOST_FACTS_ENV

    root = FIXTURES / "debian12-vm"
    probed = probe_host(root, with_gpus=False)
    monkeypatch.setenv(HOST_FACTS_ENV, json.dumps({"bf16": not probed.native_bf16, "usable_cores": 7}))
    assert probe_host(root, with_gpus=False) == probed
    assert probe_host(with_gpus=False).usable_cores == 7
