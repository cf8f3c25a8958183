"""Workload: the unit torchpace measures, and `load_workload(spec)` that finds one.

A workload spec is `pkg.module:function`, `path/to/file.py:function`, or a built-in name
(`resnet`, `gpt`, each sized for the device, and by size `resnet-small`, `resnet-full`, `gpt-small`,
`gpt-full`; `vision`, `language`, `tabular`, `inference`). The function is called afresh wherever a
workload is needed (each trial process calls it), so it may build its model and data directly.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from torchpace.errors import UsageError, UserCodeError, whole_number_in

_log = logging.getLogger(__name__)

BUILTIN_WORKLOADS = {
    "resnet": "torchpace.examples.resnet:workload",
    "resnet-small": "torchpace.examples.resnet:small",
    "resnet-full": "torchpace.examples.resnet:full",
    "gpt": "torchpace.examples.gpt:workload",
    "gpt-small": "torchpace.examples.gpt:small",
    "gpt-full": "torchpace.examples.gpt:full",
    "vision": "torchpace.examples.vision:workload",
    "language": "torchpace.examples.language:workload",
    "tabular": "torchpace.examples.tabular:workload",
    "inference": "torchpace.examples.inference:workload",
}
DEFAULT_WORKLOAD = "tabular"


@dataclass
class Workload:
    """What to train (or run): a model, its data and how one optimizer step is made.

    Attributes:
        model: the `nn.Module`.
        dataset: map-style or iterable Dataset of CPU tensors (never pre-staged on the GPU).
        loss: `(output, batch) -> scalar tensor`; None makes this an inference workload.
        optimizer: `params -> Optimizer`; defaults to AdamW(lr=1e-3) for training workloads.
        batch_size: samples in ONE optimizer step, per process (the global batch of a step).
        forward: `(model, batch) -> output`; default `model(batch[0])`.
        clip_grad_norm: max gradient norm, clipped after backward (gradients unscaled first
            under fp16), or None for no clipping.
        scheduler: `optimizer -> LR scheduler`, stepped once per optimizer step, or None.
        collate_fn: passed to the DataLoader.
        evaluate: `model -> float` quality metric (higher is better) for the convergence guard.
        shuffle: shuffle map-style datasets (with a seeded generator, so orders repeat).
        seed: seeds model init order-independent parts and the data order.
        name: shown in reports; set by `load_workload` from the spec when empty.
        loader_options: the workload's own DataLoader arguments (`num_workers`, `pin_memory`,
            `prefetch_factor`, `persistent_workers`): what it runs with where a config does not set the
            knob of that argument (`data.num_workers`, ...), and so the defaults a tune starts from.
    """

    model: Any
    dataset: Any
    loss: Callable[[Any, Any], Any] | None = None
    optimizer: Callable[[Any], Any] | None = None
    batch_size: int = 32
    forward: Callable[[Any, Any], Any] | None = None
    clip_grad_norm: float | None = None
    scheduler: Callable[[Any], Any] | None = None
    collate_fn: Callable[[list], Any] | None = None
    evaluate: Callable[[Any], float] | None = None
    shuffle: bool = True
    seed: int = 0
    name: str = ""
    loader_options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_training(self) -> bool:
        return self.loss is not None


_CALLABLES = ("loss", "optimizer", "forward", "scheduler", "collate_fn", "evaluate")


def check_workload(workload: Any, spec: str = "") -> None:
    """UsageError naming the field when a Workload has the wrong shape: a model that is not a Module
    (or, to train, has no parameters), no dataset, an empty one or one smaller than one batch, a
    batch size that is not a positive int, or a hook that is not callable."""
    where = f"workload {spec!r}: " if spec else ""
    if not isinstance(workload, Workload):
        raise UsageError(f"{where}expected a torchpace.Workload, got {type(workload).__name__}")
    for reason in (_model_problem(workload), _batch_size_problem(workload), _dataset_problem(workload)):
        if reason:
            raise UsageError(f"{where}{reason}")
    for name in _CALLABLES:
        if getattr(workload, name) is not None and not callable(getattr(workload, name)):
            raise UsageError(f"{where}Workload.{name} is a {type(getattr(workload, name)).__name__}; expected a "
                             "function or None")
    if not isinstance(workload.loader_options, Mapping):
        raise UsageError(f"{where}Workload.loader_options is a {type(workload.loader_options).__name__}; expected "
                         "a dict of DataLoader arguments, e.g. {'num_workers': 4}")


def _model_problem(workload: Workload) -> str | None:
    import torch

    if not isinstance(workload.model, torch.nn.Module):
        return f"Workload.model is a {type(workload.model).__name__}; expected a torch.nn.Module"
    if workload.is_training and not any(p.requires_grad for p in workload.model.parameters()):
        return "Workload.model has no trainable parameters, so there is nothing to train (loss=None makes it inference)"
    return None


def _batch_size_problem(workload: Workload) -> str | None:
    size = workload.batch_size
    if not whole_number_in(size, 1):
        return f"Workload.batch_size is {size!r}; expected a positive int (samples in one optimizer step)"
    return None


def _dataset_problem(workload: Workload) -> str | None:
    import torch.utils.data

    dataset = workload.dataset
    if dataset is None:
        return "Workload.dataset is None; expected a map-style or iterable torch Dataset"
    if isinstance(dataset, torch.utils.data.IterableDataset):
        return None
    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        return (f"Workload.dataset is a {type(dataset).__name__}; expected a map-style Dataset "
                "(__getitem__ and __len__) or an IterableDataset")
    size = _run_user_code("taking len(Workload.dataset)", len, dataset)
    if size == 0:
        return "Workload.dataset is empty (len 0)"
    if workload.is_training and size < workload.batch_size:
        return (f"Workload.dataset has {size} samples, fewer than one batch (batch_size {workload.batch_size}): "
                "training drops an incomplete batch, so no step could run")
    return None


def _resolve_spec(spec: str) -> tuple[str, str]:
    """Split a spec into (module-or-file, function name), mapping built-in names."""
    spec = BUILTIN_WORKLOADS.get(spec, spec)
    target, sep, func = spec.rpartition(":")
    words = spec.split()
    if not sep and len(words) > 1 and (words[0].endswith(".py") or Path(words[0]).name.startswith("python")):
        script = next((w for w in words if w.endswith(".py")), "train.py")
        command = spec if Path(words[0]).name.startswith("python") else f"python {spec}"
        raise UsageError(
            f"workload spec {spec!r} is a command, not a workload: run it in script mode, `torchpace bench -- "
            f"{command}` (also tune, profile, and `torchpace launch --config torchpace.toml -- {command}`); to use a "
            f"function in {script} that returns a torchpace.Workload, give '{script}:FUNCTION'")
    if not sep and (spec.endswith(".py") or Path(spec).is_file()):
        raise UsageError(
            f"workload spec {spec!r} names a file, not a function: to measure that script as it is, run it in "
            f"script mode, `torchpace bench -- python {spec} ARGS` (also tune, profile); to use a function in it "
            f"that returns a torchpace.Workload, give '{spec}:FUNCTION'")
    if not sep or not target or not func:
        raise UsageError(
            f"workload spec {spec!r} is not valid: expected 'pkg.module:function', "
            f"'path/to/file.py:function', or one of {', '.join(BUILTIN_WORKLOADS)}"
        )
    return target, func


def _import_target(spec: str, target: str) -> Any:
    """Import a module by dotted name or from a .py file path."""
    if target.endswith(".py") or "/" in target:
        path = Path(target)
        if not path.is_file():
            raise UsageError(f"workload spec {spec!r}: file {target!r} does not exist")
        folder = str(path.resolve().parent)
        if folder not in sys.path:  # `from train import SmallCNN` in a workload file next to train.py
            sys.path.insert(0, folder)
        module_name = f"_torchpace_workload_{path.stem}"
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_name] = module
        with _as_program(target):
            _run_user_code(f"importing {target}", module_spec.loader.exec_module, module)
        return module
    try:
        if importlib.util.find_spec(target) is None:
            raise ModuleNotFoundError(target)
    except ModuleNotFoundError:
        raise UsageError(f"workload spec {spec!r}: no module named {target!r} (is it on sys.path?)") from None
    with _as_program(target):
        return _run_user_code(f"importing {target}", importlib.import_module, target)


@contextmanager
def _as_program(path: str) -> Iterator[None]:
    """`sys.argv` is `[path]` within the block: a module that parses its command line at import or in
    its workload function (argparse in a train.py) sees no arguments, not torchpace's own."""
    saved = sys.argv
    sys.argv = [path]
    try:
        yield
    finally:
        sys.argv = saved


