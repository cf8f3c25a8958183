"""Real profiles of the planted workloads on this host (real torch, real files)."""

from __future__ import annotations

import gzip
import json

import pytest
import torch
from _profile_traces import spec

from torchpace.errors import UsageError, UserCodeError
from torchpace.findings import Severity
from torchpace.profile import VerdictKind
from torchpace.profile.capture import CaptureOptions, capture_profile
from torchpace.profile.run import profile_workload
from torchpace.profile.trace import read_trace_document
from torchpace.workload import load_workload

pytestmark = pytest.mark.slow
FAST = CaptureOptions(steps=3, python_steps=1)
LABELS = {"torchpace.input_wait", "torchpace.h2d", "torchpace.forward", "torchpace.backward", "torchpace.optimizer"}


@pytest.fixture(scope="module")
def input_bound(tmp_path_factory):
    path = tmp_path_factory.mktemp("profile") / "input.json.gz"
    return profile_workload(spec("input_bound"), options=FAST, trace_path=path), path


def test_sleepy_dataset_is_input_bound(input_bound):
    result, _ = input_bound
    assert result.verdict.kind is VerdictKind.INPUT
    assert result.verdict.stages_to_try == ("data",)
    assert "data.num_workers" in result.verdict.knobs_to_try
    assert "data.pin_memory" not in result.verdict.knobs_to_try  # does not apply without CUDA


def test_matmul_model_on_in_memory_data_is_compute_bound():
    result = profile_workload(spec("compute_bound"), options=FAST)
    assert result.verdict.kind is VerdictKind.COMPUTE
    assert result.verdict.stages_to_try == ("compute",)
    top = next(f for f in result.findings if f.id == "profile.top_ops").data["ops"]
    assert top[0]["name"] in {"aten::mm", "aten::addmm"}


def test_per_step_item_is_counted_and_reported_as_information_on_cpu():
    result = profile_workload(spec("item_per_step"), options=FAST)
    sync = next(f for f in result.findings if f.id == "profile.host_sync")
    assert sync.severity is Severity.INFO and sync.data["on_gpu"] is False
    assert sync.data["sync_per_step"] >= 1
    assert result.verdict.kind is not VerdictKind.HOST_SYNC


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host syncs only limit a step on a CUDA device")
def test_syncing_after_every_layer_is_host_sync_bound_on_cuda():
    result = profile_workload(spec("host_sync_bound"), options=FAST)
    assert result.verdict.kind is VerdictKind.HOST_SYNC


def test_exported_trace_is_gzip_json_with_events_labels_and_metadata(input_bound):
    result, path = input_bound
    assert result.trace_path == str(path)
    with gzip.open(path, "rt") as fh:
        doc = json.load(fh)
    names = {e.get("name") for e in doc["traceEvents"]}
    assert LABELS <= names
    assert sum(1 for n in names if str(n).startswith("ProfilerStep#")) == 3
    assert doc["torchpace"]["workload"] == "planted-input-bound"
    assert doc["torchpace"]["python_profile"]["steps"] == 1


def test_a_path_without_gz_gets_plain_json(tmp_path):
    capture = capture_profile(load_workload(spec("item_per_step")), options=CaptureOptions(steps=1, python_steps=0),
                              trace_path=tmp_path / "trace.json")
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert read_trace_document(tmp_path / "trace.json")["torchpace"]["python_profile"] is None
    assert capture.wall_time_s > 0


def test_a_raising_step_is_the_users_error_with_their_traceback():
    with pytest.raises(UserCodeError) as info:
        capture_profile(load_workload(spec("raises_in_step")), options=FAST)
    assert "planted failure in the user's forward" in info.value.user_traceback
    assert "workloads.py" in info.value.user_traceback


@pytest.mark.parametrize("kwargs", [{"steps": 0}, {"steps": -1}, {"warmup_steps": 0}, {"python_steps": -1}])
def test_bad_step_counts_are_usage_errors(kwargs):
    with pytest.raises(UsageError):
        CaptureOptions(**kwargs)
