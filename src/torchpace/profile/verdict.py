"""The verdict: which one thing limits the step, the evidence for it, what to do, what to tune.

Pure: `build_verdict(findings, ...)` reads the numbers the analyzers put in their findings' `data`.
Rules, in order:

1. Each time-share bottleneck whose share of the step passes its threshold is a candidate:
   input-bound (input wait + host→device copy), host-sync-bound (on a GPU only: time blocked in
   syncs, while the GPU idles), communication-bound (collectives). The largest share wins.
2. Otherwise memory-bound when peak memory is near capacity.
3. Otherwise compute-bound: the step is spent in forward, backward and optimizer.

Other candidates are reported in `also`, so a second bottleneck is not hidden by the first.
`stages_to_try_first(verdict)` names the knob stages the tuner should try first for a verdict.
"""

from __future__ import annotations

import enum
import shlex
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from torchpace.findings import Finding, Remedy, Severity
from torchpace.knobs import REGISTRY
from torchpace.profile.figures import (Communication, GpuIdle, HostSync, Memory, PythonOverhead, StepShares, StepSplit,
                                       TopOps, figures_of)
from torchpace.records import from_json, to_json

WorkloadSpec = str | Sequence[str]  # a Workload spec, or a script's command as its words

_INPUT_BOUND_FRAC = 0.25  # a quarter of the step waiting for data is more than workers usually cost to hide
_HOST_SYNC_BOUND_FRAC = 0.15  # 15% of the step blocked on the device, on top of launch gaps, caps throughput
_SYNC_GPU_IDLE_FRAC = 0.20  # syncs only limit the step when the GPU idles meanwhile (else it is compute)
_COMM_BOUND_FRAC = 0.30  # collectives over 30% of the step: scaling out is costing more than it gives
_MEMORY_BOUND_FRAC = 0.90  # within 10% of capacity, batch size and activations are what limit the step


class VerdictKind(str, enum.Enum):
    """What limits the step."""

    INPUT = "input-bound"
    HOST_SYNC = "host-sync-bound"
    COMPUTE = "compute-bound"
    MEMORY = "memory-bound"
    COMMUNICATION = "communication-bound"


# verdict -> knob stages (torchpace.knobs.STAGES) the tuner should try first, most relevant first.
_STAGES_FIRST: dict[VerdictKind, tuple[str, ...]] = {
    VerdictKind.INPUT: ("data",),
    VerdictKind.HOST_SYNC: ("data", "compute"),  # pinned, non-blocking copies; compile removes some syncs
    VerdictKind.COMPUTE: ("compute",),
    VerdictKind.MEMORY: ("memory",),
    VerdictKind.COMMUNICATION: ("distributed",),
}

# a first value worth measuring for a knob, for the remedy's `torchpace bench --set` command
_FIRST_TRY: dict[str, bool | int | str] = {
    "data.num_workers": 2,
    "data.pin_memory": True,
    "precision.amp": "bf16",
    "precision.matmul": "high",
    "compile.mode": "default",
    "model.activation_checkpointing": True,
    "optimizer.impl": "foreach",
}
# the knobs each verdict's remedies set (a knob not offered here is named in `not_offered`, with why)
_REMEDY_KNOBS: dict[VerdictKind, tuple[str, ...]] = {
    VerdictKind.INPUT: ("data.num_workers",),
    VerdictKind.HOST_SYNC: ("data.pin_memory",),
    VerdictKind.COMPUTE: ("precision.amp", "precision.matmul", "compile.mode", "optimizer.impl"),
    VerdictKind.MEMORY: ("model.activation_checkpointing",),
    VerdictKind.COMMUNICATION: (),
}


@dataclass(frozen=True)
class Offer:
    """Which knob values a remedy may set for this run on this host, and why the others are not offered.

    Attributes:
        values: knob -> the value worth measuring first (None: every knob's first value, unchecked).
        withheld: knob -> why no remedy sets it here (refused by the host, does not reach the script,
            not a value tune would try, or already in effect).
    """

    values: Mapping[str, Any] | None = None
    withheld: Mapping[str, str] = field(default_factory=dict)

    def first_try(self, knob: str) -> Any:
        """The value a remedy may set for `knob`, or None when it is not offered."""
        if knob in self.withheld:
            return None
        return _FIRST_TRY.get(knob) if self.values is None else self.values.get(knob)


