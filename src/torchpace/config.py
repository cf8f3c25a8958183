"""RunConfig: a frozen, validated mapping knob name -> value, saved as TOML.

File format (`torchpace.toml`)::

    schema_version = 1

    [knobs]                       # only knobs that differ from plain PyTorch need be listed
    "data.num_workers" = 2        # or as a table: [knobs.data] num_workers = 2
    "precision.amp" = "bf16"

    [host]                        # what it was tuned on (written by tune; informational)
    fingerprint = "..."

    [result]                      # measured figures (written by tune; informational)
    baseline_samples_per_s = 812.0  # baseline_steps_per_s for a script measured in steps/s

Unknown knobs, bad values and newer schema versions are usage errors that name the key.
"""

from __future__ import annotations

import logging
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterator, Mapping

from torchpace.errors import UsageError
from torchpace.files import write_atomic

_log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
SUPPORTED_SCHEMA_VERSIONS = (1,)


@dataclass(frozen=True)
class RunConfig(Mapping[str, Any]):
    """Knob values that differ from (or restate) the defaults; a missing knob means its default.

    Attributes:
        values: knob name -> validated value (read-only).
        host: the host summary it was tuned on (informational, may be empty).
        result: measured figures saved with it (informational, may be empty).
    """

    values: Mapping[str, Any] = field(default_factory=dict)
    host: Mapping[str, Any] = field(default_factory=dict)
    result: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        validated = {name: _knobs().get_knob(name).validate(value) for name, value in self.values.items()}
        object.__setattr__(self, "values", MappingProxyType(validated))
        object.__setattr__(self, "host", MappingProxyType(dict(self.host)))
        object.__setattr__(self, "result", MappingProxyType(dict(self.result)))

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)

    def get_value(self, name: str) -> Any:
        """The value of knob `name`: as set here, else the knob's default."""
        return self.values.get(name, _knobs().get_knob(name).default)

    def full_values(self) -> dict[str, Any]:
        """Every registered knob's effective value."""
        return {name: self.get_value(name) for name in _knobs().REGISTRY}

    def with_values(self, **changes: Any) -> "RunConfig":
        """A copy with `changes` (knob name -> value) applied; pass names via a dict: **{'a.b': 1}."""
        return RunConfig({**self.values, **changes}, self.host, self.result)

    def with_defaults(self, defaults: Mapping[str, Any]) -> "RunConfig":
        """This config where it sets a knob, `defaults` (knob name -> value: a workload's own, see
        `torchpace.knobs.workload_defaults`) where it does not: the values a run of that workload has."""
        return RunConfig({**defaults, **self.values}, self.host, self.result)

    def non_default(self) -> dict[str, Any]:
        """Only the knobs whose value differs from their default."""
        return {k: v for k, v in self.values.items() if v != _knobs().get_knob(k).default}

    def to_toml_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "knobs": dict(sorted(self.values.items()))}
        if self.host:
            doc["host"] = _drop_none(self.host)
        if self.result:
            doc["result"] = _drop_none(self.result)
        return doc


def check_on_host(config: RunConfig, host: Any, defaults: Mapping[str, Any] | None = None) -> None:
    """UsageError naming knob, value and reason for a set knob this host cannot run, whatever the
    workload: beyond the host's limits (e.g. more DataLoader workers than its cores allow), hardware
    it lacks (fp16 without CUDA), or values that conflict (with `defaults` where the config does not
    set a knob: a workload's own values). `prepare()` checks the workload on top."""
    values = config.with_defaults(defaults or {}).full_values()
    for name, value in config.values.items():
        knob = _knobs().get_knob(name)
        if value != knob.default:
            reason = knob.host_reason(value, host) or knob.conflicts(values)
            if reason:
                raise UsageError(f"knob {name!r} = {value!r} does not apply here: {reason}")


def _knobs():
    """`torchpace.knobs`, the registry that validates every value."""
    # lazy: the knob registry loads when a config is built, not with every command's options
    import torchpace.knobs

    return torchpace.knobs


def _drop_none(table: Mapping[str, Any]) -> dict[str, Any]:
    """TOML has no null: leave unknown values out."""
    return {k: (_drop_none(v) if isinstance(v, Mapping) else v) for k, v in table.items() if v is not None}


