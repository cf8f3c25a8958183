"""bench-data: the plan of figures, cold-read eviction, and a real short run on real files."""

from __future__ import annotations

import os

import pytest

from torchpace.data.bench import (DataBenchOptions, Measurement, build_cold_note, check_cold_method, choose_decoders,
                                  evict_file, pick_spread, plan_measurements, run_data_bench)
from torchpace.data.shards import write_shards
from torchpace.data.scan import scan_folder
from torchpace.errors import UsageError

from data_helpers import truncated_jpeg


def test_plan_reads_then_decodes_then_loaders():
    plan = plan_measurements(("files", "shards"), ("pillow", "simplejpeg"), (0, 2), "fadvise")
    assert plan[:4] == [Measurement("read", "files", cache="cold"), Measurement("read", "files", cache="warm"),
                        Measurement("read", "shards", cache="cold"), Measurement("read", "shards", cache="warm")]
    assert [m.decoder for m in plan if m.stage == "decode"] == ["pillow", "simplejpeg"]
    assert len([m for m in plan if m.stage == "loader"]) == 2 * 2 * 2
    assert plan[-1].label == "loader shards (simplejpeg, 2 workers)"


def test_plan_without_cold_reads_and_gpu_decoding_without_workers():
    plan = plan_measurements(("files",), ("torchvision-cuda",), (0, 2), "none")
    assert [m.cache for m in plan if m.stage == "read"] == ["warm"]
    assert [m.num_workers for m in plan if m.stage == "loader"] == [0]


def test_cold_methods_are_checked():
    assert check_cold_method("fadvise") == "fadvise"
    with pytest.raises(UsageError, match="valid values: fadvise, drop-caches, none"):
        check_cold_method("purge")
    if not os.access("/proc/sys/vm/drop_caches", os.W_OK):
        with pytest.raises(UsageError, match="needs root"):
            check_cold_method("drop-caches")


def test_evicting_a_file_leaves_it_intact(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 100_000)
    evict_file(str(path))
    assert path.read_bytes() == b"x" * 100_000


def test_named_decoders_must_be_usable():
    with pytest.raises(UsageError, match="unknown decoder"):
        choose_decoders(("libjpeg",))
    chosen, unavailable = choose_decoders(())
    assert chosen[0] == "pillow" and not set(chosen) & set(unavailable)
    for name, reason in unavailable.items():
        with pytest.raises(UsageError, match=f"decoder '{name}' cannot be used here"):
            choose_decoders((name,))


def test_spread_and_cold_note():
    assert pick_spread(tuple(range(10)), 3) == (0, 3, 6) and pick_spread((1, 2), 5) == (1, 2)
    assert build_cold_note([]) is None


@pytest.mark.filterwarnings("ignore::torchpace.data.loading.SkippedImageWarning")
def test_a_short_real_run_measures_every_figure(folder, tmp_path):
    (folder / "class_0" / "bad.jpg").write_bytes(truncated_jpeg())  # left out of decode, skipped by loaders
    options = DataBenchOptions(decoders=("pillow",), num_workers=(0,), batch_size=4, max_time_s=0.3)
    result = run_data_bench(folder, options, cache_dir=tmp_path / "cache")
    assert result.files == 25 and result.shards >= 1 and result.shard_samples == 25 and result.shards_made
    assert result.decode_images == 24 and result.cold_method == "fadvise"
    stages = [(r.stage, r.format, r.cache) for r in result.rates]
    assert stages == [("read", "files", "cold"), ("read", "files", "warm"), ("read", "shards", "cold"),
                      ("read", "shards", "warm"), ("decode", "files", None), ("loader", "files", None),
                      ("loader", "shards", None)]
    for rate in result.rates:
        assert rate.items_per_s_ci_low <= rate.items_per_s <= rate.items_per_s_ci_high and rate.windows >= 1
        assert (rate.mb_per_s is not None) == (rate.stage == "read")
    again = run_data_bench(folder, options, cache_dir=tmp_path / "cache")
    assert not again.shards_made and again.shards_dir == result.shards_dir


def test_a_shard_folder_is_measured_as_shards_only(folder, tmp_path):
    write_shards(scan_folder(folder), tmp_path / "shards", shard_size=10)
    options = DataBenchOptions(decoders=("pillow",), num_workers=(0,), batch_size=4, max_time_s=0.2, cold="none")
    result = run_data_bench(tmp_path / "shards", options)
    assert result.files == 0 and result.shards == 3 and result.decode_images == 24
    assert {r.format for r in result.rates} == {"shards"}
