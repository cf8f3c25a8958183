"""Turning a study's trials into the outcome: baseline, best config, accepted changes, trial table."""

from __future__ import annotations

from typing import Any

from torchpace.tune.guard import check_trial_guard

GUARD_NOTE = ("The convergence guard compares each candidate's loss over the first {n} seeded steps (same "
              "initial weights, same data order) with the baseline's. It catches divergence, NaNs and broken "
              "numerics early; it cannot prove equal accuracy after full training: validate the tuned config "
              "on your real metric before relying on it.")
ACCURACY_NOTE = ("The accuracy guard compares each candidate's outputs on the first {n} batches of the dataset "
                 "(in order) with the fp32 eager reference computed in the same trial: max abs error, max error "
                 "relative to the largest reference output (tolerance {rtol:.1%}) and, for classifiers, top-1 "
                 "agreement (at least {top1:.1%}). It bounds the numerical change of quantization, bf16 and "
                 "export; it is not a task metric: check the tuned model on your own validation set.")
_LATENCY_KEYS = ("latency_p50_s", "latency_p90_s", "latency_p99_s", "latency_p50_ci_low_s", "latency_p50_ci_high_s",
                 "latency_ci_rel_halfwidth", "model_size_bytes")


def trial_rows(study) -> list[dict[str, Any]]:
    """One row per torchpace trial: slot, config, status, figures, guard verdict, error."""
    from torchpace.tune.study import baseline_info, trial_info

    infos = [(t, trial_info(t)) for t in study.get_trials(deepcopy=False)]
    base = baseline_info(infos)
    rows = []
    for trial, info in infos:
        if "slot" not in info:
            continue
        rows.append(_row(trial, info, base))
    return rows


def _row(trial, info: dict, base: dict) -> dict[str, Any]:
    bench = info.get("bench") or {}
    row = {
        "number": trial.number, "slot": info["slot"], "kind": info.get("kind"), "stage": info.get("stage"),
        "knob": info.get("knob"), "value": info.get("value"), "config": info.get("config", {}),
        "status": info.get("status") or ("running" if trial.state.name == "RUNNING" else "lost"),
        "samples_per_s": bench.get("samples_per_s"), "samples_per_s_ci_low": bench.get("samples_per_s_ci_low"),
        "samples_per_s_ci_high": bench.get("samples_per_s_ci_high"), "ci_rel_halfwidth": bench.get("ci_rel_halfwidth"),
        "peak_memory_bytes": bench.get("peak_memory_bytes"), "input_bound_frac": bench.get("input_bound_frac"),
        "verdict": info.get("verdict"), "guard": None, "guard_reason": None, "guard_losses": info.get("guard_losses") or [],
        "error": (info.get("error") or "").strip().splitlines()[-1:] or None,
    }
    row["error"] = row["error"][0] if row["error"] else None
    verdict = check_trial_guard(base, info) if row["status"] == "ok" else None
    if verdict is not None:
        row["guard"], row["guard_reason"] = ("pass" if verdict.ok else "fail"), verdict.reason
    row.update(_inference_columns(info, bench))
    return row


def _inference_columns(info: dict, bench: dict) -> dict[str, Any]:
    """The objective figure of a trial, and for inference workloads its batch-1 latency, model size
    and accuracy guard verdict (`guard` fail for a candidate beyond the tolerance)."""
    columns: dict[str, Any] = {key: bench.get(key) for key in _LATENCY_KEYS}
    columns["objective_value"] = info["objective_value"] if "objective_value" in info else bench.get("samples_per_s")
    columns["objective_ci_rel"] = info["objective_ci_rel"] if "objective_ci_rel" in info else bench.get("ci_rel_halfwidth")
    accuracy = info.get("accuracy")
    columns["accuracy"] = accuracy
    if accuracy:
        columns["guard"], columns["guard_reason"] = ("pass" if accuracy["ok"] else "fail"), accuracy["reason"]
    return columns


def best_by_search(rows: list[dict]) -> dict | None:
    """The usable trial row (ok, guard not failed) with the best objective figure."""
    usable = [r for r in rows if r["status"] == "ok" and r["guard"] != "fail" and r["objective_value"]]
    return max(usable, key=lambda r: r["objective_value"], default=None)


