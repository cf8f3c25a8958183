"""Turning a study's trials into the outcome: baseline, best config, accepted changes, trial table.

`build_outcome` takes data (the trial rows, the greedy policy's replayed state, the study's
metadata), so a live tune and a study read back from storage (`report/load.py`) build the same
`TuneOutcome` the same way. Every figure in it is an `Objective` in the study's unit
(`torchpace.tune.figures` defines them); `TuneOutcome.to_dict` is the `--json` output.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from torchpace.measure.result import LATENCY, SAMPLES_PER_S, STEPS_PER_S, THROUGHPUT, AccuracyReport, LatencyFigures, Objective
from torchpace.measure.render import config_label, settings_text
from torchpace.records import from_json, spec, to_json
from torchpace.tune.attrs import PairRecord, TrialRecord
from torchpace.tune.figures import (ComparisonFigure, OtherLoad, ReportedDecision, SpeedupFigure, at_score, comparison,
                                    config_figure, config_range, figures_note, host_change_note, load_note, other_load_summary,
                                    paired_figures_note, paired_speedup)
from torchpace.tune.figures import speedup as figure_speedup
from torchpace.tune.guard import check_trial_guard
from torchpace.tune.policy import Decision, is_final_slot
from torchpace.tune.study import baseline_guard, trial_records

GUARD_NOTE = ("The convergence guard compares each candidate's loss over the first {n} seeded steps (same "
              "initial weights, same data order) with the baseline's. It catches divergence, NaNs and broken "
              "numerics early; it cannot prove equal accuracy after full training: validate the tuned config "
              "on your real metric before relying on it.")
ACCURACY_NOTE = ("The accuracy guard compares each candidate's outputs on the first {n} batches of the dataset "
                 "(in order) with the fp32 eager reference computed in the same trial: max abs error, max error "
                 "relative to the largest reference output (tolerance {rtol:.1%}) and, for classifiers, top-1 "
                 "agreement (at least {top1:.1%}). It bounds the numerical change of quantization, bf16 and "
                 "export; it is not a task metric: check the tuned model on your own validation set.")


def rate_columns(figure: Objective | None, windows: Sequence[float] = ()) -> dict[str, Any]:
    """A throughput figure under the JSON names of its unit: `samples_per_s*` (and `window_samples_per_s`), or
    `steps_per_s*` (`window_steps_per_s`) in a study measured in steps/s; the other unit's names are null."""
    columns: dict[str, Any] = {}
    for unit, name in ((SAMPLES_PER_S, "samples_per_s"), (STEPS_PER_S, "steps_per_s")):
        mine = figure is not None and figure.unit == unit
        columns.update({name: figure.value if mine else None, f"{name}_ci_low": figure.ci_low if mine else None,
                        f"{name}_ci_high": figure.ci_high if mine else None,
                        f"window_{name}": list(windows) if mine else []})
    return columns


def _score_columns(figure: Objective | None) -> dict[str, Any]:
    """`objective_value` (the figure as "higher is better": 1 / p50 for latency) and `objective_ci_rel`."""
    return {"objective_value": figure.score if figure else None,
            "objective_ci_rel": figure.ci_rel_halfwidth if figure and figure.score is not None else None}


