"""`torchpace doctor`: check this host's set-up for PyTorch.

Thin: parse options, collect facts, run the checks, print text or JSON, return the exit code
(0 nothing fails, 1 something fails — with --strict, a warning too; 2 bad input). The doctor
package is imported only when the command runs, so `torchpace doctor --help` stays light.
"""

from __future__ import annotations

import os
import time

import click

from torchpace.cli._common import emit_json, json_option, make_console
from torchpace.errors import UsageError


def _validate_data_dir(data_dir: str | None) -> str | None:
    if data_dir is not None and not os.path.isdir(data_dir):
        what = "is not a directory" if os.path.exists(data_dir) else "does not exist"
        raise UsageError(f"--data-dir {data_dir!r} {what}; pass the directory your training data is read from")
    return os.path.abspath(data_dir) if data_dir is not None else None


@click.command(name="doctor")
@click.option("--data-dir", type=click.Path(file_okay=True, dir_okay=True), default=None,
              help="Directory the training data is read from: checks the disk behind it.")
@click.option("--strict", is_flag=True, help="Exit 1 on warnings too, not only on failures.")
@json_option
def command(data_dir: str | None, strict: bool, as_json: bool) -> int:
    """Check this host's set-up for PyTorch: findings with evidence and fixes.

    Exit status: 0 when nothing fails, 1 when something fails (--strict: or warns), 2 on bad input.
    """
    # lazy: `torchpace doctor --help` loads this module; the verb's work loads only when it runs
    from torchpace.doctor.checks import run_checks
    from torchpace.doctor.probes import collect_facts
    from torchpace.doctor.render import build_report, exit_code_for, render_text

    data_dir = _validate_data_dir(data_dir)
    start = time.perf_counter()
    facts = collect_facts(data_dir=data_dir)
    findings = run_checks(facts)
    duration_s = time.perf_counter() - start
    if as_json:
        emit_json(build_report(facts, findings, strict, duration_s))
    else:
        render_text(make_console(), facts, findings, strict, duration_s)
    return exit_code_for(findings, strict)
