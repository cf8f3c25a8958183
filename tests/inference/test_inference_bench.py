"""`run_bench` and `torchpace bench` on inference workloads: batch-1 latency, throughput, accuracy."""

import json

import jsonschema
import pytest

from torchpace.inference.accuracy import AccuracyGuard
from torchpace.measure.bench import BenchOptions, run_bench
from torchpace.measure.render import bench_rows
from torchpace.measure.schema import BENCH_RESULT_SCHEMA

from inference_planted import planted, wide_mlp

_QUICK = BenchOptions(max_time_s=2, window_s=0.05)


@pytest.fixture(scope="module")
def result():
    from torchpace.host import probe_host

    workload = wide_mlp()
    return run_bench(workload, {"inference.batch_size": 64}, _QUICK, host=probe_host(),
                     accuracy=AccuracyGuard.capture(workload, enforce=False))


def test_latency_percentiles_are_ordered_and_the_ci_brackets_p50(result):
    assert result.latency_batch_size == 1 and result.latency_calls >= 1
    assert result.latency_p50_ci_low_s <= result.latency_p50_s <= result.latency_p50_ci_high_s
    assert 0 < result.latency_p50_s <= result.latency_p90_s <= result.latency_p99_s
    assert result.latency_stopped_by in ("ci", "time", "calls")


def test_throughput_is_at_the_chosen_batch_size(result):
    assert result.batch_size == 64 and result.samples_per_s > 0 and result.loss_values == []
    # a batch of 64 costs more than one sample but far less than 64 separate batch-1 calls would
    assert result.step_time_s > result.latency_p50_s / 2


def test_result_carries_model_size_and_accuracy_and_matches_the_schema(result):
    payload = json.loads(json.dumps(result.to_dict()))
    jsonschema.validate(payload, BENCH_RESULT_SCHEMA)
    assert payload["model_size_bytes"] > 64 * 256 * 4 and payload["accuracy"]["ok"]
    labels = [label for label, _ in bench_rows(payload)]
    assert {"latency p50 (batch 1)", "latency p90 / p99", "model size", "accuracy vs fp32"} <= set(labels)


def test_training_benches_keep_their_keys_and_get_no_latency(host):
    from fixtures.workloads import tiny_mlp

    r = run_bench(tiny_mlp(), None, BenchOptions(max_time_s=1, window_s=0.05, compute_only=False), host=host)
    assert r.latency_p50_s is None and r.model_size_bytes is None and r.accuracy is None and r.loss_values


def test_bench_cli_reports_latency_and_accuracy_of_a_quantized_model(cli_run):
    proc = cli_run("bench", planted("wide_mlp"), "--set", "inference.quantize=dynamic_int8", "--max-time", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    payload = json.loads(proc.stdout)
    assert payload["config"] == {"inference.quantize": "dynamic_int8"} and payload["latency_p50_s"] > 0
    assert payload["accuracy"]["ok"] and payload["accuracy"]["samples"] == 128


def test_bench_cli_export_format_the_model_cannot_take_is_a_usage_error(cli_run):
    proc = cli_run("bench", planted("branchy"), "--set", "inference.export=torch_export", "--max-time", "2")
    assert proc.returncode == 2
    assert "torch.export failed for this model: GuardOnDataDependentSymNode" in proc.stderr