@dataclass(frozen=True)
class TrialRow:
    """One trial as the outcome shows it: what ran, how it ended, its figures.

    Attributes:
        status: how it ended (`running` while another tuner runs it, `lost` when its tuner left no result).
        throughput: its measured throughput in the study's unit (for the baseline and the tuned config of an
            outcome: the figure `torchpace.tune.figures` defines, pooled or an arm's).
        window_rates: its windows in that unit.
        objective: the figure the tune ranks it by: `throughput`, or batch-1 `latency`.
        guard: `pass` or `fail` (None: not checked), with `guard_reason`.
        guard_cannot_judge: the baseline's row only: why the guard cannot judge this workload.
        error: the last line of its error (or where it is still running).
        reference: the config it was compared with (a comparison's arm A).
        pair: its comparison with `reference`.
        measurements: the baseline's and the tuned config's rows of a paired study: the measurements of the
            config its interval spans (`torchpace.tune.figures.config_range`); 0: the interval is its CI.
    """

    number: int
    slot: str
    kind: str | None = None
    stage: str | None = None
    knob: str | None = None
    value: Any = None
    config: Mapping[str, Any] = field(default_factory=dict)
    status: str = "ok"
    throughput: Objective | None = None
    window_rates: tuple[float, ...] = ()
    objective: Objective | None = None
    latency: LatencyFigures | None = field(default=None, metadata=spec(inline="latency_"))
    ci_rel_halfwidth: float | None = None
    peak_memory_bytes: int | None = None
    model_size_bytes: int | None = None
    input_bound_frac: float | None = None
    other_load_cores: float | None = None
    usable_cores: int | None = None
    verdict: str | None = None
    guard: str | None = None
    guard_reason: str | None = None
    guard_losses: tuple[float, ...] = ()
    guard_cannot_judge: str | None = field(default=None, metadata=spec(required=False))
    error: str | None = None
    worker: str | None = None
    reference: Mapping[str, Any] | None = None
    pair: PairRecord | None = None
    accuracy: AccuracyReport | None = None
    measurements: int = 0

    def to_dict(self) -> dict[str, Any]:
        """`--json`'s row: every field, and the figures under their unit's names (`rate_columns`)."""
        return {**to_json(self), **rate_columns(self.throughput, self.window_rates), **_score_columns(self.objective)}

    @classmethod
    def from_record(cls, record: TrialRecord, baseline: Any, objective: str) -> "TrialRow":
        """The row of a stored trial, its guard checked against the baseline's curve (`study.baseline_guard`)."""
        status = record.status or ("running" if record.running else "lost")
        bench, a = record.bench, record.assignment
        error = (record.error or "").strip().splitlines()[-1:]
        row = cls(
            number=record.number, slot=record.slot, kind=a.kind, stage=a.stage, knob=a.knob, value=a.value,
            config=dict(a.config), status=status, throughput=bench.objective if bench else None,
            window_rates=bench.throughput.window_rates if bench else (), objective=record.figure(objective),
            latency=bench.latency if bench else None, ci_rel_halfwidth=bench.throughput.ci_rel_halfwidth if bench else None,
            peak_memory_bytes=bench.peak_memory_bytes if bench else None,
            model_size_bytes=bench.model_size_bytes if bench else None,
            input_bound_frac=bench.input_bound_frac if bench else None,
            other_load_cores=bench.other_load_cores if bench else None, usable_cores=record.usable_cores,
            verdict=record.verdict, guard_losses=record.guard_losses, error=error[0] if error else None,
            worker=a.worker, reference=a.reference, pair=record.pair, accuracy=record.accuracy)
        if status == "running":
            started = f", started {record.started:%H:%M:%S}" if record.started else ""
            row = replace(row, error=f"still running in tuner {a.worker or '?'}{started}: its figure was not in when "
                                     "this was written")
        if record.slot == "baseline" and baseline.cannot_judge:
            row = replace(row, guard_cannot_judge=baseline.cannot_judge)
        verdict = check_trial_guard(baseline, record, baseline.scatter) if status == "ok" else None
        if verdict is not None:
            row = replace(row, guard="pass" if verdict.ok else "fail", guard_reason=verdict.reason)
        if record.accuracy:  # inference: the accuracy guard's verdict
            row = replace(row, guard="pass" if record.accuracy.ok else "fail", guard_reason=record.accuracy.reason)
        return row

    def with_figure(self, throughput: Objective | None, windows: Sequence[float] = (), **changes: Any) -> "TrialRow":
        """This row showing `throughput` (a pooled or an arm's figure) instead of its own measurement; the
        objective follows when the study ranks by throughput."""
        objective = throughput if self.objective is None or self.objective.name == THROUGHPUT else self.objective
        return replace(self, throughput=throughput, window_rates=tuple(windows), objective=objective, **changes)