def build_offer(host: Any, target: Any, *, script: bool = False, candidates: Mapping[str, Sequence[Any]] | None = None,
                in_effect: Mapping[str, str] | None = None) -> Offer:
    """What the remedies may set for `target` (a Workload, or `script_target` for an unmodified script)
    on `host`: each knob's first value when the knob applies here, this host allows that value, it
    reaches the script (script mode), tune would try it (`candidates`, when given), and the run does not
    already do it (`in_effect`: knob -> evidence, from `torchpace.profile.effect.settings_in_effect`)."""
    values, withheld = {}, {}
    for name, value in _FIRST_TRY.items():
        knob = REGISTRY[name]
        setting = f"{name}={_toml(value)}"
        if script and knob.script_reason(value):  # before `applies`: a script's model is not known
            withheld[name] = f"{setting}: does not reach an unmodified script: {knob.script_reason(value)}"
        elif refused := (knob.applies(host, target) or knob.host_reason(value, host)
                         or knob.value_applies(value, host, target)):
            withheld[name] = f"{setting}: not on this host: {refused}"
        elif candidates is not None and value not in candidates.get(name, ()):
            withheld[name] = f"{setting}: not a value tune would try here"
        elif in_effect and name in in_effect:
            withheld[name] = f"{name}: already in effect: {in_effect[name]}"
        else:
            values[name] = value
    return Offer(values, withheld)


@dataclass(frozen=True)
class Verdict:
    """The bottleneck, why we think so, and what to do about it.

    Attributes:
        kind: the bottleneck.
        evidence: the measured shares behind it, as sentences.
        remedies: what to do, as Findings (the same shape doctor reports in).
        knobs_to_try: the knobs `tune` would try first, in order.
        stages_to_try: the knob stages those come from.
        shares: the figures the rules compared (`*_frac`), None when not measured.
        also: other bottlenecks that passed their threshold.
        not_offered: (knob, why) for each knob this verdict's remedies would set that is not offered here
            (in JSON: `[{"knob", "reason"}]`).
    """

    kind: VerdictKind
    evidence: tuple[str, ...]
    remedies: tuple[Finding, ...]
    knobs_to_try: tuple[str, ...]
    stages_to_try: tuple[str, ...]
    shares: StepShares = field(default_factory=StepShares)
    also: tuple[VerdictKind, ...] = ()
    not_offered: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "evidence": list(self.evidence),
            "remedies": [r.to_dict() for r in self.remedies],
            "knobs_to_try": list(self.knobs_to_try),
            "stages_to_try": list(self.stages_to_try),
            "shares": to_json(self.shares),
            "also": [k.value for k in self.also],
            "not_offered": [{"knob": knob, "reason": why} for knob, why in self.not_offered],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Verdict":
        """The verdict `to_dict` wrote (KeyError naming a field it lacks; ValueError for an unknown kind)."""
        return cls(
            kind=VerdictKind(data["kind"]), evidence=tuple(data.get("evidence", ())),
            remedies=tuple(Finding.from_dict(r) for r in data.get("remedies", ())),
            knobs_to_try=tuple(data.get("knobs_to_try", ())), stages_to_try=tuple(data.get("stages_to_try", ())),
            shares=from_json(StepShares, data.get("shares") or {}), also=tuple(VerdictKind(k) for k in data.get("also", ())),
            not_offered=tuple((item["knob"], item["reason"]) for item in data.get("not_offered", ())))


def stages_to_try_first(verdict: Verdict | VerdictKind | str) -> list[str]:
    """The knob stage names the tuner should try first for `verdict`.

    Args:
        verdict: a Verdict, a VerdictKind, or its value (e.g. ``"input-bound"``).

    Returns:
        Stage names from `torchpace.knobs.STAGES`, most relevant first, e.g. ``["data"]`` for
        input-bound, ``["compute"]`` for compute-bound, ``["memory"]`` for memory-bound.

    Raises:
        ValueError: `verdict` is not a known verdict kind.
    """
    kind = verdict.kind if isinstance(verdict, Verdict) else VerdictKind(verdict)
    return list(_STAGES_FIRST[kind])


