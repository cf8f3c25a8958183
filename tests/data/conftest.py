"""Fixtures for the data tests: image folders, and the optional decoders' system library."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess

import pytest

from data_helpers import write_folder

_APT_TIMEOUT_S = 300


@pytest.fixture
def folder(tmp_path):
    """A class-per-sub-folder tree of 3 classes x 8 valid JPEGs."""
    return write_folder(tmp_path / "images")


def _turbojpeg_reason() -> str | None:
    from torchpace.data.decoders import TurboJpegDecoder

    return TurboJpegDecoder().unavailable_reason()


@pytest.fixture(scope="session")
def turbojpeg_library() -> None:
    """libjpeg-turbo's TurboJPEG library installed (apt, as root), or the test skipped with the reason."""
    from torchpace.data import decoders

    if _turbojpeg_reason() is None:
        return
    if importlib.util.find_spec("turbojpeg") is None:
        pytest.skip(f"turbojpeg decoder unavailable: {_turbojpeg_reason()}")
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        pytest.skip(f"turbojpeg decoder unavailable: {_turbojpeg_reason()} (installing needs root and apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", "libturbojpeg0"]
    if subprocess.run(install, env=env, capture_output=True, timeout=_APT_TIMEOUT_S).returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, timeout=_APT_TIMEOUT_S)
        subprocess.run(install, env=env, capture_output=True, timeout=_APT_TIMEOUT_S)
    decoders.decoder_unavailable_reason.cache_clear()
    reason = _turbojpeg_reason()
    if reason is not None:
        pytest.skip(f"turbojpeg decoder unavailable: {reason}")
