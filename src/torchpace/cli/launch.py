"""`torchpace launch [OPTIONS] -- [python] SCRIPT [ARGS]...`: run a training script with tuned process settings.

Parses argv into `ChildOptions` (the program after `--` through `parse_python_command`), probes the
host, plans with `plan_child` (pure), then prints the plan (`--dry-run`) or executes it and returns the
script's exit code. Nothing here imports torch.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import replace

import click

from torchpace.cli._common import check_knob_limit, emit_json, json_option
from torchpace.errors import UsageError
from torchpace.knobs import REGISTRY

MAX_NODES = 65_536  # nodes in one job: the largest training jobs run on some thousands; more is a slip
_EPILOG = """\b
Sources, highest first: cli > env > config > auto > default. A variable already set in your
environment (OMP_NUM_THREADS, LD_PRELOAD, MALLOC_CONF, ...) wins over the config and torchpace's
own choice; only an explicit option beats it. With --config, a setting the config does not hold is
left as the tuner's trials ran it (e.g. no allocator preloaded); torchpace's own `auto` choices apply
without a config, or to an option given as `auto` (--allocator auto).

\b
Examples:
  torchpace launch --dry-run -- train.py --epochs 1
  torchpace launch -- python -m mypkg.train --epochs 1
  torchpace launch --config torchpace.toml --nproc-per-node 4 -- train.py
  torchpace launch --nnodes 2 --node-rank 0 --rdzv-endpoint 10.0.0.1:29500 --nproc-per-node 8 -- train.py
"""


def _flagged() -> list:
    """The knobs a launch option sets (each declares its `launch_flag`), in the order they plan a child."""
    return sorted((k for k in REGISTRY.values() if k.launch_flag), key=lambda k: k.plan_order)


def knob_options(command):
    """Decorate a click command with the options that set a knob's value (each knob's `launch_flag`)."""
    for knob in reversed(_flagged()):
        flag = knob.launch_flag
        kind: dict = {"type": click.Choice(flag.choices)} if flag.choices else {"type": click.IntRange(min=1)}
        if flag.or_auto:
            kind = {"callback": _parsed(flag)}
        command = click.option(flag.option, flag.dest, metavar=flag.metavar, default=None, help=flag.help, **kind)(command)
    return command


def _parsed(flag):
    def parse(ctx: click.Context, param: click.Parameter, value: str | None):
        try:
            return None if value is None else flag.parse(value)
        except ValueError as err:
            raise click.BadParameter(str(err)) from None
    return parse


def knobs_given(options: dict) -> dict:
    """The command line's knob values out of `options` (the command's keyword arguments), by knob name; what
    is left in `options` is the launch's own."""
    return {knob.name: value for knob in _flagged() if (value := options.pop(knob.launch_flag.dest, None)) is not None}


def check_command(command: tuple[str, ...]):
    """The PythonCommand after `--`; UsageError when it is missing, not Python, or its script is missing."""
    # lazy: `torchpace launch --help` loads this module; the verb's work loads only when it runs
    from torchpace.launch.command import check_program_exists, parse_python_command

    if not command:
        raise UsageError("missing the script to launch: torchpace launch [OPTIONS] -- [python] SCRIPT [ARGS]...")
    program = parse_python_command(command)
    check_program_exists(program, pythonpath=os.environ.get("PYTHONPATH"))
    return program


def build_options(command: tuple[str, ...], config_path: str | None, **given: object):
    """(config, ChildOptions) from the parsed command line (the config file is loaded and validated here).

    Without --config, torchpace's own `auto` choices fill what the cli leaves open; with one, what the
    config does not hold is left as the tuner's trials ran it.
    """
    # lazy: `torchpace launch --help` loads this module; the verb's work loads only when it runs
    from torchpace.config import RunConfig, load_config
    from torchpace.launch.plan import ChildOptions
    from torchpace.launch.probe import probe_launch_facts

    program = check_command(command)
    config = load_config(config_path) if config_path else RunConfig()
    knobs = knobs_given(given)
    options = ChildOptions(program, probe_launch_facts(), config_path or "config", auto=config_path is None, given=knobs,
                           **given)
    return config, options


def interpreter_note(named: str | None, found: str | None, current: str) -> str | None:
    """A note when the interpreter named after `--` (`named`, found on PATH as `found`) is not the one
    the script runs with (`current`, torchpace's own); None when they are the same file."""
    if named is None or found is None or os.path.realpath(found) == os.path.realpath(current):
        return None
    return (f"{named} is {found}, but the script runs with {current}, the interpreter torchpace runs in (its trials "
            f"measured with it, and torchpace's hook needs it); to use {found}, run `{found} -m torchpace launch ...`")