def measure_shares(findings: Sequence[Finding]) -> StepShares:
    """The figures the verdict rules compare, read from the analyzers' findings."""
    split = figures_of(findings, StepSplit)
    labelled = split if split is not None and split.labelled else None
    sync, idle, comm = figures_of(findings, HostSync), figures_of(findings, GpuIdle), figures_of(findings, Communication)
    memory, python = figures_of(findings, Memory), figures_of(findings, PythonOverhead)
    return StepShares(
        input_frac=labelled.input_frac if labelled else None, compute_frac=labelled.compute_frac if labelled else None,
        other_frac=labelled.other.frac if labelled else None, sync_frac=sync.sync_frac if sync else None,
        gpu_idle_frac=idle.gpu_idle_frac if idle else None, comm_frac=comm.comm_frac if comm else None,
        memory_peak_frac=memory.peak_frac if memory else None, python_frac=python.python_frac if python else None)


def rank_bottlenecks(shares: StepShares, on_gpu: bool) -> list[VerdictKind]:
    """Bottlenecks passing their thresholds: time-share ones by share (largest first), then memory."""
    timed: list[tuple[float, VerdictKind]] = []
    if (shares.input_frac or 0.0) >= _INPUT_BOUND_FRAC:
        timed.append((shares.input_frac, VerdictKind.INPUT))
    idle = shares.gpu_idle_frac
    if on_gpu and (shares.sync_frac or 0.0) >= _HOST_SYNC_BOUND_FRAC and (idle is None or idle >= _SYNC_GPU_IDLE_FRAC):
        timed.append((shares.sync_frac, VerdictKind.HOST_SYNC))
    if (shares.comm_frac or 0.0) >= _COMM_BOUND_FRAC:
        timed.append((shares.comm_frac, VerdictKind.COMMUNICATION))
    ranked = [kind for _, kind in sorted(timed, key=lambda pair: -pair[0])]
    if (shares.memory_peak_frac or 0.0) >= _MEMORY_BOUND_FRAC:
        ranked.append(VerdictKind.MEMORY)
    return ranked


def build_verdict(findings: Sequence[Finding], *, on_gpu: bool = False, workload_spec: WorkloadSpec = "WORKLOAD",
                  knobs_by_stage: Mapping[str, Sequence[str]] | None = None, offer: Offer | None = None) -> Verdict:
    """The verdict from the analyzers' findings (see the module docstring for the rules).

    Args:
        findings: what `run_analyzers` returned.
        on_gpu: the run was on a CUDA device (host syncs only limit a step there).
        workload_spec: how the user named the workload, for the remedy commands: a Workload spec, or a
            script's command as its words.
        knobs_by_stage: knob names per stage to offer (e.g. only those that apply on this host);
            default: every registered knob.
        offer: which knob values a remedy may set here and why the others are not offered
            (`build_offer`); default: every knob's first value, unchecked.
    """
    shares = measure_shares(findings)
    ranked = rank_bottlenecks(shares, on_gpu)
    kind = ranked[0] if ranked else VerdictKind.COMPUTE
    stages = tuple(stages_to_try_first(kind))
    by_stage = knobs_by_stage if knobs_by_stage is not None else registered_knobs_by_stage()
    knobs = tuple(name for stage in stages for name in by_stage.get(stage, ()))
    offer = offer or Offer()
    wanted = [k for k in _REMEDY_KNOBS[kind] if on_gpu or k != "precision.matmul"]
    return Verdict(kind=kind, evidence=tuple(_evidence(kind, shares, findings)),
                   remedies=tuple(_remedies(kind, offer, workload_spec, on_gpu)), knobs_to_try=knobs,
                   stages_to_try=stages, shares=shares, also=tuple(ranked[1:]),
                   not_offered=tuple((k, offer.withheld[k]) for k in wanted if k in offer.withheld))


def registered_knobs_by_stage() -> dict[str, list[str]]:
    """Every registered knob's name, grouped by stage, in registry order."""
    # lazy: `profile --help` loads this module; the knob registry loads when a verdict names knobs
    from torchpace.knobs import REGISTRY

    grouped: dict[str, list[str]] = {}
    for knob in REGISTRY.values():
        grouped.setdefault(knob.stage, []).append(knob.name)
    return grouped


