"""Parsing Chrome traces: the committed real recordings and hand-built documents."""

from __future__ import annotations

import gzip
import json

import pytest
from _profile_traces import RECORDED, cpu_steps, ev, step

from torchpace.profile.trace import (
    TraceFormatError,
    clip_to_steps,
    parse_steps,
    parse_trace,
    read_trace,
    read_trace_document,
    union_us,
)


def test_fixture_traces_are_committed_and_small():
    names = {path.name for path in RECORDED}
    assert {"cpu_input_bound.json.gz", "cpu_compute_bound.json.gz", "cpu_item_per_step.json.gz"} <= names
    assert all(path.stat().st_size < 200_000 for path in RECORDED)


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.name)
def test_recorded_trace_parses_into_steps_labels_and_metadata(path):
    trace = read_trace(path)
    assert [s.index for s in trace.steps] == [2, 3, 4]  # wait=1, warmup=1: ProfilerStep#0 and #1 are not kept
    assert all(s.dur_us > 0 for s in trace.steps)
    labels = {e.name for e in trace.events if e.name.startswith("torchpace.")}
    assert {"torchpace.input_wait", "torchpace.h2d", "torchpace.forward", "torchpace.backward", "torchpace.optimizer"} <= labels
    assert trace.memory, "profile_memory=True records [memory] events"
    assert trace.metadata["workload"].startswith("planted-")
    assert trace.device == "cpu" and not trace.has_gpu_activity
    assert list(trace.events) == sorted(trace.events, key=lambda e: e.ts_us)


def test_parse_rejects_documents_that_are_not_traces():
    for bad in ({}, {"traceEvents": {}}, [], {"events": []}):
        with pytest.raises(TraceFormatError, match="traceEvents"):
            parse_trace(bad)


def test_parse_skips_malformed_events_and_keeps_the_rest():
    doc = {"traceEvents": [step(2, 0, 10), {"ph": "X", "name": "no-time"}, "junk", ev("aten::mm", 1, 2),
                           {"ph": "i", "name": "[memory]", "ts": 3, "args": {}}]}
    trace = parse_trace(doc)
    assert [e.name for e in trace.events] == ["ProfilerStep#2", "aten::mm"]
    assert trace.memory == ()


def test_step_spans_come_from_cpu_annotations_only():
    gpu_mirror = ev("ProfilerStep#2", 0, 10, cat="gpu_user_annotation", tid=7)
    spans = parse_steps(parse_trace({"traceEvents": [step(3, 20, 5), step(2, 0, 10), gpu_mirror]}).events)
    assert [(s.index, s.ts_us, s.end_us) for s in spans] == [(2, 0, 10), (3, 20, 25)]


def test_read_trace_handles_plain_and_gzip_files(tmp_path):
    doc = cpu_steps()
    (tmp_path / "t.json").write_text(json.dumps(doc))
    (tmp_path / "t.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    assert read_trace_document(tmp_path / "t.json") == read_trace_document(tmp_path / "t.json.gz") == doc


def test_union_counts_overlaps_once():
    assert union_us([]) == 0
    assert union_us([(0, 10), (5, 15), (20, 30), (21, 22)]) == 25


def test_clip_keeps_only_the_parts_inside_steps():
    steps = parse_trace({"traceEvents": [step(2, 0, 10), step(3, 20, 10)]}).steps
    assert clip_to_steps([(5, 25), (40, 50)], steps) == [(5, 10), (20, 25)]
