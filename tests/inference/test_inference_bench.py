"""`run_bench` and `torchpace bench` on inference workloads: batch-1 latency, throughput, accuracy."""

import json

import jsonschema
import pytest

from torchpace.inference.accuracy import AccuracyGuard
from torchpace.measure.bench import BenchOptions
from torchpace.measure.render import bench_rows
from torchpace.measure.schema import BENCH_RESULT_SCHEMA
from torchpace.trial.bench import run_bench

from inference_planted import planted, wide_mlp

_QUICK = BenchOptions(max_time_s=2, window_s=0.05)


@pytest.fixture(scope="module")
def result():
    from torchpace.host import probe_host

    workload = wide_mlp()
    return run_bench(workload, {"inference.batch_size": 64}, _QUICK, host=probe_host(),
                     accuracy=AccuracyGuard.capture(workload, enforce=False))


def test_latency_percentiles_are_ordered_and_the_ci_brackets_p50(result):
    lat = result.latency
    assert lat.batch_size == 1 and lat.calls >= 1
    assert lat.p50_ci_low_s <= lat.p50_s <= lat.p50_ci_high_s
    assert 0 < lat.p50_s <= lat.p90_s <= lat.p99_s
    assert lat.stopped_by in ("ci", "time", "calls")
    objective = result.objective_for("latency")  # the figure a latency tune is judged by: p50, in seconds
    assert (objective.unit, objective.value, objective.ci_low) == ("s", lat.p50_s, lat.p50_ci_low_s)
    assert not objective.higher_is_better and objective.score == pytest.approx(1 / lat.p50_s)


def test_throughput_is_at_the_chosen_batch_size(result):
    t = result.throughput
    assert result.step.batch_size == 64 and t.samples_per_s > 0 and result.loss_values == ()
    # every measured step was a batch of 64 (512 samples: no short last batch), not the latency's batch of 1
    per_step = [samples / steps for samples, steps in zip(t.window_samples_per_s, t.window_steps_per_s)]
    assert t.windows >= 1 and per_step == pytest.approx([64] * t.windows)
    assert t.samples_per_s == pytest.approx(64 * t.steps_per_s)


def test_result_carries_model_size_and_accuracy_and_matches_the_schema(result):
    payload = json.loads(json.dumps(result.to_dict()))
    jsonschema.validate(payload, BENCH_RESULT_SCHEMA)
    assert payload["model_size_bytes"] > 64 * 256 * 4 and payload["accuracy"]["ok"]
    labels = [label for label, _ in bench_rows(result)]
    assert {"latency p50 (batch 1)", "latency p90 / p99", "model size", "accuracy vs fp32"} <= set(labels)


def test_training_benches_keep_their_keys_and_get_no_latency(host):
    from fixtures.workloads import tiny_mlp

    r = run_bench(tiny_mlp(), None, BenchOptions(max_time_s=1, window_s=0.05, compute_only=False), host=host)
    assert r.latency is None and r.model_size_bytes is None and r.accuracy is None and r.loss_values
    assert r.to_dict()["latency_p50_s"] is None  # the JSON keeps every key, null


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


@pytest.mark.parametrize("batches", ["-1", "257", "1000000000000"])
def test_accuracy_batches_are_from_0_to_what_memory_can_hold_before_anything_runs(capsys, tmp_path, monkeypatch, host,
                                                                                  batches):
    from torchpace.bench.run import bench_workload
    from torchpace.cli import main
    from torchpace.config import RunConfig
    from torchpace.errors import UsageError
    from torchpace.protocol import MAX_EVAL_BATCHES
    from torchpace.tune.tuner import TuneOptions, Tuner

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "r.json"
    assert main(["bench", planted("wide_mlp"), "--accuracy-batches", batches, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--accuracy-batches" in err and f"0<=x<={MAX_EVAL_BATCHES}" in err  # click names the valid values
    assert list(tmp_path.iterdir()) == []  # nothing ran, nothing written
    message = f"from 0 \\(skip\\) to {MAX_EVAL_BATCHES}, got {batches}"
    with pytest.raises(UsageError, match=message):  # the library says the same
        bench_workload(planted("wide_mlp"), RunConfig(), _QUICK, host=host, accuracy_batches=int(batches))
    with pytest.raises(UsageError, match=message):
        Tuner(TuneOptions(workload=planted("wide_mlp"), storage=f"sqlite:///{tmp_path / 's.db'}",
                          accuracy_batches=int(batches)), host)
