"""The one definition of the reported figures, on trial rows (pure)."""

from dataclasses import replace

import pytest

from torchpace.measure.result import Objective
from torchpace.tune.attrs import PairRecord
from torchpace.tune.figures import (SPEEDUP_FROM_FINAL, SPEEDUP_FROM_STEPS, RangeFigure, at_score, config_figure,
                                    config_measurements, config_range, load_note, other_load_summary, paired_speedup,
                                    range_name, result_table, speedup)
from torchpace.tune.outcome import TrialRow, TuneOutcome, _pooled_row


def row(config, windows, status="ok", guard="pass", unit="samples/s", **kw):
    median = sorted(windows)[len(windows) // 2]
    return TrialRow(number=0, slot="s", config=config, status=status, guard=guard,
                    throughput=Objective("throughput", unit, median), window_rates=tuple(windows), **kw)


ROWS = [row({}, [100.0, 104.0, 98.0, 101.0, 99.0, 103.0]), row({}, [90.0, 92.0, 91.0, 93.0, 89.0, 94.0]),
        row({"data.num_workers": 2}, [150.0, 148.0, 152.0, 149.0, 151.0, 153.0]),
        row({"data.num_workers": 2}, [900.0], status="crash"), row({"data.num_workers": 2}, [5000.0], guard="fail")]


def outcome(baseline, best, ratio, **kw):
    return TuneOutcome(study="s", storage="sqlite://", strategy="random", workload="w", baseline=baseline, best_config={},
                       best=best, speedup=ratio, accepted=(), trials=(), out_path=None, stopped="done", **kw)


def test_a_configs_figure_pools_the_windows_of_its_usable_trials_and_lies_in_its_ci():
    base = config_figure(ROWS, {})
    assert base.trials == 2 and base.windows == 12
    assert base.figure.value == pytest.approx(96.0)  # the median of the 12 pooled windows
    assert base.figure.ci_low <= base.figure.value <= base.figure.ci_high and base.figure.unit == "samples/s"
    tuned = config_figure(ROWS, {"data.num_workers": 2})
    assert tuned.trials == 1  # the crashed and the guard-failed trials do not count
    assert config_figure(ROWS, {"data.num_workers": 1}) is None


def test_the_speedup_is_the_ratio_of_the_two_figures_shown_and_the_toml_holds_the_same():
    baseline, best = _pooled_row(ROWS[0], ROWS), _pooled_row(ROWS[2], ROWS)
    assert baseline.throughput == config_figure(ROWS, {}).figure != ROWS[0].throughput
    ratio = speedup(best.throughput, baseline.throughput)
    assert ratio == best.throughput.value / baseline.throughput.value
    table = result_table(outcome(baseline, best, ratio, figures_note="F", other_load=other_load_summary(ROWS)))
    assert table["speedup"] == table["tuned_samples_per_s"] / table["baseline_samples_per_s"]
    assert table["tuned_ci_low"] <= table["tuned_samples_per_s"] <= table["tuned_ci_high"] and table["figures"] == "F"
    assert table["unit"] == "samples/s"
    assert "other_load_cores" not in table  # no trial recorded it: nothing to say (and TOML has no null)


def test_the_toml_lists_every_decision_those_no_comparison_judged_too():
    from torchpace.tune.figures import ReportedDecision
    from torchpace.tune.policy import Decision

    baseline, best = _pooled_row(ROWS[0], ROWS), _pooled_row(ROWS[2], ROWS)
    kept = Decision("data", "data.num_workers", 2, 96.0, 151.0, 0.01, "accepted: 1.57x", value=2, ratio=1.57,
                    ratio_ci_low=1.5, ratio_ci_high=1.6, rounds=6)
    guard = Decision("compute", "model.channels_last", None, None, None, 0.01,
                     "rejected: every value failed the convergence guard")
    table = result_table(outcome(baseline, best, 1.57, decisions=(ReportedDecision(kept), ReportedDecision(guard))))
    assert [d["knob"] for d in table["decisions"]] == ["data.num_workers", "model.channels_last"]
    assert table["decisions"][1] == {"knob": "model.channels_last", "kept": False, "rounds": 0,
                                     "reason": "rejected: every value failed the convergence guard"}  # TOML has no null


def test_a_study_measured_in_steps_per_s_names_its_figures_so_in_the_toml_and_the_json():
    steps = [row({}, [7.8, 8.0, 8.1], unit="steps/s"), row({"data.num_workers": 2}, [9.9, 10.0, 10.2], unit="steps/s")]
    baseline, best = _pooled_row(steps[0], steps), _pooled_row(steps[1], steps)
    table = result_table(outcome(baseline, best, speedup(best.throughput, baseline.throughput)))
    assert table["unit"] == "steps/s" and table["baseline_steps_per_s"] == pytest.approx(8.0)
    assert table["tuned_steps_per_s"] == pytest.approx(10.0)
    assert not any("samples" in key for key in table)
    shown = best.to_dict()
    assert shown["steps_per_s"] == pytest.approx(10.0) and shown["samples_per_s"] is None
    assert shown["window_steps_per_s"] == [9.9, 10.0, 10.2] and shown["window_samples_per_s"] == []
    assert shown["throughput"]["unit"] == "steps/s"


def test_other_load_over_the_trials_is_said_when_any_trial_saw_it_material():
    quiet = [row({}, [1.0], other_load_cores=0.1, usable_cores=2), row({}, [1.0], other_load_cores=0.2, usable_cores=2)]
    assert other_load_summary(quiet).note is None
    busy = [*quiet, row({}, [1.0], other_load_cores=1.9, usable_cores=2)]
    summary = other_load_summary(busy)
    assert summary.median_cores == 0.2 and summary.max_cores == 1.9 and summary.trials == 3
    assert summary.note == ("tuned while other processes used 0.2 of 2 cores (median over 3 trials, up to 1.9): "
                            "the result reflects that contention")


def test_a_decision_taken_under_material_load_names_the_knobs_whose_gains_depend_on_free_cores():
    assert load_note(0.3, 2, ["threads.intra_op"]) is None  # under half a core: nothing to say
    assert load_note(1.4, 2, ["threads.intra_op"]) == (
        "measured while other processes used 1.4 of 2 cores; gains of threads.intra_op may not hold on a quiet host")
    assert load_note(1.4, 2, ["precision.amp"]) == (
        "measured while other processes used 1.4 of 2 cores: the ratio reflects that contention")
    assert load_note(None, 2, ["data.num_workers"]) is None  # unread


def test_the_speedup_of_a_paired_study_is_the_final_comparison_else_the_product_of_its_steps():
    final = PairRecord(ratio=1.3, ratio_ci_low=1.25, ratio_ci_high=1.36, rounds=12, mode="alternating")
    speedup_figure = paired_speedup(final, [1.2, 1.1])
    assert speedup_figure.to_dict() == {"speedup": 1.3, "speedup_ci_low": 1.25, "speedup_ci_high": 1.36,
                                        "speedup_rounds": 12, "speedup_from": SPEEDUP_FROM_FINAL,
                                        "speedup_mode": "alternating", "load_note": None}
    cut = paired_speedup(None, [1.2, 1.1])
    assert cut.value == pytest.approx(1.32) and cut.ci_low is None and cut.source == SPEEDUP_FROM_STEPS
    assert paired_speedup(None, []).value == 1.0


def test_a_latency_at_its_own_score_reads_the_same_and_at_another_score_is_its_inverse():
    p50 = 2.3224998585646972e-05  # 1 / (1 / p50) differs from it in the last digit
    figure = Objective("latency", "s", p50, 2.3e-05, 2.4e-05, 0.002)
    assert 1.0 / (1.0 / p50) != p50
    assert at_score(figure, figure.score) == figure
    moved = at_score(figure, 50_000.0)
    assert moved.value == pytest.approx(2e-05) and moved.ci_low == figure.ci_low
    rate = Objective("throughput", "samples/s", 100.0, 90.0, 110.0, 0.1)
    assert at_score(rate, 120.0).value == 120.0 and at_score(rate, None) == rate


def test_a_value_kept_over_the_one_kept_before_it_is_a_step_of_its_own_read_from_their_duel():
    from torchpace.tune.figures import ReportedDecision
    from torchpace.tune.outcome import _paired_changes
    from torchpace.tune.policy import Decision

    def trial(slot, config, sps):
        return TrialRow(number=0, slot=slot, config=config, status="ok", guard="pass",
                        throughput=Objective("throughput", "samples/s", sps), window_rates=(sps,))

    rows = [trial("pair:data.num_workers=1", {"data.num_workers": 1}, 120.0),
            trial("pair:data.num_workers=2", {"data.num_workers": 2}, 101.0),
            trial("duel:data.num_workers=2", {"data.num_workers": 2}, 133.0)]
    kept = [Decision("data", "data.num_workers", 1, 100.0, 120.0, 0.01, "accepted: ...", value=1, ratio=1.2,
                     ratio_ci_low=1.1, ratio_ci_high=1.3, rounds=6),
            Decision("data", "data.num_workers", 2, 120.0, 133.0, 0.01, "accepted: ... head to head", value=2, ratio=1.1,
                     ratio_ci_low=1.05, ratio_ci_high=1.15, rounds=7)]
    steps = _paired_changes([ReportedDecision(d) for d in kept], rows, "throughput")
    assert [(s.value, s.slot) for s in steps] == [(1, "pair:data.num_workers=1"), (2, "duel:data.num_workers=2")]
    assert [s.step_gain for s in steps] == [1.2, 1.1] and steps[1].speedup == pytest.approx(1.32)


def test_a_configs_range_spans_every_usable_measurement_of_it_and_keeps_the_shown_value():
    from test_tune_render import _pair

    def arm(config, value, low, high, **kw):
        return TrialRow(number=0, slot="s", config=config, throughput=Objective("throughput", "samples/s", value, low, high),
                        **kw)

    one = {"threads.intra_op": 1}
    failed_reference = replace(_pair([1.0] * 6, 50.0), reference_status="crash")
    rows = [arm({}, 100.0, 98.0, 102.0),  # the baseline alone
            arm(one, 300.0, 290.0, 310.0, reference={}, pair=_pair([3.0] * 6, 100.0)),  # its reference arm: 97-103
            arm(one, 900.0, 880.0, 920.0, guard="fail"),  # the guard failed: not a figure of the config
            arm(one, 10.0, 9.0, 11.0, status="crash"),
            arm({"x": 1}, 1.0, 0.5, 1.5, reference=one, pair=failed_reference),  # the reference arm crashed
            arm(one, 280.0, 270.0, 320.0, reference={}, pair=_pair([2.8] * 6, 100.0))]
    assert [f.value for f in config_measurements(rows, one)] == [300.0, 280.0]
    shown = rows[-1].throughput
    ranged = config_range(shown, rows, one)
    assert (ranged.measurements, ranged.figure.value, ranged.figure.ci_low, ranged.figure.ci_high) == (2, 280.0, 270.0, 320.0)
    assert ranged.figure.ci_rel_halfwidth == pytest.approx(25.0 / 280.0)
    defaults = config_range(rows[0].throughput, rows, {})  # the baseline and two reference arms (97-103 each)
    assert (defaults.measurements, defaults.figure.ci_low, defaults.figure.ci_high) == pytest.approx((3, 97.0, 103.0))
    # a figure that is none of the measurements (a latency at another score) is spanned too; one without a CI alone
    other = Objective("throughput", "samples/s", 400.0, 390.0, 410.0)
    assert config_range(other, rows, one).measurements == 3 and config_range(other, rows, one).figure.ci_high == 410.0
    alone = config_range(other, [], {"y": 2})
    assert (alone.measurements, alone.figure.ci_low, alone.figure.ci_high) == (1, 390.0, 410.0)
    assert config_range(Objective("throughput", "samples/s", 5.0), [], {}) == RangeFigure(Objective("throughput", "samples/s", 5.0), 0)
    assert range_name(1) == "range of 1 measurement" and range_name(4) == "range of 4 measurements"


def test_a_decision_on_threads_whose_incumbent_ran_far_off_its_other_measurements_says_the_host_changed():
    """No other process's load, but the incumbent's arm in the deciding comparison ran at 0.6 of its other
    measurements (a VM's cores slowed by other tenants slow two threads, not one): the gain may not hold."""
    from test_tune_render import _pair
    from torchpace.tune.figures import host_change_note
    from torchpace.tune.outcome import _decision_note
    from torchpace.tune.policy import Decision

    def row(slot, config, score, reference=None, reference_score=None):
        figure = Objective("throughput", "samples/s", score, score * 0.97, score * 1.03)
        pair = _pair([1.0] * 6, reference_score, load=0.0) if reference is not None else None
        return TrialRow(number=0, slot=slot, config=config, throughput=figure, objective=figure, reference=reference,
                        pair=pair)

    one = {"threads.intra_op": 1}
    rows = [row("baseline", {}, 100.0), row("noise", {}, 99.0, reference={}, reference_score=101.0)]
    slow = row("pair:threads.intra_op=1", one, 75.0, reference={}, reference_score=60.0)
    note = host_change_note([slow], [*rows, slow], ["threads.intra_op"])
    assert note.startswith("measured while the incumbent ran 40% slower than in its 3 other measurements of this study")
    assert "no other process's load was material" in note and "gains of threads.intra_op may not hold" in note
    fast = replace(slow, pair=replace(slow.pair, reference_value=130.0))
    assert "ran 30% faster than" in host_change_note([fast], [*rows, fast], ["threads.intra_op"])
    steady = replace(slow, pair=replace(slow.pair, reference_value=95.0))
    assert host_change_note([steady], [*rows, steady], ["threads.intra_op"]) is None  # within 1.2x either way
    assert host_change_note([slow], [*rows, slow], ["precision.amp"]) is None  # its gain does not depend on free cores
    assert host_change_note([slow], [slow], ["threads.intra_op"]) is None  # nothing else to tell a change by
    assert host_change_note([slow], [*rows, slow], ["threads.intra_op"], "the defaults").startswith(
        "measured while the defaults ran 40% slower")  # the final comparison's reference arm
    # through the outcome: the decision's note, when other processes' load was not material
    decision = Decision("system", "threads.intra_op", 1, 60.0, 75.0, 0.01, "accepted: ...", value=1, ratio=1.25,
                        other_load_cores=0.0)
    assert _decision_note(decision, [*rows, slow], usable_cores=2) == note
    loaded = replace(decision, other_load_cores=1.0)
    assert _decision_note(loaded, [*rows, slow], usable_cores=2).startswith("measured while other processes used 1.0 of 2")
