"""The verdict: pure rules over the analyzers' figures, and the stages the tuner tries first."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from _profile_traces import RECORDED, cpu_steps, cuda_sync_steps, ddp_steps

from torchpace.findings import Finding, Severity
from torchpace.knobs import STAGES
from torchpace.profile import VerdictKind, build_verdict, stages_to_try_first
from torchpace.profile.result import analyze_trace, build_profile_result
from torchpace.profile.trace import parse_trace, read_trace_document

KNOBS = {"data": ["data.num_workers", "data.prefetch_factor"], "compute": ["precision.amp", "compile.mode"],
         "memory": ["model.activation_checkpointing"]}


def _findings(input_frac=0.0, sync_frac=0.0, gpu_idle=None, comm=None, memory=None) -> list[Finding]:
    split = {"labelled": True, "steps": 3, "step_time_us": 10_000.0, "input_wait_frac": input_frac, "h2d_frac": 0.0,
             "forward_frac": (1 - input_frac) / 2, "backward_frac": (1 - input_frac) / 2, "optimizer_frac": 0.0,
             "other_frac": 0.0}
    findings = [Finding("profile.step_split", Severity.INFO, "split", data=split),
                Finding("profile.host_sync", Severity.INFO, "sync", data={"sync_frac": sync_frac})]
    if gpu_idle is not None:
        findings.append(Finding("profile.gpu_idle", Severity.INFO, "idle", data={"gpu_idle_frac": gpu_idle}))
    if comm is not None:
        findings.append(Finding("profile.communication", Severity.INFO, "comm", data={"comm_frac": comm}))
    if memory is not None:
        findings.append(Finding("profile.memory", Severity.INFO, "mem", data={"peak_frac": memory}))
    return findings


@pytest.mark.parametrize("kwargs, on_gpu, kind", [
    ({"input_frac": 0.6}, False, VerdictKind.INPUT),
    ({"input_frac": 0.1}, False, VerdictKind.COMPUTE),
    ({"sync_frac": 0.3, "gpu_idle": 0.5}, True, VerdictKind.HOST_SYNC),
    ({"sync_frac": 0.3}, False, VerdictKind.COMPUTE),  # on CPU nothing waits for a device
    ({"sync_frac": 0.3, "gpu_idle": 0.05}, True, VerdictKind.COMPUTE),  # the GPU is busy: the sync waits for compute
    ({"comm": 0.5}, False, VerdictKind.COMMUNICATION),
    ({"memory": 0.95}, False, VerdictKind.MEMORY),
    ({"input_frac": 0.4, "comm": 0.5}, False, VerdictKind.COMMUNICATION),  # the larger share wins
])
def test_verdict_rules(kwargs, on_gpu, kind):
    assert build_verdict(_findings(**kwargs), on_gpu=on_gpu, knobs_by_stage=KNOBS).kind is kind


def test_a_second_bottleneck_is_reported_in_also():
    verdict = build_verdict(_findings(input_frac=0.5, memory=0.95), knobs_by_stage=KNOBS)
    assert verdict.kind is VerdictKind.INPUT and verdict.also == (VerdictKind.MEMORY,)


def test_verdict_offers_the_knobs_of_the_stage_to_try_first():
    verdict = build_verdict(_findings(input_frac=0.6), workload_spec="vision", knobs_by_stage=KNOBS)
    assert verdict.stages_to_try == ("data",)
    assert verdict.knobs_to_try == ("data.num_workers", "data.prefetch_factor")
    commands = [r.remedy.command for r in verdict.remedies if r.remedy.command]
    assert "torchpace bench vision --set data.num_workers=2" in commands
    assert all(isinstance(r, Finding) and r.remedy and r.remedy.text for r in verdict.remedies)
    json.dumps(verdict.to_dict(), allow_nan=False)


def test_verdict_evidence_names_the_measured_share():
    verdict = build_verdict(_findings(input_frac=0.62), knobs_by_stage=KNOBS)
    assert any("62%" in line for line in verdict.evidence)


@pytest.mark.parametrize("kind", list(VerdictKind))
def test_stages_to_try_first_names_real_stages(kind):
    stages = stages_to_try_first(kind)
    assert stages and set(stages) <= set(STAGES)
    assert stages_to_try_first(kind.value) == stages


def test_stages_to_try_first_examples_and_bad_input():
    assert stages_to_try_first("input-bound") == ["data"]
    assert stages_to_try_first("compute-bound") == ["compute"]
    assert stages_to_try_first("memory-bound") == ["memory"]
    assert stages_to_try_first(build_verdict(_findings(input_frac=0.9), knobs_by_stage=KNOBS)) == ["data"]
    with pytest.raises(ValueError):
        stages_to_try_first("slow")


@pytest.mark.parametrize("doc, kind", [(cpu_steps, VerdictKind.INPUT), (cuda_sync_steps, VerdictKind.HOST_SYNC),
                                       (ddp_steps, VerdictKind.COMMUNICATION)])
def test_synthetic_traces_get_their_verdict(doc, kind):
    _, verdict = analyze_trace(parse_trace(doc()), knobs_by_stage=KNOBS)
    assert verdict.kind is kind


@pytest.mark.parametrize("name, kind", [("cpu_input_bound.json.gz", VerdictKind.INPUT),
                                        ("cpu_compute_bound.json.gz", VerdictKind.COMPUTE)])
def test_recorded_traces_get_their_verdict(name, kind):
    path = next(p for p in RECORDED if p.name == name)
    result = build_profile_result(parse_trace(read_trace_document(path)), knobs_by_stage=KNOBS)
    assert result.verdict.kind is kind
    payload = result.to_dict()
    json.dumps(payload, allow_nan=False)
    assert payload["kind"] == "torchpace.profile" and payload["steps"] == 3


def test_verdict_and_profile_package_do_not_import_torch():
    code = ("import sys, torchpace.profile, torchpace.profile.verdict, torchpace.profile.analyzers, "
            "torchpace.profile.result, torchpace.profile.render; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_remedy_commands_only_set_values_tune_would_try_here():
    findings = _findings(input_frac=0.1)
    offered = build_verdict(findings, knobs_by_stage=KNOBS, candidates={"precision.amp": ["off", "bf16"]})
    assert any("--set precision.amp=bf16" in (r.remedy.command or "") for r in offered.remedies)
    no_bf16 = build_verdict(findings, knobs_by_stage=KNOBS, candidates={"precision.amp": ["off"]})
    assert not any("precision.amp" in (r.remedy.command or "") for r in no_bf16.remedies)
