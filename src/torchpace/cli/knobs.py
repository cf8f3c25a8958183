"""`torchpace knobs [WORKLOAD | -- python train.py ARGS]`: which knobs apply on this host for this
workload (or reach this unmodified script), and why not."""

from __future__ import annotations

import click

from torchpace.cli._common import emit_json, json_option, make_console
from torchpace.cli._options import workload_argument
from torchpace.cli._script import ScriptVerb, script_command

# The change a script needs for a knob that only prepare() can apply (the Workload path).
PREPARE_CHANGE = ('run = torchpace.prepare(config="torchpace.toml", model=model, dataset=dataset, loss=loss_fn, batch_size=B)\n'
                  "for batch in run.loader: run.step(batch)   # in place of your forward / backward / step")


def plan_knob_table(host, workload) -> list[dict]:
    """One row per registered knob: stage, default, candidates here, or the reason it does not apply."""
    # lazy: `torchpace knobs --help` loads this module; the verb's work loads only when it runs
    from torchpace.knobs import knobs_in_stage_order

    rows = []
    for knob in knobs_in_stage_order():
        reason = knob.applies(host, workload)
        row = knob.describe()
        row["default"] = knob.default_for(workload)  # the workload's own DataLoader argument, where it gives one
        row["applies"] = reason is None
        row["reason"] = reason
        row["candidates"] = knob.candidates(host, workload) if reason is None else []
        rows.append(row)
    return rows


def plan_script_knob_table(host, label: str, command=None) -> list[dict]:
    """One row per knob for an unmodified script: how it reaches the script and its candidates here,
    or that it needs `torchpace.prepare()` (with the code change), or why it does not apply here (`command`: the
    script's `PythonCommand`, whose launcher may say how many ranks share this host)."""
    # lazy: `torchpace knobs --help` loads this module; the verb's work loads only when it runs
    from torchpace.knobs import knobs_in_stage_order
    from torchpace.script.knobs import script_target

    target, rows = script_target(label, command), []
    for knob in knobs_in_stage_order():
        row = knob.describe()
        reason = knob.applies(host, target) if knob.script_reach else None
        candidates = [v for v in knob.candidates(host, target) if knob.script_reason(v) is None] if knob.script_reach else []
        row.update(applies=knob.script_reach is not None and reason is None, reason=reason, candidates=candidates if reason is None else [],
                   reaches=knob.script_reach.reaches if knob.script_reach else None, needs_prepare=knob.script_reach is None,
                   prepare_values=[v for v in (knob.choices or ()) if knob.script_reason(v)] if knob.script_reach else [],
                   prepare_change=PREPARE_CHANGE if knob.script_reach is None or any(knob.script_reason(v) for v in knob.choices or ()) else None)
        rows.append(row)
    return rows


@click.command("knobs", cls=ScriptVerb)
@workload_argument
@json_option
def command(workload, as_json):
    """List every knob: its stage, default, the values worth trying here, or why it does not apply.

    With `-- python train.py ARGS`: which knobs reach that script unchanged (and how), and which need
    `torchpace.prepare()` in it, with the code change.
    """
    # lazy: `torchpace knobs --help` loads this module; the verb's work loads only when it runs
    from torchpace.host import probe_host

    host = probe_host()
    command_argv = script_command(workload)
    if command_argv:
        return _script_knobs(host, command_argv, as_json)
    # lazy: `torchpace knobs --help` loads this module; the verb's work loads only when it runs
    from torchpace.workload import load_workload

    loaded = load_workload(workload)
    rows = plan_knob_table(host, loaded)
    if as_json:
        emit_json({"workload": loaded.name, "host": host.summary(), "knobs": rows})
        return 0
    table = _knob_table(f"knobs for {loaded.name} on this host", ("stage", "default", "candidates here / why not"))
    for row in rows:
        detail = ", ".join(map(str, row["candidates"])) if row["applies"] else f"[dim]does not apply: {row['reason']}[/]"
        table.add_row(row["name"], row["stage"], str(row["default"]), detail)
    make_console().print(table)
    return 0


def _script_knobs(host, command_argv: list[str], as_json: bool) -> int:
    # lazy: `torchpace knobs --help` loads this module; the verb's work loads only when it runs
    from torchpace.launch.command import parse_python_command

    program = parse_python_command(command_argv)
    label = program.label
    rows = plan_script_knob_table(host, label, program)
    if as_json:
        emit_json({"command": command_argv, "host": host.summary(), "knobs": rows, "prepare_change": PREPARE_CHANGE})
        return 0
    table = _knob_table(f"knobs for the unmodified script {label} on this host",
                        ("stage", "reaches the script through / candidates here"))
    for row in rows:
        if row["needs_prepare"]:
            detail = "[yellow]needs torchpace.prepare()[/] in the script"
        elif not row["applies"]:
            detail = f"[dim]does not apply here: {row['reason']}[/]"
        else:
            detail = f"{row['reaches']}: {', '.join(map(str, row['candidates']))}"
            if row["prepare_values"]:
                detail += f" ({', '.join(map(str, row['prepare_values']))} needs torchpace.prepare())"
        table.add_row(row["name"], row["stage"], detail)
    console = make_console()
    console.print(table)
    console.print("For the knobs that need torchpace.prepare(), build the loop with it (two lines):")
    console.print(PREPARE_CHANGE, markup=False, highlight=False)
    return 0


def _knob_table(title: str, columns: tuple[str, ...]):
    """A Rich table whose first column holds whole knob names at any terminal width (never cut to
    `data.persistent_wo…`); the other columns fold long words instead of cutting them."""
    # lazy: `torchpace knobs --help` loads this module; the verb's work loads only when it runs
    from rich.table import Table

    # lazy: `torchpace knobs --help` loads this module; the verb's work loads only when it runs
    from torchpace.knobs import REGISTRY

    table = Table(title=title)
    table.add_column("knob", no_wrap=True, min_width=max(map(len, REGISTRY)))
    for column in columns:
        table.add_column(column, overflow="fold")
    return table