def _flatten(table: Mapping[str, Any], source: str, prefix: str = "", seen: dict[str, str] | None = None) -> dict[str, Any]:
    """{"data": {"num_workers": 2}} -> {"data.num_workers": 2}; UsageError when one knob is given twice
    (a dotted key and a table: `"data.num_workers" = 2` beside `[knobs.data] num_workers = 3`)."""
    seen = {} if seen is None else seen
    flat: dict[str, Any] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, source, f"{name}.", seen))
            continue
        spelling = f"[knobs.{prefix[:-1]}] {key}" if prefix else f'"{key}"' if "." in key else key
        if name in seen:
            raise UsageError(f"{source}: knob {name!r} is given twice ({seen[name]} and {spelling}); keep one")
        seen[name] = spelling
        flat[name] = value
    return flat


def parse_config(doc: Mapping[str, Any], source: str = "config") -> RunConfig:
    """Build a RunConfig from a parsed TOML document, checking the schema version, keys and table types."""
    version = doc.get("schema_version")
    if version is None:
        raise UsageError(f"{source}: schema_version is missing; a torchpace config starts with "
                         f"`schema_version = {SCHEMA_VERSION}`")
    if type(version) is not int or version not in SUPPORTED_SCHEMA_VERSIONS:  # `true` is no version (True == 1)
        raise UsageError(
            f"{source}: schema_version = {_toml_repr(version)} is not understood; this torchpace reads "
            f"schema_version {', '.join(map(str, SUPPORTED_SCHEMA_VERSIONS))} (a whole number)"
            + (" (upgrade torchpace to read newer files)" if type(version) is int and version > SCHEMA_VERSION else "")
        )
    unknown = set(doc) - {"schema_version", "knobs", "host", "result"}
    if unknown:
        raise UsageError(f"{source}: unknown top-level key(s) {sorted(unknown)}; expected schema_version, knobs, host, result")
    for table, shape in (("knobs", "knob = value"), ("host", "fact = value (written by tune)"),
                         ("result", "figure = value (written by tune)")):
        if table in doc and not isinstance(doc[table], Mapping):
            raise UsageError(f"{source}: {table} = {_toml_repr(doc[table])} must be a table ([{table}] with {shape})")
    knobs = _flatten(doc.get("knobs", {}), source)
    try:
        return RunConfig(knobs, doc.get("host", {}), doc.get("result", {}))
    except UsageError as err:
        raise UsageError(f"{source}: [knobs] {err}") from None


def _toml_repr(value: Any) -> str:
    """`value` as it was written in TOML (true, not True), for messages."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def load_config(path: str | Path) -> RunConfig:
    """Read a torchpace TOML config. Errors name the file and the line or key that is wrong."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise UsageError(f"cannot read config {str(path)!r}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise UsageError(f"config {str(path)!r} is not UTF-8 text (byte {err.object[err.start]:#04x} at offset "
                         f"{err.start}); a torchpace config is a TOML file, which is UTF-8") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise UsageError(f"config {str(path)!r} is not valid TOML: {err}") from None
    config = parse_config(doc, source=str(path))
    _log.info("config %s loaded: %s", path, dict(config.values) or "no knob set (the defaults)")
    return config


def save_config(config: RunConfig, path: str | Path) -> Path:
    """Write `config` as TOML atomically (`torchpace.files`: a temp file renamed over the target; secrets masked).

    Raises:
        OutputWriteFailed: the file could not be written (full disk, permissions); nothing is left behind.
    """
    # lazy: only saving a config writes TOML
    import tomli_w

    return write_atomic(path, tomli_w.dumps(config.to_toml_dict()))


def parse_assignments(pairs: list[str]) -> dict[str, Any]:
    """`["a.b=2", "c.d=bf16"]` -> typed values (TOML literal rules: 2 -> int, true -> bool, else str)."""
    values: dict[str, Any] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--set {pair!r}: expected KNOB=VALUE, e.g. --set data.num_workers=2")
        values[name.strip()] = _parse_literal(raw.strip())
    return values


def _parse_literal(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def resolve_config(config: "RunConfig | Mapping[str, Any] | str | Path | None") -> RunConfig:
    """Accept a RunConfig, a dict of knob values, a TOML path, or None (all defaults)."""
    if config is None:
        return RunConfig()
    if isinstance(config, RunConfig):
        return config
    if isinstance(config, (str, Path)):
        return load_config(config)
    if not isinstance(config, Mapping):
        raise UsageError(f"config {config!r} is a {type(config).__name__}; expected a RunConfig, a dict of knob "
                         "values, the path of a torchpace.toml, or None")
    return RunConfig(dict(config))
