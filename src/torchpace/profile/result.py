"""`ProfileResult` and `analyze_trace`: from a parsed trace to findings and a verdict (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from torchpace.findings import Finding
from torchpace.measure.stats import summarize
from torchpace.profile.analyzers import run_analyzers
from torchpace.profile.figures import StepSplit, figures_of
from torchpace.profile.trace import Trace
from torchpace.profile.verdict import Offer, Verdict, WorkloadSpec, build_verdict

RESULT_KIND = "torchpace.profile"
RESULT_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class ProfileResult:
    """What `torchpace profile` found. JSON via `to_dict` (schema: docs/reference/schemas.md)."""

    workload: str
    device: str
    config: Mapping[str, Any]
    steps: int
    verdict: Verdict
    findings: tuple[Finding, ...]
    trace_path: str | None = None
    wall_time_s: float | None = None
    # the same noise warning bench gives: IQR of the profiled steps' times over their median (> 10% is
    # noisy), and the cores other processes kept busy meanwhile (torchpace.measure.contention)
    step_time_iqr_frac: float | None = None
    noise_warning: bool = False
    other_load_cores: float | None = None
    usable_cores: int | None = None
    command: tuple[str, ...] | None = None  # script mode: the unmodified command that was profiled

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": RESULT_KIND,
            "schema_version": RESULT_SCHEMA_VERSION,
            "workload": self.workload,
            "device": self.device,
            "config": dict(self.config),
            "steps": self.steps,
            "trace_path": self.trace_path,
            "wall_time_s": self.wall_time_s,
            "step_time_iqr_frac": self.step_time_iqr_frac,
            "noise_warning": self.noise_warning,
            "other_load_cores": self.other_load_cores,
            "usable_cores": self.usable_cores,
            "command": list(self.command) if self.command else None,
            "verdict": self.verdict.to_dict(),
            "findings": [f.to_dict() for f in self.findings],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ProfileResult":
        """The result `to_dict` wrote (`torchpace profile --json`, schema version 1).

        Raises:
            KeyError: a field it needs is missing (its name).
            ValueError: a verdict kind or a severity this torchpace does not know.
        """
        command = data.get("command")
        return cls(
            workload=str(data["workload"]), device=str(data["device"]), config=dict(data.get("config") or {}),
            steps=int(data["steps"]), verdict=Verdict.from_dict(data["verdict"]),
            findings=tuple(Finding.from_dict(f) for f in data.get("findings", ())), trace_path=data.get("trace_path"),
            wall_time_s=data.get("wall_time_s"), step_time_iqr_frac=data.get("step_time_iqr_frac"),
            noise_warning=bool(data.get("noise_warning", False)), other_load_cores=data.get("other_load_cores"),
            usable_cores=data.get("usable_cores"), command=tuple(command) if command else None)

    def finding(self, finding_id: str) -> Finding | None:
        """The finding with id `finding_id` (e.g. `profile.step_split`), None when the profile has none."""
        return next((f for f in self.findings if f.id == finding_id), None)

    @property
    def step_split(self) -> StepSplit | None:
        """The step-split figures (`profile.step_split`'s), None when the steps carried no phase labels."""
        split = figures_of(self.findings, StepSplit)
        return split if split is not None and split.labelled else None


def analyze_trace(trace: Trace, *, workload_spec: WorkloadSpec = "WORKLOAD",
                  knobs_by_stage: Mapping[str, Sequence[str]] | None = None,
                  offer: Offer | None = None) -> tuple[list[Finding], Verdict]:
    """Run every registered analyzer on `trace` and build the verdict from their findings.

    `knobs_by_stage` and `offer` are as in `build_verdict`.
    """
    findings = run_analyzers(trace)
    verdict = build_verdict(findings, on_gpu=trace.device == "cuda", workload_spec=workload_spec,
                            knobs_by_stage=knobs_by_stage, offer=offer)
    return findings, verdict


def build_profile_result(trace: Trace, *, workload_spec: str = "WORKLOAD",
                         knobs_by_stage: Mapping[str, Sequence[str]] | None = None, offer: Offer | None = None,
                         trace_path: str | None = None, wall_time_s: float | None = None,
                         other_load_cores: float | None = None, usable_cores: int | None = None,
                         command: Sequence[str] | None = None) -> ProfileResult:
    """A ProfileResult for `trace` (workload, device and config read from its torchpace metadata); the
    remedies name `command` (a script's, after `--`) when given, else `workload_spec`."""
    spread = summarize([s.dur_us for s in trace.steps]) if trace.steps else None
    findings, verdict = analyze_trace(trace, workload_spec=tuple(command) if command else workload_spec,
                                      knobs_by_stage=knobs_by_stage, offer=offer)
    meta = trace.metadata
    return ProfileResult(
        workload=str(meta.get("workload", workload_spec)),
        device=str(meta.get("device", trace.device)),
        config=dict(meta.get("config") or {}),
        steps=len(trace.steps),
        verdict=verdict,
        findings=tuple(findings),
        trace_path=trace_path,
        wall_time_s=wall_time_s,
        step_time_iqr_frac=spread.iqr_frac if spread else None,
        noise_warning=bool(spread and spread.noisy),
        other_load_cores=other_load_cores,
        usable_cores=usable_cores,
        command=tuple(command) if command else None,
    )
