"""data.decoder and data.format in prepared runs, and the built-in vision workloads built on the datasets."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from torchpace.data import CropFlipNormalize, ImageFolderDataset, ShardDataset, write_shards, scan_folder
from torchpace.errors import UsageError
from torchpace.knobs import REGISTRY
from torchpace.runtime import prepare
from torchpace.workload import Workload, load_workload

from fixtures.workloads import TinyCNN, tiny_mlp


def _image_workload(folder, cache_dir, **dataset_options) -> Workload:
    torch.manual_seed(0)
    transform = CropFlipNormalize(32, (0.5,) * 3, (0.25,) * 3)
    dataset = ImageFolderDataset(folder, transform=transform, shard_cache_dir=cache_dir, **dataset_options)
    loss = lambda output, batch: torch.nn.functional.cross_entropy(output, batch[1])  # noqa: E731
    return Workload(model=TinyCNN(), dataset=dataset, loss=loss, batch_size=4, name="images")


def test_knobs_do_not_apply_to_other_datasets(host):
    for name in ("data.decoder", "data.format"):
        reason = REGISTRY[name].applies(host, tiny_mlp())
        assert "torchpace.data.ImageFolderDataset" in reason and "TensorDataset" in reason


def test_format_shards_swaps_in_the_equivalent_shard_dataset(folder, tmp_path, host):
    workload = _image_workload(folder, tmp_path / "cache")
    with prepare(workload, {"data.format": "shards"}, host=host) as run:
        dataset = run.loader.dataset
        assert isinstance(dataset, ShardDataset) and dataset.shuffle and dataset.transform is workload.dataset.transform
        labels = [label for _, batch_labels in run.loader for label in batch_labels.tolist()]
        assert torch.isfinite(run.step(next(iter(run.loader))))
    assert sorted(labels) == sorted(label for _, label in workload.dataset.samples)  # 24 of 24: batches of 4
    assert list((tmp_path / "cache" / "shards").iterdir())


def test_decoder_swaps_the_decoder_and_auto_keeps_the_workloads(folder, tmp_path, host):
    pytest.importorskip("simplejpeg", reason="install: pip install simplejpeg")
    workload = _image_workload(folder, tmp_path / "cache")
    with prepare(workload, {"data.decoder": "simplejpeg", "data.format": "shards"}, host=host) as run:
        assert isinstance(run.loader.dataset, ShardDataset) and run.loader.dataset.decoder.name == "simplejpeg"
    built_with = _image_workload(folder, tmp_path / "cache", decoder="simplejpeg")
    with prepare(built_with, {}, host=host) as run:
        assert run.loader.dataset.decoder.name == "simplejpeg"
    assert "simplejpeg" not in REGISTRY["data.decoder"].candidates(host, built_with)
    assert REGISTRY["data.decoder"].candidates(host, workload)[:2] == ["auto", "simplejpeg"]


def test_an_uninstalled_decoder_does_not_apply_and_says_how_to_install(folder, tmp_path, host):
    workload = _image_workload(folder, tmp_path / "cache")
    knob = REGISTRY["data.decoder"]
    reason = knob.value_applies("torchvision", host, workload)
    if reason is None:
        pytest.skip("torchvision is installed here")
    assert "install" in reason and "torchvision" not in knob.candidates(host, workload)
    with pytest.raises(UsageError, match="data.decoder.*install"):
        prepare(workload, {"data.decoder": "torchvision"}, host=host)


def test_gpu_decoding_conflicts_with_workers_and_pinning():
    knob = REGISTRY["data.decoder"]
    assert "num_workers = 0" in knob.conflicts({"data.decoder": "torchvision-cuda", "data.num_workers": 2})
    assert "pin_memory" in knob.conflicts({"data.decoder": "torchvision-cuda", "data.pin_memory": True})
    assert knob.conflicts({"data.decoder": "simplejpeg", "data.num_workers": 2}) is None


def test_workers_are_accepted_for_a_dataset_that_splits_itself(folder, tmp_path, host):
    write_shards(scan_folder(folder), tmp_path / "shards", shard_size=6)
    workload = dataclasses.replace(_image_workload(folder, tmp_path / "cache"), dataset=ShardDataset(tmp_path / "shards"))
    assert REGISTRY["data.num_workers"].value_applies(2, host, workload) is None
    assert "data.format" not in [k for k in REGISTRY if REGISTRY[k].applies(host, workload) is None]
    plain = dataclasses.replace(workload, dataset=_Stream())
    assert "shards_across_workers" in REGISTRY["data.num_workers"].value_applies(2, host, plain)


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter([])


def test_knob_choices_match_the_decoders():
    from torchpace.data.decoders import DECODER_NAMES

    assert REGISTRY["data.decoder"].choices == ("auto", *DECODER_NAMES)


@pytest.fixture(scope="module")
def vision_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("vision-cache")


@pytest.mark.parametrize("name, random_crop", [("vision", True), ("inference", False)])
def test_builtin_vision_workloads_read_an_image_folder(name, random_crop, vision_cache, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(vision_cache))
    workload = load_workload(name)
    dataset = workload.dataset
    assert isinstance(dataset, ImageFolderDataset) and dataset.decoder.name == "pillow"
    assert len(dataset) == 1000 and len(dataset.classes) == 10 and workload.batch_size == 64
    assert dataset.transform.random is random_crop and dataset.transform.crop_size == 80
    image, label = dataset[150]
    assert image.shape == (3, 80, 80) and label == 1
    assert dataset.root == vision_cache / "torchpace" / "vision-jpeg-v1"


def _old_vision_sample(path, label, train):
    """What the vision example's former Pillow dataset (`JpegFolder`) returned for one file."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as image:
        x = torch.from_numpy(np.asarray(image.convert("RGB"), dtype=np.uint8).copy()).permute(2, 0, 1).float().div_(255)
    if train:
        top, left = (int(v) for v in torch.randint(0, 96 - 80 + 1, (2,)))
        x = x[:, top:top + 80, left:left + 80]
        x = x.flip(2) if torch.rand(()) < 0.5 else x
    else:
        x = x[:, 8:88, 8:88]
    return (x - 0.5) / 0.25, label


@pytest.mark.parametrize("train", [True, False])
def test_vision_samples_are_the_same_as_before_the_move(train, vision_cache, monkeypatch):
    from torchpace.examples.vision import image_dataset

    monkeypatch.setenv("XDG_CACHE_HOME", str(vision_cache))
    dataset = image_dataset(train=train)
    for index in (0, 517, 999):
        torch.manual_seed(index)
        new, new_label = dataset[index]
        torch.manual_seed(index)
        old, old_label = _old_vision_sample(*dataset.samples[index], train)
        assert new_label == old_label and torch.allclose(new, old, atol=1e-6)
