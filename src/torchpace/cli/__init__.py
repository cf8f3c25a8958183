"""The `torchpace` command: a click group whose verbs are imported only when run.

`torchpace --help` and `--version` import neither torch nor any verb module, so they answer fast.
Each verb lives in its own module under `torchpace.cli` and exposes a click command named `command`.
The group's `-v`/`-q` set what torchpace's log shows on stderr for every verb (`torchpace.logs`): this
is the only place torchpace attaches a log handler.
"""

from __future__ import annotations

import importlib
import importlib.util

import click

from torchpace._version import __version__
from torchpace.logs import attach_cli_handler, cli_level

# verb -> (module, one-line help). The help is here so `--help` need not import the verbs.
_VERBS: dict[str, tuple[str, str]] = {
    "doctor": ("torchpace.cli.doctor", "Check this host's set-up for PyTorch: findings with evidence and fixes."),
    "bench": ("torchpace.cli.bench", "Measure a workload's training step: samples/s with a 95% CI, input-bound share, peak memory."),
    "tune": ("torchpace.cli.tune", "Try one knob at a time, keep what is faster and still converges; write torchpace.toml."),
    "compare": ("torchpace.cli.compare", "Is config B faster than A? Both measured in alternation: the ratio with a 95% CI."),
    "profile": ("torchpace.cli.profile", "Explain why a workload is slow: a bottleneck verdict with evidence and a trace."),
    "monitor": ("torchpace.cli.monitor", "Run a command and watch GPU/CPU/memory/IO live, with symptom alerts."),
    "launch": ("torchpace.cli.launch", "Launch a training script with tuned system settings (threads, allocator, NUMA, limits)."),
    "knobs": ("torchpace.cli.knobs", "List the knobs, their candidates on this host, and why any do not apply."),
    "report": ("torchpace.cli.report", "Write an HTML report of a study, bench or profile result."),
    "shard": ("torchpace.cli.shard", "Write an image folder as WebDataset tar shards (atomic, verified; the source is only read)."),
    "bench-data": ("torchpace.cli.bench_data", "Measure the input pipeline alone: disk reads cold/warm, decode per decoder, loader."),
}


class _LazyGroup(click.Group):
    """A group that imports a verb's module only when that verb is invoked."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name, (module, _) in _VERBS.items() if _module_exists(module))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in _VERBS or not _module_exists(_VERBS[cmd_name][0]):
            return None
        module = importlib.import_module(_VERBS[cmd_name][0])
        return module.command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, _VERBS[name][1]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _module_exists(module: str) -> bool:
    """True when the verb's module ships in this install (verbs arrive one by one)."""
    return importlib.util.find_spec(module) is not None


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="torchpace")
@click.option("-v", "--verbose", is_flag=True,
              help="Log what torchpace does on stderr: each process it starts (command, environment changes), each "
                   "trial's start and end, the study storage, the config, its decisions. Goes before the verb.")
@click.option("-q", "--quiet", is_flag=True, help="Log errors only (results and progress are shown as always).")
@click.pass_context
def cli(ctx: click.Context, verbose: bool, quiet: bool) -> None:
    """torchpace: make PyTorch training and inference fast by measuring instead of guessing."""
    if verbose and quiet:
        raise click.UsageError("-v/--verbose and -q/--quiet ask for opposite logs: give one of them")
    ctx.call_on_close(attach_cli_handler(cli_level(verbose, quiet)))


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point; returns the process exit code."""
    # lazy: every command, --help included, loads this module; this loads only when used
    from torchpace.cli._common import run_cli

    return run_cli(cli, argv)
