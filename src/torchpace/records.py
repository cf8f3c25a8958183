"""Frozen result records and their JSON, from one declaration per field.

A record is a frozen dataclass. What its JSON says about a field (the description, JSON-Schema
constraints, whether a sub-record's fields are written inline under a prefix) is declared on the
field itself with `spec(...)` (its description may instead be the record's docstring entry under
``Attributes:``), so the JSON a record writes (`to_json`), the JSON it reads back
(`from_json`, older documents included: a field they lack takes its default) and its JSON Schema
(`json_schema`) all come from that one declaration; no field is listed by hand twice.

A record may also name read-only properties to write beside its fields (`JSON_DERIVED`, e.g. a
result's `objective`): they are written and described in the schema, and recomputed when read.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

_KEY = "torchpace.json"


@dataclasses.dataclass(frozen=True)
class FieldSpec:
    """How one field appears in JSON.

    Attributes:
        description: what the field means, for the schema and the generated reference.
        schema: extra JSON-Schema keywords (`enum`, `minimum`, `const`, ...).
        inline: a sub-record's fields are written at this level, their names prefixed with this
            (None: the field is its own JSON value).
        required: the field is always written (False: written only when set, and optional to read).
        rest: a mapping that holds the names of the object this record does not know, written back
            as they were (what a newer writer added is kept, not dropped); not in the schema.
    """

    description: str = ""
    schema: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    inline: str | None = None
    required: bool = True
    rest: bool = False


def spec(description: str = "", *, inline: str | None = None, required: bool = True, rest: bool = False,
         **schema: Any) -> dict[str, Any]:
    """Field metadata: `dataclasses.field(metadata=spec("what it means", minimum=0))`."""
    return {_KEY: FieldSpec(description, schema, inline, required, rest)}


def field_spec(f: dataclasses.Field) -> FieldSpec:
    return f.metadata.get(_KEY) or FieldSpec()


class MissingFields(ValueError):
    """A JSON document lacks fields a record needs (they have no default)."""

    def __init__(self, record: str, names: Sequence[str]):
        super().__init__(f"{record} without the field(s) {', '.join(names)}")
        self.names = tuple(names)


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _optional(tp: Any) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return (args[0] if len(args) == 1 else typing.Union[tuple(args)]), len(args) < len(typing.get_args(tp))
    return tp, False


def _is_record(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


# ---- writing ---------------------------------------------------------------------------------------


def to_json(record: Any) -> dict[str, Any]:
    """`record` as a JSON object (plain dicts, lists and scalars)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        meta, value = field_spec(f), getattr(record, f.name)
        if meta.inline is not None:
            sub_type, _ = _optional(_hints(type(record))[f.name])
            sub = to_json(value) if value is not None else {name: None for name in json_names(sub_type)}
            out.update({meta.inline + name: v for name, v in sub.items()})
        elif meta.rest:
            out = {**_plain(value), **out}
        elif meta.required or value is not None:
            out[f.name] = _plain(value)
    for name in getattr(type(record), "JSON_DERIVED", ()):
        out[name] = _plain(getattr(record, name))
    return out


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_json(value)
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def json_names(cls: type) -> list[str]:
    """Every top-level JSON name a record writes, inline sub-records' prefixed names included."""
    names: list[str] = []
    for f in dataclasses.fields(cls):
        meta = field_spec(f)
        if meta.rest:
            continue
        if meta.inline is not None:
            sub_type, _ = _optional(_hints(cls)[f.name])
            names += [meta.inline + name for name in json_names(sub_type)]
        else:
            names.append(f.name)
    return names + list(getattr(cls, "JSON_DERIVED", ()))


# ---- reading ---------------------------------------------------------------------------------------


def from_json(cls: type, data: Mapping[str, Any], *, partial: bool = False) -> Any:
    """A `cls` record from a JSON object `to_json` wrote (by this or an older torchpace).

    A field the object lacks takes its default; names it does not know are ignored (or kept in the
    record's `rest` field). An inline sub-record that may be None is None when none of its fields
    has a value.

    Args:
        partial: the object holds only some of the record's figures (as stored in part by an older
            torchpace): a field it lacks that has no default is None instead of an error.

    Raises:
        MissingFields: the object lacks fields without a default (and not `partial`).
    """
    values: dict[str, Any] = {}
    missing: list[str] = []
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        meta = field_spec(f)
        tp, nullable = _optional(hints[f.name])
        if meta.rest:
            known = set(json_names(cls))
            values[f.name] = {k: v for k, v in data.items() if k not in known}
        elif meta.inline is not None:
            part = {name[len(meta.inline):]: data[name] for name in data if name.startswith(meta.inline)}
            if nullable and all(v is None for v in part.values()):
                values[f.name] = None
                continue
            try:
                values[f.name] = from_json(tp, part, partial=partial)
            except MissingFields as err:
                missing += [meta.inline + name for name in err.names]
        elif f.name in data:
            values[f.name] = _typed(tp, data[f.name])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            if partial:
                values[f.name] = None
            else:
                missing.append(f.name)
    if missing:
        raise MissingFields(cls.__name__, missing)
    return cls(**values)


