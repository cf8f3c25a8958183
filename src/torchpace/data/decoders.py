"""Pluggable JPEG decoders: bytes in, a `(3, H, W)` uint8 RGB tensor out.

Every decoder gives the same shape and, within a small tolerance, the same pixels as Pillow's
`Image.convert("RGB")`: grayscale is replicated to three channels, and CMYK/YCCK (Adobe) JPEGs are
converted with Pillow's formula. Decoders other than Pillow are optional extras; a missing one reports
`unavailable_reason()` with the command that installs it, and is never imported at torchpace's import.

| name | library | install |
|---|---|---|
| `pillow` | Pillow (a torchpace dependency) | — |
| `simplejpeg` | simplejpeg (libjpeg-turbo, bundled) | `pip install simplejpeg` |
| `turbojpeg` | PyTurboJPEG over the system libjpeg-turbo | `apt-get install libturbojpeg0` + `pip install PyTurboJPEG` |
| `torchvision` | `torchvision.io.decode_jpeg` on the CPU | `pip install torchvision` (the build matching torch) |
| `torchvision-cuda` | `torchvision.io.decode_jpeg(device="cuda")` (nvJPEG) | as above, with CUDA |

A file the library cannot decode raises `DecodeError` with the library's message; the datasets turn
it into a `CorruptImageError` that names the file.
"""

from __future__ import annotations

import functools
import io
import warnings
from typing import Any, ClassVar

import numpy as np
import torch

from torchpace.errors import UsageError

PILLOW = "pillow"
DECODER_NAMES = ("pillow", "simplejpeg", "turbojpeg", "torchvision", "torchvision-cuda")
INSTALL_EXTRA = "pip install 'torchpace[decoders]'"
JPEG_SUFFIXES = frozenset({".jpg", ".jpeg", ".jpe", ".jfif"})
_APP14 = 0xEE  # the Adobe marker: its presence means CMYK samples are stored inverted
_SOS = 0xDA  # start of scan: header markers end here


class DecodeError(Exception):
    """The decoder's library could not decode the bytes (the message is the library's)."""


class Decoder:
    """Base of the decoders. Subclasses set `name`, `install` and implement `decode`.

    Instances are cheap and picklable (DataLoader workers receive copies): library handles are made
    lazily in each process.
    """

    name: ClassVar[str]
    install: ClassVar[str] = ""
    jpeg_only: ClassVar[bool] = True
    device: ClassVar[str] = "cpu"

    def unavailable_reason(self) -> str | None:
        """None when this decoder works here, else why not and the command that installs it."""
        return None

    def decode(self, data: bytes) -> torch.Tensor:
        """Decode JPEG `data` to a `(3, H, W)` uint8 RGB tensor; DecodeError when it cannot."""
        raise NotImplementedError

    def reads(self, suffix: str) -> bool:
        """True when this decoder can read files with this suffix (e.g. `.jpg`)."""
        return not self.jpeg_only or suffix.lower() in JPEG_SUFFIXES

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))


def _hwc_to_chw(pixels: np.ndarray) -> torch.Tensor:
    """`(H, W, 3)` uint8 array -> `(3, H, W)` tensor view (channels-last memory, no copy)."""
    if not pixels.flags.writeable:
        pixels = pixels.copy()
    return torch.from_numpy(pixels).permute(2, 0, 1)


def has_adobe_marker(data: bytes) -> bool:
    """True when the JPEG header has an Adobe APP14 segment (its CMYK samples are stored inverted)."""
    offset = 2
    while offset + 4 <= len(data) and data[offset] == 0xFF:
        marker = data[offset + 1]
        if marker == _SOS:
            return False
        length = int.from_bytes(data[offset + 2:offset + 4], "big")
        if marker == _APP14 and data[offset + 4:offset + 9] == b"Adobe":
            return True
        offset += 2 + length
    return False


def cmyk_to_rgb(cmyk: np.ndarray, inverted: bool) -> np.ndarray:
    """CMYK `(H, W, 4)` uint8 -> RGB `(H, W, 3)` uint8 with Pillow's formula (bit-exact).

    Pillow computes `R = (255 - K) - C * (255 - K) / 255` with its rounding `MULDIV255`; Adobe
    JPEGs store 255 - value, so `inverted` flips the samples first.
    """
    values = (255 - cmyk if inverted else cmyk).astype(np.int32)
    not_k = 255 - values[..., 3:4]
    scaled = values[..., :3] * not_k + 128
    return (not_k - (((scaled >> 8) + scaled) >> 8)).astype(np.uint8)


class PillowDecoder(Decoder):
    """Pillow (`Image.open(...).convert("RGB")`): the reference every other decoder matches."""

    name = PILLOW
    jpeg_only = False

    def decode(self, data: bytes) -> torch.Tensor:
        # lazy: Pillow loads only when this decoder decodes (`torchpace shard` runs without it)
        from PIL import Image

        try:
            with Image.open(io.BytesIO(data)) as image:
                pixels = np.array(image.convert("RGB"), dtype=np.uint8)
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
            raise DecodeError(str(err) or type(err).__name__) from err
        return _hwc_to_chw(pixels)


