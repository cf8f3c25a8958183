"""The Rich view of a profile result, rendered from recorded and synthetic traces."""

from __future__ import annotations

import io
import json

from _profile_traces import RECORDED, cuda_sync_steps
from rich.console import Console

from torchpace.profile.render import render_profile, split_rows, top_op_rows
from torchpace.profile.result import ProfileResult, build_profile_result
from torchpace.profile.trace import parse_trace, read_trace_document


def _render(payload) -> str:
    out = io.StringIO()
    render_profile(Console(file=out, width=120, highlight=False), payload)
    return out.getvalue()


def test_render_shows_verdict_split_findings_remedies_and_trace():
    path = next(p for p in RECORDED if p.name == "cpu_input_bound.json.gz")
    payload = build_profile_result(parse_trace(read_trace_document(path)), workload_spec="my.py:wl",
                                   trace_path="out.json.gz")
    text = _render(payload)
    assert "verdict: input-bound" in text
    assert "input wait" in text and "backward" in text and "other" in text
    assert "torchpace bench my.py:wl --set data.num_workers=2" in text
    assert "out.json.gz" in text and "ui.perfetto.dev" in text
    assert [row[0] for row in split_rows(payload)] == ["input wait", "host→device copy", "forward + loss",
                                                       "backward", "optimizer", "other"]
    assert top_op_rows(payload)


def test_render_of_a_cuda_trace_shows_the_host_sync_remedy():
    payload = build_profile_result(parse_trace(cuda_sync_steps()))
    text = _render(payload)
    assert "verdict: host-sync-bound" in text
    assert "GPU idle" in text and "→" in text  # warn findings carry their remedy


def test_a_profile_read_back_from_its_json_is_the_same_record_and_renders_the_same():
    for trace in [parse_trace(read_trace_document(p)) for p in RECORDED] + [parse_trace(cuda_sync_steps())]:
        result = build_profile_result(trace, workload_spec="my.py:wl", trace_path="out.json.gz")
        read_back = ProfileResult.from_dict(json.loads(json.dumps(result.to_dict())))
        assert read_back == result
        assert _render(read_back) == _render(result)
