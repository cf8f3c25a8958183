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

The planner names no knob: each registered knob plans its own part (`Knob.plan_child`, in
`plan_order`: the processes, their NUMA binding, the threads, the allocator), from the vocabulary in
`torchpace.knobs.child`; what remains here is the launch itself (torchrun or a plain exec, numactl
per rank, NCCL, the open-files limit) and the sitecustomize hook for the knobs that reach a script
inside its process.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from torchpace.config import RunConfig
from torchpace.doctor.remedies import install_command as distro_install_command
from torchpace.doctor.remedies import install_hint
from torchpace.errors import UsageError
from torchpace.host import DistroInfo, HostFacts
from torchpace.knobs import REGISTRY, Point
from torchpace.knobs.child import (KEPT, ChildDraft, ChildPart, ChildRequest, RankBinding, Setting, Source,
                                   env_part, format_cpu_list, merge_parts)
from torchpace.launch.bind import BINDINGS_ENV  # JSON of each local rank's numactl prefix and env
from torchpace.launch.command import PythonCommand

# What callers import from the planner; the vocabulary it shares with the knobs is defined in `knobs.child`.
__all__ = ["plan_child", "ChildOptions", "LaunchFacts", "LaunchPlan", "Setting", "Source", "RankBinding", "CONFIG_ENV",
           "install_command"]

CONFIG_ENV = "TORCHPACE_LAUNCH_CONFIG"  # JSON of the knob values the sitecustomize hook applies
TORCHRUN_MODULE = "torchpace.launch.torchrun"  # torchrun that exits with the failed worker's code
BIND_MODULE = "torchpace.launch.bind"  # per-rank entrypoint that execs numactl

