"""The terminal summary of a tune accounts for the knobs it tried and did not keep, with why, and says
every figure in its unit."""

from dataclasses import replace

import pytest
from rich.console import Console

from torchpace.measure.result import BenchResult, Objective, StepShape, ThroughputFigures
from torchpace.tune.attrs import PairRecord
from torchpace.tune.figures import ReportedDecision, result_table
from torchpace.tune.outcome import TrialRow, TuneOutcome
from torchpace.tune.policy import Decision
from torchpace.tune.render import ratio_text, render_outcome


def _outcome(**kw) -> TuneOutcome:
    fields = dict(study="s", storage="sqlite://", strategy="greedy", workload="w", baseline=None, best_config={},
                  best=None, speedup=None, accepted=(), trials=(), out_path=None, stopped="done")
    return TuneOutcome(**{**fields, **kw})


def _render(outcome: TuneOutcome) -> str:
    console = Console(record=True, width=200)
    render_outcome(console, outcome)
    return console.export_text()


def test_the_summary_lists_each_knob_not_kept_with_its_reason():
    decisions = (
        Decision("data", "data.num_workers", 2, None, None, 0.01, "accepted: +40.0%, over twice the noise"),
        Decision("compute", "optimizer.impl", None, None, None, 0.01, "rejected: best optimizer.impl=foreach gives -3.0%, no faster"),
        Decision("system", "threads.intra_op", None, None, None, 0.01, "rejected: every value failed or failed the guard"),
    )
    text = _render(_outcome(decisions=tuple(ReportedDecision(d) for d in decisions)))
    assert "knobs tried and not kept" in text
    assert "optimizer.impl" in text and "gives -3.0%, no faster" in text
    assert "threads.intra_op" in text and "every value failed" in text
    assert "data.num_workers" not in text  # accepted: it belongs to the waterfall, not here


def test_a_study_measured_in_steps_per_s_never_says_samples_per_s():
    def row(slot, config, value):
        return TrialRow(number=0, slot=slot, config=config, throughput=Objective("throughput", "steps/s", value, value * 0.98,
                                                                                 value * 1.02))
    baseline, best = row("baseline", {}, 7.8), row("cand:data.num_workers=2", {"data.num_workers": 2}, 9.9)
    text = _render(_outcome(strategy="random", baseline=baseline, best=best, best_config={"data.num_workers": 2},
                            speedup=9.9 / 7.8, trials=(baseline, best), unit="steps/s", figures_note="F"))
    assert "steps/s [95% CI]" in text and "samples" not in text
    assert "9.9 / 7.8 steps/s" in text and "7.8 [7.6, 8.0]" in text  # the digits the CI supports


def _row(number, slot, config, figure, *, pair=None, reference=None, knob=None, value=None, stage=None, status="ok"):
    """A trial row as `tune.outcome.trial_rows` makes it."""
    return TrialRow(number=number, slot=slot, kind="candidate" if knob else "baseline", stage=stage, knob=knob, value=value,
                    config=config, status=status, throughput=_figure(figure), window_rates=(figure,) * 6,
                    objective=_figure(figure), ci_rel_halfwidth=0.02, peak_memory_bytes=2**28,
                    guard="pass" if knob else None, other_load_cores=0.1, usable_cores=2, reference=reference, pair=pair)


def _figure(value, spread=0.02):
    return Objective("throughput", "samples/s", value, value * (1 - spread), value * (1 + spread), spread)


