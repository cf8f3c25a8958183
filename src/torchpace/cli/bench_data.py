"""`torchpace bench-data PATH`: measure the input pipeline alone (read, decode, DataLoader)."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator

import click

from torchpace.cli._common import check_knob_limit, check_outputs, json_option, make_console, output_result
from torchpace.cli._options import SECONDS

MAX_BATCH_SIZE = 1 << 16  # 65,536 decoded images in one batch are tens of GiB: a larger batch is a slip
_DECODERS = ("pillow", "simplejpeg", "turbojpeg", "torchvision", "torchvision-cuda")


@contextmanager
def _progress_bar(enabled: bool) -> Iterator:
    """A Rich progress bar over the measurements on stderr; yields the callback (None when disabled)."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    # lazy: `torchpace bench-data --help` loads this module; the verb's work loads only when it runs
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=make_console(stderr=True), transient=True) as progress:
        task = progress.add_task("bench-data", total=None)

        def on_progress(done: int, total: int, label: str) -> None:
            progress.update(task, completed=done, total=total, description=label)

        yield on_progress


@click.command("bench-data")
@click.argument("path", type=click.Path(file_okay=False))
@click.option("--decoder", "decoders", multiple=True, type=click.Choice(_DECODERS),
              help="Decoder to measure (repeatable; default: every one usable here).")
@click.option("--num-workers", "num_workers", multiple=True, type=click.IntRange(min=0),
              help="DataLoader workers for the loader figures (repeatable; default: 0 and the usable cores).")
@click.option("--batch-size", type=click.IntRange(1, MAX_BATCH_SIZE), default=64, show_default=True, help="Loader batch size.")
@click.option("--max-time", "max_time_s", type=SECONDS, default=3.0, show_default=True,
              help="Time cap of EACH measurement, seconds.")
@click.option("--shards", default="auto", show_default=True, metavar="auto|none|DIR",
              help="Shards to measure for an image folder: auto = its shards in the cache (written on first use), "
                   "none, or a shard folder.")
@click.option("--cold", type=click.Choice(["fadvise", "drop-caches", "none"]), default="fadvise", show_default=True,
              help="How the page cache is emptied for cold reads: per-file posix_fadvise (no root), "
                   "/proc/sys/vm/drop_caches (root; drops everyone's cache), or no cold figures.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None, help="Also save the JSON result here.")
@json_option
def command(path, decoders, num_workers, batch_size, max_time_s, shards, cold, out_path, as_json):
    """Measure the input pipeline of PATH alone, without a model.

    PATH is an image folder (one sub-folder per class) or a shard folder from `torchpace shard`.
    Figures: files/s and MB/s from disk cold and warm, decode images/s per decoder, and DataLoader
    images/s per decoder and worker count; the same for the shards.
    """
    # lazy: `torchpace bench-data --help` loads this module; the verb's work loads only when it runs
    from torchpace.data.bench import DataBenchOptions, run_data_bench
    from torchpace.host import probe_host

    check_outputs({"--out": out_path}, input_dirs=[("the folder measured", path),
                                                   ("the shard folder", None if shards in ("auto", "none") else shards)])
    host = probe_host()
    for count in num_workers:
        check_knob_limit("--num-workers", "data.num_workers", count, host)
    options = DataBenchOptions(decoders=tuple(decoders), num_workers=tuple(num_workers), batch_size=batch_size,
                               max_time_s=max_time_s, shards=shards, cold=cold)
    with _progress_bar(not as_json) as on_progress:
        result = run_data_bench(path, options, on_progress=on_progress, host=host.summary())
    # lazy: `torchpace bench-data --help` loads this module; the verb's work loads only when it runs
    from torchpace.data.render import render_data_bench

    output_result(result.to_dict(), out_path, as_json, lambda console, _: render_data_bench(console, result))
    return 0

