"""Findings: the one shape in which doctor, profile and monitor report what they saw.

A `Finding` says what was checked, how it went (`Severity`), the evidence (the measured value and
the threshold it was held against) and, when something should change, a `Remedy` with the text
and, where one exists, the exact command for this host's distribution.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Mapping


class Severity(str, enum.Enum):
    """How a finding went, ordered from fine to failing."""

    OK = "ok"
    INFO = "info"
    WARN = "warn"
    FAIL = "fail"

    @property
    def rank(self) -> int:
        return _SEVERITY_ORDER.index(self)


_SEVERITY_ORDER = [Severity.OK, Severity.INFO, Severity.WARN, Severity.FAIL]


@dataclass(frozen=True)
class Remedy:
    """What to do about a finding: prose, and the command for this distribution when there is one."""

    text: str
    command: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "command": self.command}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Remedy":
        return cls(str(data["text"]), data.get("command"))


@dataclass(frozen=True)
class Finding:
    """One checked fact.

    Attributes:
        id: stable dotted identifier, e.g. ``limits.nofile``.
        severity: ok / info / warn / fail.
        title: one line for humans.
        evidence: the measured value and the threshold, as text.
        remedy: what to do, or None when nothing needs doing.
        area: grouping for display (e.g. ``torch``, ``gpu``, ``cpu``).
        data: machine-readable evidence for ``--json`` (units in key names).
    """

    id: str
    severity: Severity
    title: str
    evidence: str = ""
    remedy: Remedy | None = None
    area: str = "general"
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "severity": self.severity.value,
            "title": self.title,
            "evidence": self.evidence,
            "remedy": self.remedy.to_dict() if self.remedy else None,
            "area": self.area,
            "data": self.data,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Finding":
        """The finding `to_dict` wrote (KeyError naming a field it lacks; ValueError for an unknown severity)."""
        remedy = data.get("remedy")
        return cls(str(data["id"]), Severity(data["severity"]), str(data["title"]), str(data.get("evidence", "")),
                   Remedy.from_dict(remedy) if remedy else None, str(data.get("area", "general")), dict(data.get("data") or {}))


def worst_severity(findings: list[Finding]) -> Severity:
    """The most severe level among `findings` (OK for an empty list)."""
    return max((f.severity for f in findings), key=lambda s: s.rank, default=Severity.OK)
