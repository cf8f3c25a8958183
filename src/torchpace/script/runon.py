"""Inside an unmodified script run past its measured steps: note where it saves, evaluates, traces or exports.

A trial ends the script when its measurement is over, before the script's first checkpoint or evaluation, so no
trial sees what a knob does to the rest of the script's life. The tune's run-on check (`torchpace.trial.runon`)
runs the kept config once more, as `launch --config` runs it, with `RUN_ON_ENV` naming an events file; here the
`sitecustomize` hook notes, after the script's first training step (its first `backward()`: scripts that update
their parameters by hand have no optimizer step), each of these calls that returned:

- `save`: `torch.save` (a whole module, a state_dict, a checkpoint dict; Lightning's and the Hugging Face
  Trainer's checkpoints go through it too);
- `eval`: `Module.eval()` / `train(False)` of a module with parameters (the outermost call only);
- `trace`, `export`: `torch.jit.trace`, `torch.jit.script`, `torch.export.export` (`torch.onnx.export` goes
  through one of them);

and then the first `backward()` after one of them (`step`): the script has gone through its save or its
evaluation and trains on, so the check has seen what it came for and the parent ends the run. One JSON object
per line, appended (every process of a job writes its own lines). A call that raises is the script's failure,
seen by the parent as its exit status and traceback; nothing is noted for it here.
"""

from __future__ import annotations

import functools
import json
import os
import threading
from typing import Any, Callable

from torchpace.script.sites import caller_site

RUN_ON_ENV = "TORCHPACE_RUN_ON"  # the events file; also in the sitecustomize hook, which cannot import this
LIFE_EVENTS = ("save", "eval", "trace", "export")
STEP = "step"


class RunOnWatch:
    """Appends the script's life events to `path` (see the module docstring)."""

    def __init__(self, path: str):
        self.path = path
        self.steps = 0
        self.pending = False  # a life event was noted since the last step
        self._inside = threading.local()  # a life call made inside another (onnx.export traces): noted once

    def on_step(self) -> None:
        self.steps += 1
        if self.pending:
            self.pending = False
            self._write(STEP, "")

    def wrap(self, event: str, original: Callable[..., Any], counts: Callable[..., bool] | None = None):
        """`original`, noting `event` when it returns after the first step (and `counts(*args, **kwargs)`)."""

        @functools.wraps(original)
        def noted(*args: Any, **kwargs: Any) -> Any:
            if getattr(self._inside, "depth", 0):
                return original(*args, **kwargs)
            self._inside.depth = 1
            try:
                result = original(*args, **kwargs)
            finally:
                self._inside.depth = 0
            if self.steps and (counts is None or counts(*args, **kwargs)):
                self.pending = True
                self._write(event, caller_site())
            return result

        return noted

    def _write(self, event: str, where: str) -> None:
        line = json.dumps({"event": event, "where": where, "pid": os.getpid(), "step": self.steps}) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


def install(path: str) -> RunOnWatch:
    """Note the script's saves, evaluations, traces and exports in `path` for the rest of the process."""
    import torch

    watch = RunOnWatch(path)
    backward = torch.autograd.backward  # Tensor.backward calls it: every training step, with or without an optimizer

    @functools.wraps(backward)
    def counted(*args: Any, **kwargs: Any) -> Any:
        result = backward(*args, **kwargs)
        watch.on_step()
        return result

    torch.autograd.backward = counted
    torch.save = watch.wrap("save", torch.save)
    torch.nn.Module.train = watch.wrap("eval", torch.nn.Module.train, _evaluates)
    torch.jit.trace = watch.wrap("trace", torch.jit.trace)
    torch.jit.script = watch.wrap("trace", torch.jit.script)
    torch.export.export = watch.wrap("export", torch.export.export)  # torch.onnx.export traces or exports through these
    return watch


def _evaluates(module: Any, mode: bool = True) -> bool:
    return not mode and next(iter(module.parameters()), None) is not None


__all__ = ["RUN_ON_ENV", "LIFE_EVENTS", "STEP", "RunOnWatch", "install"]
