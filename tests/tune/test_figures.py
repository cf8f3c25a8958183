"""The one definition of the reported figures, on recorded trial rows (pure)."""

import pytest

from torchpace.tune.figures import config_figure, other_load_summary, result_table, speedup, with_figure


def row(config, windows, status="ok", guard="pass", **kw):
    return {"config": config, "status": status, "guard": guard, "samples_per_s": sorted(windows)[len(windows) // 2],
            "window_samples_per_s": windows, **kw}


ROWS = [row({}, [100.0, 104.0, 98.0, 101.0, 99.0, 103.0]), row({}, [90.0, 92.0, 91.0, 93.0, 89.0, 94.0]),
        row({"data.num_workers": 2}, [150.0, 148.0, 152.0, 149.0, 151.0, 153.0]),
        row({"data.num_workers": 2}, [900.0], status="crash"), row({"data.num_workers": 2}, [5000.0], guard="fail")]


def test_a_configs_figure_pools_the_windows_of_its_usable_trials_and_lies_in_its_ci():
    base = config_figure(ROWS, {})
    assert base["trials"] == 2 and base["windows"] == 12
    assert base["samples_per_s"] == pytest.approx(96.0)  # the median of the 12 pooled windows
    assert base["samples_per_s_ci_low"] <= base["samples_per_s"] <= base["samples_per_s_ci_high"]
    tuned = config_figure(ROWS, {"data.num_workers": 2})
    assert tuned["trials"] == 1  # the crashed and the guard-failed trials do not count
    assert config_figure(ROWS, {"data.num_workers": 1}) is None


def test_the_speedup_is_the_ratio_of_the_two_figures_shown_and_the_toml_holds_the_same():
    baseline, best = with_figure(ROWS[0], ROWS), with_figure(ROWS[2], ROWS)
    assert baseline["samples_per_s"] == config_figure(ROWS, {})["samples_per_s"] != ROWS[0]["samples_per_s"]
    ratio = speedup(best, baseline)
    assert ratio == best["samples_per_s"] / baseline["samples_per_s"]
    table = result_table({"baseline": baseline, "best": best, "speedup": ratio,
                          "extras": {"figures": "F", "other_load": other_load_summary(ROWS)}})
    assert table["speedup"] == table["tuned_samples_per_s"] / table["baseline_samples_per_s"]
    assert table["tuned_ci_low"] <= table["tuned_samples_per_s"] <= table["tuned_ci_high"] and table["figures"] == "F"
    assert "other_load_cores" not in table  # no trial recorded it: nothing to say (and TOML has no null)


def test_other_load_over_the_trials_is_said_when_any_trial_saw_it_material():
    quiet = [row({}, [1.0], other_load_cores=0.1, usable_cores=2), row({}, [1.0], other_load_cores=0.2, usable_cores=2)]
    assert other_load_summary(quiet)["note"] is None
    busy = [*quiet, row({}, [1.0], other_load_cores=1.9, usable_cores=2)]
    summary = other_load_summary(busy)
    assert summary["median_cores"] == 0.2 and summary["max_cores"] == 1.9 and summary["trials"] == 3
    assert summary["note"] == ("tuned while other processes used 0.2 of 2 cores (median over 3 trials, up to 1.9): "
                               "the result reflects that contention")


def test_a_decision_taken_under_material_load_names_the_knobs_whose_gains_depend_on_free_cores():
    from torchpace.tune.figures import load_note

    assert load_note(0.3, 2, ["threads.intra_op"]) is None  # under half a core: nothing to say
    assert load_note(1.4, 2, ["threads.intra_op"]) == (
        "measured while other processes used 1.4 of 2 cores; gains of threads.intra_op may not hold on a quiet host")
    assert load_note(1.4, 2, ["precision.amp"]) == (
        "measured while other processes used 1.4 of 2 cores: the ratio reflects that contention")
    assert load_note(None, 2, ["data.num_workers"]) is None  # unread


def test_the_speedup_of_a_paired_study_is_the_final_comparison_else_the_product_of_its_steps():
    from torchpace.tune.figures import SPEEDUP_FROM_FINAL, SPEEDUP_FROM_STEPS, paired_speedup

    final = {"pair": {"ratio": 1.3, "ratio_ci_low": 1.25, "ratio_ci_high": 1.36, "rounds": 12, "mode": "alternating"}}
    steps = [{"step_gain": 1.2}, {"step_gain": 1.1}]
    assert paired_speedup(final, steps) == {"speedup": 1.3, "speedup_ci_low": 1.25, "speedup_ci_high": 1.36,
                                            "speedup_rounds": 12, "speedup_from": SPEEDUP_FROM_FINAL,
                                            "speedup_mode": "alternating"}
    cut = paired_speedup(None, steps)
    assert cut["speedup"] == pytest.approx(1.32) and cut["speedup_ci_low"] is None and cut["speedup_from"] == SPEEDUP_FROM_STEPS
    assert paired_speedup(None, [])["speedup"] == 1.0