@dataclass(frozen=True)
class AcceptedChange:
    """One accepted knob in the waterfall.

    Attributes:
        throughput: the config's figure after the change, in the study's unit.
        objective: the figure the tune ranked it by.
        step_gain: over the config before it (paired: the deciding comparison's ratio, with its 95% CI
            `step_gain_ci_low`/`_high` and `rounds`).
        speedup: cumulative, over the baseline.
        slot: the trial that measured it.
        load_note: said when other processes' load was material during its comparison.
    """

    stage: str | None
    knob: str
    value: Any
    config: Mapping[str, Any] | None
    throughput: Objective | None
    objective: Objective | None
    step_gain: float | None
    speedup: float | None
    reason: str = ""
    step_gain_ci_low: float | None = None
    step_gain_ci_high: float | None = None
    rounds: int | None = None
    mode: str | None = None
    slot: str | None = None
    peak_memory_bytes: int | None = None
    model_size_bytes: int | None = None
    latency: LatencyFigures | None = field(default=None, metadata=spec(inline="latency_"))
    accuracy: AccuracyReport | None = None
    load_note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**to_json(self), **rate_columns(self.throughput), **_score_columns(self.objective)}


@dataclass(frozen=True)
class ExportOutcome:
    """What `tune --export` wrote (`torchpace.tune.export.ExportInfo`), or why it could not.

    Attributes:
        error: why no format worked (the other fields are then unset).
    """

    path: str
    error: str | None = None
    format: str | None = None
    size_bytes: int | None = None
    max_abs_diff: float | None = None
    runtime: Mapping[str, Any] = field(default_factory=dict)
    fallback_reason: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ExportOutcome":
        return from_json(cls, data)


@dataclass(frozen=True)
class TuneOutcome:
    """What a tune found; `to_dict` is the `--json` output.

    Attributes:
        objective: what the study ranks by, `throughput` or `latency`.
        unit: the study's throughput unit: samples/s, or steps/s for a script whose samples per step are unknown.
        baseline: the defaults' row, showing the reported baseline figure.
        best: the tuned config's row, showing the reported tuned figure.
        speedup: tuned over the defaults (see `torchpace.tune.figures`).
        accepted: the waterfall of accepted changes (greedy).
        decisions: every knob the greedy policy decided.
        figures_note: how the figures are defined (`extras.figures`).
        other_load: other processes' CPU use over the trials (`extras.other_load`).
        speedup_figure: a paired study's speedup with its CI and source (`extras.speedup`).
        noise: a paired study's A/A comparison: its CI is the noise band (`extras.noise`).
        export: what `--export` wrote.
        command: script mode: the unmodified command the study tuned (`python train.py ARGS`), None for a
            Workload.
        stepwise: its strategy decided one change at a time (greedy: a waterfall of accepted changes), not the
            best trial of a search.
        script_settings: script mode: the script's own values of the knobs that reach it, which its baseline ran
            with (`ScriptInfo.script_settings`; None when not read).
        run_on: script mode: the kept config's run past the measured steps (`torchpace.trial.runon.RunOnCheck`);
            None when not run. Its `kept` is the config written.
    """

    study: str
    storage: str
    strategy: str
    workload: str
    baseline: TrialRow | None
    best_config: Mapping[str, Any]
    best: TrialRow | None
    speedup: float | None
    accepted: tuple[AcceptedChange, ...]
    trials: tuple[TrialRow, ...]
    out_path: str | None
    stopped: str
    failed_baseline: str | None = None
    guard_note: str = ""
    objective: str = THROUGHPUT
    unit: str = SAMPLES_PER_S
    decisions: tuple[ReportedDecision, ...] = ()
    figures_note: str | None = None
    other_load: OtherLoad | None = None
    speedup_figure: SpeedupFigure | None = None
    noise: ComparisonFigure | None = None
    export: ExportOutcome | None = None
    command: tuple[str, ...] | None = None
    stepwise: bool = False
    script_settings: Mapping[str, Any] | None = None
    run_on: Any = None

    @property
    def written_config(self) -> Mapping[str, Any]:
        """The config --out holds: the tuned one, less a knob the run-on check found breaking the script."""
        return self.run_on.kept if self.run_on is not None else self.best_config

    @property
    def baseline_label(self) -> str:
        """What the baseline ran, in words: the script's own settings (with them), or PyTorch's defaults."""
        label = config_label({}, bool(self.command))
        return f"{label}: {settings_text(self.script_settings)}" if self.script_settings else label

    @property
    def paired(self) -> bool:
        """Decided by paired comparisons (its speedup is a comparison's, with a CI and a source)."""
        return self.speedup_figure is not None

    def to_dict(self) -> dict[str, Any]:
        extras: dict[str, Any] = {"decisions": [d.to_dict() for d in self.decisions], "figures": self.figures_note,
                                  "other_load": to_json(self.other_load) if self.other_load else None}
        if self.paired:
            extras.update(speedup=self.speedup_figure.to_dict(), noise=to_json(self.noise) if self.noise else None)
        return {"study": self.study, "storage": self.storage, "strategy": self.strategy, "workload": self.workload,
                "objective": self.objective, "unit": self.unit,
                "baseline": self.baseline.to_dict() if self.baseline else None, "best_config": dict(self.best_config),
                "best": self.best.to_dict() if self.best else None, "speedup": self.speedup,
                "accepted": [a.to_dict() for a in self.accepted], "trials": [t.to_dict() for t in self.trials],
                "out_path": self.out_path, "stopped": self.stopped, "failed_baseline": self.failed_baseline,
                "guard_note": self.guard_note, "command": list(self.command) if self.command else None,
                "script_settings": dict(self.script_settings) if self.script_settings is not None else None, "extras": extras,
                "export": to_json(self.export) if self.export else None,
                "run_on": self.run_on.to_dict() if self.run_on is not None else None}


