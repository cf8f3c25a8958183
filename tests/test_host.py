"""Host facts' tools, read through an injected filesystem root: allocator libraries, numactl, a compiler."""

from __future__ import annotations

from pathlib import Path

from torchpace.host import probe_host, probe_tools, which


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
