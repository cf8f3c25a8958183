"""What `torchpace launch`'s sitecustomize hook does inside the script's process once torch is imported.

GLOBAL knobs (`precision.matmul`, `backends.cudnn_benchmark`) take effect through the knobs' own
`apply`, entered on an ExitStack that an atexit handler closes, so they hold for the whole script and
are restored as it exits. LOADER knobs (`data.num_workers`, `data.pin_memory`, `data.prefetch_factor`,
`data.persistent_workers`) become `DataLoader` defaults: an argument the script passes, by keyword or
by position, is never changed. Knobs that touch the model, optimizer or step are not applied here;
they need `torchpace.prepare()` in the script.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import inspect
from types import SimpleNamespace
from typing import Any, Mapping, Sequence

from torchpace.knobs import Knob, KnobValue, Point, get_knob

_PATCHED = "__torchpace_launch_defaults__"  # marks DataLoader.__init__ once it is wrapped


def apply_launch_config(values: Mapping[str, Any]) -> None:
    """Validate `values` (knob name -> value) and apply the GLOBAL and LOADER knobs among them."""
    knobs = [(get_knob(name), get_knob(name).validate(value)) for name, value in values.items()]
    apply_global_knobs([(k, v) for k, v in knobs if k.point is Point.GLOBAL])
    patch_dataloader_defaults([(k, v) for k, v in knobs if k.point is Point.LOADER])


def apply_global_knobs(knobs: Sequence[tuple[Knob, KnobValue]]) -> None:
    """Enter each knob's set-and-restore context for the rest of the process (closed at exit)."""
    if not knobs:
        return
    stack = contextlib.ExitStack()
    for knob, value in knobs:
        knob.apply(value, stack, None)
    atexit.register(stack.close)


def patch_dataloader_defaults(knobs: Sequence[tuple[Knob, KnobValue]]) -> None:
    """Make the LOADER knobs `torch.utils.data.DataLoader`'s defaults (subclasses included)."""
    import torch.utils.data

    loader_cls = torch.utils.data.DataLoader
    original = loader_cls.__init__
    if not knobs or getattr(original, _PATCHED, None) is not None:
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        explicit = signature.bind_partial(self, *args, **kwargs).arguments
        kwargs.update(loader_defaults(_fitting(knobs, explicit.get("dataset")), explicit))
        original(self, *args, **kwargs)

    setattr(__init__, _PATCHED, tuple(knobs))
    loader_cls.__init__ = __init__


def _fitting(knobs: Sequence[tuple[Knob, KnobValue]], dataset: Any) -> list[tuple[Knob, KnobValue]]:
    """The knobs whose value can run with `dataset`, by the knobs' own rule (e.g. no workers for an
    IterableDataset that would be read once per worker)."""
    loader_only = SimpleNamespace(dataset=dataset)
    return [(knob, value) for knob, value in knobs if knob.value_applies(value, None, loader_only) is None]


def loader_defaults(knobs: Sequence[tuple[Knob, KnobValue]], explicit: Mapping[str, Any]) -> dict[str, Any]:
    """The DataLoader keyword arguments the knobs add to what the script passed (`explicit`).

    Each knob applies to the arguments so far, as in `prepare()`; only names the script did not pass
    are kept, so `num_workers=0` passed explicitly also keeps the worker-only knobs away.
    """
    merged, added = dict(explicit), {}
    for knob, value in knobs:
        scratch = dict(merged)
        knob.apply(value, scratch, None)
        for name, new in scratch.items():
            if name not in explicit:
                merged[name] = added[name] = new
    return added