@dataclass(frozen=True)
class StudyMeta:
    """What an outcome says about its study besides the trials.

    Attributes:
        study, storage: the study's name and storage URL.
        strategy: greedy, tpe, random or grid.
        workload: the workload spec.
        objective: throughput or latency.
        guard_note: what the guard checked (`build_guard_note`).
        command: script mode: the unmodified command the study tuned (None for a Workload).
    """

    study: str
    storage: str
    strategy: str
    workload: str
    objective: str = THROUGHPUT
    guard_note: str = ""
    command: tuple[str, ...] | None = None


def trial_rows(study, objective: str = THROUGHPUT, scatter: bool = True) -> list[TrialRow]:
    """One row per torchpace trial of an Optuna study: slot, config, status, figures, guard verdict (by the
    study's rule, `scatter`: `policy.guard_scatter`), error."""
    records = trial_records(study.get_trials(deepcopy=False))
    base = baseline_guard(records, scatter)
    return [TrialRow.from_record(r, base, objective) for r in records]


def study_unit(rows: Sequence[TrialRow]) -> str:
    """The throughput unit of a study's trials (samples/s unless they were measured in steps/s)."""
    return next((r.throughput.unit for r in rows if r.throughput is not None), SAMPLES_PER_S)


def best_by_search(rows: Sequence[TrialRow]) -> TrialRow | None:
    """The usable trial row (ok, guard not failed) with the best objective figure."""
    usable = [r for r in rows if r.status == "ok" and r.guard != "fail" and r.objective and r.objective.score]
    return max(usable, key=lambda r: r.objective.score, default=None)


def _matching_row(rows: Sequence[TrialRow], config: Mapping[str, Any]) -> TrialRow | None:
    """The latest ok measurement of exactly `config`."""
    matches = [r for r in rows if r.status == "ok" and r.config == config and r.throughput and r.throughput.value]
    return matches[-1] if matches else None


def _row_of(rows: Sequence[TrialRow], *slots: str) -> TrialRow | None:
    """The first ok row of the first of `slots` that has one."""
    return next((r for slot in slots for r in rows if r.slot == slot and r.status == "ok"), None)


def _accepted_changes(state, rows: Sequence[TrialRow], objective: str) -> list[AcceptedChange]:
    """The waterfall: each accepted knob, its measured figure and cumulative speedup vs baseline.

    Each step's gain is measured against the incumbent as re-measured in the same stage (side by
    side in time), and the cumulative speedup is their product: a host that drifts over a long tune
    does not inflate or deflate it the way comparing the last figure with the first one would.
    """
    accepted, config, cumulative = [], {}, 1.0
    for decision in state.decisions:
        if decision.accepted_value is None:
            continue
        config = {**config, decision.knob: decision.accepted_value}
        row = next((r for r in rows if r.slot == f"cand:{decision.knob}={decision.accepted_value}"), None)
        step_gain = decision.best_figure / decision.incumbent_figure
        cumulative *= step_gain
        accepted.append(_change(decision, row, config, decision.best_figure, objective, study_unit(rows),
                                step_gain=step_gain, speedup=cumulative))
    return accepted