def _matching_row(rows: list[dict], config: dict) -> dict | None:
    """The latest ok measurement of exactly `config`."""
    matches = [r for r in rows if r["status"] == "ok" and r["config"] == config and r["samples_per_s"]]
    return matches[-1] if matches else None


def _accepted_changes(state, rows: list[dict], objective: str = "throughput") -> list[dict]:
    """The waterfall: each accepted knob, its measured figure and cumulative speedup vs baseline.

    Each step's gain is measured against the incumbent as re-measured in the same stage (side by
    side in time), and the cumulative speedup is their product: a host that drifts over a long tune
    does not inflate or deflate it the way comparing the last figure with the first one would.
    """
    accepted = []
    config: dict = {}
    cumulative = 1.0
    for decision in state.decisions:
        if decision.accepted_value is None:
            continue
        config = {**config, decision.knob: decision.accepted_value}
        row = next((r for r in rows if r["slot"] == f"cand:{decision.knob}={decision.accepted_value}"), {})
        step_gain = decision.best_samples_per_s / decision.incumbent_samples_per_s
        cumulative *= step_gain
        accepted.append({
            "stage": decision.stage, "knob": decision.knob, "value": decision.accepted_value,
            "samples_per_s": decision.best_samples_per_s, "samples_per_s_ci_low": row.get("samples_per_s_ci_low"),
            "samples_per_s_ci_high": row.get("samples_per_s_ci_high"),
            "speedup": cumulative, "step_gain": step_gain,
            "peak_memory_bytes": row.get("peak_memory_bytes"), "reason": decision.reason,
            **_objective_columns(decision.best_samples_per_s, row, objective),
        })
    return accepted


def _objective_columns(value: float, row: dict, objective: str) -> dict[str, Any]:
    """An accepted change's objective figure and latency; under `latency` its samples/s is the measured one."""
    columns = {"objective_value": value, "accuracy": row.get("accuracy"), **{key: row.get(key) for key in _LATENCY_KEYS}}
    if objective != "throughput":
        columns["samples_per_s"] = row.get("samples_per_s")  # the policy's figure was 1 / p50, not samples/s
    return columns


def _guard_note(tuner) -> str:
    o = tuner.options
    if getattr(tuner, "is_inference", False):
        return ACCURACY_NOTE.format(n=o.accuracy_batches, rtol=o.accuracy_rtol, top1=o.min_top1_agreement)
    return GUARD_NOTE.format(n=o.guard_steps)


def build_outcome(tuner, stopped: str):
    """The TuneOutcome of `tuner`'s study as it stands now."""
    from torchpace.tune.tuner import TuneOutcome

    rows = trial_rows(tuner.study)
    objective = getattr(tuner.options, "objective", "throughput")
    baseline = next((r for r in rows if r["slot"] == "baseline" and r["status"] == "ok"), None)
    accepted: list[dict] = []
    failed_baseline = None
    decisions: list[dict] = []
    if tuner.options.strategy == "greedy":
        state = tuner.sampler.plan(tuner.study)
        failed_baseline = state.failed_baseline
        best_config = dict(state.incumbent)
        best = _matching_row(rows, best_config) if baseline else None
        if best is not None and state.incumbent_samples_per_s:
            figure = state.incumbent_samples_per_s
            best = {**best, "objective_value": figure, **({"samples_per_s": figure} if objective == "throughput" else {})}
        if baseline:
            accepted = _accepted_changes(state, rows, objective)
        decisions = [d.__dict__ for d in state.decisions]
    else:
        best = best_by_search(rows)
        best_config = dict(best["config"]) if best else {}
    if baseline is None and failed_baseline is None and any(r["slot"] == "baseline" for r in rows):
        failed_baseline = "the baseline trial failed; nothing to compare against"
    speedup = None
    if best and baseline:
        speedup = accepted[-1]["speedup"] if accepted else (best["objective_value"] / baseline["objective_value"] if best_config else 1.0)
    return TuneOutcome(
        study=tuner.study_name, storage=tuner.storage_url, strategy=tuner.options.strategy, workload=tuner.spec,
        baseline=baseline, best_config=best_config, best=best if baseline else None, speedup=speedup,
        accepted=accepted, trials=rows, out_path=None, stopped=stopped, failed_baseline=failed_baseline,
        guard_note=_guard_note(tuner), extras={"decisions": decisions}, objective=objective,
    )
