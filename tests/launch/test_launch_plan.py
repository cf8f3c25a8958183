"""Planner table tests over canned host facts: 1 and 2 NUMA nodes, with and without GPUs, user env set;
`launch --config` runs what the config says; module and interpreter-option commands."""

from __future__ import annotations

import json
from dataclasses import replace
from types import MappingProxyType

import pytest

from torchpace.config import RunConfig
from torchpace.errors import UsageError
from torchpace.host import DistroInfo, GpuInfo, HostFacts, NumaNode
from torchpace.launch.bind import BINDINGS_ENV
from torchpace.knobs import REGISTRY, Knob, Point, Reach
from torchpace.knobs.child import env_part
from torchpace.knobs.child import format_cpu_list
from torchpace.knobs.system import GLIBC_THRESHOLDS, JEMALLOC_CONF, preloaded_allocator
from torchpace.launch.command import PythonCommand
from torchpace.launch.plan import CONFIG_ENV, ChildOptions, LaunchFacts, Source, install_command, plan_child

DEBIAN = DistroInfo("debian", (), "12", "Debian GNU/Linux 12 (bookworm)")
ROCKY = DistroInfo("rocky", ("rhel", "centos", "fedora"), "9.3")
JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"

TOOLS = {"allocators": (("jemalloc", JEMALLOC), ("tcmalloc", TCMALLOC)), "allocator_dirs": ("/usr/lib/x86_64-linux-gnu",),
         "numactl": "/usr/bin/numactl"}
ONE_NODE = HostFacts(logical_cpus=8, usable_cores=8, numa_nodes=(NumaNode(0, tuple(range(8))),), distro=DEBIAN, **TOOLS)
TWO_NODES = HostFacts(logical_cpus=16, usable_cores=16, distro=DEBIAN, **TOOLS,
                      numa_nodes=(NumaNode(0, tuple(range(8))), NumaNode(1, tuple(range(8, 16)))))
GPU_NODES = HostFacts(logical_cpus=16, usable_cores=16, distro=DEBIAN, numa_nodes=TWO_NODES.numa_nodes, **TOOLS,
                      gpus=(GpuInfo(0, "H100", 80 << 30, numa_node=1), GpuInfo(1, "H100", 80 << 30, numa_node=0)))
ONE_NODE_GPU = HostFacts(logical_cpus=8, usable_cores=8, distro=DEBIAN, numa_nodes=ONE_NODE.numa_nodes, **TOOLS,
                         gpus=(GpuInfo(0, "L4", 24 << 30, numa_node=0),))

FACTS = LaunchFacts(python="/py", nofile_soft=1024, nofile_hard=1048576, is_root=True, hook_dir="/hook")
BARE = LaunchFacts(python="/py", nofile_soft=1024, nofile_hard=4096, is_root=False, hook_dir="/hook")
SCRIPT = PythonCommand(script="train.py", args=("--lr", "3"))


def plan(host=ONE_NODE, env=None, facts=FACTS, config=None, command=SCRIPT, **options):
    """`launch` as the cli plans it: torchpace's auto choices only without a config. With `facts=BARE`
    the host has no allocator and no numactl."""
    if facts is BARE:
        host = replace(host, allocators=(), numactl=None, allocator_dirs=("/usr/lib/x86_64-linux-gnu", "/venv/lib"))
    options.setdefault("auto", config is None)
    given = {knob.name: options.pop(knob.launch_flag.dest) for knob in REGISTRY.values()
             if knob.launch_flag and knob.launch_flag.dest in options}  # a knob's option, as the cli passes it on
    return plan_child(config or RunConfig(), host, MappingProxyType(env or {}),
                      ChildOptions(command, facts, given=given, **options))


def picked(result, *names):
    """{name: (value, source)} of the named settings."""
    return {n: (result.setting(n).value, result.setting(n).source.value) for n in names}


