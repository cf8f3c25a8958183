"""Shards: the round trip keeps every sample and label, WebDataset reads them, the source is never
touched, an interrupted run leaves no final-named partial shard, and loader workers split them."""

from __future__ import annotations

import io
import os
import random
import signal
import subprocess
import sys
import tarfile
import time

import pytest
import torch

from torchpace.data import CorruptImageError, ImageFolderDataset, ShardDataset, ShardError, scan_folder, write_shards
from torchpace.data.shard_dataset import plan_reading, shuffle_buffered
from torchpace.data.shards import (MANIFEST_NAME, ensure_cached_shards, iter_tar_members, iter_tar_samples, load_manifest,
                                   plan_shards, remove_stale_temp_files, split_member_name)
from torchpace.errors import UsageError

from _support import sigint_as_at_a_terminal
from data_helpers import snapshot, truncated_jpeg, write_folder


def _by_path(dataset):
    """{source path relative to the folder: (image, label)} for every sample of a dataset."""
    return {path: dataset.load(i) for i, (path, _) in enumerate(dataset.samples)}


def test_plan_covers_every_sample_once():
    plan = plan_shards(10, 4, shuffle=True, seed=1)
    assert [len(s) for s in plan] == [4, 4, 2]
    assert sorted(i for shard in plan for i in shard) == list(range(10))
    assert plan_shards(10, 4, shuffle=False, seed=0) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    with pytest.raises(UsageError, match=">= 1"):
        plan_shards(10, 0, False, 0)


def test_round_trip_keeps_every_sample_and_label(folder, tmp_path):
    before = snapshot(folder)
    manifest = write_shards(scan_folder(folder), tmp_path / "shards", shard_size=5, shuffle=True, seed=3)
    assert snapshot(folder) == before  # the source is only read
    assert [s.samples for s in manifest.shards] == [5, 5, 5, 5, 4]
    assert load_manifest(tmp_path / "shards") == manifest
    files = ImageFolderDataset(folder)
    shards = ShardDataset(tmp_path / "shards")
    assert len(shards) == 24 and shards.classes == files.classes
    seen = list(shards)
    assert sorted(label for _, label in seen) == sorted(label for _, label in files.samples)
    expected = {tuple(img.flatten().tolist()): label for img, label in (files[i] for i in range(len(files)))}
    assert {tuple(img.flatten().tolist()): label for img, label in seen} == expected


def test_shards_are_webdataset_compatible(folder, tmp_path):
    wds = pytest.importorskip("webdataset")
    write_shards(scan_folder(folder), tmp_path / "shards", shard_size=10)
    urls = [str(p) for p in sorted((tmp_path / "shards").glob("shard-*.tar"))]
    samples = list(wds.WebDataset(urls, shardshuffle=False, empty_check=False))
    assert len(samples) == 24
    assert [int(s["cls"]) for s in samples] == [label for _, label in ImageFolderDataset(folder).samples]
    assert samples[0]["path.txt"] == b"class_0/000.jpg" and samples[0]["jpg"][:2] == b"\xff\xd8"


def test_an_interrupted_run_leaves_no_partial_shard_under_a_final_name(folder, tmp_path):
    out = tmp_path / "shards"

    def interrupt(samples_done: int, bytes_done: int) -> None:
        if samples_done == 7:  # in the middle of the second shard
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_shards(scan_folder(folder), out, shard_size=5, on_progress=interrupt)
    assert sorted(p.name for p in out.iterdir()) == ["shard-000000.tar"]  # complete; no temp file, no manifest
    assert sum(1 for _ in iter_tar_samples(out / "shard-000000.tar")) == 5


