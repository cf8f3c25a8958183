"""Input-pipeline figures: decode images/s per decoder vs Pillow, and `vision` samples/s with files vs
shards, default vs tuned.

Method:
1. Decode: each usable decoder decodes the same in-memory JPEG bytes, one thread, timed with the
   window method of `torchpace bench` (`torchpace.data.bench.measure_decode`: warm-up until two
   windows agree, then windows until the 95% CI of the median is within ±2% or the time cap). Two
   image sets: the `vision` example's 96x96 files, and 256 photo-like 500x375 JPEGs (ImageNet's
   typical size) generated here. Decoders run in interleaved rounds (A B C, A B C, ...) and each
   decoder's figure is the median of its rounds, so drift on a shared host hits all alike.
2. Workload: `run_bench` (the real step: loader -> forward -> backward -> SGD) on the built-in
   `vision` workload for: default; `data.format=shards`; the tuned config (`--tuned FILE`, a
   torchpace.toml written by `torchpace tune vision`) and the tuned config with the other format;
   and any `--extra k=v,k=v` config. Configs run in interleaved rounds (A B C D, A B C D, ...). Each
   config gets the median over rounds of bench's median samples/s, and the median over rounds of
   its ratio to the first config *in the same round*: on a shared host, load from other jobs swings
   absolute figures several-fold, and the paired ratio is what survives it. `--threads N` pins
   `threads.intra_op` in every config (1 keeps a busy 2-core host from collapsing OpenMP barriers).

Usage:
    python benchmarks/bench_data.py [--tuned torchpace.toml] [--extra data.num_workers=2,data.decoder=simplejpeg]
                                    [--threads 1] [--rounds 3] [--decode-time 4] [--bench-time 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from torchpace.config import load_config
from torchpace.data.bench import DataBenchOptions, measure_decode
from torchpace.data.decoders import available_decoders
from torchpace.examples.vision import image_root
from torchpace.measure.bench import BenchOptions
from torchpace.trial.bench import run_bench
from torchpace.workload import load_workload

from _args import count, seconds

_PHOTO_SIZE = (375, 500)  # (height, width): ImageNet's most common size
_PHOTOS = 256


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tuned", type=Path, default=None, help="torchpace.toml from `torchpace tune vision`")
    parser.add_argument("--rounds", type=count, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--decode-time", type=seconds, default=4.0, help="seconds per decoder per round (default 4)")
    parser.add_argument("--bench-time", type=seconds, default=20.0, help="seconds per workload bench (default 20)")
    parser.add_argument("--extra", action="append", default=[], help="another config, k=v,k=v (repeatable)")
    parser.add_argument("--threads", type=count, default=None, help="pin threads.intra_op in every config")
    parser.add_argument("--skip-workload", action="store_true", help="decode figures only")
    parser.add_argument("--skip-decode", action="store_true", help="workload figures only")
    return parser.parse_args(argv)


def photo_jpegs(count: int) -> list[bytes]:
    """Photo-like JPEGs (smooth gradients, shapes, noise) at quality 90, deterministic."""
    images = []
    height, width = _PHOTO_SIZE
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    for seed in range(count):
        rng = np.random.default_rng(seed)
        centre = rng.uniform(0, 1, 2) * (width, height)
        blob = np.exp(-((xx - centre[0]) ** 2 + (yy - centre[1]) ** 2) / (2 * rng.uniform(40, 120) ** 2))
        base = np.stack([xx / width, yy / height, blob], axis=-1) * rng.uniform(120, 220, 3)
        pixels = np.clip(base + rng.normal(0, 6, (height, width, 3)), 0, 255).astype(np.uint8)
        with tempfile.SpooledTemporaryFile() as buffer:
            Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
            buffer.seek(0)
            images.append(buffer.read())
    return images


def decode_rates(images: tuple[bytes, ...], decoders: list[str], rounds: int, seconds: float) -> dict[str, float]:
    """Median over interleaved rounds of each decoder's median images/s."""
    options = DataBenchOptions(max_time_s=seconds)
    rates: dict[str, list[float]] = {d: [] for d in decoders}
    for _ in range(rounds):
        for decoder in decoders:
            rates[decoder].append(measure_decode(images, decoder, "files", options, time.perf_counter).items_per_s)
    return {d: statistics.median(r) for d, r in rates.items()}


