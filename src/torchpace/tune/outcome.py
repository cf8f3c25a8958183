"""Turning a study's trials into the outcome: baseline, best config, accepted changes, trial table.

`build_outcome` takes data (the trial rows, the greedy policy's replayed state, the study's
metadata), so a live tune and a study read back from storage (`report/load.py`) build the same
`TuneOutcome` the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torchpace.tune.figures import (FIGURES_NOTE, PAIRED_FIGURES_NOTE, comparison, config_figure, load_note,
                                    other_load_summary, paired_speedup, with_figure)
from torchpace.tune.figures import speedup as figure_speedup
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


@dataclass
class TuneOutcome:
    """What a tune found; `to_dict` is the `--json` output."""

    study: str
    storage: str
    strategy: str
    workload: str
    baseline: dict[str, Any] | None
    best_config: dict[str, Any]
    best: dict[str, Any] | None
    speedup: float | None
    accepted: list[dict[str, Any]]
    trials: list[dict[str, Any]]
    out_path: str | None
    stopped: str
    failed_baseline: str | None = None
    guard_note: str = ""
    extras: dict[str, Any] = field(default_factory=dict)
    objective: str = "throughput"
    export: dict[str, Any] | None = None  # what --export wrote (ExportInfo), or {"error": ...}

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class StudyMeta:
    """What an outcome says about its study besides the trials.

    Attributes:
        study, storage: the study's name and storage URL.
        strategy: greedy, tpe, random or grid.
        workload: the workload spec.
        objective: throughput or latency.
        guard_note: what the guard checked (`build_guard_note`).
    """

    study: str
    storage: str
    strategy: str
    workload: str
    objective: str = "throughput"
    guard_note: str = ""


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


def throughput_columns(bench: dict[str, Any]) -> dict[str, Any]:
    """A trial's throughput figure and its CI under the row's `samples_per_s*` names, with its unit:
    samples, or steps for a script whose samples per step are unknown (then every trial of the study
    is in steps/s, and the tables say so)."""
    if bench.get("samples_per_s") is None and bench.get("steps_per_s") is not None:
        return {"samples_per_s": bench["steps_per_s"], "samples_per_s_ci_low": bench.get("steps_per_s_ci_low"),
                "samples_per_s_ci_high": bench.get("steps_per_s_ci_high"), "throughput_unit": "steps"}
    return {"samples_per_s": bench.get("samples_per_s"), "samples_per_s_ci_low": bench.get("samples_per_s_ci_low"),
            "samples_per_s_ci_high": bench.get("samples_per_s_ci_high"), "throughput_unit": "samples"}


def _row(trial, info: dict, base: dict) -> dict[str, Any]:
    bench = info.get("bench") or {}
    row = {
        "number": trial.number, "slot": info["slot"], "kind": info.get("kind"), "stage": info.get("stage"),
        "knob": info.get("knob"), "value": info.get("value"), "config": info.get("config", {}),
        "status": info.get("status") or ("running" if trial.state.name == "RUNNING" else "lost"),
        **throughput_columns(bench), "ci_rel_halfwidth": bench.get("ci_rel_halfwidth"),
        "peak_memory_bytes": bench.get("peak_memory_bytes"), "input_bound_frac": bench.get("input_bound_frac"),
        "verdict": info.get("verdict"), "guard": None, "guard_reason": None, "guard_losses": info.get("guard_losses") or [],
        "error": (info.get("error") or "").strip().splitlines()[-1:] or None,
        "window_samples_per_s": bench.get("window_samples_per_s") or [], "other_load_cores": bench.get("other_load_cores"),
        "usable_cores": bench.get("usable_cores"), "worker": info.get("worker"),
        "reference": info.get("reference"), "pair": info.get("pair"),
    }
    row["error"] = row["error"][0] if row["error"] else None
    if row["status"] == "running":
        started = f", started {trial.datetime_start:%H:%M:%S}" if trial.datetime_start else ""
        row["error"] = f"still running in tuner {info.get('worker') or '?'}{started}: its figure was not in when this was written"
    if info["slot"] == "baseline" and base.get("guard_cannot_judge"):
        row["guard_cannot_judge"] = base["guard_cannot_judge"]
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
            "stage": decision.stage, "knob": decision.knob, "value": decision.accepted_value, "config": row.get("config", config),
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


def build_guard_note(guard_steps: int, accuracy: tuple[int, float, float] | None = None) -> str:
    """What the guard checked: the loss guard over `guard_steps` steps, or for an inference workload the
    accuracy guard (`accuracy` = batches compared, relative tolerance, minimal top-1 agreement)."""
    if accuracy is not None:
        batches, rtol, top1 = accuracy
        return ACCURACY_NOTE.format(n=batches, rtol=rtol, top1=top1)
    return GUARD_NOTE.format(n=guard_steps)


def build_outcome(rows: list[dict[str, Any]], state: Any, meta: StudyMeta, stopped: str) -> TuneOutcome:
    """The TuneOutcome of a study's trials (pure).

    Args:
        rows: `trial_rows(study)`.
        state: the greedy policy's `GreedyState` replayed over the study, None for the other strategies.
        meta: the study's name, storage, strategy, workload, objective and guard note.
        stopped: why the tune stopped (done, budget, interrupted, stored...).
    """
    if state is not None and state.paired:
        return _build_paired_outcome(rows, state, meta, stopped)
    objective = meta.objective
    baseline = next((r for r in rows if r["slot"] == "baseline" and r["status"] == "ok"), None)
    accepted: list[dict] = []
    failed_baseline = None
    decisions: list[dict] = []
    if state is not None:
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
    if baseline is None and failed_baseline is None:
        failed_baseline = baseline_not_measured(rows)
    speedup = None
    if best and baseline and objective == "throughput":
        baseline, best, accepted = _pooled_figures(rows, baseline, best, accepted)
        speedup = figure_speedup(best, baseline)
    elif best and baseline:
        speedup = accepted[-1]["speedup"] if accepted else (best["objective_value"] / baseline["objective_value"] if best_config else 1.0)
    return TuneOutcome(
        study=meta.study, storage=meta.storage, strategy=meta.strategy, workload=meta.workload,
        baseline=baseline, best_config=best_config, best=best if baseline else None, speedup=speedup,
        accepted=accepted, trials=rows, out_path=None, stopped=stopped, failed_baseline=failed_baseline,
        guard_note=" ".join(filter(None, [meta.guard_note, (baseline or {}).get("guard_cannot_judge")])),
        extras={"decisions": decisions, "figures": FIGURES_NOTE if objective == "throughput" else None,
                "other_load": other_load_summary(rows)},
        objective=objective,
    )


def _pooled_figures(rows: list[dict], baseline: dict, best: dict, accepted: list[dict]) -> tuple[dict, dict, list[dict]]:
    """Baseline, tuned and every accepted change with the figures of `torchpace.tune.figures`: each config's
    pooled windows, step gain = its figure / the previous row's, speedup = its figure / the baseline's."""
    baseline, best = with_figure(baseline, rows), with_figure(best, rows)
    previous, changes = baseline, []
    for change in accepted:
        change = {**change, **(config_figure(rows, change["config"]) or {})}
        change.update(objective_value=change["samples_per_s"], step_gain=figure_speedup(change, previous),
                      speedup=figure_speedup(change, baseline))
        changes.append(change)
        previous = change
    return baseline, best, changes


_NOT_A_VERDICT = ("budget", "interrupted", "lost", "running", "partner")  # statuses that say nothing of the config


def baseline_not_measured(rows: list[dict[str, Any]]) -> str | None:
    """Why a study has no baseline figure, when it tried one: a failure of the baseline, or that it was cut
    (by the budget, an interrupt, a lost tuner) before it finished, which `--resume` measures again."""
    tried = [r for r in rows if r["slot"] == "baseline"]
    if not tried:
        return None
    failed = [r for r in tried if r["status"] not in _NOT_A_VERDICT and r["status"] != "ok"]
    if failed:
        return f"the baseline trial failed ({failed[-1]['status']}); nothing to compare against"
    return (f"the baseline was not measured: it was cut before it finished ({tried[-1]['status']}); "
            "`torchpace tune --resume` with the same --study measures it")


def _build_paired_outcome(rows: list[dict[str, Any]], state: Any, meta: StudyMeta, stopped: str) -> TuneOutcome:
    """The outcome of a study decided by paired comparisons (see `torchpace.tune.figures`)."""
    baseline = next((r for r in rows if r["slot"] == "baseline" and r["status"] == "ok"), None)
    usable_cores = max((r.get("usable_cores") or 1 for r in rows), default=1)
    decisions = [{**d.__dict__, "load_note": load_note(d.other_load_cores, usable_cores, [d.knob])} for d in state.decisions]
    accepted = _paired_changes(decisions, rows) if baseline else []
    final = next((r for r in rows if r["slot"] == "final" and r["status"] == "ok" and comparison(r)), None)
    final = final if final is not None and final["config"] == dict(state.incumbent) else None
    best, speedup_cmp = baseline, paired_speedup(final, accepted)
    if baseline and final:  # the two arms of the final comparison
        baseline, best = {**baseline, **_reference_figures(final)}, final
    elif baseline and accepted:  # the last kept change, as measured in its deciding comparison
        last = accepted[-1]
        best = {**next(r for r in rows if r["slot"] == last["slot"]), "samples_per_s": last["samples_per_s"],
                "objective_value": last["objective_value"]}
    if final:
        speedup_cmp["load_note"] = load_note(_pair_load(final), usable_cores, list(state.incumbent))
    noise = comparison(next((r for r in rows if r["slot"] == "noise" and r["status"] == "ok"), None))
    return TuneOutcome(
        study=meta.study, storage=meta.storage, strategy=meta.strategy, workload=meta.workload, baseline=baseline,
        best_config=dict(state.incumbent), best=best if baseline else None,
        speedup=speedup_cmp["speedup"] if baseline else None, accepted=accepted, trials=rows, out_path=None,
        stopped=stopped, failed_baseline=state.failed_baseline or (None if baseline else baseline_not_measured(rows)),
        guard_note=" ".join(filter(None, [meta.guard_note, (baseline or {}).get("guard_cannot_judge")])),
        extras={"decisions": decisions, "figures": PAIRED_FIGURES_NOTE, "other_load": other_load_summary(rows),
                "speedup": speedup_cmp, "noise": noise},
        objective=meta.objective,
    )


def _paired_changes(decisions: list[dict], rows: list[dict]) -> list[dict]:
    """The waterfall of a paired study: each accepted knob with its deciding comparison's ratio (the step's
    gain, with its CI) and the product of the steps so far."""
    changes, cumulative = [], 1.0
    for decision in decisions:
        if decision["accepted_value"] is None:
            continue
        value = decision["accepted_value"]
        slots = (f"confirm-pair:{decision['knob']}={value}", f"pair:{decision['knob']}={value}")
        row = next((r for slot in slots for r in rows if r["slot"] == slot and r["status"] == "ok"), {})
        cumulative *= decision["ratio"]
        changes.append({
            "stage": decision["stage"], "knob": decision["knob"], "value": value, "slot": row.get("slot"),
            "config": row.get("config"), "samples_per_s": decision["best_samples_per_s"],
            "samples_per_s_ci_low": row.get("samples_per_s_ci_low"), "samples_per_s_ci_high": row.get("samples_per_s_ci_high"),
            "step_gain": decision["ratio"], "step_gain_ci_low": decision["ratio_ci_low"],
            "step_gain_ci_high": decision["ratio_ci_high"], "rounds": decision["rounds"], "mode": decision["mode"],
            "speedup": cumulative, "peak_memory_bytes": row.get("peak_memory_bytes"), "reason": decision["reason"],
            "load_note": decision["load_note"], "objective_value": decision["best_samples_per_s"],
            "accuracy": row.get("accuracy"), **{key: row.get(key) for key in _LATENCY_KEYS},
        })
    return changes


def _reference_figures(row: dict) -> dict[str, Any]:
    """The reference arm's (A's) figures in a comparison row, under the names of the row's own (B's)."""
    pair = row["pair"]
    bench = pair.get("reference_bench") or {}
    return {**throughput_columns(bench), "ci_rel_halfwidth": bench.get("ci_rel_halfwidth"),
            "window_samples_per_s": bench.get("window_samples_per_s") or [], "peak_memory_bytes": bench.get("peak_memory_bytes"),
            **{key: bench.get(key) for key in _LATENCY_KEYS}, "objective_value": pair.get("reference_value")}


def _pair_load(row: dict) -> float | None:
    pair = row.get("pair") or {}
    loads = [v for v in (pair.get("other_load_a"), pair.get("other_load_b")) if v is not None]
    return max(loads) if loads else None
