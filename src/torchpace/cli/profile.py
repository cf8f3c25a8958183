"""`torchpace profile [WORKLOAD]`: why the step is slow — a verdict with evidence and a trace."""

from __future__ import annotations

import contextlib
import logging
import os
import sys

import click

from torchpace.cli._common import check_outputs, emit_json, json_option, make_console
from torchpace.cli._options import build_config, config_options, device_option, workload_argument, workload_inputs
from torchpace.cli._script import (ScriptVerb, check_script_options, script_command, script_inputs, script_sources,
                                   show_output_option)
from torchpace.files import OutputWriteFailed
from torchpace.logs import cli_flags
from torchpace.profile.trace import MAX_PROFILED_STEPS

_log = logging.getLogger(__name__)

DEFAULT_TRACE = "torchpace-profile.json.gz"


@click.command("profile", cls=ScriptVerb)
@workload_argument
@config_options
@click.option("--steps", type=click.IntRange(1, MAX_PROFILED_STEPS), default=5, show_default=True,
              help=f"Steps recorded in the trace (after 1 untraced and 1 warm-up step; at most {MAX_PROFILED_STEPS}).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=DEFAULT_TRACE, show_default=True,
              help="Where to write the Chrome/Perfetto trace (gzip-compressed when it ends in .gz).")
@click.option("--python-steps", type=click.IntRange(0, MAX_PROFILED_STEPS), default=3, show_default=True,
              help=f"Steps run under cProfile for the Python-overhead analysis (0 skips it; at most {MAX_PROFILED_STEPS}).")
@device_option
@show_output_option
@json_option
def command(workload, config_path, assignments, steps, trace_path, python_steps, device, show_output, as_json):
    """Explain why WORKLOAD is slow (default: the built-in `tabular`).

    Runs a few real steps under torch.profiler and reports a verdict (input-bound,
    host-sync-bound, compute-bound, memory-bound or communication-bound), the evidence, what to
    do, and the knobs `torchpace tune` would try first. WORKLOAD is `pkg.module:function`,
    `path/to/file.py:function`, or one of resnet, gpt (sized for the device; resnet-small,
    resnet-full, gpt-small, gpt-full by name), vision, language, tabular, inference. An unmodified
    training script runs after `--` (`torchpace profile -- python train.py ARGS`): its own steps are
    traced, labelled by torchpace's hook (input wait, forward, backward, optimizer).
    """
    command_argv = script_command(workload)
    check_script_options(command_argv, show_output)
    inputs = script_inputs(command_argv, config_path) if command_argv else workload_inputs(workload, config_path)
    check_outputs({"--trace": trace_path}, inputs, source_dirs=script_sources(command_argv) if command_argv else ())
    config = build_config(config_path, assignments)
    if command_argv:
        return _profile_script(command_argv, config, steps, python_steps, trace_path, as_json, show_output)
    # lazy: `torchpace profile --help` loads this module; the verb's work loads only when it runs
    from torchpace.knobs.distributed import nproc_of
    from torchpace.engine.distributed import RankEnv

    ranks, nproc = RankEnv.from_env(), nproc_of(config.values)
    if nproc > 1 and not ranks.under_torchrun:  # every rank must step (their collectives are in the trace)
        _log.info("the config runs %d processes: profile runs again as that many torchrun ranks (every rank steps)", nproc)
        args = [*cli_flags(), "profile", *([workload] if workload else []), *(["--config", config_path] if config_path else []),
                *[part for assignment in assignments for part in ("--set", assignment)], "--steps", str(steps),
                "--trace", trace_path, "--python-steps", str(python_steps), *(["--device", device] if device else []),
                *(["--json"] if as_json else [])]
        return _under_torchrun(workload, config, args)
    from torchpace.profile.capture import CaptureOptions
    from torchpace.profile.run import profile_workload

    options = CaptureOptions(steps=steps, python_steps=python_steps)
    with _status(not as_json and ranks.rank == 0, f"profiling {workload or 'tabular'} for {steps + 2} steps"), \
            _figures_before_a_write_failure(as_json):
        result = profile_workload(workload, config, options, device=device, trace_path=trace_path if ranks.rank == 0 else None)
    if ranks.rank != 0:
        return 0  # rank 0 reports for the job
    return _report(result, as_json)


@contextlib.contextmanager
def _figures_before_a_write_failure(as_json: bool):
    """When the trace cannot be written (a full disk), the profile's figures are printed, then the
    error's one line (exit 1)."""
    try:
        yield
    except OutputWriteFailed as failure:
        if failure.figures is not None:
            _report(failure.figures, as_json)
        raise


def _report(result, as_json: bool) -> int:
    """Print a profile result (`ProfileResult`) as JSON or as the Rich report; exit 0."""
    if as_json:
        emit_json(result.to_dict())
    else:
        # lazy: `torchpace profile --help` loads this module; the verb's work loads only when it runs
        from torchpace.profile.render import render_profile

        render_profile(make_console(), result)
    return 0


def _profile_script(command_argv: list[str], config, steps: int, python_steps: int, trace_path: str, as_json: bool,
                    show_output: bool) -> int:
    # lazy: `torchpace profile --help` loads this module; the verb's work loads only when it runs
    from torchpace.host import probe_host
    from torchpace.profile.capture import CaptureOptions
    from torchpace.bench.script import profile_script

    options = CaptureOptions(steps=steps, python_steps=python_steps)
    with _figures_before_a_write_failure(as_json):
        result = profile_script(command_argv, config, options, probe_host(), trace_path=trace_path, show_progress=not as_json,
                                show_output=show_output)
    return _report(result, as_json)


def _under_torchrun(workload: str | None, config, args: list[str]) -> int:
    """Run this profile again as the config's `nproc_per_node` torchrun ranks, planned by the one child planner as a trial
    is (the config's process-level settings, NUMA binding per rank) and run as `launch` runs a plan;
    rank 0 prints. A knob that does not apply is exit 2 before any rank starts. Returns the exit
    status of the first rank that failed, else 0."""
    # lazy: `torchpace profile --help` loads this module; the verb's work loads only when it runs
    from torchpace.host import probe_host
    from torchpace.launch.command import PythonCommand
    from torchpace.launch.execute import execute
    from torchpace.launch.plan import ChildOptions, plan_child
    from torchpace.launch.probe import probe_launch_facts
    from torchpace.runtime.prepare import check_config
    from torchpace.workload import load_workload

    base_env = dict(os.environ)
    host = probe_host(env=base_env)
    check_config(config, host, load_workload(workload))
    options = ChildOptions(PythonCommand(module="torchpace", args=tuple(args)), probe_launch_facts(), "the config",
                           config_over_env=True, prepared=True)
    return execute(plan_child(config, host, base_env, options))


def _status(enabled: bool, message: str):
    """A spinner on stderr while the profile runs (nothing when disabled or not a terminal)."""
    if not enabled or not sys.stderr.isatty():
        return contextlib.nullcontext()
    return make_console(stderr=True).status(message)
