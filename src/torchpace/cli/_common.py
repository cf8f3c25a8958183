"""What every verb shares: error-to-exit-code mapping, JSON output, the Rich console."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from torchpace.errors import TorchpaceError, UserCodeError


def run_cli(group: click.Group, argv: list[str] | None) -> int:
    """Run the click group; map torchpace errors to a stderr message and their exit code."""
    try:
        result = group.main(args=argv, prog_name="torchpace", standalone_mode=False)
    except UserCodeError as err:
        click.echo(f"torchpace: error: {err}.", err=True)
        click.echo("---- traceback from YOUR code (not torchpace) ----", err=True)
        click.echo(err.user_traceback.rstrip(), err=True)
        click.echo("---- end of your traceback ----", err=True)
        return err.exit_code
    except TorchpaceError as err:
        click.echo(f"torchpace: error: {err}", err=True)
        return err.exit_code
    except click.exceptions.Exit as err:
        return err.exit_code
    except click.ClickException as err:
        err.show()
        return err.exit_code
    except click.Abort:
        click.echo("Aborted.", err=True)
        return 130
    return result if isinstance(result, int) else 0


def json_option(func):
    """The `--json` flag every reporting verb has."""
    return click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (schema: docs/reference/schemas.md).")(func)


def emit_json(payload: dict[str, Any]) -> None:
    """Write `payload` as indented JSON to stdout."""
    json.dump(payload, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")


def make_console(stderr: bool = False):
    """A Rich console (imported lazily: `--help` must stay light)."""
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def output_result(payload: dict[str, Any], out_path: str | None, as_json: bool, render) -> None:
    """Save `payload` to `out_path` (if given), then print it as JSON or with `render(console, payload)`."""
    if out_path:
        from torchpace.measure.run import save_result

        save_result(payload, out_path)
    if as_json:
        emit_json(payload)
    else:
        render(make_console(), payload)


__all__ = ["run_cli", "json_option", "emit_json", "make_console", "output_result"]