def test_a_killed_cli_run_leaves_only_complete_shards(tmp_path):
    source = write_folder(tmp_path / "many", classes=2, per_class=150, size=(64, 64))
    out = tmp_path / "shards"
    process = subprocess.Popen([sys.executable, "-m", "torchpace", "shard", str(source), "--out", str(out),
                                "--shard-size", "20"], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (out / "shard-000001.tar").exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    finals = sorted(out.glob("shard-*.tar"))
    assert finals, "the run ended before a shard was written"
    for path in finals:
        assert sum(1 for _ in iter_tar_samples(path)) == 20  # whole shards only
    if not (out / MANIFEST_NAME).exists():  # killed before the end: a re-run cleans up after it
        remove_stale_temp_files(out)
        assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_ctrl_c_on_the_cli_exits_130_and_removes_its_temp_file(tmp_path):
    source = write_folder(tmp_path / "many", classes=2, per_class=150, size=(64, 64))
    out = tmp_path / "shards"
    process = subprocess.Popen([sys.executable, "-m", "torchpace", "shard", str(source), "--out", str(out),
                                "--shard-size", "20"], stderr=subprocess.PIPE, text=True,
                               preexec_fn=sigint_as_at_a_terminal)
    deadline = time.monotonic() + 60
    while not (out / "shard-000000.tar").exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    # stopped at its first shard (14 to go), interrupted while stopped, then let go: the interrupt
    # arrives mid-run however fast this host shards
    process.send_signal(signal.SIGSTOP)
    process.send_signal(signal.SIGINT)
    process.send_signal(signal.SIGCONT)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 130, stderr
    assert not (out / MANIFEST_NAME).exists()
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
    assert all(sum(1 for _ in iter_tar_samples(p)) == 20 for p in out.glob("shard-*.tar"))


def test_out_inside_the_source_or_over_old_shards_is_refused(folder, tmp_path):
    index = scan_folder(folder)
    with pytest.raises(UsageError, match="inside the source folder"):
        write_shards(index, folder / "class_0" / "shards")
    write_shards(index, tmp_path / "shards")
    with pytest.raises(UsageError, match="already holds shards"):
        write_shards(index, tmp_path / "shards")
    assert write_shards(index, tmp_path / "shards", shard_size=30, overwrite=True).samples == 24
    assert sorted(p.name for p in (tmp_path / "shards").glob("shard-*")) == ["shard-000000.tar"]


def test_an_unreadable_source_file_stops_the_run_naming_it(folder, tmp_path):
    index = scan_folder(folder)
    (folder / "class_2" / "001.jpg").unlink()
    with pytest.raises(ShardError, match="cannot read source file .*class_2/001.jpg"):
        write_shards(index, tmp_path / "shards")
    assert not (tmp_path / "shards" / MANIFEST_NAME).exists()


def test_tar_reader_handles_long_names_and_reports_truncation(tmp_path):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in ("deep/" + "x" * 120 + ".jpg", "deep/" + "x" * 120 + ".cls"):
            info = tarfile.TarInfo(name)
            info.size = 3
            tar.addfile(info, io.BytesIO(b"abc"))
    assert [n for n, _ in iter_tar_members(io.BytesIO(buffer.getvalue()))] == ["deep/" + "x" * 120 + ".jpg",
                                                                              "deep/" + "x" * 120 + ".cls"]
    assert split_member_name("a/b/0001.path.txt") == ("a/b/0001", "path.txt")
    cut = tmp_path / "cut.tar"
    cut.write_bytes(buffer.getvalue()[:1600])
    with pytest.raises(ShardError, match="cut.tar.*truncated"):
        list(iter_tar_samples(cut))
    cut.write_bytes(buffer.getvalue()[:2048])  # between two members
    with pytest.raises(ShardError, match="cut.tar.*end-of-archive"):
        list(iter_tar_samples(cut))
    with pytest.raises(ShardError, match="not a tar file"):
        (tmp_path / "text.tar").write_bytes(b"hello" * 200)
        list(iter_tar_samples(tmp_path / "text.tar"))


def test_a_corrupt_image_in_a_shard_names_shard_and_source(folder, tmp_path):
    (folder / "class_1" / "004.jpg").write_bytes(truncated_jpeg())
    write_shards(scan_folder(folder), tmp_path / "shards", shard_size=30)
    with pytest.raises(CorruptImageError, match=r"shard-000000.tar:00000012 \(source class_1/004.jpg\)"):
        list(ShardDataset(tmp_path / "shards"))
    with pytest.warns(UserWarning, match="class_1/004.jpg"):
        assert len(list(ShardDataset(tmp_path / "shards", on_error="skip"))) == 23


def test_a_folder_without_manifest_says_how_to_make_one(tmp_path):
    with pytest.raises(ShardError, match="torchpace shard SRC_DIR --out"):
        ShardDataset(tmp_path)


def test_reading_plan_splits_shards_or_samples_disjointly():
    assert plan_reading([3, 1, 0, 2], 1, 2).shards == (1, 2)
    few = [plan_reading([0, 1], r, 3) for r in range(3)]
    assert all(p.shards == (0, 1) and p.stride == 3 for p in few) and [p.offset for p in few] == [0, 1, 2]


def test_shuffle_buffer_yields_a_permutation():
    out = list(shuffle_buffered(range(100), 10, random.Random(0)))
    assert sorted(out) == list(range(100)) and out != list(range(100))


@pytest.mark.parametrize("shard_size", [3, 24], ids=["shards-split", "samples-split"])
def test_loader_workers_read_every_sample_exactly_once(folder, tmp_path, shard_size):
    write_shards(scan_folder(folder), tmp_path / "shards", shard_size=shard_size)
    dataset = ShardDataset(tmp_path / "shards", shuffle=True, shuffle_buffer=4)
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=2,
                                         generator=torch.Generator().manual_seed(0))
    images = [img for batch, _ in loader for img in batch]
    keys = sorted(tuple(img.flatten()[:64].tolist()) for img in images)
    assert len(keys) == 24 and len(set(keys)) == 24


