"""The child planner: from a config, host facts, the caller's environment and options to a `LaunchPlan`.

`plan_child` is the ONE planner of a child process's argv and env: `launch` runs its plan, every tune
trial (`trial/runner.py`), `bench` in a fresh process and `profile` under torchrun run theirs, so a
config runs the way it was measured. It is pure: it reads nothing from the machine (the facts come in
as `HostFacts`, with the allocators and numactl found, and `LaunchFacts`, both collected by
`torchpace.launch.probe`) and never touches `os.environ`. Every setting carries its value, its source
and the reason, with the precedence

    cli > env > config > auto > default

where `env` means a value the user already set in the environment they launch from: it wins over
the config and torchpace's own choice, and only an explicit command-line option beats it (a trial
sets `config_over_env`: the value it measures must be the one it runs). `auto` is torchpace's own
choice (jemalloc when installed, NUMA binding on several nodes, OMP_NUM_THREADS = usable cores): it
applies to what neither the cli nor the config decides only when the caller asks (`launch` without
`--config`, or an option given as `auto`). Otherwise such a setting is left as a trial runs it
(`default`: nothing set), so `launch --config F` runs what F says and no more. What several
processes need whatever the config says (threads per rank under torchrun, which would force 1; the
rank's CPU slice when bound; NCCL error handling; the open-files limit) is planned the same way for
trials and launches.
"""

from __future__ import annotations

import enum
import json
import os
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from torchpace.config import RunConfig
from torchpace.errors import UsageError
from torchpace.host import ALLOCATOR_LIBRARIES, DistroInfo, HostFacts, NumaNode
from torchpace.knobs import REGISTRY, Point
from torchpace.knobs.distributed import nproc_of
from torchpace.launch.bind import BINDINGS_ENV  # JSON of each local rank's numactl prefix and env
from torchpace.launch.command import PythonCommand

CONFIG_ENV = "TORCHPACE_LAUNCH_CONFIG"  # JSON of the knob values the sitecustomize hook applies
TORCHRUN_MODULE = "torchpace.launch.torchrun"  # torchrun that exits with the failed worker's code
BIND_MODULE = "torchpace.launch.bind"  # per-rank entrypoint that execs numactl

ALLOCATORS = ("jemalloc", "tcmalloc")  # in the order `auto` prefers them
NUMA_MODES = ("auto", "off", "node")
# A soft RLIMIT_NOFILE worth raising to: DataLoader workers pass batches as shared-memory file
# descriptors; far higher limits make programs that loop over every possible fd slow at start-up.
_NOFILE_TARGET = 65536
_KEPT = "already set in your environment; left as is"
_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # OpenMP's and MKL's thread counts, read at start-up
# jemalloc's settings from the PyTorch CPU tuning guide: background purging, no eager decay.
JEMALLOC_CONF = "oversize_threshold:1,background_thread:true,metadata_thp:auto,dirty_decay_ms:-1,muzzy_decay_ms:-1"
_KMP_AFFINITY = "granularity=fine,compact,1,0"  # Intel OpenMP: one thread per bound CPU, packed
_PREPARE_POINTS = (Point.MODEL, Point.OPTIMIZER, Point.DATASET, Point.STEP)

class Source(str, enum.Enum):
    """Where a setting's value came from, highest precedence first."""

    CLI = "cli"
    ENV = "env"
    CONFIG = "config"
    AUTO = "auto"
    DEFAULT = "default"


@dataclass(frozen=True)
class Setting:
    """One decision of the plan.

    Attributes:
        name: an env var (`OMP_NUM_THREADS`), a limit (`RLIMIT_NOFILE`), a launch parameter
            (`nproc_per_node`, `numa`, `allocator`) or a knob the hook applies (`precision.matmul`).
        value: the value the child gets, as text; None when nothing is set.
        source: where the value came from.
        reason: why, in words a user can act on.
    """

    name: str
    value: str | None
    source: Source
    reason: str