def _change(decision, row: TrialRow | None, config: Mapping[str, Any], score: float, objective: str, unit: str,
            **figures: Any) -> AcceptedChange:
    """An accepted change measured by `row` at the policy's figure `score` (its throughput, when the study
    ranks by throughput; else its measured throughput beside the objective)."""
    throughput = row.throughput if row else None
    ranked = row.objective if row else None
    if objective == THROUGHPUT:
        throughput = at_score(throughput, score) if throughput else Objective(THROUGHPUT, unit, score)
        ranked = throughput
    else:
        ranked = at_score(ranked, score)
    return AcceptedChange(
        stage=decision.stage, knob=decision.knob, value=decision.accepted_value,
        config=(row.config if row else None) or config, throughput=throughput, objective=ranked,
        reason=decision.reason, slot=row.slot if row else None, peak_memory_bytes=row.peak_memory_bytes if row else None,
        model_size_bytes=row.model_size_bytes if row else None, latency=row.latency if row else None,
        accuracy=row.accuracy if row else None, **figures)


def build_guard_note(guard_steps: int, accuracy: tuple[int, float, float] | None = None) -> str:
    """What the guard checked: the loss guard over `guard_steps` steps, or for an inference workload the
    accuracy guard (`accuracy` = batches compared, relative tolerance, minimal top-1 agreement)."""
    if accuracy is not None:
        batches, rtol, top1 = accuracy
        return ACCURACY_NOTE.format(n=batches, rtol=rtol, top1=top1)
    return GUARD_NOTE.format(n=guard_steps)


def build_outcome(rows: Sequence[TrialRow], state: Any, meta: StudyMeta, stopped: str) -> TuneOutcome:
    """The TuneOutcome of a study's trials (pure).

    Args:
        rows: `trial_rows(study, meta.objective)`.
        state: the strategy's replay of the study (greedy's `GreedyState`), None for a search that decides
            nothing step by step.
        meta: the study's name, storage, strategy, workload, objective and guard note.
        stopped: why the tune stopped (done, budget, interrupted, stored...).
    """
    rows = tuple(rows)
    if state is not None and state.paired:
        return _build_paired_outcome(rows, state, meta, stopped)
    objective = meta.objective
    baseline = _row_of(rows, "baseline")
    accepted: list[AcceptedChange] = []
    failed_baseline = None
    decisions: tuple[ReportedDecision, ...] = ()
    if state is not None:
        failed_baseline = state.failed_baseline
        best_config = dict(state.incumbent)
        best = _matching_row(rows, best_config) if baseline else None
        if best is not None and state.incumbent_figure:
            figure = state.incumbent_figure
            best = replace(best, objective=at_score(best.objective, figure),
                           throughput=at_score(best.throughput, figure) if objective == THROUGHPUT else best.throughput)
        if baseline:
            accepted = _accepted_changes(state, rows, objective)
        decisions = tuple(ReportedDecision(d) for d in state.decisions)
    else:
        best = best_by_search(rows)
        best_config = dict(best.config) if best else {}
    if baseline is None and failed_baseline is None:
        failed_baseline = baseline_not_measured(rows)
    speedup = None
    if best and baseline and objective == THROUGHPUT:
        baseline, best, accepted = _pooled_figures(rows, baseline, best, accepted)
        speedup = figure_speedup(best.throughput, baseline.throughput)
    elif best and baseline:
        speedup = accepted[-1].speedup if accepted else (figure_speedup(best.objective, baseline.objective) if best_config
                                                         else 1.0)
    unit = study_unit(rows)
    return TuneOutcome(
        study=meta.study, storage=meta.storage, strategy=meta.strategy, workload=meta.workload,
        baseline=baseline, best_config=best_config, best=best if baseline else None, speedup=speedup,
        accepted=tuple(accepted), trials=rows, out_path=None, stopped=stopped, failed_baseline=failed_baseline,
        guard_note=_guard_note(meta, baseline), objective=objective, unit=unit, decisions=decisions,
        figures_note=figures_note(unit) if objective == THROUGHPUT else None, other_load=other_load_summary(rows),
        command=meta.command, stepwise=state is not None, script_settings=_script_settings(state, meta),
    )


