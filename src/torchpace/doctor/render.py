"""Doctor's output: Rich text grouped by area, or the JSON document of `schema`; and the exit code.

`build_report` and `exit_code_for` are pure; `render_text` only writes to the console it is given.
"""

from __future__ import annotations

import textwrap
from typing import Any

from rich.text import Text

from torchpace._version import __version__
from torchpace.doctor.facts import DoctorFacts
from torchpace.doctor.remedies import package_manager
from torchpace.doctor.schema import SCHEMA_VERSION
from torchpace.errors import EXIT_FAILURE, EXIT_OK
from torchpace.findings import Finding, Severity, worst_severity

AREAS: dict[str, str] = {
    "torch": "PyTorch build",
    "gpu": "GPUs",
    "cpu": "CPU",
    "memory": "Memory",
    "limits": "Limits",
    "storage": "Storage",
    "allocator": "Allocator",
    "cluster": "Cluster",
    "smoke": "Smoke tests",
    "doctor": "Doctor",
}

_STYLE = {Severity.OK: "green", Severity.INFO: "cyan", Severity.WARN: "yellow", Severity.FAIL: "bold red"}


def exit_code_for(findings: list[Finding], strict: bool = False) -> int:
    """1 when a finding fails (with `strict`, when one warns too); 0 otherwise."""
    limit = Severity.WARN if strict else Severity.FAIL
    return EXIT_FAILURE if any(f.severity.rank >= limit.rank for f in findings) else EXIT_OK


def summarize(findings: list[Finding]) -> dict[str, Any]:
    """Counts per severity and the worst one."""
    counts: dict[str, Any] = {s.value: sum(f.severity is s for f in findings) for s in Severity}
    counts["worst"] = worst_severity(findings).value
    return counts


def group_by_area(findings: list[Finding]) -> dict[str, list[Finding]]:
    """Findings per area, areas in display order (unknown areas last), findings in check order."""
    order = list(AREAS) + sorted({f.area for f in findings} - set(AREAS))
    return {area: [f for f in findings if f.area == area] for area in order if any(f.area == area for f in findings)}


def build_report(facts: DoctorFacts, findings: list[Finding], strict: bool, duration_s: float) -> dict[str, Any]:
    """The ``--json`` document (see `torchpace.doctor.schema.DOCTOR_JSON_SCHEMA`)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "torchpace_version": __version__,
        "host": {
            "distro": facts.distro.pretty_name or facts.distro.id,
            "distro_family": facts.distro.family,
            "package_manager": package_manager(facts.distro),
            "python": facts.python.version,
            "torch_version": facts.torch.version,
            "usable_cores": facts.cpu.usable_cores,
            "gpu_count": len(facts.nvml.gpus),
        },
        "strict": strict,
        "exit_code": exit_code_for(findings, strict),
        "summary": summarize(findings),
        "duration_s": round(duration_s, 3),
        "findings": [f.to_dict() for f in findings],
    }


def render_text(console, facts: DoctorFacts, findings: list[Finding], strict: bool, duration_s: float) -> None:
    """Print findings grouped by area: severity, title, evidence, remedy and its command."""
    torch = facts.torch.version or "torch not importable"
    console.print(Text.assemble(("torchpace doctor", "bold"), f"  {facts.distro.pretty_name or facts.distro.id}"
                                f" · Python {facts.python.version} · torch {torch}"))
    for area, items in group_by_area(findings).items():
        console.print()
        console.print(Text(AREAS.get(area, area), style="bold underline"))
        for finding in items:
            _render_finding(console, finding)
    summary = summarize(findings)
    code = exit_code_for(findings, strict)
    console.print()
    console.print(Text.assemble(
        ("Summary: ", "bold"),
        ", ".join(f"{summary[s.value]} {s.value}" for s in Severity),
        f" in {duration_s:.1f} s; exit {code}" + (" (--strict: warnings fail)" if strict else ""),
    ))


def _render_finding(console, finding: Finding) -> None:
    badge = f"{finding.severity.value.upper():>4}"
    console.print(Text.assemble("  ", (badge, _STYLE[finding.severity]), "  ", finding.title))
    width = max(40, console.width)
    if finding.evidence:
        _print_wrapped(console, finding.evidence, "        ", width, "dim")
    if finding.remedy:
        _print_wrapped(console, "→ " + finding.remedy.text, "        ", width, "")
        if finding.remedy.command:
            console.print(Text.assemble("          $ ", (finding.remedy.command, "bold")), overflow="fold")


def _print_wrapped(console, text: str, indent: str, width: int, style: str) -> None:
    """Print `text` wrapped to `width` with every line indented (Rich would not indent wrapped lines)."""
    for line in textwrap.wrap(text, width=width, initial_indent=indent, subsequent_indent=indent + "  ") or [indent]:
        console.print(Text(line, style=style), overflow="fold")