def check_here(config, given: dict, host) -> None:
    """UsageError (exit 2, nothing started) for a config knob this host cannot run, as `bench` checks
    it, or an option that sets a knob (--nproc-per-node, --omp-threads: `Knob.launch_flag`) beyond what
    the host allows (the knobs' own limits); `given`: the knobs' values by knob name."""
    # lazy: `torchpace launch --help` loads this module; the verb's work loads only when it runs
    from torchpace.config import check_on_host
    from torchpace.script.knobs import SCRIPT_OWN_DEFAULTS

    check_on_host(config, host, SCRIPT_OWN_DEFAULTS)  # the script's own DDP takes the ddp.* knobs
    for knob in _flagged():
        check_knob_limit(knob.launch_flag.option, knob.name, given.get(knob.name), host)


@click.command("launch", epilog=_EPILOG, context_settings={"allow_interspersed_args": False,
                                                            "help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="A torchpace.toml: process-level knobs go to the env, global and DataLoader knobs to a sitecustomize hook.")
@knob_options
@click.option("--nnodes", type=click.IntRange(1, MAX_NODES), default=None, help="Nodes in the job (needs --rdzv-endpoint).  [default: 1]")
@click.option("--node-rank", type=click.IntRange(0, MAX_NODES - 1), default=None,
              help="This node's rank; node 0 hosts the c10d rendezvous store.")
@click.option("--rdzv-endpoint", metavar="HOST:PORT", default=None, help="c10d rendezvous address every node can reach.")
@click.option("--nofile", type=click.IntRange(min=1), default=None,
              help="Soft limit of open files for the script (default: raised toward the hard limit).")
@click.option("--dry-run", is_flag=True, help="Print the exact command and the env changes with their sources; run nothing.")
@json_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[--] [python] SCRIPT|-m MODULE [ARGS]...")
def command(command, config_path, dry_run, as_json, **given):
    """Run SCRIPT with tuned threads, allocator, NUMA binding and limits; one process or many via torchrun.

    SCRIPT may follow `python` (any Python interpreter's name) or be `-m MODULE`; it runs with the
    interpreter torchpace runs in. Exits with the script's exit code (with torchrun: the first failed rank's).
    """
    # lazy: `torchpace launch --help` loads this module; the verb's work loads only when it runs
    from torchpace.launch.plan import plan_child
    from torchpace.launch.probe import probe_launch_host
    from torchpace.launch.render import plan_to_dict, render_plan, render_summary

    if as_json and not dry_run:
        raise UsageError("--json prints the plan, so it goes with --dry-run")
    base_env = dict(os.environ)
    rendezvous = _rendezvous_of_allocation(given, base_env)
    config, options = build_options(command, config_path, **given)
    host = probe_launch_host(env=base_env)
    check_here(config, options.given, host)
    plan = plan_child(config, host, base_env, options)
    plan = _with_interpreter_note(plan, options, base_env)
    if rendezvous is not None:
        plan = replace(plan, notes=(*plan.notes, f"--nnodes {rendezvous.nnodes} --node-rank {rendezvous.node_rank} "
                                                 f"--rdzv-endpoint {rendezvous.endpoint} from {rendezvous.source}"))
    if dry_run:
        if as_json:
            emit_json(plan_to_dict(plan, base_env))
        else:
            click.echo(render_plan(plan, base_env), nl=False)
        return 0
    # lazy: `torchpace launch --help` loads this module; the verb's work loads only when it runs
    from torchpace.launch.execute import execute

    click.echo(render_summary(plan, base_env), err=True, nl=False)
    return execute(plan)


def _rendezvous_of_allocation(given: dict, env: dict):
    """Where the command line gives no rendezvous, the one the scheduler allocation implies (`launch.cluster`),
    filled into `given` (--nnodes, --node-rank, --rdzv-endpoint); None when there is none to derive."""
    if any(given.get(name) is not None for name in ("nnodes", "node_rank", "rdzv_endpoint")):
        return None  # the command line's flags win over the allocation
    # lazy: `torchpace launch --help` loads this module; the verb's work loads only when it runs
    from torchpace.allocation import read_allocation
    from torchpace.launch.cluster import rendezvous_of

    rendezvous = rendezvous_of(read_allocation(env))
    if rendezvous is not None:
        given.update(nnodes=rendezvous.nnodes, node_rank=rendezvous.node_rank, rdzv_endpoint=rendezvous.endpoint)
    return rendezvous


def _with_interpreter_note(plan, options, base_env):
    """`plan` with a note when the interpreter named after `--` is not the one the script runs with."""
    named = options.command.interpreter
    note = interpreter_note(named, named and shutil.which(named, path=base_env.get("PATH")), options.facts.python)
    return plan if note is None else replace(plan, notes=(*plan.notes, note))
