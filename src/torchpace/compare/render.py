"""Rich rendering of a comparison (`torchpace.compare.result.Comparison`)."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from torchpace.compare.result import Comparison
from torchpace.measure.render import format_latency
from torchpace.measure.result import SECONDS


def render_comparison(console, r: Comparison) -> None:
    latency = r.unit == SECONDS
    value = format_latency if latency else (lambda v: f"{v:,.2f}")
    table = Table(title=f"compare {escape(r.target)}  ({_mode(r)})", title_justify="left")
    for column in ("arm", "config", ("batch-1 p50" if latency else r.unit) + " (median of its turns)", "95% CI", "other load"):
        table.add_column(column)
    for name, arm in (("A", r.a), ("B", r.b)):
        config = ", ".join(f"{k}={v}" for k, v in sorted(arm.config.items())) or "PyTorch defaults"
        figure = value(arm.figure) if arm.figure is not None else arm.status
        ci = f"[{value(arm.ci_low)}, {value(arm.ci_high)}]" if arm.ci_low is not None else "-"
        load = f"{arm.other_load_cores:.1f} cores" if arm.other_load_cores is not None else "-"
        table.add_row(name, config, figure, ci, load)
    console.print(table)
    console.print(f"[bold]{r.summary}[/bold]")
    if r.other_load_note:
        console.print(f"[yellow]{r.other_load_note}[/yellow]")
    for name, arm in (("A", r.a), ("B", r.b)):
        if not arm.ok and arm.error:
            console.print(f"arm {name} {arm.status}: {arm.error}")


def _mode(r: Comparison) -> str:
    if r.mode == "alternating":
        return (f"in alternation: turns of one length, A B A then B A B to a round, the other arm stopped; "
                f"stopped by {r.stopped_by}")
    return f"separate runs A B A B A B, because {r.mode_reason}"