def print_decode_table(label: str, rates: dict[str, float], images: tuple[bytes, ...]) -> None:
    mean_kb = sum(map(len, images)) / len(images) / 1024
    print(f"\ndecode, {label} ({len(images)} JPEGs, {mean_kb:.1f} KiB mean), one thread:")
    for decoder, rate in rates.items():
        print(f"  {decoder:<12} {rate:>9,.0f} images/s   {rate / rates['pillow']:.2f}x pillow")


def parse_extra(text: str) -> dict:
    """`k=v,k=v` -> config values (ints where they parse)."""
    pairs = (item.split("=", 1) for item in text.split(",") if item)
    return {k: int(v) if v.isdigit() else v for k, v in pairs}


def workload_configs(tuned: Path | None, extras: list[str], threads: int | None) -> dict[str, dict]:
    configs = {"files, default": {}, "shards, default": {"data.format": "shards"}}
    if tuned is not None:
        values = dict(load_config(tuned).values)
        fmt = values.get("data.format", "files")
        other = "shards" if fmt == "files" else "files"
        configs[f"{fmt}, tuned"] = values
        configs[f"{other}, tuned"] = {**values, "data.format": other}
    for text in extras:
        configs[text] = parse_extra(text)
    pinned = {"threads.intra_op": threads} if threads else {}
    return {name: {**pinned, **values} for name, values in configs.items()}


def workload_rates(configs: dict[str, dict], rounds: int, seconds: float) -> dict[str, tuple]:
    """Per config: (median samples/s, median ratio to the first config in the same round, the rounds' figures)."""
    figures: dict[str, list[float]] = {name: [] for name in configs}
    options = BenchOptions(max_time_s=seconds, compute_only=False)
    for _ in range(rounds):
        for name, config in configs.items():
            figures[name].append(run_bench(load_workload("vision"), config, options).throughput.samples_per_s)
    first = next(iter(figures.values()))
    return {name: (statistics.median(f), statistics.median(a / b for a, b in zip(f, first)), f)
            for name, f in figures.items()}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    decoders = [d for d in available_decoders() if d != "torchvision-cuda"]
    vision = tuple(p.read_bytes() for p in sorted(image_root().rglob("*.jpg")))
    print(f"decoders usable here: {', '.join(decoders)}")
    if not args.skip_decode:
        print_decode_table("vision 96x96", decode_rates(vision, decoders, args.rounds, args.decode_time), vision)
        photos = tuple(photo_jpegs(_PHOTOS))
        print_decode_table("photo-like 500x375", decode_rates(photos, decoders, args.rounds, args.decode_time), photos)
    if args.skip_workload:
        return
    if args.tuned is not None and not load_config(args.tuned).values:
        print(f"\n{args.tuned}: torchpace tune accepted no change here; its tuned config is the defaults")
    configs = workload_configs(args.tuned, args.extra, args.threads)
    print(f"\nvision workload, samples/s (run_bench, {args.rounds} interleaved rounds of {args.bench_time:.0f} s):")
    for name, (median, ratio, rounds) in workload_rates(configs, args.rounds, args.bench_time).items():
        config = ", ".join(f"{k}={v}" for k, v in configs[name].items()) or "defaults"
        spread = ", ".join(f"{r:.0f}" for r in rounds)
        print(f"  {name:<16} median {median:>6.1f}  paired ratio {ratio:.2f}x  rounds [{spread}]  ({config})")


if __name__ == "__main__":
    main()
