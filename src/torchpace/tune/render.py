"""Rich rendering of a tune outcome: the waterfall of accepted changes and the rejected/failed trials."""

from __future__ import annotations

from typing import Any

from torchpace.measure.render import format_bytes


def _ci(row: dict) -> str:
    if row.get("samples_per_s_ci_low") is None:
        return ""
    return f" [{row['samples_per_s_ci_low']:,.0f}, {row['samples_per_s_ci_high']:,.0f}]"


def render_outcome(console, o: dict[str, Any]) -> None:
    from rich.table import Table

    if o["failed_baseline"]:
        console.print(f"[red]tune stopped:[/] {o['failed_baseline']}")
    base = o["baseline"]
    if base:
        table = Table(title=f"torchpace tune: {o['workload']} ({o['strategy']}, {len(o['trials'])} trials, stopped: {o['stopped']})")
        for column in ("change", "samples/s [95% CI]", "step gain", "cumulative speedup", "peak memory"):
            table.add_column(column)
        table.add_row("baseline (PyTorch defaults)", f"{base['samples_per_s']:,.1f}{_ci(base)}", "", "1.00x", format_bytes(base["peak_memory_bytes"]))
        for a in o["accepted"]:
            table.add_row(f"+ {a['knob']} = {a['value']}", f"{a['samples_per_s']:,.1f}{_ci(a)}", f"{a['step_gain']:.2f}x",
                          f"{a['speedup']:.2f}x", format_bytes(a["peak_memory_bytes"]))
        console.print(table)
    _render_rejected(console, o["trials"])
    if o["speedup"] is not None:
        config = ", ".join(f"{k}={v}" for k, v in o["best_config"].items()) or "PyTorch defaults (nothing beat the noise)"
        console.print(f"[bold]best:[/] {config}  ->  {o['speedup']:.2f}x the baseline")
    if o["out_path"]:
        console.print(f"wrote {o['out_path']}  (apply it: torchpace.prepare(workload, '{o['out_path']}') or "
                      f"torchpace launch --config {o['out_path']} -- train.py)")
    console.print(f"[dim]{o['guard_note']}[/]")


def _render_rejected(console, trials: list[dict]) -> None:
    from rich.table import Table

    rows = [t for t in trials if t["status"] != "ok" or t["guard"] == "fail"]
    if not rows:
        return
    table = Table(title="failed and guard-rejected trials")
    for column in ("#", "config", "status", "reason"):
        table.add_column(column)
    for t in rows:
        config = ", ".join(f"{k}={v}" for k, v in t["config"].items()) or "defaults"
        status = t["status"] if t["status"] != "ok" else "guard"
        reason = t["guard_reason"] if t["status"] == "ok" else (t["error"] or "")
        table.add_row(str(t["number"]), config, status, reason[:120])
    console.print(table)
