"""Options shared by the verbs that run a workload (bench, tune, profile, knobs)."""

from __future__ import annotations

import click

from torchpace.errors import UsageError


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
    from torchpace.config import RunConfig, load_config, parse_assignments

    base = load_config(config_path) if config_path else RunConfig()
    return base.with_values(**parse_assignments(list(assignments)))


def positive_seconds(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    if value is not None and value <= 0:
        raise click.BadParameter(f"must be > 0 seconds, got {value}")
    return value


def check_writable(path: str | None, what: str) -> None:
    """UsageError (exit 2) now, before any work, when `path` cannot be written."""
    import os
    from pathlib import Path

    if path is None:
        return
    parent = Path(path).resolve().parent
    if not parent.is_dir() or not os.access(parent, os.W_OK) or (Path(path).exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"{what} {path!r} cannot be written (is the directory there and writable?)")
