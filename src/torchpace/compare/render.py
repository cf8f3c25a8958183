"""Rich rendering of a comparison (`torchpace.measure.comparison.Comparison`): the cells the report shows
too (`torchpace.measure.render.comparison_rows`), in a terminal table."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from torchpace.measure.comparison import Comparison
from torchpace.measure.render import comparison_columns, comparison_failures, comparison_mode, comparison_rows


def render_comparison(console, r: Comparison) -> None:
    table = Table(title=f"compare {escape(r.target)}  ({comparison_mode(r)})", title_justify="left")
    for column in comparison_columns(r):
        table.add_column(column)
    for row in comparison_rows(r):
        table.add_row(*(escape(cell) for cell in row))
    console.print(table)
    console.print(f"[bold]{escape(r.summary)}[/bold]")
    if r.other_load_note:
        console.print(f"[yellow]{escape(r.other_load_note)}[/yellow]")
    for line in comparison_failures(r):
        console.print(escape(line))