def test_shuffled_epochs_differ_and_repeat_with_the_seed(folder, tmp_path):
    write_shards(scan_folder(folder), tmp_path / "shards", shard_size=4)

    def labels(dataset):
        return [label for _, label in dataset]

    first = ShardDataset(tmp_path / "shards", shuffle=True, seed=5, shuffle_buffer=8)
    epoch0, epoch1 = labels(first), labels(first)
    again = ShardDataset(tmp_path / "shards", shuffle=True, seed=5, shuffle_buffer=8)
    assert labels(again) == epoch0 and epoch1 != epoch0 and sorted(epoch1) == sorted(epoch0)


def test_cached_shards_are_made_once_and_follow_the_source(folder, tmp_path):
    cache = tmp_path / "cache"
    index = scan_folder(folder)
    made = ensure_cached_shards(index, cache)
    mtime = (made / MANIFEST_NAME).stat().st_mtime_ns
    assert ensure_cached_shards(index, cache) == made and (made / MANIFEST_NAME).stat().st_mtime_ns == mtime
    assert not [p for p in made.parent.iterdir() if p.name.startswith(".")]
    assert load_manifest(made).shuffled
    target = folder / "class_0" / "000.jpg"
    target.write_bytes(target.read_bytes() + b"\0")
    os.utime(target, ns=(0, 0))
    assert ensure_cached_shards(scan_folder(folder), cache) != made


def test_as_shards_keeps_decoder_transform_and_policy(folder, tmp_path):
    dataset = ImageFolderDataset(folder, transform=lambda x: x.float(), on_error="skip", shard_cache_dir=tmp_path / "c")
    shards = dataset.as_shards(shuffle=False)
    assert isinstance(shards, ShardDataset) and shards.on_error == "skip" and shards.decoder == dataset.decoder
    assert sorted(label for _, label in shards) == sorted(label for _, label in dataset.samples)
    assert next(iter(shards))[0].dtype == torch.float32
