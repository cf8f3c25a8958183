"""The search space: for this host and workload, each applicable knob with the values to try."""

from __future__ import annotations

from dataclasses import dataclass, field

from torchpace.knobs import Point, knobs_in_stage_order

TUNED_STAGES = ("system", "data", "compute", "memory", "distributed", "inference")  # inference knobs apply to loss=None workloads only


@dataclass(frozen=True)
class KnobSpace:
    """One knob in the search: its stage, default (the workload's own value where it gives one:
    `Knob.default_for`), and every value worth trying (default first);
    `companions[value]`: other knobs' values to set with it when the incumbent cannot take it alone;
    `shares_cores`: its gain depends on how many cores are free (`Knob.shares_cores`)."""

    stage: str
    name: str
    default: object
    values: tuple
    companions: dict = field(default_factory=dict, compare=False)
    shares_cores: bool = False

    @property
    def alternatives(self) -> tuple:
        return tuple(v for v in self.values if v != self.default)


def build_space(host, workload, stages: tuple[str, ...] = TUNED_STAGES, only: set[str] | None = None,
                objective: str = "throughput", script: bool = False) -> list[KnobSpace]:
    """Applicable knobs of `stages` (in stage order) with their candidates; `only` restricts names.

    For the `latency` objective, knobs of the input pipeline (DataLoader and dataset points,
    `inference.batch_size` among them) are left out: batch-1 latency is timed on one pre-staged
    sample, so they cannot change it. A knob's default is the workload's own value where it gives one
    (`Workload.loader_options`): what the baseline runs with. For an unmodified script (`script`), only knobs that reach it
    (`Knob.script_reach`) and their values that can (`Knob.script_reason`) are tried.
    """
    space = []
    for knob in knobs_in_stage_order():
        if knob.stage not in stages or (only is not None and knob.name not in only):
            continue
        if objective == "latency" and knob.point in (Point.LOADER, Point.DATASET):
            continue
        if (script and knob.script_reach is None) or knob.applies(host, workload) is not None:
            continue
        values = tuple(v for v in knob.candidates(host, workload) if not script or knob.script_reason(v) is None)
        if len(values) > 1:
            companions = {v: knob.companions(v) for v in values if knob.companions(v)}
            space.append(KnobSpace(knob.stage, knob.name, knob.default_for(workload), values, companions,
                                   knob.shares_cores))
    return space
