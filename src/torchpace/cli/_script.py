"""What `bench`, `tune` and `profile` share for script mode: WORKLOAD or `-- python train.py ARGS`.

Click would hand the words after `--` to the WORKLOAD argument, so a verb built with `ScriptVerb` sets
them aside before click parses (`script_command(ctx)` returns them). A WORKLOAD and a command together,
or a `--` with nothing after it, is a UsageError (exit 2).
"""

from __future__ import annotations

import os
import shlex

import click

from torchpace.errors import UsageError

_META = "torchpace.script_command"


class ScriptVerb(click.Command):
    """A click command whose arguments after `--` are the user's command, untouched by click."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            cut = args.index("--")
            ctx.meta[_META] = list(args[cut + 1:])
            args = args[:cut]
        return super().parse_args(ctx, args)


def script_command(workload: str | None) -> list[str] | None:
    """The command after `--` (None without `--`); UsageError when it is empty or comes with a WORKLOAD."""
    command = click.get_current_context().meta.get(_META)
    if command is None:
        return None
    if not command:
        raise UsageError("nothing after `--`: give the training command, e.g. `-- python train.py ARGS`")
    if workload is not None:
        raise UsageError(f"give either a WORKLOAD ({workload!r}) or a command after `--` "
                         f"({shlex.join(command)!r}), not both")

    # lazy: every command, --help included, loads this module; this loads only when used
    from torchpace.launch.command import check_program_exists, parse_python_command

    program = parse_python_command(command)
    launcher = program.launcher
    if launcher is not None and launcher.nnodes > 1:
        raise UsageError(f"the command's {launcher.name} runs the job on {launcher.nnodes} nodes, and torchpace measures "
                         f"a job's ranks on this host only: give it one node (drop --nnodes / --num_machines), "
                         f"or measure the same script on one node")
    check_program_exists(program, pythonpath=os.environ.get("PYTHONPATH"))  # before a baseline or a study exists
    return command


def script_inputs(command: list[str], config_path: str | None) -> list[tuple[str, object]]:
    """The files a script-mode run reads (the script, a folder's `__main__.py` or the module `-m` runs, every
    file its command line names, the config), for `check_outputs`."""
    # lazy: every command, --help included, loads this module; this loads only when used
    from torchpace.cli._common import command_files
    from torchpace.launch.command import parse_python_command, program_sources

    program = program_sources(parse_python_command(command), pythonpath=os.environ.get("PYTHONPATH"))[0]
    return [*program, *command_files(command), ("the config", config_path)]


def script_sources(command: list[str]) -> list[tuple[str, object]]:
    """The folders a script-mode run's program imports its own Python from (`launch.command.program_sources`),
    for `check_outputs(source_dirs=...)`: no output may overwrite a module the script imports."""
    # lazy: every command, --help included, loads this module; this loads only when used
    from torchpace.launch.command import parse_python_command, program_sources

    return program_sources(parse_python_command(command), pythonpath=os.environ.get("PYTHONPATH"))[1]


def python_sources(command) -> tuple[list, list]:
    """(files, folders) of `launch.command.program_sources` when `command` runs a Python program that is
    there, else nothing: for `monitor`, which runs any command."""
    # lazy: every command, --help included, loads this module; this loads only when used
    from torchpace.launch.command import parse_python_command, program_sources

    try:
        return program_sources(parse_python_command(list(command)), pythonpath=os.environ.get("PYTHONPATH"))
    except UsageError:  # not Python, or not there: monitor runs it as it is (and says when it is missing)
        return [], []


# more samples in one optimizer step than any step holds (a billion; LLM steps count a few million tokens):
# a larger figure is a slip, and every samples/s figure would be scaled by it
MAX_SAMPLES_PER_STEP = 1 << 30


def samples_per_step_option(func):
    """`--samples-per-step N`: samples in one step of a script whose batches do not tell."""
    return click.option("--samples-per-step", type=click.IntRange(1, MAX_SAMPLES_PER_STEP), default=None,
                        help="Script mode: samples in one optimizer step, when the script's DataLoader batches do not "
                             "tell (default: the leading dimension of each batch; else figures are steps/s).")(func)


def show_output_option(func):
    """`--show-output`: stream the script's own output to stderr while it runs (it is kept in a log file
    under .torchpace/logs/ either way)."""
    return click.option("--show-output", is_flag=True, default=False,
                        help="Script mode: also stream the script's own output (its prints, the framework's progress) "
                             "to stderr as it runs; it is kept in a log file under .torchpace/logs/ either way.")(func)


_SCRIPT_ONLY = {"--show-output": "streams the output of a script", "--samples-per-step": "tells the samples in one step of a script"}


def check_script_options(command: list[str] | None, show_output: bool = False, samples_per_step: int | None = None) -> None:
    """UsageError for a script-mode option (`--show-output`, `--samples-per-step`) without a script: a Workload
    runs in torchpace's own process, and its batches tell the samples of a step."""
    given = {"--show-output": show_output, "--samples-per-step": samples_per_step is not None}
    named = next((name for name, value in given.items() if value), None)
    if named is not None and command is None:
        raise UsageError(f"{named} {_SCRIPT_ONLY[named]} given after `--` (`-- python train.py ARGS`); there is no "
                         "script here (a Workload's own batches tell its samples, and it runs in torchpace's process)")
