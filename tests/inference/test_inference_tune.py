"""`tune` on inference workloads, with real trial processes on planted models and tiny budgets."""


import pytest
import torch

from torchpace.config import load_config
from torchpace.inference.capture import load_exported
from torchpace.measure.stats import MIN_WINDOWS_FOR_CI

from inference_planted import branchy_breaks_under_int8, planted


def _by_slot(outcome):
    return {t.slot: t for t in outcome.trials}


def test_int8_candidate_beyond_tolerance_is_rejected_with_its_figures(latency_tune):
    outcome, _ = latency_tune
    trial = _by_slot(outcome)["pair:inference.quantize=dynamic_int8"]
    assert trial.status == "guard" and trial.guard == "fail"
    assert trial.accuracy.top1_agreement < 0.5 and trial.accuracy.max_rel_err > 0.05
    assert "rejected: max abs err" in trial.error and "top-1 agreement" in trial.error
    assert "inference.quantize" not in outcome.best_config


def test_export_format_that_fails_records_the_exporters_error_and_the_search_goes_on(latency_tune):
    outcome, _ = latency_tune
    slots = _by_slot(outcome)
    assert slots["pair:inference.export=torch_export"].status == "invalid"
    assert "torch.export failed for this model: GuardOnDataDependentSymNode" in slots["pair:inference.export=torch_export"].error
    assert slots["pair:inference.export=torchscript"].status == "ok"
    # the latency objective's turns time single batch-1 calls: both arms held at once, one start-up each
    pair = slots["pair:inference.export=torchscript"].pair
    assert pair.mode == "alternating" and pair.mode_reason is None and pair.processes_started == 2
    assert pair.rounds >= MIN_WINDOWS_FOR_CI or pair.stopped_by == "time"
    assert outcome.stopped == "done"


def test_latency_objective_ranks_by_batch1_p50(latency_tune):
    outcome, _ = latency_tune
    base = outcome.baseline
    assert outcome.objective == "latency" and base.accuracy.ok and base.guard == "pass"
    assert base.objective.name == "latency" and base.objective.unit == "s" and base.objective.value == base.latency.p50_s
    assert base.to_dict()["objective_value"] == pytest.approx(1 / base.latency.p50_s)
    saved = load_config(outcome.out_path)
    assert saved.result["objective"] == "latency" and saved.result["baseline_latency_p50_s"] == pytest.approx(base.latency.p50_s)


def test_export_writes_the_chosen_model_and_it_reproduces_the_fp32_outputs(latency_tune):
    outcome, tmp = latency_tune
    export = outcome.export
    assert export.path == str(tmp / "model.pt2") and export.format == "torchscript"  # torch.export cannot
    assert export.max_abs_diff < 1e-4
    if "inference.export" not in outcome.best_config:
        assert "torch.export failed" in export.fallback_reason
    workload = branchy_breaks_under_int8()
    inputs = workload.dataset.tensors[0][:8]
    with torch.no_grad():
        torch.testing.assert_close(load_exported(export.path)(inputs), workload.model(inputs), rtol=1e-5, atol=1e-4)


def test_latency_objective_on_a_training_workload_is_a_usage_error(cli_run):
    proc = cli_run("tune", planted("trains"), "--objective", "latency", "--budget", "30s")
    assert proc.returncode == 2
    assert "--objective latency needs an inference workload" in proc.stderr and "trains" in proc.stderr


def test_export_of_a_training_workload_is_a_usage_error(cli_run, tmp_path):
    proc = cli_run("tune", planted("trains"), "--export", str(tmp_path / "m.pt2"), "--budget", "30s", "--json")
    assert proc.returncode == 2 and "--export writes an optimized inference model" in proc.stderr
    assert proc.stdout == "" and not (tmp_path / "m.pt2").exists()