# A soft RLIMIT_NOFILE worth raising to: DataLoader workers pass batches as shared-memory file
# descriptors; far higher limits make programs that loop over every possible fd slow at start-up.
_NOFILE_TARGET = 65536
_KMP_AFFINITY = "granularity=fine,compact,1,0"  # Intel OpenMP: one thread per bound CPU, packed
_PREPARE_POINTS = (Point.MODEL, Point.OPTIMIZER, Point.DATASET, Point.STEP)

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
        given: the command line's value of each knob that takes one (its `Knob.launch_flag`: processes,
            NUMA binding, allocator, threads), by knob name; a knob not in it was not given.
        nnodes, node_rank, rdzv_endpoint: the rendezvous of several nodes (cli).
        nofile: the child's soft RLIMIT_NOFILE.
    """

    command: PythonCommand
    facts: "LaunchFacts"
    config_name: str = "config"
    auto: bool = False
    config_over_env: bool = False
    prepared: bool = False
    given: Mapping[str, Any] = field(default_factory=dict)
    nnodes: int | None = None
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    nofile: int | None = None


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
    _check_distributed(options)
    launcher = options.command.launcher
    draft = ChildDraft(multi_node=(options.nnodes or 1) > 1 or options.rdzv_endpoint is not None,
                       launcher=launcher.name if launcher is not None else None,
                       launcher_ranks=launcher.ranks_per_node if launcher is not None else None)
    parts = _plan_knobs(config, host, base_env, options, draft)
    _check_launcher(options, draft)
    parts += [
        _plan_launcher(options, draft),
        _plan_binding_env(draft.bindings, base_env, host, draft.torchrun),
        _plan_nccl(host, base_env, draft.torchrun or draft.ranks > 1),
        _plan_hook(config, base_env, options),
    ]
    nofile, nofile_setting = _plan_nofile(options)
    env = _apply_env(base_env, parts)
    needs_prepare = () if options.prepared else _needs_prepare(config)
    notes = [note for part in parts for note in part.notes] + _prepare_notes(needs_prepare)
    settings = [s for part in parts for s in part.settings] + [nofile_setting]
    argv = _build_argv(options, host, draft.nproc, draft.torchrun, draft.bindings)
    return LaunchPlan(tuple(argv), env, tuple(settings), options.command.label, needs_prepare, nofile, draft.bindings,
                      tuple(notes))


def _plan_knobs(config: RunConfig, host: HostFacts, base_env: Mapping[str, str], options: ChildOptions,
                draft: ChildDraft) -> list[ChildPart]:
    """Every registered knob's own part of the child, in `plan_order` (knobs that plan none are left out);
    each gets the config's value (None when unset) and the command line's (its `launch_flag`, `ChildOptions.given`)."""
    request = ChildRequest(host, base_env, options.config_name, options.auto, options.config_over_env,
                           options.facts.allowed_cpus,
                           functools.partial(install_command, host.distro, is_root=options.facts.is_root))
    parts = []
    for knob in sorted(REGISTRY.values(), key=lambda k: k.plan_order):
        given = options.given.get(knob.name)
        part = knob.plan_child(config.values.get(knob.name), given, request, draft)
        if part is not None:
            parts.append(part)
    return parts


def _apply_env(base_env: Mapping[str, str], parts: Sequence[ChildPart]) -> dict[str, str]:
    env = dict(base_env)
    for part in parts:
        for name, value in part.env.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
    return env


# ---- processes: plain exec or torchrun ----------------------------------------------------------

def _plan_launcher(options: ChildOptions, draft: ChildDraft) -> ChildPart:
    """Nodes and the launcher: the program runs directly, or torchrun runs its processes on each node."""
    nnodes = options.nnodes or 1
    part = ChildPart([_cli_or_default("nnodes", options.nnodes, 1, "this node only")])
    if options.node_rank is not None:
        part.settings.append(Setting("node_rank", str(options.node_rank), Source.CLI,
                                     "node 0 hosts the c10d rendezvous store; global ranks follow the rendezvous"))
    if draft.launcher is not None and not draft.torchrun:
        ranks = f"{draft.launcher_ranks} process(es)" if draft.launcher_ranks else "the processes its options say"
        part.settings.append(Setting("launcher", draft.launcher, Source.CLI,
                                     f"the command's own: it starts {ranks} on this node, each with torchpace's hook"))
        return part
    how = (f"torch.distributed.run (torchrun): {draft.nproc} process(es) on each of {nnodes} node(s)" if draft.torchrun
           else "one process: the script runs directly, no torchrun")
    part.settings.append(Setting("launcher", "torchrun" if draft.torchrun else "exec",
                                 Source.CLI if draft.torchrun else Source.DEFAULT, how))
    return part


def _check_launcher(options: ChildOptions, draft: ChildDraft) -> None:
    """UsageError when torchpace is asked to start ranks of a command whose own launcher starts them."""
    if draft.launcher is None:
        return
    if draft.torchrun:
        asked = (f"nproc_per_node = {draft.nproc}" if draft.nproc > 1 else "--nnodes / --rdzv-endpoint")
        raise UsageError(f"{asked} asks torchpace to start the ranks, and the command's own {draft.launcher} starts them: "
                         f"give the number of processes and nodes in its options (torchrun --nproc-per-node N, "
                         f"accelerate launch --num_processes N), or run the script without its launcher")


def _cli_or_default(name: str, given: int | None, default: int, default_reason: str) -> Setting:
    if given is not None:
        return Setting(name, str(given), Source.CLI, f"--{name.replace('_', '-')} {given}")
    return Setting(name, str(default), Source.DEFAULT, default_reason)


def _check_distributed(options: ChildOptions) -> None:
    """UsageError for multi-node options that cannot work together."""
    nnodes = options.nnodes or 1
    nproc = options.given.get("nproc_per_node")
    if nproc is not None and nproc < 1:
        raise UsageError(f"--nproc-per-node must be 1 or more, got {nproc}")
    if nnodes > 1 and not options.rdzv_endpoint:
        raise UsageError(f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT, the address every node can reach "
                         "(e.g. node 0's IP and a free port)")
    if options.node_rank is not None and not 0 <= options.node_rank < nnodes:
        raise UsageError(f"--node-rank {options.node_rank} is out of range for --nnodes {nnodes} (valid: 0..{nnodes - 1})")
    if options.rdzv_endpoint is not None:
        host, sep, port = options.rdzv_endpoint.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise UsageError(f"--rdzv-endpoint {options.rdzv_endpoint!r} is not HOST:PORT (e.g. 10.0.0.1:29500)")
        if not 1 <= int(port) <= 65535:
            raise UsageError(f"--rdzv-endpoint {options.rdzv_endpoint!r}: port {int(port)} is not a TCP port "
                             "(valid: 1 to 65535)")


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


def _plan_binding_env(bindings: Sequence[RankBinding], base_env: Mapping[str, str], host: HostFacts,
                      torchrun: bool) -> ChildPart:
    """GOMP_CPU_AFFINITY / KMP_AFFINITY for bound ranks; under torchrun, each rank's numactl command."""
    if not bindings:
        return ChildPart()
    part = env_part({"KMP_AFFINITY": _KMP_AFFINITY}, Source.AUTO, "Intel OpenMP: one thread per bound CPU", base_env)
    gomp_reason = "GNU OpenMP: threads pinned to the rank's CPUs"
    if not torchrun:
        gomp = env_part({"GOMP_CPU_AFFINITY": format_cpu_list(bindings[0].cpus)}, Source.AUTO, gomp_reason, base_env)
        return merge_parts(part, gomp)
    keep_gomp = "GOMP_CPU_AFFINITY" in base_env
    per_rank = {str(b.local_rank): {"prefix": b.numactl_prefix(str(host.numactl)),
                                    "env": {} if keep_gomp else {"GOMP_CPU_AFFINITY": format_cpu_list(b.cpus)}}
                for b in bindings}
    part.env[BINDINGS_ENV] = json.dumps(per_rank, sort_keys=True)
    part.settings.append(Setting(BINDINGS_ENV, part.env[BINDINGS_ENV], Source.AUTO,
                                 f"each local rank's numactl command and CPU list, read by {BIND_MODULE}"))
    part.settings.append(Setting("GOMP_CPU_AFFINITY", base_env["GOMP_CPU_AFFINITY"], Source.ENV, KEPT) if keep_gomp
                         else Setting("GOMP_CPU_AFFINITY", "per rank", Source.AUTO, f"{gomp_reason} (set by {BIND_MODULE})"))
    return part


