"""The verdict: pure rules over the analyzers' figures, and the stages the tuner tries first."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
from torch import nn
from _profile_traces import RECORDED, cpu_steps, cuda_sync_steps, ddp_steps

from torchpace.findings import Finding, Severity
from torchpace.knobs import STAGES
from torchpace.host import HostFacts
from torchpace.profile import VerdictKind, build_verdict, stages_to_try_first
from torchpace.profile.verdict import build_offer
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
    offered = build_verdict(findings, knobs_by_stage=KNOBS, offer=build_offer(BF16, MLP, candidates={"precision.amp": ["off", "bf16"]}))
    assert any("--set precision.amp=bf16" in (r.remedy.command or "") for r in offered.remedies)
    no_bf16 = build_verdict(findings, knobs_by_stage=KNOBS, offer=build_offer(BF16, MLP, candidates={"precision.amp": ["off"]}))
    assert not any("precision.amp" in (r.remedy.command or "") for r in no_bf16.remedies)
    assert ("precision.amp", "precision.amp=bf16: not a value tune would try here") in no_bf16.not_offered


# An AVX2-only CPU (no native bf16) with a C compiler, and one with AVX512-BF16 and none.
AVX2 = HostFacts(cpu_flags=frozenset({"avx2"}), has_compiler=True)
BF16 = HostFacts(cpu_flags=frozenset({"avx512_bf16"}), has_compiler=False)
MLP = SimpleNamespace(name="mlp", model=nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)), dataset=None,
                      optimizer=None, is_training=True)


def _remedy_commands(verdict) -> str:
    return " ".join(r.remedy.command or "" for r in verdict.remedies)


def test_no_advice_for_a_knob_this_host_refuses_and_the_reason_is_said():
    verdict = build_verdict(_findings(), offer=build_offer(AVX2, MLP, script=True), workload_spec=("python", "train.py"))
    assert "precision.amp" not in _remedy_commands(verdict) and "bf16" not in " ".join(r.remedy.text for r in verdict.remedies)
    assert "--set compile.mode=default -- python train.py" in _remedy_commands(verdict)  # compile reaches a script now
    reasons = dict(verdict.not_offered)
    assert reasons["precision.amp"].startswith("precision.amp=bf16: not on this host: this CPU has no native bf16")
    no_compiler = build_verdict(_findings(), offer=build_offer(BF16, MLP))
    assert "compile.mode" not in _remedy_commands(no_compiler) and "C compiler" in dict(no_compiler.not_offered)["compile.mode"]
    assert "--set precision.amp=bf16" in _remedy_commands(no_compiler)


def test_no_advice_for_what_the_run_already_does():
    in_effect = {"optimizer.impl": "the optimizer already runs fused kernels (aten::_fused_adamw_ in the operators)",
                 "precision.amp": "the forward already runs under bfloat16 autocast",
                 "data.num_workers": "the DataLoader already loads in 2 worker process(es)"}
    offer = build_offer(BF16, MLP, in_effect=in_effect)
    compute = build_verdict(_findings(), offer=offer)
    assert "optimizer.impl" not in _remedy_commands(compute) and "precision.amp" not in _remedy_commands(compute)
    assert "foreach" not in " ".join(r.remedy.text for r in compute.remedies)
    assert dict(compute.not_offered)["optimizer.impl"] == f"optimizer.impl: already in effect: {in_effect['optimizer.impl']}"
    assert compute.remedies[-1].id == "profile.remedy.tune"  # nothing else offered: the tuner measures what applies
    data = build_verdict(_findings(input_frac=0.6), offer=offer)
    assert [r.id for r in data.remedies] == ["profile.remedy.data_cost", "profile.remedy.tune"]
    assert "2 worker process(es)" in dict(data.not_offered)["data.num_workers"]


def test_a_knob_that_needs_prepare_is_not_offered_to_a_script():
    verdict = build_verdict(_findings(memory=0.95), offer=build_offer(BF16, MLP, script=True), workload_spec=("python", "train.py"))
    assert "activation_checkpointing" not in _remedy_commands(verdict)
    assert "does not reach an unmodified script" in dict(verdict.not_offered)["model.activation_checkpointing"]
    assert "prepare()" in dict(verdict.not_offered)["model.activation_checkpointing"]
