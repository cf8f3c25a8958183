"""The JSON document ``torchpace doctor --json`` prints, as a JSON Schema (draft 2020-12).

The tests validate real output against `DOCTOR_JSON_SCHEMA`; docs/guide/doctor.md summarises it.
Bump `SCHEMA_VERSION` when a field changes meaning or goes away; adding fields does not.
"""

from __future__ import annotations

SCHEMA_VERSION = 1

_SEVERITY = {"type": "string", "enum": ["ok", "info", "warn", "fail"]}

_FINDING = {
    "type": "object",
    "required": ["id", "severity", "title", "evidence", "remedy", "area", "data"],
    "additionalProperties": False,
    "properties": {
        "id": {"type": "string", "pattern": r"^[a-z_]+(\.[a-z0-9_]+)+$", "description": "stable dotted id, e.g. limits.nofile"},
        "severity": _SEVERITY,
        "title": {"type": "string", "minLength": 1},
        "evidence": {"type": "string", "description": "the measured value and the threshold, for humans"},
        "remedy": {
            "oneOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "required": ["text", "command"],
                    "additionalProperties": False,
                    "properties": {
                        "text": {"type": "string", "minLength": 1},
                        "command": {"type": ["string", "null"], "description": "exact command for this distribution"},
                    },
                },
            ]
        },
        "area": {"type": "string", "enum": ["torch", "gpu", "cpu", "memory", "limits", "storage", "allocator", "cluster", "smoke", "doctor"]},
        "data": {"type": "object", "description": "machine-readable evidence; units in key names (*_bytes, *_s, *_c)"},
    },
}

DOCTOR_JSON_SCHEMA: dict = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "torchpace doctor report",
    "type": "object",
    "required": ["schema_version", "torchpace_version", "host", "strict", "exit_code", "summary", "duration_s", "findings"],
    "additionalProperties": False,
    "properties": {
        "schema_version": {"const": SCHEMA_VERSION},
        "torchpace_version": {"type": "string"},
        "host": {
            "type": "object",
            "required": ["distro", "distro_family", "package_manager", "python", "torch_version", "usable_cores", "gpu_count"],
            "properties": {
                "distro": {"type": "string"},
                "distro_family": {"type": "string", "enum": ["debian", "rhel", "unknown"]},
                "package_manager": {"type": ["string", "null"], "enum": ["apt-get", "dnf", "yum", None]},
                "python": {"type": "string"},
                "torch_version": {"type": ["string", "null"]},
                "usable_cores": {"type": "integer", "minimum": 1},
                "gpu_count": {"type": "integer", "minimum": 0},
            },
        },
        "strict": {"type": "boolean", "description": "--strict: warnings fail too"},
        "exit_code": {"type": "integer", "enum": [0, 1]},
        "summary": {
            "type": "object",
            "required": ["ok", "info", "warn", "fail", "worst"],
            "additionalProperties": False,
            "properties": {
                "ok": {"type": "integer", "minimum": 0},
                "info": {"type": "integer", "minimum": 0},
                "warn": {"type": "integer", "minimum": 0},
                "fail": {"type": "integer", "minimum": 0},
                "worst": _SEVERITY,
            },
        },
        "duration_s": {"type": "number", "minimum": 0},
        "findings": {"type": "array", "items": _FINDING},
    },
}
