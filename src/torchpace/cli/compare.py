"""`torchpace compare [WORKLOAD | -- python train.py ARGS]`: is config B faster than config A?"""

from __future__ import annotations

import click

from torchpace.cli._common import check_outputs, json_option, output_result
from torchpace.cli._options import SECONDS, device_option, objective_option, workload_argument, workload_inputs
from torchpace.cli._script import (ScriptVerb, check_script_options, samples_per_step_option, script_command, script_inputs,
                                     script_sources)
from torchpace.errors import UsageError


@click.command("compare", cls=ScriptVerb)
@workload_argument
@click.option("--config", "config_paths", multiple=True, type=click.Path(dir_okay=False), metavar="FILE",
              help="A config (a torchpace.toml). Alone, it is B against the defaults; with --set, it is A and B is it "
                   "with the --set; given twice, A then B.")
@click.option("--set", "assignments", multiple=True, metavar="KNOB=VALUE",
              help="Set a knob in B (repeatable), over B's config.")
@click.option("--max-time", "max_time_s", type=SECONDS, default=30.0, show_default=True,
              help="Seconds of rounds (both arms' turns together); each arm's warm-up comes before, alone.")
@click.option("--sequential", is_flag=True,
              help="Compare in separate runs (A B A B A B) instead of turns of two processes held at once.")
@objective_option("Compare samples/s at the batch size, or batch-1 p50 latency (inference workloads: each turn "
                  "times single calls).")
@device_option
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None, help="Also save the JSON result here.")
@samples_per_step_option
@json_option
def command(workload, config_paths, assignments, max_time_s, sequential, objective, device, out_path, samples_per_step,
            as_json):
    """Measure config B against config A on WORKLOAD (default: the built-in `tabular`) or on an
    unmodified script given after `--`, in alternation: both run as trial processes at once and take
    turns, one measured window each per round while the other is stopped, so the host's drift falls
    on both alike. Prints B / A (the median of the rounds' ratios) with its 95% CI.

    \b
    torchpace compare --set precision.amp=bf16                     # bf16 vs the defaults, on `tabular`
    torchpace compare --set data.num_workers=2 -- python train.py  # on your script
    torchpace compare --config torchpace.toml                      # a tuned config vs the defaults
    torchpace compare --config a.toml --config b.toml vision       # two configs
    torchpace compare --objective latency --set threads.intra_op=1 inference  # batch-1 p50
    """
    # lazy: `torchpace compare --help` loads this module; the verb's work loads only when it runs
    from torchpace.compare.render import render_comparison
    from torchpace.compare.run import CompareOptions, compare
    from torchpace.host import probe_host

    command_argv = script_command(workload)
    check_script_options(command_argv, samples_per_step=samples_per_step)
    if len(config_paths) > 2:
        raise UsageError(f"--config is given {len(config_paths)} times; give at most two (A's, then B's)")
    inputs = [*(script_inputs(command_argv, None) if command_argv else workload_inputs(workload)),
              *(("a config", path) for path in config_paths)]
    check_outputs({"--out": out_path}, inputs, source_dirs=script_sources(command_argv) if command_argv else ())
    config_a, config_b = build_pair(config_paths, assignments)
    options = CompareOptions(max_time_s=max_time_s, sequential=sequential, samples_per_step=samples_per_step, device=device,
                             objective=objective)
    result = compare(workload, command_argv, config_a, config_b, options, probe_host(), show_progress=not as_json)
    output_result(result.to_dict(), out_path, as_json, lambda console, _: render_comparison(console, result))
    return 0 if result.verdict != "failed" else 1


def build_pair(config_paths: tuple[str, ...], assignments: tuple[str, ...]):
    """(A, B) from the --config files and the --set assignments:

    - two configs: A and B, with --set over B;
    - one config and --set: A is the config, B the config with --set;
    - one config alone: A is PyTorch's defaults and B the config ("is my tuned config faster?");
    - no config: A is the defaults, B the defaults with --set (the defaults against themselves without).
    """
    # lazy: `torchpace compare --help` loads this module; the verb's work loads only when it runs
    from torchpace.config import RunConfig, load_config, parse_assignments

    configs = [load_config(path) for path in config_paths]
    changes = parse_assignments(list(assignments))
    if len(configs) == 2:
        config_a, base_b = configs
    elif len(configs) == 1 and not changes:
        config_a, base_b = RunConfig(), configs[0]
    else:
        config_a = base_b = configs[0] if configs else RunConfig()
    return config_a, base_b.with_values(**changes)
