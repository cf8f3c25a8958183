"""System knobs are pure functions of the host facts: what allocators and numactl the facts list decides
whether they apply, whatever this machine has."""

from __future__ import annotations

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
