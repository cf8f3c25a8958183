"""Options shared by the verbs that run a workload (bench, tune, profile, knobs)."""

from __future__ import annotations

import math

import click


def workload_argument(func):
    return click.argument("workload", required=False, metavar="[WORKLOAD]")(func)


def config_options(func):
    """`--config FILE` and repeatable `--set KNOB=VALUE` (applied over the file)."""
    func = click.option("--set", "assignments", multiple=True, metavar="KNOB=VALUE",
                        help="Set a knob (repeatable), over --config. See `torchpace knobs`.")(func)
    return click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
                        help="A torchpace.toml to apply.")(func)


def build_config(config_path: str | None, assignments: tuple[str, ...]):
    """The RunConfig from --config and --set (UsageError on a bad file, knob or value)."""
    # lazy: every command, --help included, loads this module; this loads only when used
    from torchpace.config import RunConfig, load_config, parse_assignments

    base = load_config(config_path) if config_path else RunConfig()
    return base.with_values(**parse_assignments(list(assignments)))


class FiniteFloat(click.FloatRange):
    """A float option that must be a finite number within its range: `inf` and `nan` are refused
    (click's FloatRange lets `nan` through every bound, and `inf` past an open upper end)."""

    name = "finite float"

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number; valid: a number with {self._describe_range()}", param, ctx)
        return number


# the longest duration any option takes: past it a value is a slip (an extra zero, hours for seconds), and
# past about 24.8 days a wait no longer fits the C int of milliseconds the kernel's poll() takes
MAX_SECONDS = 7 * 24 * 3600.0
SECONDS = FiniteFloat(min=0, min_open=True, max=MAX_SECONDS)  # every duration option: finite, > 0, at most a week


def objective_option(help_text: str):
    """`--objective throughput|latency`: the figure a verb judges configs by (`torchpace.tune.objective`)."""
    return click.option("--objective", type=click.Choice(["throughput", "latency"]), default="throughput",
                        show_default=True, help=help_text)


def device_option(func):
    """`--device`: a torch device this host has (checked when parsed: exit 2 naming what is valid)."""
    return click.option("--device", default=None, callback=_check_device,
                        help="torch device (default: cuda when available, else cpu).")(func)


def _check_device(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    import torch

    try:
        device = torch.device(value)
    except RuntimeError:
        raise click.BadParameter(f"{value!r} is not a torch device; valid: cpu, cuda, cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise click.BadParameter(f"{value!r}: this host has no CUDA device; use cpu")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise click.BadParameter(f"{value!r}: this host has {torch.cuda.device_count()} CUDA device(s)")
    return value


def workload_inputs(workload: str | None, config_path: str | None = None) -> list[tuple[str, object]]:
    """The files a workload verb reads (the workload's Python file, the config), for `check_outputs`."""
    # lazy: every command, --help included, loads this module; this loads only when used
    from torchpace.cli._common import workload_file

    return [("the workload file", workload_file(workload)), ("the config", config_path)]
