"""The knob registry: every knob, by name, in the tuner's stage order (docs/design.md#config-and-knobs).

Stages run system -> data -> compute -> memory -> distributed (inference knobs plug in the same way).
"""

from __future__ import annotations

from torchpace.errors import UsageError
from torchpace.knobs import compute, data, distributed, inference, memory, system
from torchpace.knobs import input as input_knobs
from torchpace.knobs.base import STAGES, ApplyContext, Knob, KnobSubject, KnobValue, Point, Reach, ScriptHook, ScriptSubject

REGISTRY: dict[str, Knob] = {}


def register(knob: Knob) -> None:
    """Add a knob plug-in; its name must be new."""
    if knob.name in REGISTRY:
        raise ValueError(f"knob {knob.name!r} is registered twice")
    REGISTRY[knob.name] = knob


for _module in (system, data, input_knobs, compute, memory, distributed, inference):
    for _knob in _module.KNOBS:
        register(_knob)


def get_knob(name: str) -> Knob:
    """The knob named `name`; UsageError listing the known names otherwise."""
    if name not in REGISTRY:
        from difflib import get_close_matches  # lazy: only a misspelt name needs it; the registry loads on CLI paths

        close = get_close_matches(name, REGISTRY, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise UsageError(f"unknown knob {name!r}{hint}; known knobs: {', '.join(REGISTRY)}")
    return REGISTRY[name]


def knobs_in_stage_order() -> list[Knob]:
    return sorted(REGISTRY.values(), key=lambda k: STAGES.index(k.stage))


__all__ = ["REGISTRY", "register", "get_knob", "knobs_in_stage_order", "Knob", "KnobValue", "Point", "Reach", "ApplyContext",
           "KnobSubject", "ScriptSubject", "ScriptHook", "STAGES"]
