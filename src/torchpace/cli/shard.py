"""`torchpace shard SRC_DIR --out DIR`: write WebDataset-compatible tar shards of an image folder."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import click

from torchpace.cli._common import check_outputs, emit_json, json_option, make_console

# samples per shard: WebDataset's shards hold a few thousand images (hundreds of MB); a million is a slip
MAX_SHARD_SIZE = 1 << 20
MAX_SEED = 2**32 - 1  # the seeds numpy and most tools take, so the same --seed means the same elsewhere


@contextmanager
def _progress_bar(enabled: bool, total_samples: int) -> Iterator:
    """A Rich progress bar over the samples on stderr; yields the callback (None when disabled)."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    # lazy: `torchpace shard --help` loads this module; the verb's work loads only when it runs
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("sharding"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[mb]:,.1f} MB"),
                  TimeRemainingColumn(), console=make_console(stderr=True), transient=True) as progress:
        task = progress.add_task("shard", total=total_samples, mb=0.0)

        def on_progress(samples: int, read_bytes: int) -> None:
            progress.update(task, completed=samples, mb=read_bytes / 1e6)

        yield on_progress


def _render(console, manifest, out_dir) -> None:
    console.print(f"wrote {manifest.samples:,} samples ({len(manifest.classes)} classes, "
                  f"{manifest.size_bytes / 1e6:,.1f} MB) in {len(manifest.shards)} shards to {out_dir}")
    console.print(f"verified: every shard reads back with its sample count; the source has {manifest.samples:,} images")
    first, last = manifest.shards[0].name, manifest.shards[-1].name
    console.print(f"read them with torchpace.data.ShardDataset({str(out_dir)!r}) or "
                  f"webdataset.WebDataset('{out_dir}/shard-{{{first[6:12]}..{last[6:12]}}}.tar')")


@click.command("shard")
@click.argument("src_dir", type=click.Path(file_okay=False))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Folder for the shards (created).")
@click.option("--shard-size", type=click.IntRange(1, MAX_SHARD_SIZE), default=1000, show_default=True, help="Samples per shard.")
@click.option("--shuffle", is_flag=True, help="Shuffle samples across shards (seeded), so each shard mixes the classes.")
@click.option("--seed", type=click.IntRange(0, MAX_SEED), default=0, show_default=True,
              help=f"Seed of --shuffle (0 to {MAX_SEED}).")
@click.option("--overwrite", is_flag=True, help="Replace shards already in --out.")
@json_option
def command(src_dir, out_dir, shard_size, shuffle, seed, overwrite, as_json):
    """Write the images of SRC_DIR (one sub-folder per class) as WebDataset tar shards in --out.

    Each sample is `<key>.jpg` (the file's bytes, unchanged), `<key>.cls` (the label) and
    `<key>.path.txt` (the source path); `manifest.json` lists the shards. The source files are only
    read. Each shard is written under a hidden name and renamed when complete, so an interrupted run
    leaves no half-written shard under a final name. Afterwards every shard is read back and its
    sample count checked.
    """
    # lazy: `torchpace shard --help` loads this module; the verb's work loads only when it runs
    from torchpace.data.scan import scan_folder
    from torchpace.data.shards import check_out_dir, write_shards

    check_outputs({"--out": out_dir}, out_dirs=["--out"])
    index = scan_folder(src_dir)
    check_out_dir(index.root, Path(out_dir), overwrite)
    with _progress_bar(not as_json, len(index.samples)) as on_progress:
        manifest = write_shards(index, out_dir, shard_size=shard_size, shuffle=shuffle, seed=seed,
                                overwrite=overwrite, on_progress=on_progress)
    if as_json:
        emit_json({"out": str(Path(out_dir).resolve()), **manifest.to_dict()})
    else:
        _render(make_console(), manifest, Path(out_dir).resolve())
    return 0