def applicable_knobs_by_stage(host: Any, workload: Any) -> dict[str, list[str]]:
    """Like `registered_knobs_by_stage`, keeping only knobs that apply to `host` and `workload`."""
    grouped: dict[str, list[str]] = {}
    for knob in _applicable_knobs(host, workload):
        grouped.setdefault(knob.stage, []).append(knob.name)
    return grouped


def candidate_values(host: Any, workload: Any) -> dict[str, list[Any]]:
    """Each applicable knob's candidate values on `host` for `workload` (what tune would try)."""
    return {knob.name: list(knob.candidates(host, workload)) for knob in _applicable_knobs(host, workload)}


def _applicable_knobs(host: Any, workload: Any) -> list:
    # lazy: `profile --help` loads this module; the knob registry loads when a verdict names knobs
    from torchpace.knobs import REGISTRY

    return [knob for knob in REGISTRY.values()
            if knob.applies(host, workload) is None and not (knob.training_only and not workload.is_training)]


# --- evidence -----------------------------------------------------------------------------------


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def _evidence(kind: VerdictKind, shares: StepShares, findings: Sequence[Finding]) -> list[str]:
    split = figures_of(findings, StepSplit)
    lines = []
    if split is not None and split.labelled:
        lines.append(f"step {split.step_time_us / 1000:.1f} ms: input wait + host→device copy {_pct(shares.input_frac)}, "
                     f"forward + backward + optimizer {_pct(shares.compute_frac)}, other {_pct(shares.other_frac)}")
    thresholds = {
        VerdictKind.INPUT: f"input share {_pct(shares.input_frac)} ≥ {_INPUT_BOUND_FRAC:.0%}: the step waits for data",
        VerdictKind.HOST_SYNC: f"host syncs take {_pct(shares.sync_frac)} of the step (≥ {_HOST_SYNC_BOUND_FRAC:.0%}) "
                               f"while the GPU idles {_pct(shares.gpu_idle_frac)}",
        VerdictKind.COMMUNICATION: f"collectives take {_pct(shares.comm_frac)} of the step (≥ {_COMM_BOUND_FRAC:.0%})",
        VerdictKind.MEMORY: f"peak memory is {_pct(shares.memory_peak_frac)} of capacity (≥ {_MEMORY_BOUND_FRAC:.0%})",
        VerdictKind.COMPUTE: "no input, sync, communication or memory share passed its threshold: the time goes to the model's own work",
    }
    lines.append(thresholds[kind])
    top = figures_of(findings, TopOps)
    if kind is VerdictKind.COMPUTE and top is not None and top.ops:
        lines.append("heaviest operators: " + ", ".join(f"{r.name} {r.self_frac:.0%}" for r in top.ops[:3]))
    if shares.sync_frac and kind is not VerdictKind.HOST_SYNC:
        lines.append(f"host syncs: {_pct(shares.sync_frac)} of the step")
    if shares.python_frac is not None:
        lines.append(f"interpreted Python: {_pct(shares.python_frac)} of step time (cProfile pass)")
    return lines


# --- remedies -----------------------------------------------------------------------------------