def _pair(ratios, reference_figure, load=0.1, mode="alternating"):
    ordered = sorted(ratios)
    reference = BenchResult(workload="w", config={}, device="cpu", step=StepShape(32), peak_memory_bytes=2**28,
                            peak_memory_kind="cpu_peak_rss", wall_time_s=1.0, throughput=ThroughputFigures(
                                samples_per_s=reference_figure, samples_per_s_ci_low=reference_figure * 0.97,
                                samples_per_s_ci_high=reference_figure * 1.03, samples_per_s_iqr=1.0, ci_rel_halfwidth=0.03,
                                noise_warning=False, step_time_s=0.01, windows=6, measured_steps=60,
                                window_samples_per_s=(reference_figure,) * 6, warmup_s=0.1, warmup_steps=5,
                                warmup_converged=True, stopped_by="pair"))
    return PairRecord(mode=mode, ratios=tuple(ratios), ratio=ordered[len(ordered) // 2], ratio_ci_low=ordered[0],
                      ratio_ci_high=ordered[-1], rounds=len(ratios), other_load_a=load, other_load_b=load,
                      reference_status="ok", reference_value=reference_figure, reference_bench=reference)


def test_a_paired_study_shows_each_gain_with_its_ci_the_load_note_and_the_speedup_from_the_final_comparison():
    from torchpace.tune.outcome import StudyMeta, build_outcome
    from torchpace.tune.policy import Record, plan_greedy
    from torchpace.tune.space import KnobSpace

    one_thread = {"threads.intra_op": 1}
    rows = [_row(0, "baseline", {}, 1000.0),
            _row(1, "noise", {}, 1010.0, pair=_pair([0.99, 1.0, 1.01], 1000.0), reference={}),  # 3 rounds: a 75% CI
            _row(2, "pair:threads.intra_op=1", one_thread, 3000.0, knob="threads.intra_op", value=1, stage="system",
                 pair=_pair([2.9, 3.0, 3.1, 3.05, 2.95, 3.0], 1000.0, load=1.4), reference={}),
            _row(3, "final", one_thread, 2900.0, pair=_pair([2.8, 2.9, 3.0, 2.85, 2.95, 2.9], 1000.0, load=1.4),
                 reference={})]
    records = [Record("baseline", {}, figure=1000.0, windows=8, warmup_converged=True),
               *(Record(r.slot, dict(r.config), figure=r.throughput.value, reference={}, ratios=r.pair.ratios,
                        reference_figure=1000.0, warmup_converged=True, reference_warmup_converged=True,
                        mode="alternating", other_load_cores=r.pair.other_load_a) for r in rows[1:])]
    state = plan_greedy([KnobSpace("system", "threads.intra_op", "auto", ("auto", 1))], records)
    assert state.done and state.incumbent == one_thread
    outcome = build_outcome(rows, state, StudyMeta("s", "sqlite://", "greedy", "tabular"), "done")
    text = _render(outcome)
    # the same study of a script: its baseline's own settings are the outcome's, said with the baseline
    own = {"data.num_workers": 2}
    script_state = plan_greedy([KnobSpace("system", "threads.intra_op", "auto", ("auto", 1))],
                               [replace(records[0], script_settings=own), *records[1:]])
    script = build_outcome(rows, script_state, StudyMeta("s", "sqlite://", "greedy", "train.py",
                                                         command=("python", "train.py")), "done")
    assert script.script_settings == own and script.to_dict()["script_settings"] == own
    assert result_table(script)["baseline_settings"] == own and "baseline_settings" not in result_table(outcome)
    assert "baseline (the script's own settings: num_workers=2)" in _render(script)
    assert "+ threads.intra_op = 1" in text and "3.00x [2.90, 3.10], 6 rounds" in text
    assert ("threads.intra_op = 1 was measured while other processes used 1.4 of 2 cores; gains of threads.intra_op "
            "may not hold on a quiet host") in text
    assert "threads.intra_op=1  ->  2.90x [2.80, 3.00], 6 rounds the defaults" in text
    assert "the tuned config compared with the defaults in alternation" in text
    assert "noise: the defaults compared with themselves gave 1.00x [0.99, 1.01], 3 rounds (75% CI)" in text
    assert outcome.speedup == 2.9 and outcome.baseline.throughput.value == 1000.0  # the final comparison's arms
    assert outcome.best.throughput.value == 2900.0
    assert outcome.to_dict()["baseline"]["samples_per_s"] == 1000.0 and outcome.to_dict()["best"]["samples_per_s"] == 2900.0
    # each shown with the range of every measurement of its config: the defaults' baseline trial, both arms of
    # the A/A comparison, and the reference arm of both comparisons with them; the tuned config's two arms B
    base, best = outcome.baseline, outcome.best
    assert (base.measurements, base.throughput.ci_low, base.throughput.ci_high) == pytest.approx((5, 970.0, 1010.0 * 1.02))
    assert (best.measurements, best.throughput.ci_low, best.throughput.ci_high) == pytest.approx((2, 2900.0 * 0.98, 3000.0 * 1.02))
    assert "1,000 [970, 1,030] (range of 5 measurements)" in text
    assert "tuned, compared with the defaults │ 2,900 [2,842, 3,060] (range of 2 measurements)" in text
    table = result_table(outcome)
    assert (table["baseline_measurements"], table["tuned_measurements"]) == (5, 2)
    assert (table["tuned_ci_low"], table["tuned_ci_high"]) == (best.throughput.ci_low, best.throughput.ci_high)
    assert outcome.to_dict()["best"]["measurements"] == 2


@pytest.mark.parametrize("paired", [True, False], ids=["paired", "separate runs"])
@pytest.mark.parametrize("cut", ["interrupted", "budget", "lost"])
def test_a_baseline_cut_before_it_finished_is_not_called_failed(cut, paired):
    from torchpace.tune.outcome import StudyMeta, build_outcome
    from torchpace.tune.policy import RETRY, Record, plan_greedy
    from torchpace.tune.space import KnobSpace

    space = [KnobSpace("system", "threads.intra_op", "auto", ("auto", 1))]
    state = plan_greedy(space, [Record("baseline", {}, state=RETRY, status=cut)], paired=paired)
    assert state.failed_baseline is None and state.next is not None and state.next.slot == "baseline"  # run again
    rows = [replace(_row(0, "baseline", {}, 1000.0, status=cut), throughput=None, objective=None, window_rates=())]
    outcome = build_outcome(rows, state, StudyMeta("s", "sqlite://", "greedy", "tabular"), cut)
    assert "failed" not in outcome.failed_baseline and f"cut before it finished ({cut})" in outcome.failed_baseline
    assert "--resume" in outcome.failed_baseline
    assert "the baseline trial failed" not in _render(outcome)
    crashed = [Record("baseline", {}, status="crash"), *([] if paired else [Record("baseline#2", {}, status="crash")])]
    crashed = plan_greedy(space, crashed, paired=paired)  # a verdict on the config
    assert crashed.failed_baseline == "the baseline trial failed (crash); nothing to compare against"


def test_a_ratio_on_fewer_rounds_than_a_95_percent_ci_needs_names_the_coverage_it_has():
    assert ratio_text(2.37, 0.39, 4.35, 2) == "2.37x [0.39, 4.35], 2 rounds (50% CI)"
    assert ratio_text(1.32, 1.25, 1.40, 6) == "1.32x [1.25, 1.40], 6 rounds"
    assert ratio_text(1.32, None, None, 2) == "1.32x, 2 rounds" and ratio_text(None, None, None) == "-"


def test_a_script_tunes_baseline_is_said_to_be_its_own_settings_not_pytorch_defaults():
    """A tune of `train.py --workers 2`: its baseline ran the script's own loader and optimizer settings, and says
    them; a tune that kept nothing leaves the script's own settings, not "PyTorch defaults"."""
    figure = Objective("throughput", "samples/s", 100.0, 98.0, 102.0, 0.02)
    baseline = TrialRow(number=0, slot="baseline", kind="baseline", throughput=figure, objective=figure)
    own = {"data.num_workers": 2, "data.persistent_workers": False, "optimizer.impl": "default"}
    outcome = _outcome(strategy="random", baseline=baseline, best=baseline, speedup=1.0, trials=(baseline,),
                       command=("python", "train.py", "--workers", "2"), script_settings=own)
    text = _render(outcome)
    assert outcome.baseline_label == ("the script's own settings: num_workers=2, persistent_workers=False, "
                                      "optimizer.impl=default")
    assert "baseline (the script's own settings: num_workers=2" in text
    assert "the script's own settings (nothing beat the noise)" in text and "PyTorch defaults" not in text
    assert outcome.to_dict()["script_settings"] == own
    workload = _render(replace(outcome, command=None, script_settings=None))
    assert "baseline (PyTorch defaults)" in workload


def test_a_run_on_failure_names_the_knob_taken_back_in_the_summary_the_toml_and_the_json():
    from torchpace.trial.runon import FAILED, PAST, RunOn, RunOnCheck

    config = {"threads.intra_op": 1, "model.channels_last": True}
    failed = RunOn(FAILED, 4.2, ("eval at train.py:47",), error="exit status 1; its last output lines:\n  | Traceback\n"
                   "  | RuntimeError: view size is not compatible [with] input", config=config)
    check = RunOnCheck(failed, {"threads.intra_op": 1}, culprit="model.channels_last",
                       runs=(failed, RunOn(PAST, 3.0), RunOn(FAILED, 4.0), RunOn(PAST, 3.1)))
    row = TrialRow(number=0, slot="baseline", config={}, throughput=Objective("throughput", "samples/s", 10.0, 9.8, 10.2))
    outcome = _outcome(baseline=row, best=row, best_config=config, speedup=1.0, command=("python", "train.py"), run_on=check)
    text = _render(outcome)
    assert "run past the measured steps: the script failed after 4 s (eval at train.py:47): exit status 1" in text
    assert "RuntimeError: view size is not compatible [with] input" in text  # the script's words, not rich markup
    assert "model.channels_last is taken back" in text and "written config: {'threads.intra_op': 1}" in text
    assert outcome.written_config == {"threads.intra_op": 1} and outcome.best_config == config  # measured vs written
    table = result_table(outcome)
    assert table["run_on"] == FAILED and table["run_on_taken_back"] == "model.channels_last"
    dumped = outcome.to_dict()["run_on"]
    assert dumped["culprit"] == "model.channels_last" and dumped["kept"] == {"threads.intra_op": 1}
    assert [r["status"] for r in dumped["runs"]] == [FAILED, PAST, FAILED, PAST]


def test_a_tune_without_a_run_on_writes_the_config_it_measured():
    outcome = _outcome(best_config={"data.num_workers": 2})
    assert outcome.written_config == {"data.num_workers": 2} and outcome.to_dict()["run_on"] is None
    assert "run past the measured steps" not in _render(outcome)
