"""`tune --export`: prepare the workload under the tuned config and write its model as an artifact
(`torchpace.inference.capture` does the capturing: torch.export or TorchScript trace + freeze).

The artifact holds the model with its MODEL-point knobs applied (channels_last, dynamic int8
quantization). Runtime settings are not part of an artifact: `torch.compile`, autocast
(`precision.amp`), `inference_mode` and thread counts are applied where the artifact is served
(`runtime_settings` lists them).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchpace.config import RunConfig, resolve_config
from torchpace.inference.capture import ExportFailed, example_input, load_exported, save_artifact
from torchpace.knobs import REGISTRY, Point

_NOT_IN_ARTIFACT = ("inference.export", "compile.mode")  # the format is decided here; compile happens at serve time


@dataclass(frozen=True)
class ExportInfo:
    """What `export_workload` wrote.

    Attributes:
        path: the artifact's path.
        format: `torch_export` (load with `torch.export.load(path).module()`) or `torchscript`
            (`torch.jit.load(path)`).
        size_bytes: the artifact's size on disk.
        max_abs_diff: largest |output difference| between the artifact, reloaded from disk, and the
            prepared model it was made from, on the example batch.
        runtime: tuned knobs to apply where it is served (the artifact cannot carry them; for
            `model.channels_last` it holds the NHWC weights, and the server converts its inputs).
        fallback_reason: why torch.export was not used when the config left the format open.
    """

    path: str
    format: str
    size_bytes: int
    max_abs_diff: float
    runtime: dict[str, Any] = field(default_factory=dict)
    fallback_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_ALSO_AT_SERVE_TIME = ("compile.mode", "model.channels_last")  # compile is not saved; NHWC weights want NHWC inputs


def runtime_settings(config: Any) -> dict[str, Any]:
    """The non-default knobs a server must apply itself: threads, env, autocast, inference mode,
    compile, and channels_last (the file holds NHWC weights; the server converts its 4-D inputs)."""
    return {name: value for name, value in config.non_default().items()
            if REGISTRY[name].point in (Point.ENV, Point.GLOBAL, Point.STEP) or name in _ALSO_AT_SERVE_TIME}


def export_workload(workload: Any, config: Any, path: str | Path, *, host: Any = None) -> ExportInfo:
    """Prepare `workload` under `config` and write its model as an artifact at `path`.

    The format is the config's `inference.export`; when that is `none`, torch.export is tried first
    and TorchScript trace + freeze is the fallback. The artifact is reloaded and checked against the
    prepared model before returning.

    Raises:
        ExportFailed: no format could capture this model (the message carries the exporter's error).
    """
    from torchpace.runtime import prepare

    config = resolve_config(config)
    fmt = config.get_value("inference.export")
    runtime = runtime_settings(config)
    in_artifact = RunConfig({k: v for k, v in config.values.items()
                             if k not in _NOT_IN_ARTIFACT and (k not in runtime or k == "model.channels_last")})
    with prepare(workload, in_artifact, host=host, device="cpu") as run:
        example = example_input(workload, run.loader.dataset, run.device, bool(config.get_value("model.channels_last")))
        fmt, fallback = _save_with_fallback(run.model, fmt, example, Path(path))
        with torch.no_grad():
            expected = run.model(example)
            reloaded = load_exported(path)(example)
    diff = float((reloaded.float() - expected.float()).abs().max())
    return ExportInfo(str(path), fmt, Path(path).stat().st_size, diff, runtime, fallback)


def _save_with_fallback(model: nn.Module, fmt: str, example: torch.Tensor, path: Path) -> tuple[str, str | None]:
    """Save in `fmt`; for `none`, torch.export first and TorchScript when it fails. Returns (format, fallback reason)."""
    if fmt != "none":
        save_artifact(model, fmt, example, path)
        return fmt, None
    try:
        save_artifact(model, "torch_export", example, path)
        return "torch_export", None
    except ExportFailed as err:
        save_artifact(model, "torchscript", example, path)
        return "torchscript", str(err)
