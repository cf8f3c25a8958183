"""The accuracy guard for inference candidates (it replaces the training loss-curve guard).

Every candidate's outputs are compared with the fp32 eager reference on a fixed evaluation set: the
first K batches of the workload's dataset in order (no shuffle). The reference is computed in the
same process, from the workload as built, before `prepare()` applies any knob (the model still in
fp32, eager, on the CPU, under `no_grad`); the candidate's outputs come from the prepared run's own
step (device copy, autocast, inference mode, compiled / quantized / exported model) on the SAME
batches. Inputs are identical on both sides on purpose: a knob that reads the data another way
(a DATASET-point knob such as tar shards) may also change the sample order, which an element-wise
comparison would mistake for wrong outputs; such knobs keep their own equivalence tests.

Figures, over all output tensors of all evaluation batches:
- `max_abs_err`: the largest |candidate - reference| of any element;
- `max_rel_err`: `max_abs_err` divided by the largest |reference| element. Element-wise relative
  error is meaningless near zero outputs, so the error is taken relative to the output's scale;
- `top1_agreement` (classifiers: a 2-D `[batch, classes]` output): the share of samples whose
  argmax is the same as the reference's.

A candidate passes when `max_abs_err <= atol + rtol * max|reference|` and, for classifiers,
`top1_agreement >= min_top1_agreement`. Memory: the reference outputs of K batches are kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from torchpace.errors import TorchpaceError
from torchpace.measure.result import AccuracyReport  # noqa: F401  (the record lives with the other results)

DEFAULT_EVAL_BATCHES = 4  # at most `torchpace.protocol.MAX_EVAL_BATCHES`
# bf16 autocast and int8 weights move a small CNN's logits by ~0.5% of their scale; a broken
# conversion moves them by tens of percent and flips predictions.
DEFAULT_RTOL = 0.05
DEFAULT_ATOL = 1e-5  # absolute floor: an all-zero reference output must not demand exact zeros
DEFAULT_MIN_TOP1_AGREEMENT = 0.99


@dataclass(frozen=True)
class AccuracyTolerance:
    """How far a candidate's outputs may be from the fp32 eager reference's (see the module docstring)."""

    rtol: float = DEFAULT_RTOL
    atol: float = DEFAULT_ATOL
    min_top1_agreement: float = DEFAULT_MIN_TOP1_AGREEMENT


class AccuracyRejected(TorchpaceError):
    """A candidate's outputs are beyond the tolerance (the trial's `guard` failure class)."""

    def __init__(self, report: AccuracyReport):
        super().__init__(report.reason)
        self.report = report


def output_tensors(output: Any) -> list[torch.Tensor]:
    """The floating tensors of a (nested) model output, as float32 on the CPU, in a fixed order."""
    if isinstance(output, torch.Tensor):
        return [output.detach().float().cpu()] if output.is_floating_point() else []
    if isinstance(output, dict):
        return [t for key in sorted(output) for t in output_tensors(output[key])]
    if isinstance(output, (list, tuple)):
        return [t for item in output for t in output_tensors(item)]
    return []


def _top1_matches(reference: torch.Tensor, candidate: torch.Tensor) -> tuple[int, int] | None:
    """(agreeing samples, samples) for a `[batch, classes]` output, None for other shapes."""
    if reference.dim() != 2 or reference.shape[1] < 2:
        return None
    return int((reference.argmax(1) == candidate.argmax(1)).sum()), reference.shape[0]


def _errors(reference: list[list[torch.Tensor]], candidate: list[list[torch.Tensor]]) -> tuple[float, float, int, int]:
    """(max abs err, max |reference|, top-1 agreeing, top-1 total) over matching output tensors."""
    max_abs = ref_max = 0.0
    agree = total = 0
    for ref_batch, cand_batch in zip(reference, candidate):
        if len(ref_batch) != len(cand_batch) or any(r.shape != c.shape for r, c in zip(ref_batch, cand_batch)):
            return math.inf, 0.0, 0, 0
        for ref, cand in zip(ref_batch, cand_batch):
            max_abs = max(max_abs, float((cand - ref).abs().max()) if ref.numel() else 0.0)
            ref_max = max(ref_max, float(ref.abs().max()) if ref.numel() else 0.0)
        counts = _top1_matches(ref_batch[0], cand_batch[0]) if ref_batch else None
        if counts:
            agree, total = agree + counts[0], total + counts[1]
    return max_abs, ref_max, agree, total


def compare_outputs(reference: list[list[torch.Tensor]], candidate: list[list[torch.Tensor]], samples: int,
                    tolerance: AccuracyTolerance = AccuracyTolerance()) -> AccuracyReport:
    """Compare per-batch output tensors (see `output_tensors`) and decide against `tolerance`. Pure."""
    max_abs, ref_max, agree, total = _errors(reference, candidate)
    max_rel = max_abs / ref_max if ref_max > 0 else (0.0 if max_abs == 0 else math.inf)
    top1 = agree / total if total else None
    err_ok = math.isfinite(max_abs) and max_abs <= tolerance.atol + tolerance.rtol * ref_max
    top1_ok = top1 is None or top1 >= tolerance.min_top1_agreement
    reason = _describe(max_abs, max_rel, top1, samples, tolerance, err_ok, top1_ok)
    return AccuracyReport(samples=samples, max_abs_err=max_abs, max_rel_err=max_rel, reference_max_abs=ref_max,
                          top1_agreement=top1, ok=err_ok and top1_ok, reason=reason, rtol=tolerance.rtol,
                          atol=tolerance.atol, min_top1_agreement=tolerance.min_top1_agreement)


def _describe(max_abs, max_rel, top1, samples, tol: AccuracyTolerance, err_ok: bool, top1_ok: bool) -> str:
    if math.isinf(max_abs):
        return "rejected: outputs are non-finite or differ in shape from the fp32 reference"
    parts = [f"max abs err {max_abs:.3g}, rel {max_rel:.2%} {'<=' if err_ok else '>'} {tol.rtol:.1%}"]
    if top1 is not None:
        parts.append(f"top-1 agreement {top1:.1%} {'>=' if top1_ok else '<'} {tol.min_top1_agreement:.1%}")
    verdict = "ok" if err_ok and top1_ok else "rejected"
    return f"{verdict}: " + "; ".join(parts) + f" ({samples} samples vs fp32 eager)"


def evaluation_batches(dataset: Any, workload: Any, batches: int) -> list[Any]:
    """The first `batches` batches of `dataset` in order (the fixed evaluation set)."""
    loader = torch.utils.data.DataLoader(dataset, batch_size=workload.batch_size, shuffle=False,
                                         collate_fn=workload.collate_fn)
    out = []
    for batch in loader:
        out.append(batch)
        if len(out) == batches:
            break
    return out


def _call_model(workload: Any, model: Any, batch: Any) -> Any:
    if workload.forward is not None:
        return workload.forward(model, batch)
    return model(batch[0] if isinstance(batch, (list, tuple)) else batch)


def reference_outputs(workload: Any, batches: list[Any]) -> list[list[torch.Tensor]]:
    """The workload's own model as built (fp32, eager, eval mode, `no_grad`) on `batches`."""
    from torchpace.engine.batch import to_device

    model = workload.model
    device = next(model.parameters(), torch.empty(0)).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return [output_tensors(_call_model(workload, model, to_device(batch, device))) for batch in batches]
    finally:
        model.train(was_training)