@dataclass(frozen=True)
class ChildOptions:
    """What the caller asks of the child; None means "not given" (the lower sources decide).

    Attributes:
        command: the Python program each process runs (`train.py ARGS`, `-m torchpace.trial SPEC RESULT`).
        facts: this machine's interpreter, limits and CPUs (`torchpace.launch.probe.probe_launch_facts`).
        config_name: how messages name the config (`torchpace.toml`).
        auto: True when settings that neither the cli nor the config decides take torchpace's own
            `auto` choice (`launch` without `--config`); False leaves them as a trial runs them.
            An option given as `"auto"` asks for that setting's auto choice either way.
        config_over_env: True for a trial: the config's values win over variables already set in
            `base_env` (a trial must run the value it measures). False for `launch`: the user's
            environment wins over the config (cli > env > config).
        prepared: True when the child is torchpace's own program that applies the config itself
            with `torchpace.prepare()` (a Workload trial, `bench`, `profile`): no sitecustomize hook,
            and the global/DataLoader knobs are listed as applied by prepare(). False for a user's
            script, which gets the hook.
        nproc_per_node, nnodes, node_rank, rdzv_endpoint: processes and rendezvous (cli).
        numa: `auto`, `off` or `node` (cli); allocator: `auto`, `jemalloc`, `tcmalloc` or `system`;
        omp_threads: `auto` or threads per process; nofile: the child's soft RLIMIT_NOFILE.
    """

    command: PythonCommand
    facts: "LaunchFacts"
    config_name: str = "config"
    auto: bool = False
    config_over_env: bool = False
    prepared: bool = False
    nproc_per_node: int | None = None
    nnodes: int | None = None
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    numa: str | None = None
    allocator: str | None = None
    omp_threads: int | str | None = None
    nofile: int | None = None

    def wants_auto(self, given: object) -> bool:
        """Whether a setting whose cli option is `given` takes torchpace's own auto choice."""
        return given == "auto" or (given is None and self.auto)


@dataclass(frozen=True)
class LaunchFacts:
    """What the planner needs from this process besides HostFacts (see `probe_launch_facts`).

    Attributes:
        python: the interpreter that runs the program (and torchrun): the one torchpace runs in.
        nofile_soft: the current soft RLIMIT_NOFILE; None when unlimited.
        nofile_hard: the hard RLIMIT_NOFILE; None when unlimited.
        allowed_cpus: CPUs this process may run on (its affinity); None when unknown.
        is_root: whether install commands need sudo.
        hook_dir: the directory holding torchpace's sitecustomize.py.
    """

    python: str
    nofile_soft: int | None
    nofile_hard: int | None
    allowed_cpus: frozenset[int] | None = None
    is_root: bool = False
    hook_dir: str = ""


@dataclass(frozen=True)
class RankBinding:
    """Where one local rank runs: its NUMA node and its own slice of that node's CPUs."""

    local_rank: int
    node: int
    cpus: tuple[int, ...]

    def numactl_prefix(self, numactl: str) -> list[str]:
        """`numactl --physcpubind=CPUS --membind=NODE`: CPUs and memory on the node."""
        return [numactl, f"--physcpubind={format_cpu_list(self.cpus)}", f"--membind={self.node}"]