class SimpleJpegDecoder(Decoder):
    """simplejpeg: libjpeg-turbo bundled in the wheel; strict, so a truncated file is an error."""

    name = "simplejpeg"
    install = "pip install simplejpeg"

    def unavailable_reason(self) -> str | None:
        return _import_reason("simplejpeg", self.install)

    def decode(self, data: bytes) -> torch.Tensor:
        import simplejpeg

        try:
            return _hwc_to_chw(simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True))
        except ValueError as err:
            raise DecodeError(str(err)) from err


class TurboJpegDecoder(Decoder):
    """PyTurboJPEG over the system libjpeg-turbo (`libturbojpeg0` on Debian/Ubuntu).

    libjpeg-turbo's warnings (e.g. "Premature end of JPEG file") are errors here, as in Pillow.
    PyTurboJPEG 2.x needs libjpeg-turbo 3; where the system has 2.x, PyTurboJPEG 1.x is the one.
    """

    name = "turbojpeg"
    install = "apt-get install -y libturbojpeg0 && pip install PyTurboJPEG"

    def __init__(self) -> None:
        self._handle: Any = None

    def __getstate__(self) -> dict:
        return {}  # the ctypes handle is made again in each worker

    def __setstate__(self, state: dict) -> None:
        self._handle = None

    def unavailable_reason(self) -> str | None:
        reason = _import_reason("turbojpeg", self.install)
        if reason is None:
            try:
                self._library()
            except (OSError, RuntimeError) as err:
                first_line = str(err).strip().splitlines()[0]
                return (f"PyTurboJPEG cannot load libjpeg-turbo ({first_line}); "
                        f"install: {self.install} (with libjpeg-turbo 2.x: pip install 'PyTurboJPEG<2')")
        return reason

    def _library(self) -> Any:
        if self._handle is None:
            from turbojpeg import TurboJPEG

            self._handle = TurboJPEG()
        return self._handle

    def decode(self, data: bytes) -> torch.Tensor:
        import turbojpeg

        library = self._library()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # libjpeg-turbo warnings mean corrupt data
            try:
                colorspace = library.decode_header(data)[3]
                if colorspace in (turbojpeg.TJCS_CMYK, turbojpeg.TJCS_YCCK):
                    cmyk = library.decode(data, pixel_format=turbojpeg.TJPF_CMYK)
                    return _hwc_to_chw(cmyk_to_rgb(cmyk, has_adobe_marker(data)))
                return _hwc_to_chw(library.decode(data, pixel_format=turbojpeg.TJPF_RGB))
            except (OSError, ValueError, UserWarning) as err:
                raise DecodeError(str(err)) from err


class TorchvisionDecoder(Decoder):
    """`torchvision.io.decode_jpeg` (libjpeg-turbo on the CPU; nvJPEG for `torchvision-cuda`)."""

    name = "torchvision"
    install = "pip install torchvision  # the build that matches your torch"

    def unavailable_reason(self) -> str | None:
        try:
            from torchvision.io import ImageReadMode, decode_jpeg  # noqa: F401
        except (ImportError, OSError, RuntimeError, AttributeError) as err:
            first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
            return f"torchvision.io.decode_jpeg does not import here ({first_line}); install: {self.install}"
        return None

    def decode(self, data: bytes) -> torch.Tensor:
        from torchvision.io import ImageReadMode, decode_jpeg

        if not data:
            raise DecodeError("empty file")
        encoded = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # libjpeg warnings (e.g. a truncated file) mean corrupt data
            try:
                return decode_jpeg(encoded, mode=ImageReadMode.RGB, device=self.device)
            except (RuntimeError, UserWarning) as err:
                raise DecodeError(str(err)) from err


class TorchvisionCudaDecoder(TorchvisionDecoder):
    """`torchvision.io.decode_jpeg(device="cuda")`: returns CUDA tensors (use with num_workers=0)."""

    name = "torchvision-cuda"
    device = "cuda"

    def unavailable_reason(self) -> str | None:
        if not torch.cuda.is_available():
            return "decoding on the GPU needs a CUDA device; none here"
        return super().unavailable_reason()


_DECODERS: dict[str, type[Decoder]] = {
    cls.name: cls for cls in (PillowDecoder, SimpleJpegDecoder, TurboJpegDecoder, TorchvisionDecoder, TorchvisionCudaDecoder)
}


def _import_reason(module: str, install: str) -> str | None:
    try:
        __import__(module)
    except ImportError as err:
        return f"{module} is not installed ({err}); install: {install}"
    return None


def get_decoder(decoder: "str | Decoder") -> Decoder:
    """The decoder named `decoder` (or `decoder` itself); UsageError listing the valid names."""
    if isinstance(decoder, Decoder):
        return decoder
    if decoder not in _DECODERS:
        raise UsageError(f"unknown decoder {decoder!r}; valid decoders: {', '.join(DECODER_NAMES)}")
    return _DECODERS[decoder]()


@functools.lru_cache(maxsize=None)
def decoder_unavailable_reason(name: str) -> str | None:
    """None when decoder `name` works in this process, else why not (with the install command)."""
    return get_decoder(name).unavailable_reason()


def available_decoders() -> list[str]:
    """Names of the decoders that work here, Pillow first."""
    return [name for name in DECODER_NAMES if decoder_unavailable_reason(name) is None]
