"""The accuracy guard: pure comparison figures, and real quantized models checked against fp32."""

import math

import pytest
import torch

from torchpace.inference.accuracy import (AccuracyGuard, AccuracyRejected, AccuracyTolerance, compare_outputs,
                                          output_tensors)
from torchpace.inference.quantize import model_size_bytes
from torchpace.runtime import prepare

from inference_planted import breaks_under_int8, wide_mlp

INT8 = {"inference.quantize": "dynamic_int8"}


def _logits(rows):
    return [[torch.tensor(rows, dtype=torch.float32)]]


def test_identical_outputs_pass_with_zero_error():
    ref = _logits([[3.0, 1.0], [0.0, 2.0]])
    report = compare_outputs(ref, ref, samples=2)
    assert report.ok and report.max_abs_err == 0 and report.top1_agreement == 1.0
    assert report.reason.startswith("ok:")


def test_error_is_relative_to_the_largest_reference_output():
    ref, cand = _logits([[4.0, 1.0], [0.0, 2.0]]), _logits([[4.2, 1.0], [0.0, 2.0]])
    report = compare_outputs(ref, cand, samples=2, tolerance=AccuracyTolerance(rtol=0.01))
    assert report.max_abs_err == pytest.approx(0.2) and report.max_rel_err == pytest.approx(0.05)
    assert not report.ok and "rel 5.00% > 1.0%" in report.reason
    assert compare_outputs(ref, cand, samples=2, tolerance=AccuracyTolerance(rtol=0.06)).ok


def test_flipped_predictions_are_rejected_even_when_errors_are_small():
    ref, cand = _logits([[1.0, 0.99]] * 9 + [[0.0, 1.0]]), _logits([[0.99, 1.0]] * 9 + [[0.0, 1.0]])
    report = compare_outputs(ref, cand, samples=10)
    assert report.top1_agreement == pytest.approx(0.1) and not report.ok
    assert "top-1 agreement 10.0% < 99.0%" in report.reason


def test_nonfinite_or_reshaped_outputs_are_rejected():
    ref = _logits([[1.0, 2.0]])
    assert not compare_outputs(ref, _logits([[float("nan"), 2.0]]), samples=1).ok
    reshaped = compare_outputs(ref, [[torch.ones(1, 3)]], samples=1)
    assert not reshaped.ok and math.isinf(reshaped.max_abs_err) and "shape" in reshaped.reason


def test_nested_outputs_are_flattened_in_a_fixed_order_and_integers_skipped():
    out = {"b": torch.ones(2), "a": (torch.zeros(1), torch.arange(3))}
    assert [t.tolist() for t in output_tensors(out)] == [[0.0], [1.0, 1.0]]


def test_quantized_model_is_smaller_and_its_outputs_within_tolerance(host):
    with prepare(wide_mlp(), host=host) as run:
        fp32_bytes = model_size_bytes(run.model)
    workload = wide_mlp()
    guard = AccuracyGuard.capture(workload)
    with prepare(workload, INT8, host=host) as run:
        assert any(isinstance(m, torch.ao.nn.quantized.dynamic.Linear) for m in run.model.modules())
        int8_bytes = model_size_bytes(run.model)
        report = guard(run)
    assert int8_bytes < 0.5 * fp32_bytes  # int8 weights: about a quarter of fp32, plus scales
    assert report.ok and 0 < report.max_rel_err < 0.05 and report.top1_agreement == 1.0


def test_planted_int8_breakage_is_rejected_by_the_guard_with_its_figures(host):
    workload = breaks_under_int8()
    guard = AccuracyGuard.capture(workload)
    with prepare(workload, INT8, host=host) as run:
        with pytest.raises(AccuracyRejected) as caught:
            guard(run)
    report = caught.value.report
    assert not report.ok and report.max_rel_err > 0.5 and report.top1_agreement < 0.5
    assert str(caught.value).startswith("rejected: max abs err") and "top-1 agreement" in str(caught.value)
    # the same model in fp32 matches to float rounding: the guard blames the quantization, not the workload
    with prepare(breaks_under_int8(), host=host) as run:
        assert AccuracyGuard.capture(breaks_under_int8())(run).max_rel_err < 1e-5


def test_a_report_only_guard_never_raises(host):
    guard = AccuracyGuard.capture(breaks_under_int8(), batches=1, enforce=False)
    with prepare(breaks_under_int8(), INT8, host=host) as run:
        report = guard(run)
    assert not report.ok and report.samples == 32