@dataclass(frozen=True)
class LaunchPlan:
    """Everything `execute` (or a trial's runner) runs and `--dry-run` prints.

    Attributes:
        argv: the exact command.
        script: the program as messages name it (`train.py`, `-m pkg.train`).
        env: the child's complete environment.
        settings: every decision with its source and reason.
        needs_prepare: config knobs that change the model, optimizer or step; the hook cannot apply
            them, the script's own `torchpace.prepare()` call does.
        nofile: the soft RLIMIT_NOFILE to give the child; None leaves the limit as it is.
        bindings: each local rank's NUMA binding (empty when not binding).
        notes: what the user should know before the run (a missing tool and how to install it).
    """

    argv: tuple[str, ...]
    env: Mapping[str, str]
    settings: tuple[Setting, ...]
    script: str = ""
    needs_prepare: tuple[str, ...] = ()
    nofile: int | None = None
    bindings: tuple[RankBinding, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def uses_torchrun(self) -> bool:
        return TORCHRUN_MODULE in self.argv

    def setting(self, name: str) -> Setting:
        """The setting called `name` (KeyError when the plan has none)."""
        for setting in self.settings:
            if setting.name == name:
                return setting
        raise KeyError(name)


@dataclass
class _Part:
    """What one planning step decides: settings, env changes (None removes a var), notes."""

    settings: list[Setting] = field(default_factory=list)
    env: dict[str, str | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def plan_child(config: RunConfig, host: HostFacts, base_env: Mapping[str, str], options: ChildOptions) -> LaunchPlan:
    """Plan a child process: its command, its env, and every setting's value, source and reason.

    The one planner of trials, `bench` in a fresh process, `profile` under torchrun and `launch`.
    A config's `nproc_per_node > 1` (or a multi-node option) runs the program under torchrun.

    Args:
        config: the knob values to run with (a trial's config, the `--config` file, or empty).
        host: this machine (cores, NUMA nodes, GPUs and their nodes, allocators, numactl, distro).
        base_env: the environment the child starts from (never modified).
        options: the program, this process's facts, cli choices and the caller's policy (auto,
            config_over_env, prepared: see `ChildOptions`).

    Returns:
        The LaunchPlan: `argv`, `env` (complete), `settings`, `nofile` (the soft RLIMIT_NOFILE to give
        the child, None: unchanged), `bindings`, `needs_prepare` and `notes`.

    Raises:
        UsageError: bad options, or an allocator or numactl that was asked for but is missing.
    """
    nproc, torchrun, processes = _plan_processes(config, options)
    bindings, numa = _plan_numa(config, options, host, nproc)
    parts = [
        processes,
        _plan_threads(config, options, host, base_env, nproc, bindings),
        numa,
        _plan_binding_env(bindings, base_env, host, torchrun),
        _plan_allocator(config, options, host, base_env),
        _plan_nccl(host, base_env, torchrun),
        _plan_hook(config, base_env, options),
    ]
    nofile, nofile_setting = _plan_nofile(options)
    env = _apply_env(base_env, parts)
    needs_prepare = () if options.prepared else _needs_prepare(config)
    notes = [note for part in parts for note in part.notes] + _prepare_notes(needs_prepare)
    settings = [s for part in parts for s in part.settings] + [nofile_setting]
    argv = _build_argv(options, host, nproc, torchrun, bindings)
    return LaunchPlan(tuple(argv), env, tuple(settings), options.command.label, needs_prepare, nofile, bindings,
                      tuple(notes))


def _apply_env(base_env: Mapping[str, str], parts: Sequence[_Part]) -> dict[str, str]:
    env = dict(base_env)
    for part in parts:
        for name, value in part.env.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
    return env


def _env_part(wanted: Mapping[str, str], source: Source, reason: str, base_env: Mapping[str, str],
              over_env: bool = False) -> _Part:
    """Settings for env vars: a var the user already set wins unless the value comes from the cli
    (or `over_env`: a trial's config value)."""
    part = _Part()
    for name, value in wanted.items():
        if name in base_env and source is not Source.CLI and not over_env:
            part.settings.append(Setting(name, base_env[name], Source.ENV, _KEPT))
        else:
            part.settings.append(Setting(name, value, source, reason))
            part.env[name] = value
    return part


# ---- processes: plain exec or torchrun ----------------------------------------------------------

def _plan_processes(config: RunConfig, options: ChildOptions) -> tuple[int, bool, _Part]:
    """(processes per node, whether torchrun runs them, the settings)."""
    _check_distributed(options)
    configured = nproc_of(config.values)
    nproc = options.nproc_per_node or configured
    nnodes = options.nnodes or 1
    torchrun = nproc > 1 or nnodes > 1 or options.rdzv_endpoint is not None
    part = _Part()
    if options.nproc_per_node is None and "nproc_per_node" in config.values:
        part.settings.append(Setting("nproc_per_node", str(configured), Source.CONFIG,
                                     f"nproc_per_node = {configured} in {options.config_name}"))
    else:
        part.settings.append(_cli_or_default("nproc_per_node", options.nproc_per_node, 1, "one process per node"))
    part.settings.append(_cli_or_default("nnodes", options.nnodes, 1, "this node only"))
    if options.node_rank is not None:
        part.settings.append(Setting("node_rank", str(options.node_rank), Source.CLI,
                                     "node 0 hosts the c10d rendezvous store; global ranks follow the rendezvous"))
    how = (f"torch.distributed.run (torchrun): {nproc} process(es) on each of {nnodes} node(s)" if torchrun
           else "one process: the script runs directly, no torchrun")
    part.settings.append(Setting("launcher", "torchrun" if torchrun else "exec",
                                 Source.CLI if torchrun else Source.DEFAULT, how))
    return nproc, torchrun, part


def _cli_or_default(name: str, given: int | None, default: int, default_reason: str) -> Setting:
    if given is not None:
        return Setting(name, str(given), Source.CLI, f"--{name.replace('_', '-')} {given}")
    return Setting(name, str(default), Source.DEFAULT, default_reason)


def _check_distributed(options: ChildOptions) -> None:
    """UsageError for multi-node options that cannot work together."""
    nnodes = options.nnodes or 1
    if options.nproc_per_node is not None and options.nproc_per_node < 1:
        raise UsageError(f"--nproc-per-node must be 1 or more, got {options.nproc_per_node}")
    if nnodes > 1 and not options.rdzv_endpoint:
        raise UsageError(f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT, the address every node can reach "
                         "(e.g. node 0's IP and a free port)")
    if options.node_rank is not None and not 0 <= options.node_rank < nnodes:
        raise UsageError(f"--node-rank {options.node_rank} is out of range for --nnodes {nnodes} (valid: 0..{nnodes - 1})")
    if options.rdzv_endpoint is not None:
        host, sep, port = options.rdzv_endpoint.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise UsageError(f"--rdzv-endpoint {options.rdzv_endpoint!r} is not HOST:PORT (e.g. 10.0.0.1:29500)")


def _build_argv(options: ChildOptions, host: HostFacts, nproc: int, torchrun: bool,
                bindings: Sequence[RankBinding]) -> list[str]:
    """The exact command: the program itself, or torchrun running it on every rank."""
    python, command = options.facts.python, options.command
    if not torchrun:
        prefix = bindings[0].numactl_prefix(str(host.numactl)) if bindings else []
        return [*prefix, *command.argv(python)]
    argv = [python, "-m", TORCHRUN_MODULE, f"--nproc-per-node={nproc}"]
    if options.rdzv_endpoint is None:
        argv.append("--standalone")
    else:
        argv += [f"--nnodes={options.nnodes or 1}", "--rdzv-backend=c10d", f"--rdzv-endpoint={options.rdzv_endpoint}"]
        if options.node_rank is not None:
            argv.append(f"--rdzv-conf=is_host={'true' if options.node_rank == 0 else 'false'}")
    if bindings:
        return [*argv, "--no-python", python, "-m", BIND_MODULE, python, "-u", *command.interpreter_args, *command.program()]
    if command.interpreter_args:  # torchrun cannot pass interpreter options: it runs the interpreter itself
        return [*argv, "--no-python", python, "-u", *command.interpreter_args, *command.program()]
    return [*argv, *command.program()]


# ---- threads --------------------------------------------------------------------------------------

def _plan_threads(config: RunConfig, options: ChildOptions, host: HostFacts, base_env: Mapping[str, str], nproc: int,
                  bindings: Sequence[RankBinding]) -> _Part:
    """OMP_NUM_THREADS and MKL_NUM_THREADS: explicit under torchrun (which would force 1) and when
    bound; otherwise set only by the cli, the config or an asked-for auto choice."""
    configured = config.get_value("threads.intra_op")
    given = options.omp_threads
    over_env = configured != "auto" and options.config_over_env
    if isinstance(given, int):
        threads, source, reason = given, Source.CLI, f"--omp-threads {given}"
    elif "OMP_NUM_THREADS" in base_env and not over_env:
        part = _env_part({"OMP_NUM_THREADS": base_env["OMP_NUM_THREADS"]}, Source.ENV, "", base_env)
        if configured != "auto" and str(configured) != base_env["OMP_NUM_THREADS"]:
            part.notes.append(_env_wins_note(f"OMP_NUM_THREADS={base_env['OMP_NUM_THREADS']}",
                                             f"threads.intra_op = {configured}", "OMP_NUM_THREADS", options))
        return part
    elif configured != "auto":
        threads, source, reason = int(configured), Source.CONFIG, f"threads.intra_op = {configured} in {options.config_name}"
    elif options.wants_auto(given) or nproc > 1 or bindings:
        threads, reason = _auto_threads(host, nproc, bindings)
        source = Source.AUTO
    else:
        why = f"left unset: torch picks its thread count (threads.intra_op is auto in {options.config_name})"
        return _Part([Setting(name, None, Source.DEFAULT, why) for name in _THREAD_VARS])
    return _env_part(dict.fromkeys(_THREAD_VARS, str(threads)), source, reason, base_env, over_env)


def _env_wins_note(what: str, tuned: str, variable: str, options: ChildOptions) -> str:
    """A note that the caller's environment (`what`) overrides the config's `tuned` value."""
    return (f"{what} in your environment wins over {tuned} in {options.config_name}, so the script does not run "
            f"as it was tuned; unset {variable} (or pass the option) to run the tuned value")


def _auto_threads(host: HostFacts, nproc: int, bindings: Sequence[RankBinding]) -> tuple[int, str]:
    """Threads per rank: the rank's CPU slice when bound, else usable cores shared among the ranks."""
    if bindings:
        size = len(bindings[0].cpus)
        return size, f"each rank is bound to {size} CPU(s) of its NUMA node"
    threads = max(1, host.usable_cores // nproc)
    reason = f"{host.usable_cores} usable core(s) / {nproc} rank(s) on this node"
    if nproc > host.usable_cores:
        reason += " (more ranks than cores: the ranks share cores)"
    return threads, reason


# ---- NUMA binding ---------------------------------------------------------------------------------

def _plan_numa(config: RunConfig, options: ChildOptions, host: HostFacts, nproc: int) -> tuple[tuple[RankBinding, ...], _Part]:
    """Bind each rank's CPUs and memory to a NUMA node (with GPUs: its GPU's node), or say why not."""
    mode, source, asked = _numa_mode(config, options)
    facts = options.facts
    nodes = _usable_nodes(host, facts)
    if mode == "off":
        return (), _Part([Setting("numa", "off", source, asked or "binding is off")])
    if host.numactl is None and mode == "node":
        raise UsageError(f"NUMA binding was asked for ({asked}) but numactl is not installed; "
                         f"install it with: {install_command(host.distro, 'numactl', facts.is_root)}")
    why_not = _why_not_bind(host, nodes, nproc) if mode == "auto" else None
    if why_not is not None:
        part = _Part([Setting("numa", None, Source.AUTO, why_not)])
        if host.numactl is None and len(nodes) > 1:
            part.notes.append(f"numactl not found, so ranks are not NUMA-bound; install it with: "
                              f"{install_command(host.distro, 'numactl', facts.is_root)}")
        return (), part
    bindings = plan_rank_bindings(host, nodes, nproc)
    where = "; ".join(f"rank {b.local_rank}: node {b.node}, cpus {format_cpu_list(b.cpus)}" for b in bindings)
    reason = asked or (f"{len(nodes)} NUMA nodes" + (", each rank on its GPU's node" if host.gpus else ""))
    return bindings, _Part([Setting("numa", "node", Source.AUTO if mode == "auto" else source, f"{reason} ({where})")])


def _numa_mode(config: RunConfig, options: ChildOptions) -> tuple[str, Source, str]:
    """(auto/off/node, its source, how it was asked for: empty for auto)."""
    if options.numa is not None and options.numa != "auto":
        if options.numa not in NUMA_MODES:
            raise UsageError(f"--numa {options.numa!r} is not valid; valid values: {', '.join(NUMA_MODES)}")
        return options.numa, Source.CLI, f"--numa {options.numa}"
    if "system.numa" in config.values:
        value = config.values["system.numa"]
        return ("node" if value == "bind" else "off"), Source.CONFIG, f"system.numa = {value} in {options.config_name}"
    if options.wants_auto(options.numa):
        return "auto", Source.AUTO, ""
    return "off", Source.DEFAULT, f"not bound: {options.config_name} does not set system.numa"


def _why_not_bind(host: HostFacts, nodes: Sequence[NumaNode], nproc: int) -> str | None:
    """None when `auto` binds, else the reason it does not."""
    if len(nodes) < 2:
        return f"{len(nodes) or 1} NUMA node: nothing to bind"
    if host.numactl is None:
        return f"{len(nodes)} NUMA nodes, but numactl is not installed"
    if not host.gpus and nproc < len(nodes):
        return (f"{nproc} rank(s) on {len(nodes)} NUMA nodes: binding would leave nodes idle "
                "(--numa node binds anyway)")
    return None


def _usable_nodes(host: HostFacts, facts: LaunchFacts) -> tuple[NumaNode, ...]:
    """NUMA nodes with the CPUs this process may use (one node of all CPUs when the kernel shows none)."""
    nodes = host.numa_nodes or (NumaNode(0, tuple(range(host.logical_cpus))),)
    if facts.allowed_cpus is None:
        return nodes
    kept = (NumaNode(n.id, tuple(c for c in n.cpus if c in facts.allowed_cpus)) for n in nodes)
    return tuple(n for n in kept if n.cpus) or (NumaNode(nodes[0].id, tuple(sorted(facts.allowed_cpus))),)


def plan_rank_bindings(host: HostFacts, nodes: Sequence[NumaNode], nproc: int) -> tuple[RankBinding, ...]:
    """Each local rank's node and CPU slice: ranks on one node get disjoint, equal slices of it.

    With GPUs, rank i runs on GPU i's NUMA node; without, ranks are spread over the nodes in
    contiguous blocks (4 ranks on 2 nodes: 0,1 -> node 0; 2,3 -> node 1).
    """
    by_id = {n.id: n for n in nodes}
    node_of = [_rank_node(host, nodes, rank, nproc) for rank in range(nproc)]
    counts = {node: node_of.count(node) for node in node_of}
    size = max(1, min(len(by_id[node].cpus) // count for node, count in counts.items()))
    size = min(size, max(1, host.usable_cores // nproc))
    seen: dict[int, int] = {}
    bindings = []
    for rank, node in enumerate(node_of):
        cpus = by_id[node].cpus
        start = (seen.get(node, 0) * size) % len(cpus)
        seen[node] = seen.get(node, 0) + 1
        bindings.append(RankBinding(rank, node, tuple(cpus[start:start + size])))
    return tuple(bindings)


def _rank_node(host: HostFacts, nodes: Sequence[NumaNode], rank: int, nproc: int) -> int:
    if host.gpus:
        gpu = host.gpus[rank % len(host.gpus)]
        if gpu.numa_node is not None and gpu.numa_node in {n.id for n in nodes}:
            return gpu.numa_node
    return nodes[rank * len(nodes) // nproc].id


def _plan_binding_env(bindings: Sequence[RankBinding], base_env: Mapping[str, str], host: HostFacts,
                      torchrun: bool) -> _Part:
    """GOMP_CPU_AFFINITY / KMP_AFFINITY for bound ranks; under torchrun, each rank's numactl command."""
    if not bindings:
        return _Part()
    part = _env_part({"KMP_AFFINITY": _KMP_AFFINITY}, Source.AUTO, "Intel OpenMP: one thread per bound CPU", base_env)
    gomp_reason = "GNU OpenMP: threads pinned to the rank's CPUs"
    if not torchrun:
        gomp = _env_part({"GOMP_CPU_AFFINITY": format_cpu_list(bindings[0].cpus)}, Source.AUTO, gomp_reason, base_env)
        return _merge(part, gomp)
    keep_gomp = "GOMP_CPU_AFFINITY" in base_env
    per_rank = {str(b.local_rank): {"prefix": b.numactl_prefix(str(host.numactl)),
                                    "env": {} if keep_gomp else {"GOMP_CPU_AFFINITY": format_cpu_list(b.cpus)}}
                for b in bindings}
    part.env[BINDINGS_ENV] = json.dumps(per_rank, sort_keys=True)
    part.settings.append(Setting(BINDINGS_ENV, part.env[BINDINGS_ENV], Source.AUTO,
                                 f"each local rank's numactl command and CPU list, read by {BIND_MODULE}"))
    part.settings.append(Setting("GOMP_CPU_AFFINITY", base_env["GOMP_CPU_AFFINITY"], Source.ENV, _KEPT) if keep_gomp
                         else Setting("GOMP_CPU_AFFINITY", "per rank", Source.AUTO, f"{gomp_reason} (set by {BIND_MODULE})"))
    return part


def _merge(*parts: _Part) -> _Part:
    merged = _Part()
    for part in parts:
        merged.settings += part.settings
        merged.env.update(part.env)
        merged.notes += part.notes
    return merged


def format_cpu_list(cpus: Sequence[int]) -> str:
    """`(0, 1, 2, 3, 8)` -> `"0-3,8"`, the kernel's and numactl's CPU list syntax."""
    ranges: list[list[int]] = []
    for cpu in sorted(cpus):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)


# ---- allocator ------------------------------------------------------------------------------------

def _plan_allocator(config: RunConfig, options: ChildOptions, host: HostFacts, base_env: Mapping[str, str]) -> _Part:
    """LD_PRELOAD of jemalloc (with MALLOC_CONF) or tcmalloc, or the system's malloc, and why."""
    preloaded = preloaded_allocator(base_env.get("LD_PRELOAD", ""))
    configured = "system.allocator" in config.values
    if options.allocator not in (None, "auto"):
        wanted, source, asked = options.allocator, Source.CLI, f"--allocator {options.allocator}"
    elif preloaded is not None and not (configured and options.config_over_env):
        part = _Part([Setting("allocator", preloaded, Source.ENV, "LD_PRELOAD in your environment already preloads it")])
        if configured and config.values["system.allocator"] != preloaded:
            part.notes.append(_env_wins_note(f"LD_PRELOAD with {preloaded}",
                                             f"system.allocator = {config.values['system.allocator']}", "LD_PRELOAD", options))
        return part
    elif configured:
        wanted = str(config.values["system.allocator"])
        source, asked = Source.CONFIG, f"system.allocator = {wanted} in {options.config_name}"
    elif options.wants_auto(options.allocator):
        return _auto_allocator(host, base_env, options.facts)
    else:
        return _Part([Setting("allocator", "system", Source.DEFAULT,
                              f"nothing preloaded: {options.config_name} does not set system.allocator")])
    if wanted == "system":
        return _system_allocator(base_env, source, asked)
    library = host.allocator_library(wanted)
    if library is None:
        raise UsageError(f"{wanted} was asked for ({asked}) but is not installed in {', '.join(host.allocator_dirs)}; "
                         f"install it with: {install_command(host.distro, wanted, options.facts.is_root)}")
    return _preload(wanted, library, _without_allocators(base_env), source, asked)


def _auto_allocator(host: HostFacts, base_env: Mapping[str, str], facts: LaunchFacts) -> _Part:
    for name in ALLOCATORS:
        library = host.allocator_library(name)
        if library is not None:
            return _preload(name, library, base_env, Source.AUTO, f"{name} found")
    command = install_command(host.distro, "jemalloc", facts.is_root)
    part = _Part([Setting("allocator", "system", Source.AUTO, f"neither jemalloc nor tcmalloc is installed ({command})")])
    part.notes.append(f"no jemalloc or tcmalloc found, so the script keeps the system malloc; install jemalloc with: {command}")
    return part


def allocator_env(name: str, library: str, env: Mapping[str, str]) -> dict[str, str]:
    """The env vars that preload allocator `name` from `library` for a child whose env is `env`.

    `library` goes first in LD_PRELOAD, ahead of what `env` already preloads; jemalloc also gets
    JEMALLOC_CONF as MALLOC_CONF unless `env` sets MALLOC_CONF. Pure: returns the changes only.
    """
    changes = {"LD_PRELOAD": ":".join(p for p in (library, env.get("LD_PRELOAD", "")) if p)}
    if name == "jemalloc" and "MALLOC_CONF" not in env:
        changes["MALLOC_CONF"] = JEMALLOC_CONF
    return changes


def _preload(name: str, library: str, env: Mapping[str, str], source: Source, why: str) -> _Part:
    """Preload `library`; jemalloc gets MALLOC_CONF unless the user's environment sets one."""
    changes = allocator_env(name, library, env)
    part = _Part([Setting("allocator", name, source, f"{why}: {library}"),
                  Setting("LD_PRELOAD", changes["LD_PRELOAD"], source, f"preload {name} ({why})")], env=dict(changes))
    if "MALLOC_CONF" in changes:
        part.settings.append(Setting("MALLOC_CONF", changes["MALLOC_CONF"], source,
                                     "jemalloc settings from the PyTorch CPU tuning guide"))
    elif name == "jemalloc":
        part.settings.append(Setting("MALLOC_CONF", env["MALLOC_CONF"], Source.ENV, _KEPT))
    return part


def _system_allocator(base_env: Mapping[str, str], source: Source, asked: str) -> _Part:
    part = _Part([Setting("allocator", "system", source, f"{asked}: the C library's malloc")])
    if preloaded_allocator(base_env.get("LD_PRELOAD", "")) is not None:
        stripped = _without_allocators(base_env).get("LD_PRELOAD")
        part.env["LD_PRELOAD"] = stripped
        part.settings.append(Setting("LD_PRELOAD", stripped, source, f"{asked}: allocators removed from your LD_PRELOAD"))
    return part


def preloaded_allocator(ld_preload: str) -> str | None:
    """The allocator (jemalloc/tcmalloc) an LD_PRELOAD value already loads, or None."""
    for entry in ld_preload.replace(" ", ":").split(":"):
        base = os.path.basename(entry)
        for name, libraries in ALLOCATOR_LIBRARIES.items():
            if base in libraries or base.startswith(f"lib{name}"):
                return name
    return None


def _without_allocators(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with jemalloc/tcmalloc taken out of LD_PRELOAD (the var removed when nothing is left)."""
    kept = [e for e in env.get("LD_PRELOAD", "").replace(" ", ":").split(":") if e and preloaded_allocator(e) is None]
    stripped = {k: v for k, v in env.items() if k != "LD_PRELOAD"}
    if kept:
        stripped["LD_PRELOAD"] = ":".join(kept)
    return stripped


def install_command(distro: DistroInfo, tool: str, is_root: bool) -> str:
    """The command that installs `tool` (jemalloc, tcmalloc, numactl) here, as doctor gives it."""
    from torchpace.doctor.remedies import install_command as distro_install_command, install_hint

    return distro_install_command(distro, tool, is_root) or f"your package manager ({install_hint(tool)})"


# ---- limits, NCCL, the sitecustomize hook ---------------------------------------------------------

def _plan_nofile(options: ChildOptions) -> tuple[int | None, Setting]:
    """The child's soft RLIMIT_NOFILE: --nofile, else raised toward the hard limit."""
    soft, hard = options.facts.nofile_soft, options.facts.nofile_hard
    if options.nofile is not None:
        if hard is not None and options.nofile > hard:
            raise UsageError(f"--nofile {options.nofile} is above the hard limit {hard}; raise the hard limit first "
                             "(/etc/security/limits.conf, or LimitNOFILE= for a systemd service)")
        return options.nofile, Setting("RLIMIT_NOFILE", str(options.nofile), Source.CLI, f"--nofile {options.nofile}")
    target = _NOFILE_TARGET if hard is None else min(hard, _NOFILE_TARGET)
    if soft is None or soft >= target:
        shown = "unlimited" if soft is None else str(soft)
        return None, Setting("RLIMIT_NOFILE", shown, Source.DEFAULT, f"the soft limit {shown} is already high enough")
    return target, Setting("RLIMIT_NOFILE", str(target), Source.AUTO,
                           f"raised from the soft limit {soft} toward the hard limit "
                           f"{'unlimited' if hard is None else hard} (at most {_NOFILE_TARGET})")


def _plan_nccl(host: HostFacts, base_env: Mapping[str, str], torchrun: bool) -> _Part:
    name = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
    if not torchrun:
        return _Part([Setting(name, None, Source.DEFAULT, "one process: no NCCL process group")])
    if not host.gpus:
        return _Part([Setting(name, None, Source.DEFAULT, "no CUDA device: the ranks use gloo, not NCCL")])
    return _env_part({name: "1"}, Source.AUTO, "a failed NCCL collective aborts the job instead of hanging it", base_env)


def _plan_hook(config: RunConfig, base_env: Mapping[str, str], options: ChildOptions) -> _Part:
    """The sitecustomize hook: the knobs that reach an unmodified script in-process (`Knob.script_reach`:
    global, DataLoader, optimizer, autocast); a `prepared` child applies them itself."""
    values = {name: value for name, value in sorted(config.non_default().items()) if _hook_applies(name, value)}
    if not values:
        return _Part()
    if options.prepared:
        return _Part([Setting(name, _shown(value), Source.CONFIG, "applied by torchpace.prepare() in the child")
                      for name, value in values.items()])
    pythonpath = os.pathsep.join(p for p in (options.facts.hook_dir, base_env.get("PYTHONPATH", "")) if p)
    part = _Part(env={"PYTHONPATH": pythonpath, CONFIG_ENV: json.dumps(values, sort_keys=True)})
    part.settings.append(Setting("PYTHONPATH", pythonpath, Source.CONFIG, "puts torchpace's sitecustomize hook first"))
    part.settings.append(Setting(CONFIG_ENV, part.env[CONFIG_ENV], Source.CONFIG, "the knobs the hook applies"))
    for name, value in values.items():
        knob = REGISTRY[name]
        where = knob.script_reach.how if knob.script_reach is not None else ""
        part.settings.append(Setting(name, _shown(value), Source.CONFIG, f"{where}; {knob.help.rstrip('.')}"))
    return part


def _hook_applies(name: str, value: object) -> bool:
    """True when the hook applies knob `name` = `value` inside the script."""
    knob = REGISTRY[name]
    return knob.script_reach is not None and knob.script_reach.in_process and knob.script_reason(value) is None


def _shown(value: object) -> str:
    """A knob value as a setting shows it: strings as they are, others as JSON (`true`, `2`)."""
    return value if isinstance(value, str) else json.dumps(value)


def _needs_prepare(config: RunConfig) -> tuple[str, ...]:
    """Config knobs (not at their default) that touch the model, optimizer or step and that the hook
    cannot apply to an unmodified script."""
    return tuple(sorted(name for name, value in config.non_default().items()
                        if REGISTRY[name].point in _PREPARE_POINTS and not _hook_applies(name, value)))


def _prepare_notes(needs_prepare: Sequence[str]) -> list[str]:
    if not needs_prepare:
        return []
    verb = "changes" if len(needs_prepare) == 1 else "change"
    return [f"{', '.join(needs_prepare)} {verb} the model, optimizer or training step, which the launch hook "
            "cannot do: call torchpace.prepare(..., config) in the script for that"]