def _toml(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _bench_command(spec: WorkloadSpec, offer: Offer, wanted: Sequence[str]) -> str | None:
    """`torchpace bench SPEC --set K=V ...` for the wanted knobs that are on offer here."""
    sets = [part for k in wanted if offer.first_try(k) is not None for part in ("--set", f"{k}={_toml(offer.first_try(k))}")]
    return verb_command("bench", spec, sets) if sets else None


def verb_command(verb: str, spec: WorkloadSpec, options: Sequence[str] = ()) -> str:
    """`torchpace VERB SPEC OPTIONS` for a Workload spec (a string), or `torchpace VERB OPTIONS -- COMMAND` for
    a script's command (a sequence of words), quoted for the shell (`shlex.join`): pasted, it runs exactly
    these words, whatever they hold."""
    if isinstance(spec, str):
        return shlex.join(["torchpace", verb, spec, *options])
    return shlex.join(["torchpace", verb, *options, "--", *spec])


def _remedy(key: str, title: str, text: str, command: str | None, severity: Severity = Severity.WARN) -> Finding:
    return Finding(id=f"profile.remedy.{key}", severity=severity, title=title, remedy=Remedy(text, command), area="profile")


def _remedies(kind: VerdictKind, offer: Offer, spec: WorkloadSpec, on_gpu: bool) -> list[Finding]:
    """The remedies for `kind`; one that sets a knob only where `offer` offers it, else the tuner as a last one."""
    if kind is VerdictKind.INPUT:
        remedies = [_remedy("data_cost", "make each sample cheaper to load",
                            "Decode and augment less per sample: store pre-decoded or smaller files, move augmentation "
                            "to the GPU, or cache decoded samples when the dataset fits in memory.", None, Severity.INFO)]
        workers = _bench_command(spec, offer, ["data.num_workers"])
        if workers:
            remedies.insert(0, _remedy("data_workers", "load batches in parallel with the step",
                                       "Use DataLoader worker processes (num_workers, persistent_workers, prefetch_factor) "
                                       "so the next batches are decoded while this one trains.", workers))
    elif kind is VerdictKind.HOST_SYNC:
        remedies = [_remedy("host_sync", "stop reading device values every step",
                            "Keep the loss and metrics on the device and read them every N steps; remove `.item()`, "
                            "`.cpu()`, `print(tensor)` and data-dependent Python branches from the step.", None)]
        pinned = _bench_command(spec, offer, ["data.pin_memory"])
        if pinned:
            remedies.append(_remedy("pinned_copies", "make host→device copies asynchronous",
                                    "Pin host memory and copy with non_blocking=True, so the copy does not wait.", pinned))
    elif kind is VerdictKind.MEMORY:
        checkpointing = _bench_command(spec, offer, ["model.activation_checkpointing"])
        remedies = [_remedy("memory", "free memory per step",
                            "Recompute activations in backward (activation checkpointing) or split the batch into "
                            "micro-batches with gradient accumulation; then a larger batch or model fits.", checkpointing)
                    ] if checkpointing else []
    elif kind is VerdictKind.COMMUNICATION:
        return [_remedy("communication", "hide communication behind backward",
                        "Overlap gradient all-reduce with backward (DDP bucket size, gradient_as_bucket_view, "
                        "static_graph), raise the per-process batch, or check the interconnect.", verb_command("tune", spec))]
    else:
        remedies = _compute_remedies(offer, spec, on_gpu)
    if not any(r.remedy and r.remedy.command for r in remedies):
        remedies.append(_remedy("tune", "measure what else applies here",
                                "The usual knob for this bottleneck is not offered (see why below); the tuner measures "
                                "every knob that applies here, one at a time.", verb_command("tune", spec), Severity.INFO))
    return remedies


def _compute_remedies(offer: Offer, spec: WorkloadSpec, on_gpu: bool) -> list[Finding]:
    remedies = []
    precision = [k for k in ("precision.amp", "precision.matmul") if (on_gpu or k == "precision.amp") and offer.first_try(k)]
    if precision:
        text = {("precision.amp",): "Use bf16 autocast (precision.amp=bf16)" + ("." if on_gpu else ": this CPU computes bf16 natively."),
                ("precision.matmul",): "Allow TF32 matmuls on the GPU (precision.matmul=high).",
                ("precision.amp", "precision.matmul"): "Use bf16 autocast (precision.amp=bf16) and TF32 matmuls "
                                                       "(precision.matmul=high) on the GPU."}[tuple(precision)]
        remedies.append(_remedy("compute_precision", "do less work per step", text,
                                _bench_command(spec, offer, precision), Severity.INFO))
    if offer.first_try("compile.mode"):
        remedies.append(_remedy("compute_compile", "fuse the model's operators",
                                "Compile the model (compile.mode=default" + ("; reduce-overhead for many small kernels)."
                                                                            if on_gpu else ")."),
                                _bench_command(spec, offer, ["compile.mode"]), Severity.INFO))
    if offer.first_try("optimizer.impl"):
        remedies.append(_remedy("compute_optimizer", "update all parameters in a few kernels",
                                "Use the multi-tensor (foreach) optimizer, or the fused one where it has a kernel "
                                "(optimizer.impl=foreach | fused).", _bench_command(spec, offer, ["optimizer.impl"]),
                                Severity.INFO))
    return remedies
