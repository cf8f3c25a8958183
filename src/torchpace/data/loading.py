"""What the folder and shard datasets share: choosing a decoder, decoding one image, and what
happens to an image that cannot be decoded (`on_error="raise"` or `"skip"`)."""

from __future__ import annotations

import warnings

import torch

from torchpace.data.decoders import DecodeError, Decoder, get_decoder
from torchpace.errors import TorchpaceError, UsageError

ON_ERROR_CHOICES = ("raise", "skip")


class CorruptImageError(TorchpaceError):
    """An image could not be read or decoded; the message names its file (or shard and key).

    The constructor takes the message alone, so the error survives being re-raised by a DataLoader
    worker (torch rebuilds worker exceptions from their message).
    """


class SkippedImageWarning(UserWarning):
    """An image that could not be decoded was skipped (`on_error="skip"`)."""


def check_on_error(on_error: str) -> str:
    """`on_error` when valid; UsageError naming the valid values otherwise."""
    if on_error not in ON_ERROR_CHOICES:
        raise UsageError(f"on_error={on_error!r} is not valid; valid values: {', '.join(ON_ERROR_CHOICES)}")
    return on_error


def resolve_decoder(decoder: "str | Decoder") -> Decoder:
    """The decoder object; UsageError when unknown or not usable here (with its install command)."""
    resolved = get_decoder(decoder)
    reason = resolved.unavailable_reason()
    if reason is not None:
        raise UsageError(f"decoder {resolved.name!r} cannot be used here: {reason}")
    return resolved


def decode_image(decoder: Decoder, data: bytes, where: str) -> torch.Tensor:
    """Decode `data` (read from `where`, a path or `shard:key`); CorruptImageError naming `where`."""
    try:
        return decoder.decode(data)
    except DecodeError as err:
        raise CorruptImageError(f"cannot decode {where} with the {decoder.name} decoder: {err}") from err


def warn_skipped(err: CorruptImageError) -> None:
    """Report a skipped image (a warning per image: the message names it)."""
    warnings.warn(f"skipped: {err}", SkippedImageWarning, stacklevel=3)
