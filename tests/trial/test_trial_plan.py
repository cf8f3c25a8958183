"""A trial runs what `launch --config` runs: for configs x hosts (one node; two NUMA nodes; two NUMA nodes
with GPUs), the trial child's plan equals the plan `torchpace launch --config F -- python -m torchpace.trial
SPEC RESULT` makes, setting by setting, with the same argv and env."""

from __future__ import annotations

import pytest

from torchpace.cli.launch import build_options
from torchpace.config import RunConfig, save_config
from torchpace.host import DistroInfo, GpuInfo, HostFacts, NumaNode
from torchpace.launch.plan import CONFIG_ENV, LaunchFacts, plan_child
from torchpace.trial.runner import plan_trial

_TOOLS = {"allocators": (("jemalloc", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"),
                         ("tcmalloc", "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")),
          "allocator_dirs": ("/usr/lib/x86_64-linux-gnu",), "numactl": "/usr/bin/numactl", "distro": DistroInfo("debian")}
_NODES = (NumaNode(0, tuple(range(8))), NumaNode(1, tuple(range(8, 16))))
HOSTS = {
    "one node": HostFacts(logical_cpus=8, usable_cores=8, numa_nodes=(NumaNode(0, tuple(range(8))),), **_TOOLS),
    "two NUMA nodes": HostFacts(logical_cpus=16, usable_cores=16, numa_nodes=_NODES, **_TOOLS),
    "two NUMA nodes, GPUs": HostFacts(logical_cpus=16, usable_cores=16, numa_nodes=_NODES, **_TOOLS,
                                      gpus=(GpuInfo(0, "H100", 80 << 30, numa_node=1), GpuInfo(1, "H100", 80 << 30, numa_node=0))),
}
DDP = {"nproc_per_node": 2, "distributed.strategy": "ddp"}
CONFIGS = {
    "defaults": {},
    "threads": {"threads.intra_op": 2},
    "jemalloc": {"system.allocator": "jemalloc"},
    "numa bind": {"system.numa": "bind"},
    "all process knobs": {"system.allocator": "tcmalloc", "system.numa": "bind", "threads.intra_op": 3},
    "two processes": DDP,
    "two processes, bound, jemalloc": {**DDP, "system.numa": "bind", "system.allocator": "jemalloc"},
    "global and loader knobs": {"precision.matmul": "high", "data.num_workers": 2},
}
ENV = {"PATH": "/usr/bin:/bin", "HOME": "/home/user"}
_HOOK_MECHANICS = ("PYTHONPATH", CONFIG_ENV)  # a Workload trial's child applies these knobs with prepare() instead


def _compared(plan) -> list[tuple[str, str | None, str]]:
    return [(s.name, s.value, s.source.value) for s in plan.settings if s.name not in _HOOK_MECHANICS]


@pytest.mark.parametrize("host_name", list(HOSTS))
@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_a_trial_plans_its_child_as_launch_does(tmp_path, host_name, config_name):
    host, values = HOSTS[host_name], CONFIGS[config_name]
    spec, result, path = tmp_path / "spec.json", tmp_path / "result.json", tmp_path / "torchpace.toml"
    save_config(RunConfig(values), path)
    config, options = build_options(("python", "-m", "torchpace.trial", str(spec), str(result)), str(path))
    launched = plan_child(config, host, ENV, options)
    trial = plan_trial(values, host, ENV, spec, result)
    assert trial.argv == launched.argv
    assert _compared(trial) == _compared(launched)
    assert {k: v for k, v in trial.env.items() if k not in _HOOK_MECHANICS} == \
        {k: v for k, v in launched.env.items() if k not in _HOOK_MECHANICS}
    assert trial.nofile == launched.nofile and trial.bindings == launched.bindings


def test_a_bound_trial_puts_each_rank_on_its_gpus_node(tmp_path):
    facts = LaunchFacts(python="/py", nofile_soft=None, nofile_hard=None)  # every CPU allowed
    plan = plan_trial({**DDP, "system.numa": "bind"}, HOSTS["two NUMA nodes, GPUs"], ENV, tmp_path / "s", tmp_path / "r", facts)
    assert [(b.local_rank, b.node, b.cpus) for b in plan.bindings] == [(0, 1, tuple(range(8, 16))), (1, 0, tuple(range(8)))]
    assert plan.env["OMP_NUM_THREADS"] == "8" and "torchpace.launch.bind" in plan.argv
