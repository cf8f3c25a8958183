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


def workload_defaults(workload: KnobSubject) -> dict[str, KnobValue]:
    """Knob name -> value for every knob whose default the workload sets itself (`Knob.default_for`: its
    own DataLoader arguments, `Workload.loader_options`), validated by the knob.

    Raises:
        UsageError: an argument that no knob sets (naming the ones that can be given), or a value the
            knob refuses.
    """
    options = getattr(workload, "loader_options", None) or {}
    owners = {knob.loader_argument: knob for knob in REGISTRY.values() if knob.loader_argument}
    unknown = sorted(str(name) for name in options if name not in owners)
    if unknown:
        raise UsageError(f"Workload.loader_options: {', '.join(map(repr, unknown))} cannot be given there; the "
                         f"DataLoader arguments a workload may set itself are {', '.join(owners)}")
    defaults = {}
    for argument in options:
        knob = owners[argument]
        try:
            defaults[knob.name] = knob.default_for(workload)
        except UsageError as err:
            raise UsageError(f"Workload.loader_options[{argument!r}]: {err}") from None
    return defaults


def knobs_in_stage_order() -> list[Knob]:
    return sorted(REGISTRY.values(), key=lambda k: STAGES.index(k.stage))


__all__ = ["REGISTRY", "register", "get_knob", "knobs_in_stage_order", "workload_defaults", "Knob", "KnobValue", "Point",
           "Reach", "ApplyContext", "KnobSubject", "ScriptSubject", "ScriptHook", "STAGES"]
