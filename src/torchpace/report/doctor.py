"""The doctor's view of the host, for the report: its findings that are not ok.

`collect_doctor_summary` runs torchpace's doctor (it probes this machine; torch is imported in a
child process, never here) and hands the findings to the pure `build_doctor_summary`. The doctor
checks the machine that renders the report; when that does not look like the machine the figures
were measured on, the summary says so, so nobody fixes the wrong host.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from torchpace.doctor.checks import run_checks
from torchpace.doctor.probes import collect_facts
from torchpace.findings import Finding, Severity
from torchpace.report.load import DoctorSummary

# The measured host's summary keys compared with this machine's, with their labels.
_SAME_HOST_KEYS = (("cpu_model", "CPU"), ("logical_cpus", "logical CPUs"), ("torch_version", "torch"))


def collect_doctor_summary(measured_host: Mapping[str, Any] | None) -> DoctorSummary:
    """Run the doctor on this machine and summarise it against the measured host's summary."""
    facts = collect_facts()
    this_host = {
        "distro": facts.distro.pretty_name or facts.distro.id,
        "python": facts.python.version,
        "torch_version": facts.torch.version,
        "cpu_model": facts.cpu.cpu_model,
        "logical_cpus": facts.cpu.logical_cpus,
    }
    return build_doctor_summary(run_checks(facts), this_host, measured_host)


def build_doctor_summary(findings: Sequence[Finding], this_host: Mapping[str, Any],
                         measured_host: Mapping[str, Any] | None) -> DoctorSummary:
    """The not-ok findings, worst first, and whether this machine looks like the measured one (pure)."""
    counts = {s.value: sum(f.severity is s for f in findings) for s in Severity}
    shown = sorted((f for f in findings if f.severity is not Severity.OK), key=lambda f: -f.severity.rank)
    return DoctorSummary(tuple(f.to_dict() for f in shown), counts, dict(this_host),
                         other_host=describe_host_difference(this_host, measured_host))


def describe_host_difference(this_host: Mapping[str, Any], measured_host: Mapping[str, Any] | None) -> str | None:
    """Why the measured host looks like another machine than this one; None when it looks the same."""
    if not measured_host:
        return None
    differences = [f"{label} {measured_host[key]!r} measured, {this_host.get(key)!r} here"
                   for key, label in _SAME_HOST_KEYS
                   if measured_host.get(key) is not None and this_host.get(key) is not None
                   and measured_host[key] != this_host[key]]
    return "; ".join(differences) or None
