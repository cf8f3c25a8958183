"""Markdown pieces for the generated reference: tables and code spans, escaped for table cells."""

from __future__ import annotations

from typing import Any, Iterable, Sequence


def code(value: Any) -> str:
    """`value` as an inline code span (booleans as TOML writes them)."""
    if isinstance(value, bool):
        value = "true" if value else "false"
    return f"`{value}`"


def cell(text: Any) -> str:
    """`text` made safe for one table cell: no newlines, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """A GitHub-flavoured Markdown table, one line per row."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return lines
