"""`torchpace knobs [WORKLOAD]`: which knobs apply on this host for this workload, and why not."""

from __future__ import annotations

import click

from torchpace.cli._common import emit_json, json_option, make_console
from torchpace.cli._options import workload_argument


def plan_knob_table(host, workload) -> list[dict]:
    """One row per registered knob: stage, default, candidates here, or the reason it does not apply."""
    from torchpace.knobs import knobs_in_stage_order

    rows = []
    for knob in knobs_in_stage_order():
        reason = knob.applies(host, workload)
        row = knob.describe()
        row["applies"] = reason is None
        row["reason"] = reason
        row["candidates"] = knob.candidates(host, workload) if reason is None else []
        rows.append(row)
    return rows


@click.command("knobs")
@workload_argument
@json_option
def command(workload, as_json):
    """List every knob: its stage, default, the values worth trying here, or why it does not apply."""
    from torchpace.host import probe_host
    from torchpace.workload import load_workload

    host = probe_host()
    loaded = load_workload(workload)
    rows = plan_knob_table(host, loaded)
    if as_json:
        emit_json({"workload": loaded.name, "host": host.summary(), "knobs": rows})
        return 0
    from rich.table import Table

    table = Table(title=f"knobs for {loaded.name} on this host")
    for column in ("knob", "stage", "default", "candidates here / why not"):
        table.add_column(column)
    for row in rows:
        detail = ", ".join(map(str, row["candidates"])) if row["applies"] else f"[dim]does not apply: {row['reason']}[/]"
        table.add_row(row["name"], row["stage"], str(row["default"]), detail)
    make_console().print(table)
    return 0