def _script_settings(state: Any, meta: StudyMeta) -> Mapping[str, Any] | None:
    """A script study's baseline settings, as the policy replayed them (None for a Workload or when not read)."""
    return (state.script_settings or None) if state is not None and meta.command else None


def _guard_note(meta: StudyMeta, baseline: TrialRow | None) -> str:
    return " ".join(filter(None, [meta.guard_note, baseline.guard_cannot_judge if baseline else None]))


def _pooled_figures(rows: Sequence[TrialRow], baseline: TrialRow, best: TrialRow,
                    accepted: list[AcceptedChange]) -> tuple[TrialRow, TrialRow, list[AcceptedChange]]:
    """Baseline, tuned and every accepted change with the figures of `torchpace.tune.figures`: each config's
    pooled windows, step gain = its figure / the previous row's, speedup = its figure / the baseline's."""
    baseline, best = _pooled_row(baseline, rows), _pooled_row(best, rows)
    previous, changes = baseline.throughput, []
    for change in accepted:
        pooled = config_figure(rows, change.config or {})
        figure = pooled.figure if pooled else change.throughput
        changes.append(replace(change, throughput=figure, objective=figure, step_gain=figure_speedup(figure, previous),
                               speedup=figure_speedup(figure, baseline.throughput)))
        previous = figure
    return baseline, best, changes


def _pooled_row(row: TrialRow, rows: Sequence[TrialRow]) -> TrialRow:
    """`row` (one trial of a config) showing the config's pooled figure."""
    pooled = config_figure(rows, row.config or {})
    return row.with_figure(pooled.figure, row.window_rates, ci_rel_halfwidth=pooled.figure.ci_rel_halfwidth) if pooled else row


_NOT_A_VERDICT = ("budget", "interrupted", "lost", "running", "partner")  # statuses that say nothing of the config


def baseline_not_measured(rows: Sequence[TrialRow]) -> str | None:
    """Why a study has no baseline figure, when it tried one: a failure of the baseline, or that it was cut
    (by the budget, an interrupt, a lost tuner) before it finished, which `--resume` measures again."""
    tried = [r for r in rows if r.slot == "baseline"]
    if not tried:
        return None
    failed = [r for r in tried if r.status not in _NOT_A_VERDICT and r.status != "ok"]
    if failed:
        return f"the baseline trial failed ({failed[-1].status}); nothing to compare against"
    return (f"the baseline was not measured: it was cut before it finished ({tried[-1].status}); "
            "`torchpace tune --resume` with the same --study measures it")


def _build_paired_outcome(rows: Sequence[TrialRow], state: Any, meta: StudyMeta, stopped: str) -> TuneOutcome:
    """The outcome of a study decided by paired comparisons (see `torchpace.tune.figures`)."""
    baseline = _row_of(rows, "baseline")
    usable_cores = max((r.usable_cores or 1 for r in rows), default=1)
    decisions = tuple(ReportedDecision(d, _decision_note(d, rows, usable_cores)) for d in state.decisions)
    accepted = _paired_changes(decisions, rows, meta.objective) if baseline else []
    # the final comparison of the incumbent (`final`, or `final:N` after a resume decided more knobs)
    final = next((r for r in reversed(rows) if is_final_slot(r.slot) and r.status == "ok" and comparison(r.pair)
                  and r.config == dict(state.incumbent)), None)
    best = baseline
    speedup = paired_speedup(final.pair if final else None, [a.step_gain for a in accepted])
    if baseline and final:
        baseline = _reference_arm(baseline, final.pair, meta.objective)
        best = final
    elif baseline and accepted:
        last = accepted[-1]
        row = next((r for r in rows if r.slot == last.slot), baseline)
        best = replace(row, throughput=last.throughput, objective=last.objective)
    if baseline:  # each figure shown with the range of every measurement of its config
        nothing_kept = best is baseline
        baseline = _ranged(baseline, rows)
        best = baseline if nothing_kept else _ranged(best, rows)
    if final:
        knobs = list(state.incumbent)
        speedup = replace(speedup, load_note=load_note(final.pair.other_load_cores, usable_cores, knobs)
                          or host_change_note([final], rows, knobs, "the defaults"))
    noise = _row_of(rows, "noise")
    unit = study_unit(rows)
    return TuneOutcome(
        study=meta.study, storage=meta.storage, strategy=meta.strategy, workload=meta.workload, baseline=baseline,
        best_config=dict(state.incumbent), best=best if baseline else None,
        speedup=speedup.value if baseline else None, accepted=tuple(accepted), trials=tuple(rows), out_path=None,
        stopped=stopped, failed_baseline=state.failed_baseline or (None if baseline else baseline_not_measured(rows)),
        guard_note=_guard_note(meta, baseline), objective=meta.objective, unit=unit, decisions=decisions,
        figures_note=paired_figures_note(unit), other_load=other_load_summary(rows), speedup_figure=speedup,
        noise=comparison(noise.pair) if noise else None, command=meta.command, stepwise=True,
        script_settings=_script_settings(state, meta),
    )


