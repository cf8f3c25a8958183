"""Dynamic int8 quantization of Linear / LSTM / GRU layers (CPU), and the model-size figure.

torch 2.13 still ships `torch.ao.quantization.quantize_dynamic`, but marks all of `torch.ao.quantization`
deprecated in favour of torchao's `quantize_` API. torchao is not a torchpace dependency, so the
deprecated eager API is used here with its deprecation warnings filtered (only around this call).
Dynamic quantization stores weights as int8 and quantizes activations on the fly per call; it runs
on the CPU quantized engines (x86/fbgemm, onednn, qnnpack) only.
"""

from __future__ import annotations

import io
import warnings

import torch
from torch import nn

QUANTIZABLE_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, nn.LSTM, nn.GRU)
_DEPRECATION_MESSAGES = (r".*torch\.ao\.quantization is deprecated.*", r".*quantize_per_tensor.*deprecated.*")


def quantizable_layers(model: nn.Module) -> list[str]:
    """Names of the submodules dynamic int8 quantization would replace."""
    return [name for name, module in model.named_modules() if type(module) in QUANTIZABLE_TYPES]


def cpu_quantized_engine() -> str | None:
    """The quantized engine torch would use on this CPU, or None when it has none."""
    engines = [e for e in torch.backends.quantized.supported_engines if e != "none"]
    return torch.backends.quantized.engine if engines else None


def quantize_dynamic_int8(model: nn.Module) -> nn.Module:
    """A copy of `model` with its Linear/LSTM/GRU layers dynamically quantized to int8 (CPU only).

    The original model is left untouched (torch's `inplace=False`).
    """
    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():
        for message in _DEPRECATION_MESSAGES:
            warnings.filterwarnings("ignore", message=message)
        return quantize_dynamic(model, set(QUANTIZABLE_TYPES), dtype=torch.qint8)


def model_size_bytes(model: nn.Module) -> int:
    """Bytes the model's weights take when saved: its `state_dict` through `torch.save`, or the
    whole TorchScript archive for a (frozen) ScriptModule, whose weights are constants."""
    buffer = io.BytesIO()
    if isinstance(model, torch.jit.ScriptModule):
        with warnings.catch_warnings():  # torch 2.13 deprecates TorchScript; this only measures the archive
            warnings.filterwarnings("ignore", message=r"`torch\.jit\.save` is deprecated", category=DeprecationWarning)
            torch.jit.save(model, buffer)
    else:
        torch.save(getattr(model, "_orig_mod", model).state_dict(), buffer)
    return buffer.tell()
