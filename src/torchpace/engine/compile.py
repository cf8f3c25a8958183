"""torch.compile as the knobs apply it: the mode's options, CUDA-graph modes' step marks, and the
rule that refuses a CUDA-graph mode for inputs whose shapes change from step to step.

`reduce-overhead` (and `max-autotune`, which includes it) records the compiled model's kernels as CUDA
graphs and replays them: one graph per input shape, recorded again for each new shape. A model whose
input shapes change every step (variable-length sequences without padding to a fixed length, a
multi-scale augmentation) would record on most steps and gain nothing, so `ShapeWatch` follows the
first calls' input shapes and names that case; the caller ends the trial (`invalid`) or runs eagerly.
In a training loop, every optimizer step marks the start of a new CUDA-graph iteration
(`torch.compiler.cudagraph_mark_step_begin`), so outputs a script keeps from one step to the next are
never overwritten under it by the next replay.
"""

from __future__ import annotations

from typing import Any

import torch

from torchpace.errors import UsageError

CUDA_GRAPH_MODES = frozenset({"reduce-overhead", "max-autotune"})  # compiled code replayed as CUDA graphs (on CUDA)
_WATCHED_CALLS = 8  # the first calls whose input shapes are compared
_MOST_SHAPES = 3  # distinct input shapes among them a CUDA-graph mode fits (a last short batch, an eval batch)


def compile_options(mode: str) -> dict[str, Any]:
    """`torch.compile` keyword arguments for a `compile.mode` value (`default`: torch's own default)."""
    return {} if mode == "default" else {"mode": mode}


def uses_cuda_graphs(mode: str) -> bool:
    """True for the modes whose compiled code is recorded and replayed as CUDA graphs."""
    return mode in CUDA_GRAPH_MODES


class ShapeWatch:
    """Follows the input shapes of a CUDA-graph-mode model's first calls (pure: shapes in, reason out).

    Attributes:
        shapes: the distinct input signatures seen among the watched calls.
        calls: the calls seen so far (counting stops after the watched ones).
    """

    def __init__(self, mode: str):
        self.mode = mode
        self.shapes: set[tuple] = set()
        self.calls = 0

    def see(self, signature: tuple) -> str | None:
        """Note one call's input signature; the reason the mode does not fit once too many differ, else None."""
        if self.calls >= _WATCHED_CALLS:
            return None
        self.calls += 1
        self.shapes.add(signature)
        if len(self.shapes) > _MOST_SHAPES:
            return (f"compile.mode = {self.mode} records a CUDA graph per input shape, and the inputs changed shape "
                    f"{len(self.shapes)} times in the first {self.calls} calls: pad them to a fixed shape, or use "
                    "compile.mode = default or max-autotune-no-cudagraphs")
        return None


def input_signature(args: Any) -> tuple:
    """The shapes and dtypes of the tensors in `args` (nested tuples, lists and dicts followed), in order."""
    if isinstance(args, torch.Tensor):
        return ((tuple(args.shape), str(args.dtype)),)
    if isinstance(args, dict):
        return tuple(item for key in args for item in input_signature(args[key]))
    if isinstance(args, (list, tuple)):
        return tuple(item for value in args for item in input_signature(value))
    return ()


def mark_cuda_graph_step() -> None:
    """A new CUDA-graph iteration starts: outputs of the replays before it may be overwritten from now on."""
    torch.compiler.cudagraph_mark_step_begin()


def compile_model(model, mode: str):
    """`torch.compile(model)` with the mode's options; under a CUDA-graph mode its first calls' input shapes
    are watched, and a model whose inputs change shape from call to call raises `UsageError` (the
    config does not fit the workload: a trial of it is `invalid`)."""
    compiled = torch.compile(model, **compile_options(mode))
    if uses_cuda_graphs(mode) and torch.cuda.is_available():  # on a CPU, max-autotune records no graph
        watch = ShapeWatch(mode)

        def check_shapes(module, args, kwargs):
            if not torch.compiler.is_compiling():
                why = watch.see(input_signature((args, kwargs)))
                if why is not None:
                    raise UsageError(why)

        compiled.register_forward_pre_hook(check_shapes, with_kwargs=True)
    return compiled
