"""Analyzers: one shared conformance test every registered analyzer passes, then exact figures."""

from __future__ import annotations

import json
import re

import pytest
from _profile_traces import RECORDED, cpu_steps, cuda_sync_steps, ddp_steps, document, ev, label, step

from torchpace.findings import Finding, Severity
from torchpace.profile.analyzers import REGISTRY, Analyzer, register, run_analyzers, self_times_us
from torchpace.profile.figures import (Communication, GpuIdle, HostSync, Memory, PythonOverhead, StepSplit, TopKernels,
                                       TopOps, figures_of)
from torchpace.profile.trace import parse_trace, read_trace_document
from torchpace.records import to_json

FIGURES = (StepSplit, HostSync, GpuIdle, TopOps, TopKernels, Memory, Communication, PythonOverhead)

TRACES = {
    **{path.name: (lambda p=path: read_trace_document(p)) for path in RECORDED},
    "synthetic-cpu": cpu_steps,
    "synthetic-cuda": cuda_sync_steps,
    "synthetic-ddp": ddp_steps,
    "empty": lambda: {"traceEvents": []},
}


def _frac_values(data):
    for key, value in data.items():
        if key.endswith("_frac") and isinstance(value, (int, float)):
            yield key, value
        if isinstance(value, list):
            for row in value:
                if isinstance(row, dict):
                    yield from _frac_values(row)


@pytest.mark.parametrize("trace_name", TRACES)
@pytest.mark.parametrize("name", REGISTRY)
def test_analyzer_conformance(name, trace_name):
    analyzer = REGISTRY[name]
    assert isinstance(analyzer, Analyzer) and type(analyzer).__name__.endswith("Analyzer")
    assert re.fullmatch(r"[a-z][a-z_]*", analyzer.name)
    trace = parse_trace(TRACES[trace_name]())
    before = parse_trace(TRACES[trace_name]())
    findings = analyzer.analyze(trace)
    assert isinstance(findings, list) and all(isinstance(f, Finding) for f in findings)
    for finding in findings:
        assert finding.id == f"profile.{name}" or finding.id.startswith(f"profile.{name}.")
        assert finding.area == "profile" and finding.title and isinstance(finding.severity, Severity)
        json.dumps(finding.to_dict(), allow_nan=False)  # --json carries it as is
        for key, value in _frac_values(finding.data):
            assert 0.0 <= value <= 1.0 + 1e-9, f"{finding.id}: {key} = {value}"
    assert [f.to_dict() for f in analyzer.analyze(trace)] == [f.to_dict() for f in findings]  # deterministic
    assert trace == before  # the trace is not changed
    # a finding's data is its figures' record as JSON, and reads back as that record (also from --json)
    for finding in findings:
        record = next((r for r in FIGURES if r.FINDING_ID == finding.id), None)
        if record is not None and finding.data:
            read = figures_of([Finding.from_dict(json.loads(json.dumps(finding.to_dict())))], record)
            assert to_json(read) == finding.data, finding.id


def test_registry_rejects_a_duplicate_name():
    with pytest.raises(ValueError, match="twice"):
        register(REGISTRY["step_split"])


def _one(findings, finding_id):
    matches = [f for f in findings if f.id == finding_id]
    assert len(matches) == 1, [f.id for f in findings]
    return matches[0]


def test_step_split_is_computed_from_the_labels_inside_each_step():
    data = REGISTRY["step_split"].analyze(parse_trace(cpu_steps()))[0].data
    assert data["steps"] == 2 and data["step_time_us"] == 10_000
    expected = {"input_wait": 4_000, "h2d": 500, "forward": 2_000, "backward": 2_000, "optimizer": 1_000, "other": 500}
    for phase, us in expected.items():
        assert data[f"{phase}_us"] == pytest.approx(us)
        assert data[f"{phase}_frac"] == pytest.approx(us / 10_000)


def test_step_split_partitions_a_closure_optimizer_without_double_counting():
    """Lightning's automatic optimization: `optimizer.step(closure)` runs forward and backward inside the
    optimizer label; each instant counts once, for the innermost label."""
    events = []
    for i, t0 in enumerate((0.0, 10_000.0)):
        events += [step(i + 2, t0, 10_000), label("input_wait", t0, 1_000),
                   label("optimizer", t0 + 1_000, 8_500),  # pre-hook ... post-hook, around the closure
                   label("forward", t0 + 1_500, 3_000), label("backward", t0 + 4_500, 4_000),
                   label("forward", t0 + 5_000, 500)]  # recomputed inside backward (checkpointing)
    data = REGISTRY["step_split"].analyze(parse_trace(document(events)))[0].data
    expected = {"input_wait": 1_000, "forward": 3_500, "backward": 3_500, "optimizer": 1_500, "other": 500, "h2d": 0}
    for phase, us in expected.items():
        assert data[f"{phase}_us"] == pytest.approx(us), phase
    assert sum(data[f"{p}_frac"] for p in expected) == pytest.approx(1.0)


