"""`torchpace bench [WORKLOAD | -- python train.py ARGS]`: measure the training step (samples/s with a 95% CI)."""

from __future__ import annotations

import click

from torchpace.cli._common import check_outputs, json_option, output_result
from torchpace.cli._options import SECONDS, build_config, config_options, device_option, workload_argument, workload_inputs
from torchpace.cli._script import (ScriptVerb, check_script_options, samples_per_step_option, script_command,
                                     script_inputs, script_sources, show_output_option)
from torchpace.protocol import MAX_EVAL_BATCHES


@click.command("bench", cls=ScriptVerb)
@workload_argument
@config_options
@click.option("--max-time", "max_time_s", type=SECONDS, default=60.0, show_default=True,
              help="Time cap in seconds (warm-up + measurement).")
@device_option
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None, help="Also save the JSON result here.")
@click.option("--accuracy-batches", type=click.IntRange(0, MAX_EVAL_BATCHES), default=4, show_default=True,
              help="Inference workloads: report the outputs' distance from the fp32 eager reference on this many batches (0: skip).")
@click.option("--scaling", "scaling", default=None, metavar="N0,N1,...",
              help="Measure the job at each world size (ranks on this node) against the first, and report the scaling "
                   "efficiency with its CI: a script's launcher option (torchrun --nproc-per-node) or a Workload's "
                   "nproc_per_node is set for each; --max-time is each comparison's time.")
@samples_per_step_option
@show_output_option
@json_option
def command(workload, config_path, assignments, max_time_s, device, out_path, accuracy_batches, scaling, samples_per_step,
            show_output, as_json):
    """Measure WORKLOAD's real training step (default: the built-in `tabular`), or an unmodified
    training script given after `--` (`torchpace bench -- python train.py ARGS`).

    WORKLOAD is `pkg.module:function`, `path/to/file.py:function`, or one of resnet, gpt (sized for
    the device; resnet-small, resnet-full, gpt-small, gpt-full by name), vision, language, tabular,
    inference. A script is measured inside its own process: a step is
    one optimizer step (or one backward() without an optimizer), samples come from its DataLoader.
    """
    # lazy: `torchpace bench --help` loads this module; the verb's work loads only when it runs
    from torchpace.host import probe_host
    from torchpace.measure.bench import BenchOptions
    from torchpace.bench.run import bench_workload, nonfinite_loss_message

    command_argv = script_command(workload)
    check_script_options(command_argv, show_output, samples_per_step)
    inputs = script_inputs(command_argv, config_path) if command_argv else workload_inputs(workload, config_path)
    check_outputs({"--out": out_path}, inputs, source_dirs=script_sources(command_argv) if command_argv else ())
    config = build_config(config_path, assignments)
    host = probe_host()
    if scaling is not None:
        return _scaling(workload, command_argv, config, scaling, max_time_s, device, samples_per_step, host, out_path,
                        as_json)
    if command_argv:
        # lazy: `torchpace bench --help` loads this module; the verb's work loads only when it runs
        from torchpace.bench.script import bench_script

        result = bench_script(command_argv, config, max_time_s, host, samples_per_step=samples_per_step,
                              show_progress=not as_json, show_output=show_output)
    else:
        result = bench_workload(workload, config, BenchOptions(max_time_s=max_time_s), host=host, device=device,
                                show_progress=not as_json, accuracy_batches=accuracy_batches)
    # lazy: `torchpace bench --help` loads this module; the verb's work loads only when it runs
    from torchpace.measure.render import render_bench

    output_result(result.to_dict(), out_path, as_json, lambda console, _: render_bench(console, result))
    problem = nonfinite_loss_message(result.loss_values)
    if problem:
        click.echo(f"torchpace: error: {problem}", err=True)
        return 1
    return 0


def _scaling(workload, command_argv, config, scaling: str, max_time_s: float, device, samples_per_step, host, out_path,
             as_json: bool) -> int:
    """`bench --scaling`: the job at each world size against the first (`torchpace.compare.scaling`)."""
    # lazy: `torchpace bench --help` loads this module; the verb's work loads only when it runs
    from torchpace.compare.run import CompareOptions
    from torchpace.compare.scaling import measure_scaling, parse_scaling, render_scaling

    sizes = parse_scaling(scaling, host)
    options = CompareOptions(max_time_s=max_time_s, samples_per_step=samples_per_step, device=device)
    result = measure_scaling(workload, command_argv, config, sizes, options, host, show_progress=not as_json)
    output_result(result.to_dict(), out_path, as_json, lambda console, _: render_scaling(console, result))
    return 0 if all(point.error is None for point in result.points) else 1