def install_command(distro: DistroInfo, tool: str, is_root: bool) -> str:
    """The command that installs `tool` (jemalloc, tcmalloc, numactl) here, as doctor gives it."""
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


def _plan_nccl(host: HostFacts, base_env: Mapping[str, str], torchrun: bool) -> ChildPart:
    name = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
    if not torchrun:
        return ChildPart([Setting(name, None, Source.DEFAULT, "one process: no NCCL process group")])
    if not host.gpus:
        return ChildPart([Setting(name, None, Source.DEFAULT, "no CUDA device: the ranks use gloo, not NCCL")])
    return env_part({name: "1"}, Source.AUTO, "a failed NCCL collective aborts the job instead of hanging it", base_env)


def _plan_hook(config: RunConfig, base_env: Mapping[str, str], options: ChildOptions) -> ChildPart:
    """The sitecustomize hook: the knobs that reach an unmodified script in-process (`Knob.script_reach`:
    global, DataLoader, optimizer, autocast, compile); a `prepared` child applies them itself."""
    values = {name: value for name, value in sorted(config.values.items()) if _hook_sets(name, value)}
    if not values:
        return ChildPart()
    if options.prepared:
        return ChildPart([Setting(name, _shown(value), Source.CONFIG, "applied by torchpace.prepare() in the child")
                      for name, value in values.items()])
    pythonpath = os.pathsep.join(p for p in (options.facts.hook_dir, base_env.get("PYTHONPATH", "")) if p)
    part = ChildPart(env={"PYTHONPATH": pythonpath, CONFIG_ENV: json.dumps(values, sort_keys=True)})
    part.settings.append(Setting("PYTHONPATH", pythonpath, Source.CONFIG, "puts torchpace's sitecustomize hook first"))
    part.settings.append(Setting(CONFIG_ENV, part.env[CONFIG_ENV], Source.CONFIG, "the knobs the hook applies"))
    for name, value in values.items():
        knob = REGISTRY[name]
        where = knob.script_guard or (knob.script_reach.how if knob.script_reach is not None else "")
        part.settings.append(Setting(name, _shown(value), Source.CONFIG, f"{where}; {knob.help.rstrip('.')}"))
    return part


def _hook_sets(name: str, value: object) -> bool:
    """True when the hook has `name` = `value` to apply in the script: a value that differs from the default, or
    one equal to it that replaces the script's own argument (`Reach.sets_arguments`: `data.num_workers = 0` over
    the script's `--workers 2`)."""
    knob = REGISTRY[name]
    if value == knob.default:
        return _hook_applies(name, value) and knob.script_reach.sets_arguments
    return _hook_applies(name, value) or bool(knob.script_guard)


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
