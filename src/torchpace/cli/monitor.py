"""`torchpace monitor`: run a command and watch GPU/CPU/memory/IO live, with symptom alerts.

Parses argv into `MonitorOptions` and decides the view; `torchpace.monitor.run` does the work and is
imported only when the verb runs, so `torchpace monitor --help` imports neither torch nor psutil.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from torchpace.cli._common import check_outputs, command_files, emit_json, json_option, make_console
from torchpace.cli._options import FiniteFloat
from torchpace.cli._script import python_sources
from torchpace.monitor import MAX_INTERVAL_S, MIN_INTERVAL_S


def plan_view(no_live: bool, stdout_tty: bool, stderr_tty: bool) -> tuple[bool, tuple[bool, bool]]:
    """(live view?, capture CMD's (stdout, stderr)?).

    The live view draws on stderr when it is a terminal, and then shows CMD's output above itself:
    only the streams that go to that terminal are captured, so a redirected stream stays redirected.
    """
    live = stderr_tty and not no_live
    return live, (live and stdout_tty, live)


@click.command(
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
    short_help="Run a command and watch GPU/CPU/memory/IO live, with symptom alerts.",
)
@click.option("--interval", "interval_s", type=FiniteFloat(min=MIN_INTERVAL_S, max=MAX_INTERVAL_S), default=1.0,
              show_default=True, help=f"Seconds between samples ({MIN_INTERVAL_S} to {MAX_INTERVAL_S:g}).")
@click.option("--csv", "csv_path", type=click.Path(path_type=Path), default=None,
              help="Write one row per sample to this CSV file (columns and units: docs/guide/monitor.md).")
@click.option("--tensorboard", "tensorboard_dir", type=click.Path(path_type=Path), default=None,
              help="Write every metric as TensorBoard scalars to this directory (pip install 'torchpace[tensorboard]').")
@click.option("--no-live", is_flag=True, help="Print plain periodic lines instead of the live view.")
@json_option
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def command(interval_s: float, csv_path: Path | None, tensorboard_dir: Path | None, no_live: bool,
            as_json: bool, cmd: tuple[str, ...]) -> int:
    """Run CMD, sample it and the host, raise symptom alerts, and exit with CMD's exit code.

    \b
    Example:
      torchpace monitor --csv run.csv -- python train.py --epochs 3

    Ctrl-C and SIGTERM are passed on to CMD's whole process group; whatever CMD leaves
    running when it exits is stopped. Exit codes: CMD's own; 127 when CMD does not exist,
    126 when it cannot be executed, 2 for bad options (nothing is started then).
    """
    files, sources = python_sources(cmd)
    check_outputs({"--csv": csv_path, "--tensorboard": tensorboard_dir}, [*files, *command_files(cmd)],
                  out_dirs=["--tensorboard"], source_dirs=sources)
    # lazy: `torchpace monitor --help` loads this module; the verb's work loads only when it runs
    from torchpace.monitor.live import LiveView, PlainView, render_summary
    from torchpace.monitor.run import MonitorOptions, build_summary, probe_cores, run_monitor

    live, capture = plan_view(no_live, sys.stdout.isatty(), sys.stderr.isatty())
    options = MonitorOptions(command=tuple(cmd), interval_s=interval_s, csv_path=csv_path,
                             tensorboard_dir=tensorboard_dir, capture_output=capture)
    console = make_console(stderr=True)
    title = f"torchpace monitor: {shlex.join(cmd)}"
    usable_cores = probe_cores()
    view = LiveView(console, title, usable_cores) if live else PlainView(console)
    result = run_monitor(options, view, usable_cores=usable_cores)
    summary = build_summary(result)
    if as_json:
        emit_json(summary)
    else:
        console.print(render_summary(summary))
    return result.exit_code

