"""Parsing a Chrome/Perfetto trace (as `torch.profiler` exports it) into frozen events.

Pure: `parse_trace(doc)` takes the JSON document (a dict) and returns a `Trace`; nothing here
touches torch or the filesystem except `read_trace`, which loads a `.json` or `.json.gz` file.

What torch 2.x's Kineto export holds, and what this module keeps:

- complete events (`ph == "X"`) with `ts`/`dur` in microseconds (floats): CPU operators
  (`cat == "cpu_op"`), `record_function` labels (`user_annotation`; their GPU-side mirror is
  `gpu_user_annotation`), CUDA runtime calls (`cuda_runtime`), kernels (`kernel`), copies
  (`gpu_memcpy`) and memsets (`gpu_memset`);
- one `ProfilerStep#N` label per profiled step, N counting every `prof.step()` call, so with a
  schedule of wait=1, warmup=1 the first recorded step is `ProfilerStep#2`;
- `[memory]` instant events (`ph == "i"`) when `profile_memory=True`: `args["Total Allocated"]`
  is the allocator's running total after the event, `args["Device Type"]` 0 for CPU, 1 for CUDA;
- `deviceProperties` (one entry per GPU, with `totalGlobalMem`), and torchpace's own block under
  the top-level key `torchpace` (see `capture.py`).
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

# a trace holds every op and allocation of every traced step in memory until it is written (tens of MB
# a step for a large model): a profile records a few steps, at most this many (`--steps`, `--python-steps`)
MAX_PROFILED_STEPS = 100
METADATA_KEY = "torchpace"
STEP_PREFIX = "ProfilerStep#"
LABEL_PREFIX = "torchpace."
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
_DEVICE_TYPES = {0: "cpu", 1: "cuda"}  # c10::DeviceType values Kineto writes in "[memory]" events
GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})


class TraceFormatError(ValueError):
    """The document is not a Chrome trace as torch.profiler writes it."""


@dataclass(frozen=True)
class TraceEvent:
    """One complete (`ph == "X"`) event. Times in microseconds since the trace's time base."""

    name: str
    cat: str
    ts_us: float
    dur_us: float
    pid: int | str
    tid: int | str
    args: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def end_us(self) -> float:
        return self.ts_us + self.dur_us


@dataclass(frozen=True)
class StepSpan:
    """One `ProfilerStep#N` span: a whole step, as the training loop saw it."""

    index: int
    ts_us: float
    dur_us: float
    tid: int | str

    @property
    def end_us(self) -> float:
        return self.ts_us + self.dur_us


@dataclass(frozen=True)
class MemorySample:
    """One `[memory]` event: the allocator's total after an allocation (`bytes` > 0) or free."""

    ts_us: float
    device: str
    device_id: int
    bytes: int
    total_allocated_bytes: int