def _typed(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    tp, _ = _optional(tp)
    if _is_record(tp):
        return from_json(tp, value)
    origin = typing.get_origin(tp)
    if origin is tuple and isinstance(value, (list, tuple)):
        item = typing.get_args(tp)[0] if typing.get_args(tp) else Any
        return tuple(_typed(item, v) for v in value)
    if origin in (Mapping, dict) and isinstance(value, Mapping):
        return dict(value)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def type_problem(cls: type, data: Mapping[str, Any], prefix: str = "") -> str | None:
    """The first value of a JSON object that is not of the type `cls` declares for it (`ratio: expected a
    number, found 'x'`), None when every one is; a null, a field the object lacks and a name `cls` does not
    know are left to `from_json`. For a document read from a file (hand-edited or damaged) before its
    record is rendered."""
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        meta = field_spec(f)
        tp, nullable = _optional(hints[f.name])
        if meta.rest:
            continue
        if meta.inline is not None:
            part = {name[len(meta.inline):]: data[name] for name in data if name.startswith(meta.inline)}
            problem = None if nullable and all(v is None for v in part.values()) else \
                type_problem(tp, part, prefix + meta.inline)
        else:
            problem = _value_problem(tp, data.get(f.name), prefix + f.name)
        if problem:
            return problem
    return None


_EXPECTED = {str: "a string", int: "a whole number", float: "a number", bool: "true or false"}


def _value_problem(tp: Any, value: Any, name: str) -> str | None:
    if value is None:
        return None
    tp, _ = _optional(tp)
    origin = typing.get_origin(tp)
    if _is_record(tp) or origin in (Mapping, dict) or tp in (dict, Mapping):
        if not isinstance(value, Mapping):
            return f"{name}: expected an object, found {value!r}"[:200]
        return type_problem(tp, value, name + ".") if _is_record(tp) else None
    if origin in (tuple, list, Sequence):
        if not isinstance(value, list):
            return f"{name}: expected a list, found {value!r}"[:200]
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        item = args[0] if len(args) == 1 else Any
        return next((p for i, v in enumerate(value) if (p := _value_problem(item, v, f"{name}[{i}]"))), None)
    ok = {str: lambda v: isinstance(v, str), bool: lambda v: isinstance(v, bool),
          int: lambda v: isinstance(v, int) and not isinstance(v, bool),
          float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)}.get(tp)
    if ok is not None and not ok(value):
        return f"{name}: expected {_EXPECTED[tp]}, found {value!r}"[:200]
    return None


# ---- the schema ------------------------------------------------------------------------------------


def json_schema(cls: type, title: str | None = None) -> dict[str, Any]:
    """The JSON Schema of what `to_json` writes for `cls` (a top-level document when `title` is given)."""
    properties, required = _properties(cls)
    schema: dict[str, Any] = {"type": "object", "required": required, "properties": properties}
    if title is not None:
        schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": title, **schema}
    return schema


def _properties(cls: type) -> tuple[dict[str, Any], list[str]]:
    properties: dict[str, Any] = {}
    required: list[str] = []
    hints = _hints(cls)
    notes = dict(docstring_attributes(cls.__doc__ or ""))
    for f in dataclasses.fields(cls):
        meta = field_spec(f)
        if meta.rest:
            continue
        if meta.inline is not None:
            tp, nullable = _optional(hints[f.name])
            sub_properties, sub_required = _properties(tp)
            for name, sub in sub_properties.items():
                properties[meta.inline + name] = _nullable(sub) if nullable else sub
            required += [meta.inline + name for name in sub_required]
            continue
        properties[f.name] = _described(_type_schema(hints[f.name]), meta, notes.get(f.name, ""))
        if meta.required:
            required.append(f.name)
    for name in getattr(cls, "JSON_DERIVED", ()):
        prop = getattr(cls, name)
        doc = (prop.__doc__ or "").strip().splitlines()[0] if prop.__doc__ else ""
        properties[name] = _described(_type_schema(typing.get_type_hints(prop.fget)["return"]), FieldSpec(doc))
        required.append(name)
    return properties, required


def _described(schema: dict[str, Any], meta: FieldSpec, note: str = "") -> dict[str, Any]:
    schema = {**schema, **meta.schema}
    if "const" in meta.schema or "enum" in meta.schema:
        schema.pop("type", None)
    if meta.description or note:
        schema["description"] = meta.description or note
    return schema


def docstring_attributes(doc: str) -> list[tuple[str, str]]:
    """(name, text) pairs of a Google-style docstring's ``Attributes:`` section, continuation lines joined."""
    lines = inspect.cleandoc(doc).splitlines()
    if "Attributes:" not in lines:
        return []
    pairs: list[list[str]] = []
    for line in lines[lines.index("Attributes:") + 1:]:
        if not line.strip():
            break
        match = re.match(r"^\s{4}(\w+):\s*(.*)$", line)
        if match:
            pairs.append([match.group(1), match.group(2)])
        elif pairs:
            pairs[-1][1] += " " + line.strip()
    return [(name, text.replace("``", "`")) for name, text in pairs]


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    schema = dict(schema)
    if "enum" in schema and None not in schema["enum"]:
        schema["enum"] = [*schema["enum"], None]
    kind = schema.get("type")
    if isinstance(kind, str):
        schema["type"] = [kind, "null"]
    elif isinstance(kind, list) and "null" not in kind:
        schema["type"] = [*kind, "null"]
    return schema


_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _type_schema(tp: Any) -> dict[str, Any]:
    tp, nullable = _optional(tp)
    if tp in _SCALARS:
        schema: dict[str, Any] = {"type": _SCALARS[tp]}
    elif _is_record(tp):
        schema = json_schema(tp)
    elif typing.get_origin(tp) in (tuple, list, Sequence):
        args = typing.get_args(tp)
        schema = {"type": "array", "items": _type_schema(args[0]) if args and args[0] is not Any else {}}
    elif typing.get_origin(tp) in (Mapping, dict) or tp in (dict, Mapping):
        schema = {"type": "object"}
    else:
        schema = {}
    return _nullable(schema) if nullable else schema