def _run_user_code(where: str, func: Callable, *args: Any) -> Any:
    """Call user code; an exception inside it (or an exit) becomes a UserCodeError carrying its traceback."""
    with exits_as_errors(where):
        try:
            return func(*args)
        except Exception as err:  # the user's code may raise anything: it is reported, not swallowed
            raise UserCodeError(where, "".join(traceback.format_exception(err))) from err


@contextmanager
def exits_as_errors(where: str) -> Iterator[None]:
    """Within the block, `sys.exit(n)` and `os._exit(n)` called by the workload in THIS process become a
    UserCodeError (exit 1 with a message) instead of ending torchpace silently with the workload's code.

    `os._exit` is replaced only for the block and acts as before in forked children (DataLoader
    workers, whose exits the loader reports itself)."""
    real_exit, owner = os._exit, os.getpid()

    def exit_here(code: int) -> None:
        if os.getpid() != owner:
            real_exit(code)
        raise SystemExit(code)

    os._exit = exit_here
    try:
        yield
    except SystemExit as err:
        raise UserCodeError(f"{where}: it called sys.exit({err.code!r}) or os._exit({err.code!r})",
                            "".join(traceback.format_exception(err))) from None
    finally:
        os._exit = real_exit


def load_workload(spec: str | None = None) -> Workload:
    """Resolve `spec` and call its function to build a fresh Workload.

    Raises:
        UsageError: the spec does not resolve, the function returns something else, or a Workload
            of the wrong shape (`check_workload`).
        UserCodeError: the user's module or function raised.
    """
    spec = spec or DEFAULT_WORKLOAD
    target, func_name = _resolve_spec(spec)
    module = _import_target(spec, target)
    func = getattr(module, func_name, None)
    if not callable(func):
        raise UsageError(f"workload spec {spec!r}: {target!r} has no function {func_name!r}")
    with _as_program(target):
        workload = _run_user_code(f"building workload {spec!r}", func)
    if not isinstance(workload, Workload):
        program = f"python {target}" if target.endswith(".py") else f"python -m {target}"
        raise UsageError(
            f"workload spec {spec!r}: {func_name}() returned {type(workload).__name__}, expected a torchpace.Workload. "
            f"If {func_name}() is your training loop, measure it unchanged in script mode: "
            f"`torchpace bench -- {program} ARGS` (also tune, profile)"
        )
    check_workload(workload, spec)
    if not workload.name:
        workload.name = spec
    _log.info("workload %r built: %s, batch size %s, %s", spec, type(workload.model).__name__, workload.batch_size,
              "training" if workload.is_training else "inference")
    return workload
