"""ImageFolderDataset: the ImageFolder layout and order, clear errors for bad folders, corrupt files
reported by path (raise or skip), decoder swaps, and the crop/flip/normalise transform."""

from __future__ import annotations

import warnings

import pytest
import torch

from torchpace.data import CorruptImageError, CropFlipNormalize, FolderError, ImageFolderDataset, SkippedImageWarning
from torchpace.errors import UsageError

from data_helpers import SIZE, cmyk_jpeg, gray_jpeg, photo_like, truncated_jpeg


def test_classes_labels_and_order_follow_imagefolder(folder):
    (folder / "class_1" / ".hidden.jpg").write_bytes(b"x")
    (folder / "notes.txt").write_text("not a class")
    dataset = ImageFolderDataset(folder)
    assert dataset.classes == ("class_0", "class_1", "class_2")
    assert len(dataset) == 24
    assert [label for _, label in dataset.samples] == [0] * 8 + [1] * 8 + [2] * 8
    assert dataset.samples[8][0].endswith("class_1/000.jpg")
    assert dataset.class_to_idx == {"class_0": 0, "class_1": 1, "class_2": 2} and dataset.targets[8] == 1
    image, label = dataset[9]
    assert image.dtype == torch.uint8 and image.shape == (3, *SIZE) and label == 1


def test_grayscale_and_cmyk_files_come_out_rgb(folder):
    (folder / "class_0" / "gray.jpg").write_bytes(gray_jpeg())
    (folder / "class_0" / "print.jpg").write_bytes(cmyk_jpeg())
    dataset = ImageFolderDataset(folder)
    for index, (path, _) in enumerate(dataset.samples):
        if path.endswith(("gray.jpg", "print.jpg")):
            assert dataset[index][0].shape == (3, *SIZE)


@pytest.mark.parametrize("layout, message", [
    ("missing", "is not a folder"),
    ("empty", r"no class sub-folders \(nothing in it\)"),
    ("flat", r"no class sub-folders \(2 images directly in it\)"),
    ("no_images", "3 class sub-folders but no images"),
])
def test_bad_folders_are_clear_usage_errors(tmp_path, layout, message):
    root = tmp_path / "data"
    if layout != "missing":
        root.mkdir()
    if layout == "flat":
        for name in ("a.jpg", "b.jpg"):
            photo_like(0).save(root / name)
    if layout == "no_images":
        for name in ("x", "y", "z"):
            (root / name).mkdir()
            (root / name / "readme.txt").write_text("no images")
    with pytest.raises(FolderError, match=message) as info:
        ImageFolderDataset(root)
    assert isinstance(info.value, UsageError) and str(root) in str(info.value)


def test_a_truncated_file_raises_naming_its_path(folder):
    bad = folder / "class_1" / "003.jpg"
    bad.write_bytes(truncated_jpeg())
    dataset = ImageFolderDataset(folder)
    index = [p for p, _ in dataset.samples].index(str(bad))
    with pytest.raises(CorruptImageError, match=f"cannot decode {bad} with the pillow decoder"):
        dataset[index]


def test_the_path_survives_a_loader_worker(folder):
    bad = folder / "class_2" / "000.jpg"
    bad.write_bytes(b"garbage, not an image")
    loader = torch.utils.data.DataLoader(ImageFolderDataset(folder), batch_size=8, num_workers=1)
    with pytest.raises(CorruptImageError, match=str(bad)):
        list(loader)


def test_skip_warns_with_the_path_and_serves_the_next_image(folder):
    bad = folder / "class_0" / "002.jpg"
    bad.write_bytes(truncated_jpeg())
    dataset = ImageFolderDataset(folder, on_error="skip")
    with pytest.warns(SkippedImageWarning, match=str(bad)):
        image, label = dataset[2]
    assert torch.equal(image, dataset[3][0]) and label == 0
    assert len(dataset) == 24


def test_skip_with_nothing_decodable_still_raises(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.jpg").write_bytes(b"junk")
    dataset = ImageFolderDataset(tmp_path, on_error="skip")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SkippedImageWarning)
        with pytest.raises(CorruptImageError, match="no image under"):
            dataset[0]


def test_an_unreadable_file_is_reported_like_a_corrupt_one(folder):
    dataset = ImageFolderDataset(folder)
    (folder / "class_0" / "000.jpg").unlink()
    with pytest.raises(CorruptImageError, match="cannot read .*000.jpg"):
        dataset[0]


def test_bad_options_are_usage_errors(folder):
    with pytest.raises(UsageError, match="valid values: raise, skip"):
        ImageFolderDataset(folder, on_error="ignore")
    with pytest.raises(UsageError, match="unknown decoder 'opencv'"):
        ImageFolderDataset(folder, decoder="opencv")


def test_a_jpeg_only_decoder_refuses_png_files(folder):
    photo_like(5).save(folder / "class_0" / "extra.png")
    assert len(ImageFolderDataset(folder)) == 25  # Pillow reads it
    with pytest.raises(UsageError, match="reads JPEG only.*extra.png"):
        ImageFolderDataset(folder, decoder="simplejpeg")


def test_with_decoder_returns_a_copy(folder):
    pytest.importorskip("simplejpeg", reason="install: pip install simplejpeg")
    dataset = ImageFolderDataset(folder)
    other = dataset.with_decoder("simplejpeg")
    assert other.decoder.name == "simplejpeg" and dataset.decoder.name == "pillow"
    assert other.samples == dataset.samples
    assert (other[5][0].int() - dataset[5][0].int()).abs().max() <= 8


def test_transform_crops_flips_and_normalises():
    image = torch.arange(3 * 10 * 12, dtype=torch.int64).remainder(256).to(torch.uint8).view(3, 10, 12)
    centre = CropFlipNormalize(8, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25), random=False)(image)
    expected = (image[:, 1:9, 2:10].float() / 255 - 0.5) / 0.25
    assert torch.allclose(centre, expected)
    torch.manual_seed(0)
    crops = [CropFlipNormalize(8, (0.5,) * 3, (0.25,) * 3)(image) for _ in range(20)]
    assert all(c.shape == (3, 8, 8) for c in crops)
    assert len({tuple(c.flatten().tolist()) for c in crops}) > 1  # positions and flips vary
    with pytest.raises(ValueError, match="smaller than the 16-pixel crop"):
        CropFlipNormalize(16, (0.5,) * 3, (0.25,) * 3)(image)