def candidate_outputs(run: Any, batches: list[Any]) -> list[list[torch.Tensor]]:
    """The prepared run's outputs on `batches`, through its own step (device copy, autocast, model)."""
    return [output_tensors(run.step(batch)) for batch in batches]


class AccuracyGuard:
    """Holds the fp32 eager reference of a workload; checks a prepared run against it.

    Build it with `AccuracyGuard.capture(workload, ...)` BEFORE `prepare()` changes the model;
    then call it with the prepared run (what `run_bench(..., accuracy=guard)` does). With
    `enforce`, a candidate beyond the tolerance raises AccuracyRejected; without, it is reported.
    """

    def __init__(self, batches: list[Any], reference: list[list[torch.Tensor]], tolerance: AccuracyTolerance, enforce: bool):
        self.batches = batches
        self.reference = reference
        self.tolerance = tolerance
        self.enforce = enforce

    @classmethod
    def capture(cls, workload: Any, batches: int = DEFAULT_EVAL_BATCHES, tolerance: AccuracyTolerance = AccuracyTolerance(),
                enforce: bool = True) -> "AccuracyGuard":
        """Compute the reference outputs of `workload`'s model on its first `batches` batches."""
        fixed = evaluation_batches(workload.dataset, workload, batches)
        return cls(fixed, reference_outputs(workload, fixed), tolerance, enforce)

    def __call__(self, run: Any) -> AccuracyReport:
        """The report for prepared run `run`; AccuracyRejected when enforced and beyond tolerance."""
        from torchpace.engine.batch import batch_len

        samples = sum(batch_len(b) for b in self.batches)
        report = compare_outputs(self.reference, candidate_outputs(run, self.batches), samples, self.tolerance)
        if self.enforce and not report.ok:
            raise AccuracyRejected(report)
        return report