def _deciding_slots(knob: str, value: Any) -> tuple[str, ...]:
    """The slots of the comparisons that judged `knob = value`, the one that decides first: a value kept over the
    one kept just before it (revision 4) was decided by their duel, else by its confirmation, else its comparison."""
    return tuple(f"{kind}:{knob}={value}" for kind in ("duel", "confirm-pair", "pair"))


def _decision_note(decision: Decision, rows: Sequence[TrialRow], usable_cores: int) -> str | None:
    """The note beside a paired decision: other processes' load when it was material during the deciding comparison,
    else a host that changed during one of the comparisons of the value judged (`host_change_note`)."""
    slots = _deciding_slots(decision.knob, decision.value)
    deciding = [r for r in rows if r.slot in slots and r.status == "ok"] if decision.value is not None else []
    return (load_note(decision.other_load_cores, usable_cores, [decision.knob])
            or host_change_note(deciding, rows, [decision.knob]))


def _paired_changes(decisions: Sequence[ReportedDecision], rows: Sequence[TrialRow], objective: str) -> list[AcceptedChange]:
    """The waterfall of a paired study: each accepted knob with its deciding comparison's ratio (the step's
    gain, with its CI) and the product of the steps so far."""
    changes, cumulative = [], 1.0
    for reported in decisions:
        decision = reported.decision
        if decision.accepted_value is None:
            continue
        value = decision.accepted_value
        row = _row_of(rows, *_deciding_slots(decision.knob, value))
        cumulative *= decision.ratio
        changes.append(_change(decision, row, {}, decision.best_figure, objective, study_unit(rows), step_gain=decision.ratio,
                               step_gain_ci_low=decision.ratio_ci_low, step_gain_ci_high=decision.ratio_ci_high,
                               rounds=decision.rounds, mode=decision.mode, speedup=cumulative,
                               load_note=reported.load_note))
    return changes


def _ranged(row: TrialRow, rows: Sequence[TrialRow]) -> TrialRow:
    """`row` showing its figure with the interval of `config_range`: every measurement of its config."""
    if row.throughput is None:
        return row
    ranged = config_range(row.throughput, rows, row.config or {})
    return row.with_figure(ranged.figure, row.window_rates, ci_rel_halfwidth=ranged.figure.ci_rel_halfwidth,
                           measurements=ranged.measurements)


def _reference_arm(baseline: TrialRow, pair: PairRecord, objective: str) -> TrialRow:
    """The baseline row showing the figures of the final comparison's reference arm (A, the defaults)."""
    bench = pair.reference_bench
    if bench is None:
        return baseline
    ranked = at_score(bench.objective_for(objective), pair.reference_value)
    row = baseline.with_figure(bench.objective, bench.throughput.window_rates,
                               ci_rel_halfwidth=bench.throughput.ci_rel_halfwidth, peak_memory_bytes=bench.peak_memory_bytes,
                               latency=bench.latency, model_size_bytes=bench.model_size_bytes)
    return replace(row, objective=ranked if objective == LATENCY else row.objective)