def test_step_split_warns_when_the_steps_carry_no_labels():
    finding = REGISTRY["step_split"].analyze(parse_trace({"traceEvents": [step(2, 0, 100), ev("aten::mm", 1, 50)]}))[0]
    assert finding.severity is Severity.WARN and finding.data["labelled"] is False
    assert finding.data["other_frac"] == 1.0


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.name)
def test_recorded_step_split_adds_up_to_the_step_time(path):
    data = REGISTRY["step_split"].analyze(parse_trace(read_trace_document(path)))[0].data
    phases = ("input_wait", "h2d", "forward", "backward", "optimizer", "other")
    assert sum(data[f"{p}_frac"] for p in phases) == pytest.approx(1.0)
    assert data["forward_us"] > 0 and data["backward_us"] > 0


def test_host_sync_on_cpu_counts_step_items_but_not_input_or_optimizer_scalars():
    finding = REGISTRY["host_sync"].analyze(parse_trace(cpu_steps()))[0]
    assert finding.severity is Severity.INFO and finding.remedy is not None
    assert finding.data["sync_count"] == 2 and finding.data["by_name"] == {"aten::item": 2}
    assert finding.data["sync_frac"] == pytest.approx(200 / 20_000)
    assert finding.data["on_gpu"] is False


def test_host_sync_on_cuda_counts_blocking_copies_once_and_warns():
    finding = REGISTRY["host_sync"].analyze(parse_trace(cuda_sync_steps()))[0]
    assert finding.severity is Severity.WARN
    assert finding.data["by_name"] == {"aten::item": 2}  # item > _local_scalar_dense > sync: one sync
    assert finding.data["sync_frac"] == pytest.approx(0.2)
    assert finding.data["dtoh_copies"] == 2


def test_recorded_item_per_step_is_counted_and_reported_as_information():
    trace = parse_trace(read_trace_document(next(p for p in RECORDED if p.name == "cpu_item_per_step.json.gz")))
    finding = REGISTRY["host_sync"].analyze(trace)[0]
    assert finding.severity is Severity.INFO
    assert finding.data["sync_per_step"] >= 1


def test_gpu_idle_is_the_step_time_without_kernels_or_copies():
    finding = REGISTRY["gpu_idle"].analyze(parse_trace(cuda_sync_steps()))[0]
    assert finding.data["gpu_idle_frac"] == pytest.approx(0.6)
    assert finding.severity is Severity.WARN
    assert REGISTRY["gpu_idle"].analyze(parse_trace(cpu_steps())) == []


def test_self_time_subtracts_direct_children_only():
    events = parse_trace({"traceEvents": [ev("a", 0, 100), ev("b", 10, 50), ev("c", 20, 10), ev("d", 200, 5, tid=2)]}).events
    assert {e.name: us for e, us in self_times_us(events)} == {"a": 50, "b": 40, "c": 10, "d": 5}


def test_top_ops_rank_by_self_time_within_steps():
    findings = REGISTRY["top_ops"].analyze(parse_trace(cpu_steps()))
    ops = _one(findings, "profile.top_ops").data["ops"]
    assert ops[0] == {"name": "aten::mm", "calls": 2, "self_us": 2_000, "self_frac": 0.1}
    cuda = REGISTRY["top_ops"].analyze(parse_trace(cuda_sync_steps()))
    assert _one(cuda, "profile.top_ops.kernels").data["kernels"][0]["name"] == "ampere_sgemm_128x64_nn"


def test_memory_compares_the_peak_with_capacity():
    cpu = REGISTRY["memory"].analyze(parse_trace(cpu_steps()))[0]
    assert cpu.severity is Severity.WARN and cpu.data["peak_frac"] == pytest.approx(0.9)
    cuda = REGISTRY["memory"].analyze(parse_trace(cuda_sync_steps()))[0]
    assert cuda.data["peak_bytes"] == 3 * 2**30 and cuda.data["capacity_bytes"] == 4 * 2**30
    assert cuda.severity is Severity.OK


def test_communication_share_unions_overlapping_collectives():
    finding = REGISTRY["communication"].analyze(parse_trace(ddp_steps()))[0]
    assert finding.data["comm_frac"] == pytest.approx(0.4)
    assert finding.data["collectives"] == {"gloo:all_reduce": 4}
    assert finding.severity is Severity.WARN
    assert REGISTRY["communication"].analyze(parse_trace(cpu_steps())) == []


def test_python_overhead_reads_the_cprofile_summary_from_metadata():
    doc = cpu_steps()
    doc["torchpace"]["python_profile"] = {"steps": 3, "total_s": 2.0, "python_self_s": 0.8,
                                          "top": [{"function": "forward", "file": "m.py", "line": 3, "calls": 3,
                                                   "self_s": 0.5, "cumulative_s": 1.0}]}
    finding = REGISTRY["python_overhead"].analyze(parse_trace(doc))[0]
    assert finding.data["python_frac"] == pytest.approx(0.4) and finding.severity is Severity.WARN
    assert finding.data["top"][0]["function"] == "forward"


def test_run_analyzers_runs_every_registered_analyzer():
    findings = run_analyzers(parse_trace(cuda_sync_steps()))
    prefixes = {f.id.split(".")[1] for f in findings}
    assert {"step_split", "host_sync", "gpu_idle", "top_ops", "memory"} <= prefixes
