"""System knobs are pure functions of the host facts: what allocators and numactl the facts list decides
whether they apply, whatever this machine has."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from torchpace.host import HostFacts, NumaNode
from torchpace.knobs import get_knob

from fixtures.workloads import tiny_mlp

TWO_NODES = (NumaNode(0, (0, 1)), NumaNode(1, (2, 3)))


@pytest.fixture(scope="module")
def mlp():
    return tiny_mlp()


def test_allocator_applies_by_the_libraries_the_facts_list(mlp):
    knob = get_knob("system.allocator")
    bare = HostFacts(allocator_dirs=("/usr/lib", "/venv/lib"))
    assert "neither jemalloc nor tcmalloc is installed" in knob.applies(bare, mlp)
    assert knob.value_applies("jemalloc", bare, mlp) == "jemalloc not found in /usr/lib, /venv/lib"
    tcmalloc_only = HostFacts(allocators=(("tcmalloc", "/usr/lib/libtcmalloc.so.4"),))
    assert knob.applies(tcmalloc_only, mlp) is None
    assert knob.candidates(tcmalloc_only, mlp) == ["system", "tcmalloc"]


def test_numa_applies_with_two_nodes_and_numactl_in_the_facts(mlp):
    knob = get_knob("system.numa")
    assert "binding needs 2 or more" in knob.applies(HostFacts(numa_nodes=TWO_NODES[:1], numactl="/usr/bin/numactl"), mlp)
    assert knob.applies(HostFacts(numa_nodes=TWO_NODES), mlp) == "numactl is not installed"
    assert knob.applies(HostFacts(numa_nodes=TWO_NODES, numactl="/usr/bin/numactl"), mlp) is None


# A fresh process's malloc: how many of its blocks of 8 MiB and of 64 MiB glibc serves from their own
# mmap (mallinfo2's hblks), after fix_glibc_thresholds() when asked ("fix") and what it returned.
_MAPPED_PROBE = r"""
import ctypes, json, sys
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype, libc.malloc.restype, libc.malloc.argtypes = Info, ctypes.c_void_p, (ctypes.c_size_t,)
fixed = None
if sys.argv[1] == "fix":
    from torchpace.knobs.system import fix_glibc_thresholds
    fixed = fix_glibc_thresholds()
def mapped(size):
    before = libc.mallinfo2().hblks
    assert libc.malloc(size)
    return libc.mallinfo2().hblks - before
print(json.dumps({"fixed": fixed, "8MiB": mapped(8 << 20), "64MiB": mapped(64 << 20)}))
"""

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc thresholds: glibc only")


def _probe_mapped(env, how="plain"):
    out = subprocess.run([sys.executable, "-c", _MAPPED_PROBE, how], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _glibc_env():
    """This environment without anything that sets glibc's thresholds or preloads another malloc."""
    return {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k not in ("LD_PRELOAD", "GLIBC_TUNABLES")}


@glibc_only
def test_a_child_planned_on_the_system_malloc_serves_blocks_to_32_mib_from_its_heap():
    from torchpace.launch.plan import ChildOptions, plan_child
    from torchpace.launch.probe import probe_launch_facts
    from torchpace.launch.command import PythonCommand
    from torchpace.config import RunConfig

    env = _glibc_env()
    plan = plan_child(RunConfig(), HostFacts(), env, ChildOptions(PythonCommand(script="x.py"), probe_launch_facts()))
    assert _probe_mapped(env) == {"fixed": None, "8MiB": 1, "64MiB": 1}  # glibc's own: mmap from 128 KiB up
    assert _probe_mapped(plan.env) == {"fixed": None, "8MiB": 0, "64MiB": 1}


@glibc_only
def test_fix_glibc_thresholds_gives_this_process_what_its_children_get_unless_the_user_set_them():
    env = _glibc_env()
    assert _probe_mapped(env, "fix") == {"fixed": True, "8MiB": 0, "64MiB": 1}
    assert _probe_mapped({**env, "MALLOC_TRIM_THRESHOLD_": "131072"}, "fix")["fixed"] is False
    assert _probe_mapped({**env, "GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=4194304"}, "fix") == {
        "fixed": False, "8MiB": 1, "64MiB": 1}