@dataclass(frozen=True)
class Trace:
    """A parsed trace: events in time order, the profiled steps, memory samples and metadata.

    Attributes:
        events: complete events, sorted by start time (step spans included).
        steps: the `ProfilerStep#N` spans, in order.
        memory: `[memory]` samples (empty unless the profile recorded memory).
        device_properties: one dict per GPU, as Kineto wrote it (empty on CPU-only runs).
        metadata: torchpace's block (workload, device, capacity, Python profile...), or {}.
    """

    events: tuple[TraceEvent, ...]
    steps: tuple[StepSpan, ...]
    memory: tuple[MemorySample, ...] = ()
    device_properties: tuple[Mapping[str, Any], ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def step_total_us(self) -> float:
        """Wall time of all profiled steps together."""
        return sum(step.dur_us for step in self.steps)

    @property
    def has_gpu_activity(self) -> bool:
        """True when the trace holds GPU kernels, copies or memsets (a CUDA run)."""
        return any(event.cat in GPU_CATEGORIES for event in self.events)

    @property
    def device(self) -> str:
        """The device the workload ran on: from metadata, else guessed from the events."""
        recorded = self.metadata.get("device")
        if recorded:
            return str(recorded).split(":")[0]
        return "cuda" if self.has_gpu_activity or self.device_properties else "cpu"

    def events_in(self, categories: Iterable[str]) -> list[TraceEvent]:
        """Events whose `cat` is one of `categories`, in time order."""
        wanted = frozenset(categories)
        return [event for event in self.events if event.cat in wanted]


def parse_trace(doc: Mapping[str, Any]) -> Trace:
    """Parse a Chrome trace document (the JSON object) into a `Trace`.

    Raises:
        TraceFormatError: `doc` has no `traceEvents` list.
    """
    raw_events = doc.get("traceEvents") if isinstance(doc, Mapping) else None
    if not isinstance(raw_events, list):
        raise TraceFormatError("not a Chrome trace: expected a JSON object with a 'traceEvents' list")
    events = sorted((e for e in (_parse_complete(raw) for raw in raw_events) if e is not None), key=lambda e: e.ts_us)
    memory = tuple(sorted((m for m in (_parse_memory(raw) for raw in raw_events) if m is not None), key=lambda m: m.ts_us))
    metadata = doc.get(METADATA_KEY)
    return Trace(
        events=tuple(events),
        steps=parse_steps(events),
        memory=memory,
        device_properties=tuple(p for p in doc.get("deviceProperties") or () if isinstance(p, Mapping)),
        metadata=metadata if isinstance(metadata, Mapping) else {},
    )


def parse_steps(events: Iterable[TraceEvent]) -> tuple[StepSpan, ...]:
    """The CPU-side `ProfilerStep#N` spans among `events`, ordered by N."""
    steps = []
    for event in events:
        match = _STEP_RE.match(event.name)
        if match and event.cat == "user_annotation":
            steps.append(StepSpan(int(match.group(1)), event.ts_us, event.dur_us, event.tid))
    return tuple(sorted(steps, key=lambda s: s.index))


def _parse_complete(raw: Any) -> TraceEvent | None:
    if not isinstance(raw, Mapping) or raw.get("ph") != "X":
        return None
    try:
        ts_us, dur_us = float(raw["ts"]), float(raw.get("dur", 0.0))
    except (KeyError, TypeError, ValueError):
        return None  # a complete event without a usable time cannot be placed: skip it
    args = raw.get("args")
    return TraceEvent(str(raw.get("name", "")), str(raw.get("cat", "")), ts_us, dur_us,
                      raw.get("pid", 0), raw.get("tid", 0), args if isinstance(args, Mapping) else {})


def _parse_memory(raw: Any) -> MemorySample | None:
    if not isinstance(raw, Mapping) or raw.get("name") != "[memory]":
        return None
    args = raw.get("args") or {}
    try:
        return MemorySample(
            ts_us=float(raw["ts"]),
            device=_DEVICE_TYPES.get(int(args.get("Device Type", 0)), "other"),
            device_id=int(args.get("Device Id", 0)),
            bytes=int(args.get("Bytes", 0)),
            total_allocated_bytes=int(args["Total Allocated"]),
        )
    except (KeyError, TypeError, ValueError):
        return None  # a memory event without its totals says nothing about the peak: skip it


def read_trace_document(path: str | Path) -> dict[str, Any]:
    """Load a `.json` or gzip-compressed `.json.gz` trace file into its JSON document."""
    path = Path(path)
    with path.open("rb") as fh:
        gzipped = fh.read(2) == b"\x1f\x8b"
    opener = gzip.open if gzipped else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def read_trace(path: str | Path) -> Trace:
    """`parse_trace(read_trace_document(path))`."""
    return parse_trace(read_trace_document(path))


# --- interval arithmetic over trace spans (microseconds) -----------------------------------------


def union_us(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by `(start_us, end_us)` intervals, overlaps counted once."""
    total, current_start, current_end = 0.0, None, None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total


def clip_to_steps(intervals: Iterable[tuple[float, float]], steps: Iterable[StepSpan]) -> list[tuple[float, float]]:
    """The parts of `intervals` that fall inside any step span."""
    spans = [(s.ts_us, s.end_us) for s in steps]
    clipped = []
    for start, end in intervals:
        for span_start, span_end in spans:
            lo, hi = max(start, span_start), min(end, span_end)
            if hi > lo:
                clipped.append((lo, hi))
    return clipped


def in_step_us(events: Iterable[TraceEvent], steps: Iterable[StepSpan]) -> float:
    """Time the `events` cover inside the step spans (overlaps and nesting counted once)."""
    return union_us(clip_to_steps(((e.ts_us, e.end_us) for e in events), steps))
