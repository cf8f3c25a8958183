"""Exit codes, grouping, the JSON document against its schema, and the text rendering."""

from __future__ import annotations

import io
from dataclasses import replace

import jsonschema
import pytest
from rich.console import Console

from torchpace.doctor import checks, render
from torchpace.doctor.facts import EnvFacts, RLimit
from torchpace.doctor.schema import DOCTOR_JSON_SCHEMA
from torchpace.findings import Finding, Remedy, Severity


def _f(severity, area="cpu", id="cpu.x"):
    return Finding(id=id, severity=severity, title="t", area=area)


@pytest.mark.parametrize("severities, strict, code", [
    ([], False, 0),
    ([Severity.OK, Severity.INFO], True, 0),
    ([Severity.WARN], False, 0),
    ([Severity.WARN], True, 1),
    ([Severity.FAIL], False, 1),
    ([Severity.OK, Severity.FAIL], True, 1),
])
def test_exit_code(severities, strict, code):
    assert render.exit_code_for([_f(s) for s in severities], strict) == code


def test_group_by_area_keeps_display_order_and_unknown_areas_last():
    findings = [_f(Severity.OK, "smoke"), _f(Severity.OK, "zzz"), _f(Severity.OK, "torch"), _f(Severity.OK, "smoke")]
    grouped = render.group_by_area(findings)
    assert list(grouped) == ["torch", "smoke", "zzz"]
    assert len(grouped["smoke"]) == 2


def _misconfigured(healthy):
    return replace(healthy, env=EnvFacts(cuda_launch_blocking="1", omp_num_threads="256"),
                   limits=replace(healthy.limits, nofile=RLimit(256, 256)))


def test_json_report_validates_against_schema(healthy):
    facts = _misconfigured(healthy)
    findings = checks.run_checks(facts)
    report = render.build_report(facts, findings, strict=False, duration_s=2.5)
    jsonschema.Draft202012Validator.check_schema(DOCTOR_JSON_SCHEMA)
    jsonschema.validate(report, DOCTOR_JSON_SCHEMA, cls=jsonschema.Draft202012Validator)
    assert report["exit_code"] == 1
    assert report["summary"]["fail"] == 1 and report["summary"]["worst"] == "fail"
    assert report["host"] == {"distro": "Ubuntu 22.04.4 LTS", "distro_family": "debian", "package_manager": "apt-get",
                              "python": "3.10.12", "torch_version": "2.4.1+cu124", "usable_cores": 64, "gpu_count": 2}


def test_schema_rejects_what_it_should(healthy):
    report = render.build_report(healthy, checks.run_checks(healthy), strict=True, duration_s=1.0)
    bad_severity = dict(report, findings=[dict(report["findings"][0], severity="error")])
    missing_remedy_key = dict(report, findings=[{k: v for k, v in report["findings"][0].items() if k != "remedy"}])
    for bad in (bad_severity, missing_remedy_key, dict(report, exit_code=2), {k: v for k, v in report.items() if k != "host"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, DOCTOR_JSON_SCHEMA, cls=jsonschema.Draft202012Validator)


def test_text_groups_by_area_with_evidence_and_commands(healthy):
    facts = _misconfigured(healthy)
    out = io.StringIO()
    render.render_text(Console(file=out, width=100, color_system=None), facts, checks.run_checks(facts), False, 2.5)
    text = out.getvalue()
    headings = [line for line in text.splitlines() if line in render.AREAS.values()]
    assert headings == ["PyTorch build", "GPUs", "CPU", "Memory", "Limits", "Storage", "Allocator", "Cluster", "Smoke tests"]
    assert "  FAIL  Open-files limit too low for DataLoader workers" in text
    assert "ulimit -n = 256 (hard 256)" in text
    assert "$ unset CUDA_LAUNCH_BLOCKING" in text
    assert "$ export OMP_NUM_THREADS=64" in text
    assert text.rstrip().endswith("exit 1")
    assert not [line for line in text.splitlines() if line != line.rstrip()]  # no trailing padding


def test_remedy_without_command_renders_text_only():
    out = io.StringIO()
    finding = Finding(id="cpu.x", severity=Severity.INFO, title="T", evidence="E", remedy=Remedy("do this"), area="cpu")
    render._render_finding(Console(file=out, width=80, color_system=None), finding)
    assert out.getvalue().splitlines() == ["  INFO  T", "        E", "        → do this"]
