"""Every decoder gives Pillow's shape and (within a small tolerance) Pillow's pixels, on RGB,
grayscale and CMYK JPEGs; a truncated or non-JPEG file is a DecodeError, never a bare library error."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torchpace.data.decoders import (DECODER_NAMES, DecodeError, PillowDecoder, TorchvisionCudaDecoder, cmyk_to_rgb,
                                     decoder_unavailable_reason, get_decoder, has_adobe_marker)
from torchpace.errors import UsageError

from data_helpers import SIZE, cmyk_jpeg, gray_jpeg, rgb_jpeg, truncated_jpeg

CPU_DECODERS = ("pillow", "simplejpeg", "turbojpeg", "torchvision")
_MAX_ABS_DIFF = 8  # libjpeg builds differ in IDCT/upsampling rounding by a few levels at most
_MEAN_ABS_DIFF = 1.0


@pytest.fixture(params=CPU_DECODERS)
def decoder(request):
    """Each CPU decoder; skipped with the reason and install command where it cannot run."""
    if request.param == "turbojpeg":
        request.getfixturevalue("turbojpeg_library")
    reason = decoder_unavailable_reason(request.param)
    if reason is not None:
        pytest.skip(reason)
    return get_decoder(request.param)


@pytest.mark.parametrize("make", [rgb_jpeg, gray_jpeg, cmyk_jpeg], ids=["rgb", "grayscale", "cmyk"])
def test_decoder_matches_pillow(decoder, make):
    data = make()
    expected = PillowDecoder().decode(data)
    got = decoder.decode(data)
    assert got.dtype == torch.uint8 and got.shape == expected.shape == (3, *SIZE)
    diff = (got.int() - expected.int()).abs()
    assert diff.max() <= _MAX_ABS_DIFF and diff.float().mean() <= _MEAN_ABS_DIFF


@pytest.mark.parametrize("data", [truncated_jpeg(), b"not a jpeg at all", b""], ids=["truncated", "text", "empty"])
def test_bad_bytes_are_a_decode_error(decoder, data):
    with pytest.raises(DecodeError) as info:
        decoder.decode(data)
    assert str(info.value)


def test_decoders_survive_pickling_for_loader_workers(decoder):
    import pickle

    copy = pickle.loads(pickle.dumps(decoder))
    assert torch.equal(copy.decode(rgb_jpeg()), decoder.decode(rgb_jpeg()))


def test_adobe_marker_found_only_in_cmyk_jpegs():
    assert has_adobe_marker(cmyk_jpeg())
    assert not has_adobe_marker(rgb_jpeg()) and not has_adobe_marker(b"\xff\xd8") and not has_adobe_marker(b"")


def test_cmyk_conversion_is_pillows():
    from PIL import Image

    cmyk = np.random.default_rng(0).integers(0, 256, (7, 5, 4), dtype=np.uint8)
    expected = np.asarray(Image.fromarray(cmyk, "CMYK").convert("RGB"))
    assert np.array_equal(cmyk_to_rgb(cmyk, inverted=False), expected)
    assert np.array_equal(cmyk_to_rgb(255 - cmyk, inverted=True), expected)


def test_unknown_decoder_names_the_valid_ones():
    with pytest.raises(UsageError, match="valid decoders: pillow, simplejpeg"):
        get_decoder("libjpeg")


def test_every_unavailable_decoder_says_how_to_install_it():
    for name in DECODER_NAMES:
        reason = decoder_unavailable_reason(name)
        assert reason is None or "install" in reason or "CUDA" in reason, reason


def test_gpu_decoder_needs_cuda():
    if torch.cuda.is_available():
        pytest.skip("CUDA is present here")
    assert "CUDA" in TorchvisionCudaDecoder().unavailable_reason()


def test_pillow_reads_png_and_jpeg_only_decoders_do_not():
    assert get_decoder("pillow").reads(".PNG") and get_decoder("simplejpeg").reads(".JPEG")
    assert not get_decoder("simplejpeg").reads(".png")
