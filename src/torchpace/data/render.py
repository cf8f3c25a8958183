"""Rich rendering of a `bench-data` result (`DataBenchResult`), read by its fields."""

from __future__ import annotations

from rich.table import Table

from torchpace.data.bench import DataBenchResult
from torchpace.measure.stats import MIN_WINDOWS_FOR_CI

_COLD_METHOD_TEXT = {
    "fadvise": "each file evicted from the page cache right before it is read: posix_fadvise(POSIX_FADV_DONTNEED), no root needed",
    "drop-caches": "the whole page cache dropped (/proc/sys/vm/drop_caches, as root) before each pass",
    "none": "not measured (--cold none)",
}
_UNITS = {"read": "files/s", "decode": "images/s", "loader": "images/s"}


def build_rows(r: DataBenchResult) -> list[tuple[str, ...]]:
    """One row per figure: (what, format, detail, rate with unit, 95% CI, MB/s, vs Pillow)."""
    pillow = {(x.stage, x.format, x.num_workers): x.items_per_s for x in r.rates if x.decoder == "pillow"}
    rows = []
    for x in r.rates:
        unit = "samples/s" if x.stage == "read" and x.format == "shards" else _UNITS[x.stage]
        detail = x.cache or x.decoder + (f", {x.num_workers} workers" if x.num_workers is not None else "")
        base = pillow.get((x.stage, x.format, x.num_workers)) if x.decoder else None
        rows.append((
            x.stage, x.format, detail, f"{x.items_per_s:,.0f} {unit}" + (" ~" if x.noisy else ""),
            f"[{x.items_per_s_ci_low:,.0f}, {x.items_per_s_ci_high:,.0f}]" if x.windows >= MIN_WINDOWS_FOR_CI
            else f"{x.windows} windows",
            f"{x.mb_per_s:,.1f}" if x.mb_per_s is not None else "",
            f"{x.items_per_s / base:.2f}x" if base else "",
        ))
    return rows


def _header(r: DataBenchResult) -> str:
    parts = []
    if r.files:
        parts.append(f"{r.files:,} files, {r.file_bytes / 1e6:,.1f} MB")
    if r.shards:
        made = ", written to the cache now" if r.shards_made else ""
        parts.append(f"{r.shards} shards, {r.shard_samples:,} samples, {r.shard_bytes / 1e6:,.1f} MB{made}")
    return f"torchpace bench-data: {r.path} ({'; '.join(parts)})"


def render_data_bench(console, r: DataBenchResult) -> None:
    """Print the figures table and the notes on how they were measured."""
    table = Table(title=_header(r))
    for column in ("stage", "format", "cache / decoder", "median", "95% CI", "MB/s", "vs pillow"):
        table.add_column(column, justify="right" if column in ("median", "95% CI", "MB/s", "vs pillow") else "left")
    for row in build_rows(r):
        table.add_row(*row)
    console.print(table)
    console.print(f"cold reads: {_COLD_METHOD_TEXT[r.cold_method]}")
    if r.cold_note:
        console.print(f"[yellow]note:[/] {r.cold_note}")
    console.print(f"decode: {r.decode_images} images in memory, one thread; loader: DataLoader, batch "
                  f"{r.batch_size}, shuffled, read + decode, no transform, warm cache; "
                  f"~ marks a noisy figure (IQR > 10% of the median); a CI needs {MIN_WINDOWS_FOR_CI} windows")
    for name, reason in r.unavailable_decoders.items():
        console.print(f"[dim]not measured: {name}: {reason}[/]")
