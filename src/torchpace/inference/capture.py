"""Capturing a model as an artifact: torch.export (an ExportedProgram, `.pt2`) or TorchScript trace +
freeze; saving and loading either. torch only: this is what the `inference.export` knob runs inside
`prepare()`, and it imports nothing of torchpace's above the runtime's batch helpers (the workflow
that prepares a workload and writes its artifact is `export.py`).

torch.export is given a dynamic batch dimension, so one artifact serves batch 1 and the tuned batch
alike; a model that specialises on its batch size fails to export, which is a result ("this format
does not work for this model"), never a crash.

torch 2.13 marks TorchScript (`torch.jit.trace/freeze/save/load`) deprecated in favour of torch.export;
it still works and is still the one format that captures dynamically quantized layers, so it is
kept as the second format, with those deprecation warnings silenced around torchpace's own calls.
"""

from __future__ import annotations

import contextlib
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchpace.errors import UsageError
from torchpace.files import atomic_output

FORMATS = ("torch_export", "torchscript")
_EXAMPLE_BATCH = 4  # samples in the example batch the exporters trace with (>= 2: export specialises 0 and 1)
_ERROR_CHARS = 400  # the exporter's message is kept to this many characters in one-line reports


class ExportFailed(UsageError):
    """The exporter could not capture this model in the asked format (the message carries its error)."""


@contextlib.contextmanager
def _torchscript_deprecation_silenced():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated", category=DeprecationWarning)
        yield


def _first_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return f"{type(err).__name__}: {text}"[:_ERROR_CHARS]


def example_input(workload: Any, dataset: Any, device: torch.device, channels_last: bool) -> torch.Tensor:
    """A small batch of the model's input (the first samples of `dataset`, on `device`).

    Raises:
        ExportFailed: the workload has a custom `forward`, or its model input is not one tensor.
    """
    from torchpace.engine.batch import to_device

    if workload.forward is not None:
        raise ExportFailed("the workload has a custom forward(model, batch): cannot tell which tensors the model takes")
    size = max(2, min(_EXAMPLE_BATCH, workload.batch_size))
    loader = torch.utils.data.DataLoader(dataset, batch_size=size, shuffle=False, collate_fn=workload.collate_fn)
    batch = to_device(next(iter(loader)), device, channels_last=channels_last)
    inputs = batch[0] if isinstance(batch, (list, tuple)) else batch
    if not isinstance(inputs, torch.Tensor):
        raise ExportFailed(f"the model's input is a {type(inputs).__name__}, not one tensor: export needs a tensor input")
    return inputs


def export_program(model: nn.Module, example: torch.Tensor) -> "torch.export.ExportedProgram":
    """`torch.export.export` with a dynamic batch dimension; ExportFailed with the exporter's error."""
    from torch.export import Dim

    try:
        return torch.export.export(model, (example,), dynamic_shapes=({0: Dim("batch", min=1)},))
    except Exception as err:  # the exporter raises many types (Unsupported, UserError, AttributeError...): all mean "not exportable"
        raise ExportFailed(f"torch.export failed for this model: {_first_line(err)}") from err


def trace_and_freeze(model: nn.Module, example: torch.Tensor) -> torch.jit.ScriptModule:
    """`torch.jit.trace` then `torch.jit.freeze` (weights inlined as constants); ExportFailed with the tracer's error."""
    try:
        with torch.no_grad(), _torchscript_deprecation_silenced():
            return torch.jit.freeze(torch.jit.trace(model.eval(), example))
    except Exception as err:  # the tracer raises many types (TracingCheckError, RuntimeError...): all mean "not traceable"
        raise ExportFailed(f"TorchScript trace failed for this model: {_first_line(err)}") from err


def export_module(model: nn.Module, fmt: str, example: torch.Tensor) -> nn.Module:
    """The runnable module of `model` exported in `fmt` (what `prepare()` runs for `inference.export`)."""
    if fmt == "torch_export":
        return export_program(model, example).module()
    if fmt == "torchscript":
        return trace_and_freeze(model, example)
    raise UsageError(f"export format {fmt!r} is not valid; valid formats: {', '.join(FORMATS)}")


def save_artifact(model: nn.Module, fmt: str, example: torch.Tensor, path: Path) -> None:
    """Export `model` in `fmt` and write it to `path` (ExportedProgram archive or TorchScript file),
    atomically (`torchpace.files`: a full disk is one `OutputWriteFailed`, and no partial file is left)."""
    artifact = export_program(model, example) if fmt == "torch_export" else trace_and_freeze(model, example)
    with atomic_output(path, "wb") as stream:
        if fmt == "torch_export":
            torch.export.save(artifact, stream)
        else:
            with _torchscript_deprecation_silenced():
                torch.jit.save(artifact, stream)


def read_artifact_format(path: str | Path) -> str:
    """`torch_export` or `torchscript`, from the archive's contents (both are zip files)."""
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
    if any("/code/" in n or n.endswith("constants.pkl") for n in names):
        return "torchscript"
    return "torch_export"


def load_exported(path: str | Path) -> nn.Module:
    """Load an artifact `torchpace tune --export` wrote, whichever its format, as a callable module."""
    if read_artifact_format(path) == "torchscript":
        with _torchscript_deprecation_silenced():
            return torch.jit.load(str(path), map_location="cpu")
    return torch.export.load(str(path)).module()