# (id, host, options, base env, expected {setting: (value, source)})
TABLE = [
    ("one node: all auto", ONE_NODE, {}, {}, {
        "launcher": ("exec", "default"), "OMP_NUM_THREADS": ("8", "auto"), "MKL_NUM_THREADS": ("8", "auto"),
        "numa": (None, "auto"), "allocator": ("jemalloc", "auto"), "LD_PRELOAD": (JEMALLOC, "auto"),
        "MALLOC_CONF": (JEMALLOC_CONF, "auto"), "RLIMIT_NOFILE": ("65536", "auto"),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": (None, "default")}),
    ("one node: 2 ranks share the cores", ONE_NODE, {"nproc_per_node": 2}, {}, {
        "launcher": ("torchrun", "cli"), "nproc_per_node": ("2", "cli"), "OMP_NUM_THREADS": ("4", "auto"),
        "numa": (None, "auto"), "TORCH_NCCL_ASYNC_ERROR_HANDLING": (None, "default")}),
    ("one node, 1 GPU: nothing to bind, NCCL on", ONE_NODE_GPU, {"nproc_per_node": 1, "nnodes": 2,
                                                                 "rdzv_endpoint": "10.0.0.1:29500"}, {}, {
        "numa": (None, "auto"), "TORCH_NCCL_ASYNC_ERROR_HANDLING": ("1", "auto"), "OMP_NUM_THREADS": ("8", "auto")}),
    ("two nodes: 1 rank is not bound", TWO_NODES, {}, {}, {
        "numa": (None, "auto"), "OMP_NUM_THREADS": ("16", "auto")}),
    ("two nodes: 2 ranks, one per node", TWO_NODES, {"nproc_per_node": 2}, {}, {
        "numa": ("node", "auto"), "OMP_NUM_THREADS": ("8", "auto"), "KMP_AFFINITY": ("granularity=fine,compact,1,0", "auto"),
        "GOMP_CPU_AFFINITY": ("per rank", "auto")}),
    ("two nodes, GPUs: NCCL and GPU-node binding", GPU_NODES, {"nproc_per_node": 2}, {}, {
        "numa": ("node", "auto"), "TORCH_NCCL_ASYNC_ERROR_HANDLING": ("1", "auto"), "OMP_NUM_THREADS": ("8", "auto")}),
    ("user env wins over auto", TWO_NODES, {"nproc_per_node": 2},
     {"OMP_NUM_THREADS": "3", "LD_PRELOAD": "/opt/lib/libtcmalloc.so.4", "KMP_AFFINITY": "verbose",
      "GOMP_CPU_AFFINITY": "0-15"}, {
        "OMP_NUM_THREADS": ("3", "env"), "allocator": ("tcmalloc", "env"), "KMP_AFFINITY": ("verbose", "env"),
        "GOMP_CPU_AFFINITY": ("0-15", "env")}),
    ("user env wins over config", ONE_NODE_GPU, {"config": RunConfig({"threads.intra_op": 2, "system.allocator": "jemalloc"}),
                                                 "nproc_per_node": 2},
     {"OMP_NUM_THREADS": "5", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0", "MALLOC_CONF": "narenas:2"}, {
        "OMP_NUM_THREADS": ("5", "env"), "TORCH_NCCL_ASYNC_ERROR_HANDLING": ("0", "env"),
        "MALLOC_CONF": ("narenas:2", "env"), "allocator": ("jemalloc", "config")}),
    ("a config leaves what it does not hold as its trials ran", TWO_NODES,
     {"config": RunConfig({"data.num_workers": 2})}, {}, {
        "allocator": ("system", "default"), "numa": ("off", "default"), "OMP_NUM_THREADS": (None, "default"),
        "MKL_NUM_THREADS": (None, "default"), "RLIMIT_NOFILE": ("65536", "auto")}),
    ("--allocator/--numa/--omp-threads auto with a config ask for the auto choices", TWO_NODES,
     {"config": RunConfig({"data.num_workers": 2}), "allocator": "auto", "numa": "auto", "omp_threads": "auto",
      "nproc_per_node": 2}, {}, {
        "allocator": ("jemalloc", "auto"), "numa": ("node", "auto"), "OMP_NUM_THREADS": ("8", "auto")}),
    ("a config's several processes still get threads per rank", ONE_NODE,
     {"config": RunConfig({"nproc_per_node": 2, "distributed.strategy": "ddp"})}, {}, {
        "OMP_NUM_THREADS": ("4", "auto"), "allocator": ("system", "default"), "numa": ("off", "default")}),
    ("cli wins over env", ONE_NODE, {"omp_threads": 6, "allocator": "tcmalloc"},
     {"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "3", "LD_PRELOAD": "/x/libjemalloc.so.2:/x/libfoo.so"}, {
        "OMP_NUM_THREADS": ("6", "cli"), "MKL_NUM_THREADS": ("6", "cli"), "allocator": ("tcmalloc", "cli"),
        "LD_PRELOAD": (f"{TCMALLOC}:/x/libfoo.so", "cli")}),
    ("config over auto", ONE_NODE, {"config": RunConfig({"threads.intra_op": 2, "system.allocator": "tcmalloc",
                                                         "system.numa": "bind"})}, {}, {
        "OMP_NUM_THREADS": ("2", "config"), "allocator": ("tcmalloc", "config"), "numa": ("node", "config")}),
    ("cli auto defers to config", ONE_NODE, {"allocator": "auto", "numa": "auto", "omp_threads": "auto",
                                             "config": RunConfig({"system.allocator": "system", "system.numa": "off",
                                                                  "threads.intra_op": 3})}, {}, {
        "allocator": ("system", "config"), "numa": ("off", "config"), "OMP_NUM_THREADS": ("3", "config")}),
    ("--allocator system strips a preloaded allocator", ONE_NODE, {"allocator": "system"},
     {"LD_PRELOAD": "/x/libjemalloc.so.2:/x/libfoo.so"}, {
        "allocator": ("system", "cli"), "LD_PRELOAD": ("/x/libfoo.so", "cli")}),
]


@pytest.mark.parametrize("name, host, options, env, expected", TABLE, ids=[row[0] for row in TABLE])
def test_settings_table(name, host, options, env, expected):
    result = plan(host, env, **options)
    assert picked(result, *expected) == expected
    for setting in result.settings:  # every setting explains itself
        assert setting.reason and isinstance(setting.source, Source)


def test_env_set_by_user_reaches_child_unchanged():
    env = {"OMP_NUM_THREADS": "3", "MALLOC_CONF": "narenas:2", "PATH": "/bin"}
    result = plan(ONE_NODE, env)
    assert {k: result.env[k] for k in env} == env
    assert result.env["LD_PRELOAD"] == JEMALLOC


def test_bare_host_says_how_to_install_and_caps_nofile_at_hard_limit():
    result = plan(ONE_NODE, facts=BARE)
    assert picked(result, "allocator", "RLIMIT_NOFILE") == {"allocator": ("system", "auto"), "RLIMIT_NOFILE": ("4096", "auto")}
    assert "LD_PRELOAD" not in result.env and result.nofile == 4096
    assert any("sudo apt-get install -y libjemalloc2" in note for note in result.notes)


def test_single_process_argv_is_the_script_itself():
    result = plan(ONE_NODE)
    assert result.argv == ("/py", "train.py", "--lr", "3") and not result.uses_torchrun
    assert result.script == "train.py"


MODULE = PythonCommand(module="pkg.train", args=("--lr", "3"), interpreter="python3", interpreter_args=("-X", "dev"))


def test_a_module_with_interpreter_options_runs_with_this_interpreter_plain_under_torchrun_and_bound():
    assert plan(ONE_NODE, command=MODULE).argv == ("/py", "-X", "dev", "-m", "pkg.train", "--lr", "3")
    module = PythonCommand(module="pkg.train", args=("--lr", "3"))
    assert plan(ONE_NODE, command=module, nproc_per_node=2).argv[4:] == ("--standalone", "-m", "pkg.train", "--lr", "3")
    assert plan(ONE_NODE, command=MODULE, nproc_per_node=2).argv[4:] == (
        "--standalone", "--no-python", "/py", "-u", "-X", "dev", "-m", "pkg.train", "--lr", "3")
    assert plan(TWO_NODES, command=MODULE, nproc_per_node=2).argv[5:] == (
        "--no-python", "/py", "-m", "torchpace.launch.bind", "/py", "-u", "-X", "dev", "-m", "pkg.train", "--lr", "3")
    assert plan(ONE_NODE, command=MODULE).script == "-m pkg.train"


def test_with_a_config_nothing_is_preloaded_bound_or_threaded_that_the_config_does_not_say():
    result = plan(TWO_NODES, {"PATH": "/bin"}, config=RunConfig({"precision.matmul": "high"}), config_name="torchpace.toml")
    assert result.argv == ("/py", "train.py", "--lr", "3") and result.bindings == ()
    assert {k for k in result.env if k not in ("PATH", "PYTHONPATH", CONFIG_ENV)} == set(GLIBC_THRESHOLDS)
    assert "torchpace.toml does not set system.allocator" in result.setting("allocator").reason
    assert not any("jemalloc" in note for note in result.notes)


FIXED = {name: (str(value), "auto") for name, value in GLIBC_THRESHOLDS.items()}
UNSET = dict.fromkeys(GLIBC_THRESHOLDS, (None, "env"))


# (id, host, options, base env, what the thresholds are: FIXED, UNSET (the user's own), or absent)
THRESHOLDS = [
    ("launch --config without an allocator", ONE_NODE, {"config": RunConfig({"precision.matmul": "high"})}, {}, FIXED),
    ("a trial of the defaults", ONE_NODE, {"config": RunConfig(), "config_over_env": True}, {}, FIXED),
    ("auto on a host without jemalloc or tcmalloc", ONE_NODE, {"facts": BARE}, {}, FIXED),
    ("--allocator system strips a preloaded jemalloc", ONE_NODE, {"allocator": "system"},
     {"LD_PRELOAD": "/x/libjemalloc.so.2"}, FIXED),
    ("auto preloads jemalloc", ONE_NODE, {}, {}, None),
    ("a trial of tcmalloc", ONE_NODE, {"config": RunConfig({"system.allocator": "tcmalloc"}), "config_over_env": True},
     {}, None),
    ("tcmalloc preloaded in the environment", ONE_NODE, {"config": RunConfig()}, {"LD_PRELOAD": "/x/libtcmalloc.so.4"}, None),
    ("the user's MALLOC_TRIM_THRESHOLD_, even in a trial", ONE_NODE, {"config": RunConfig(), "config_over_env": True},
     {"MALLOC_TRIM_THRESHOLD_": "131072"}, {"MALLOC_TRIM_THRESHOLD_": ("131072", "env"), "MALLOC_MMAP_THRESHOLD_": (None, "env")}),
    ("the user's MALLOC_TOP_PAD_", ONE_NODE, {"config": RunConfig()}, {"MALLOC_TOP_PAD_": "0"}, UNSET),
    ("the user's MALLOC_MMAP_MAX_", ONE_NODE, {"config": RunConfig()}, {"MALLOC_MMAP_MAX_": "0"}, UNSET),
    ("the user's GLIBC_TUNABLES", ONE_NODE, {"config": RunConfig()},
     {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.mmap_threshold=65536"}, UNSET),
]


@pytest.mark.parametrize("name, host, options, env, expected", THRESHOLDS, ids=[row[0] for row in THRESHOLDS])
def test_the_system_malloc_runs_with_glibcs_thresholds_fixed_unless_the_user_fixed_them(name, host, options, env, expected):
    facts = options.pop("facts", FACTS)
    result = plan(host, env, facts=facts, **options)
    if expected is None:  # jemalloc or tcmalloc: glibc's malloc serves nothing
        assert not any(s.name in GLIBC_THRESHOLDS for s in result.settings)
        assert not set(GLIBC_THRESHOLDS) & set(result.env)
        return
    assert result.setting("allocator").value == "system"
    assert picked(result, *GLIBC_THRESHOLDS) == expected
    assert {name: result.env.get(name) for name in GLIBC_THRESHOLDS} == {name: value for name, (value, _) in expected.items()}
    if expected is not FIXED:
        assert all("set in your environment" in result.setting(name).reason for name in GLIBC_THRESHOLDS)


def test_a_trial_runs_its_config_over_the_callers_environment():
    env = {"OMP_NUM_THREADS": "5", "MKL_NUM_THREADS": "5", "LD_PRELOAD": "/x/libtcmalloc.so.4:/x/libfoo.so"}
    config = RunConfig({"threads.intra_op": 2, "system.allocator": "jemalloc"})
    launched = plan(ONE_NODE, env, config=config)
    trial = plan(ONE_NODE, env, config=config, config_over_env=True)
    assert picked(launched, "OMP_NUM_THREADS", "allocator") == {"OMP_NUM_THREADS": ("5", "env"), "allocator": ("tcmalloc", "env")}
    assert [n.split(" in your")[0] for n in launched.notes if "wins over" in n] == ["OMP_NUM_THREADS=5", "LD_PRELOAD with tcmalloc"]
    assert picked(trial, "OMP_NUM_THREADS", "MKL_NUM_THREADS", "allocator") == {
        "OMP_NUM_THREADS": ("2", "config"), "MKL_NUM_THREADS": ("2", "config"), "allocator": ("jemalloc", "config")}
    assert trial.env["LD_PRELOAD"] == f"{JEMALLOC}:/x/libfoo.so"
    unset = plan(ONE_NODE, env, config=RunConfig(), config_over_env=True)  # what the config does not set: the env's
    assert picked(unset, "OMP_NUM_THREADS", "allocator") == {"OMP_NUM_THREADS": ("5", "env"), "allocator": ("tcmalloc", "env")}


def test_a_prepared_child_gets_no_hook_and_lists_the_knobs_prepare_applies():
    config = RunConfig({"precision.matmul": "high", "data.num_workers": 2, "compile.mode": "default"})
    result = plan(ONE_NODE, {"PYTHONPATH": "/mine"}, config=config, prepared=True)
    assert result.env["PYTHONPATH"] == "/mine" and CONFIG_ENV not in result.env
    assert picked(result, "precision.matmul", "data.num_workers") == {
        "precision.matmul": ("high", "config"), "data.num_workers": ("2", "config")}
    assert "prepare()" in result.setting("data.num_workers").reason
    assert result.needs_prepare == () and not any("torchpace.prepare" in note for note in result.notes)


def test_torchrun_argv_standalone():
    result = plan(ONE_NODE, nproc_per_node=2)
    assert result.argv == ("/py", "-m", "torchpace.launch.torchrun", "--nproc-per-node=2", "--standalone",
                           "train.py", "--lr", "3")


def test_multi_node_argv_uses_c10d_and_node_rank_picks_the_store_host():
    result = plan(ONE_NODE, nproc_per_node=2, nnodes=2, node_rank=1, rdzv_endpoint="10.0.0.1:29500")
    assert result.argv[3:8] == ("--nproc-per-node=2", "--nnodes=2", "--rdzv-backend=c10d",
                                "--rdzv-endpoint=10.0.0.1:29500", "--rdzv-conf=is_host=false")
    assert plan(ONE_NODE, nnodes=2, node_rank=0, rdzv_endpoint="h:1").argv[7] == "--rdzv-conf=is_host=true"


def test_two_nodes_four_ranks_get_disjoint_slices():
    result = plan(TWO_NODES, nproc_per_node=4)
    assert [(b.node, format_cpu_list(b.cpus)) for b in result.bindings] == [(0, "0-3"), (0, "4-7"), (1, "8-11"), (1, "12-15")]
    assert result.setting("OMP_NUM_THREADS").value == "4"
    per_rank = json.loads(result.env[BINDINGS_ENV])
    assert per_rank["2"] == {"prefix": ["/usr/bin/numactl", "--physcpubind=8-11", "--membind=1"],
                             "env": {"GOMP_CPU_AFFINITY": "8-11"}}
    assert result.argv[5:] == ("--no-python", "/py", "-m", "torchpace.launch.bind", "/py", "-u", "train.py", "--lr", "3")


def test_gpu_ranks_bind_to_their_gpus_nodes():
    result = plan(GPU_NODES, nproc_per_node=2)
    assert [(b.local_rank, b.node) for b in result.bindings] == [(0, 1), (1, 0)]


def test_single_process_on_gpu_node_binds_with_numactl_prefix():
    result = plan(GPU_NODES)
    assert result.argv[:3] == ("/usr/bin/numactl", "--physcpubind=8-15", "--membind=1")
    assert result.env["GOMP_CPU_AFFINITY"] == "8-15" and result.env["OMP_NUM_THREADS"] == "8"


def test_binding_keeps_to_allowed_cpus():
    facts = replace(FACTS, allowed_cpus=frozenset({2, 3, 10, 11}))
    host = replace(TWO_NODES, usable_cores=4)
    result = plan(host, facts=facts, nproc_per_node=2)
    assert [(b.node, b.cpus) for b in result.bindings] == [(0, (2, 3)), (1, (10, 11))]


def test_numa_node_forced_on_one_node_host():
    result = plan(ONE_NODE, numa="node", nproc_per_node=2)
    assert picked(result, "numa") == {"numa": ("node", "cli")}
    assert [b.cpus for b in result.bindings] == [(0, 1, 2, 3), (4, 5, 6, 7)]


def test_numa_off_and_missing_numactl_in_auto():
    assert plan(TWO_NODES, numa="off", nproc_per_node=2).bindings == ()
    result = plan(TWO_NODES, facts=BARE, nproc_per_node=2)
    assert result.bindings == () and "not installed" in result.setting("numa").reason
    assert any("sudo apt-get install -y numactl" in note for note in result.notes)


@pytest.mark.parametrize("options, host, message", [
    ({"allocator": "tcmalloc"}, ONE_NODE, "sudo apt-get install -y libgoogle-perftools4"),
    ({"allocator": "jemalloc"}, HostFacts(distro=ROCKY), "sudo dnf install -y jemalloc"),
    ({"config": RunConfig({"system.allocator": "jemalloc"})}, ONE_NODE, "system.allocator = jemalloc in config"),
    ({"numa": "node"}, ONE_NODE, "sudo apt-get install -y numactl"),
    ({"config": RunConfig({"system.numa": "bind"})}, HostFacts(distro=ROCKY), "sudo dnf install -y numactl"),
    ({"nofile": 5000}, ONE_NODE, "--nofile 5000 is above the hard limit 4096"),
])
def test_missing_tools_and_impossible_limits_are_usage_errors(options, host, message):
    with pytest.raises(UsageError, match=message.replace("-", r"\-").replace(".", r"\.")):
        plan(host, facts=BARE, **options)


@pytest.mark.parametrize("options, message", [
    ({"nnodes": 2}, "--nnodes 2 needs --rdzv-endpoint"),
    ({"nnodes": 2, "node_rank": 2, "rdzv_endpoint": "h:1"}, "--node-rank 2 is out of range"),
    ({"rdzv_endpoint": "nohostport"}, "is not HOST:PORT"),
    ({"rdzv_endpoint": "h:0"}, "port 0 is not a TCP port"), ({"rdzv_endpoint": "h:65536"}, "valid: 1 to 65535"),
    ({"nproc_per_node": 0}, "--nproc-per-node must be 1 or more"),
    ({"numa": "socket"}, "valid values: auto, off, node"),
])
def test_bad_distributed_options(options, message):
    with pytest.raises(UsageError, match=message):
        plan(**options)


def test_nofile_already_high_or_unlimited():
    high = replace(FACTS, nofile_soft=100000)
    assert plan(facts=high).nofile is None
    unlimited = replace(FACTS, nofile_hard=None)
    assert plan(facts=unlimited).nofile == 65536
    assert plan(nofile=2048).setting("RLIMIT_NOFILE").source is Source.CLI


def test_hook_gets_global_and_loader_knobs_and_names_what_needs_prepare():
    config = RunConfig({"precision.matmul": "high", "data.num_workers": 2, "threads.intra_op": 2,
                        "precision.amp": "bf16", "compile.mode": "default", "data.pin_memory": False,
                        "model.channels_last": True, "model.activation_checkpointing": True})
    result = plan(config=config, env={"PYTHONPATH": "/mine"})
    assert result.env["PYTHONPATH"] == "/hook:/mine"
    # threads: kept over the script's own call; pin_memory's default too, over the script's own pin_memory=True
    assert json.loads(result.env[CONFIG_ENV]) == {"compile.mode": "default", "data.num_workers": 2, "precision.amp": "bf16",
                                                  "precision.matmul": "high", "threads.intra_op": 2, "data.pin_memory": False,
                                                  "model.channels_last": True}  # threads: kept over the script's own call
    assert result.needs_prepare == ("model.activation_checkpointing",)
    assert any("torchpace.prepare" in note for note in result.notes)
    assert picked(result, "precision.matmul") == {"precision.matmul": ("high", "config")}


def test_no_hook_without_hook_knobs():
    # defaults that change nothing in a script: the planner's own threads, no compile, no autocast
    result = plan(config=RunConfig({"threads.intra_op": "auto", "compile.mode": "off", "precision.amp": "off"}))
    assert CONFIG_ENV not in result.env and "PYTHONPATH" not in result.env and result.needs_prepare == ()


def test_a_default_value_set_over_a_scripts_own_argument_reaches_the_hook_and_the_dry_run():
    """`"data.num_workers" = 0` in a toml (or `--set`) for a script that passes `--workers 2`: the value replaces the
    script's own argument, so it goes to the hook like any other, and the plan shows it."""
    result = plan(config=RunConfig({"data.num_workers": 0, "data.persistent_workers": False, "optimizer.impl": "default"}))
    assert json.loads(result.env[CONFIG_ENV]) == {"data.num_workers": 0, "data.persistent_workers": False,
                                                  "optimizer.impl": "default"}
    assert result.setting("data.num_workers").value == "0" and result.setting("optimizer.impl").value == "default"


def test_a_thread_count_reaches_the_env_and_holds_over_the_scripts_own_call():
    result = plan(config=RunConfig({"threads.intra_op": 2}))
    assert result.env["OMP_NUM_THREADS"] == "2" and json.loads(result.env[CONFIG_ENV]) == {"threads.intra_op": 2}
    assert "torch.set_num_threads" in result.setting("threads.intra_op").reason


def test_plan_is_pure():
    env = {"PATH": "/bin", "LD_PRELOAD": "/x/libfoo.so"}
    before = dict(env)
    first, second = plan(TWO_NODES, env, nproc_per_node=2), plan(TWO_NODES, env, nproc_per_node=2)
    assert env == before and first == second


def test_helpers():
    assert format_cpu_list((0, 1, 2, 3, 8, 10, 11)) == "0-3,8,10-11"
    assert preloaded_allocator("/a/libfoo.so /usr/lib/libtcmalloc_minimal.so.4") == "tcmalloc"
    assert preloaded_allocator("/a/libfoo.so") is None
    assert install_command(DistroInfo("arch"), "numactl", True) == "your package manager (debian: numactl, rhel: numactl)"


def test_bind_entrypoint_builds_the_ranks_numactl_command():
    from torchpace.launch.bind import build_rank_command

    result = plan(TWO_NODES, {"PATH": "/bin"}, nproc_per_node=2)
    argv, env = build_rank_command(["/py", "-u", "train.py"], {**result.env, "LOCAL_RANK": "1"})
    assert argv == ["/usr/bin/numactl", "--physcpubind=8-15", "--membind=1", "/py", "-u", "train.py"]
    assert env["GOMP_CPU_AFFINITY"] == "8-15" and BINDINGS_ENV not in env
    _, kept = build_rank_command(["x"], {**result.env, "LOCAL_RANK": "0", "GOMP_CPU_AFFINITY": "3"})
    assert kept["GOMP_CPU_AFFINITY"] == "3"


def test_package_exports_resolve_lazily():
    import torchpace.launch as launch

    assert launch.plan_child is plan_child and launch.Source is Source and launch.PythonCommand is PythonCommand
    assert callable(launch.probe_launch_facts) and callable(launch.render_plan)
    with pytest.raises(AttributeError):
        launch.nothing_here


def test_a_config_tuned_with_several_processes_launches_them_through_torchrun_unless_the_cli_says_otherwise():
    config = RunConfig({"nproc_per_node": 2, "distributed.strategy": "ddp"})
    result = plan(ONE_NODE, config=config, config_name="torchpace.toml")
    assert result.uses_torchrun and "--nproc-per-node=2" in result.argv
    assert picked(result, "nproc_per_node", "OMP_NUM_THREADS") == {"nproc_per_node": ("2", "config"), "OMP_NUM_THREADS": ("4", "auto")}
    assert result.needs_prepare == ("distributed.strategy",)  # the script's prepare() wraps the model
    assert picked(plan(ONE_NODE, config=config, nproc_per_node=1), "nproc_per_node") == {"nproc_per_node": ("1", "cli")}


class _ArenaKnob(Knob):
    """A process-level knob the planner has never heard of: glibc's malloc arenas, as an env var."""

    name = "test.malloc_arenas"
    stage = "system"
    point = Point.ENV
    default = 0
    choices = (0, 2, 4)
    script_reach = Reach.PROCESS

    def plan_child(self, value, given, request, draft):
        if not value:
            return None
        return env_part({"MALLOC_ARENA_MAX": str(value)}, Source.CONFIG, f"{self.name} = {value}", request.base_env,
                        request.config_over_env)


def test_a_new_process_level_knob_reaches_the_child_without_a_change_to_the_planner(monkeypatch):
    monkeypatch.setitem(REGISTRY, _ArenaKnob.name, _ArenaKnob())
    result = plan(config=RunConfig({"test.malloc_arenas": 2}))
    assert result.env["MALLOC_ARENA_MAX"] == "2" and picked(result, "MALLOC_ARENA_MAX") == {"MALLOC_ARENA_MAX": ("2", "config")}
    assert "MALLOC_ARENA_MAX" not in plan(config=RunConfig({"test.malloc_arenas": 0})).env
    kept = plan(env={"MALLOC_ARENA_MAX": "8"}, config=RunConfig({"test.malloc_arenas": 2}))  # the user's env wins (launch)
    assert kept.env["MALLOC_ARENA_MAX"] == "8" and kept.setting("MALLOC_ARENA_MAX").source is Source.ENV
