"""`torchpace report` of a recorded result of each version: it reads, renders, and says every figure in
the unit it was measured in (a script bench without samples per step is steps/s everywhere)."""

from __future__ import annotations

import pytest

from _support import FIXTURES
from torchpace.report import write_report
from torchpace.report.load import load_report_data

RESULTS = FIXTURES / "results"


@pytest.mark.parametrize("name, unit", [("bench_before_steps.json", "samples/s"),
                                        ("bench_script_steps_only.json", "steps/s"),
                                        ("bench_with_steps.json", "samples/s")])
def test_a_recorded_bench_of_each_version_renders_in_its_unit(name, unit, tmp_path):
    data = load_report_data(str(RESULTS / name))
    assert data.kind == "bench" and data.bench.objective.unit == unit
    html = write_report(data, tmp_path / "bench.html", with_doctor=False).read_text(encoding="utf-8")
    assert f'<div class="label">{unit}</div>' in html and 'data-chart="windows"' in html
    if unit == "steps/s":
        # samples/s is named once, in the hint on how to get it; no figure is labelled with it
        assert html.count("samples/s") == html.count("--samples-per-step N gives samples/s") == 1
        assert "batch unknown" in html


def _workers_study(base_figure, best_figure, base_windows, best_windows):
    """A greedy tune of a script that kept `data.num_workers = 2`: its baseline at `base_figure`, its tuned config
    at `best_figure` (`Objective`s in the study's unit), each with its windows."""
    from torchpace.tune.figures import figures_note
    from torchpace.tune.outcome import AcceptedChange, TrialRow, TuneOutcome

    gain = best_figure.value / base_figure.value
    base = TrialRow(number=0, slot="baseline", kind="baseline", throughput=base_figure, objective=base_figure,
                    window_rates=base_windows, guard_losses=(2.0, 1.9, 1.8))
    best = TrialRow(number=1, slot="cand:data.num_workers=2", kind="candidate", stage="data", knob="data.num_workers",
                    value=2, config={"data.num_workers": 2}, throughput=best_figure, objective=best_figure,
                    window_rates=best_windows, guard="pass", guard_losses=(2.0, 1.9, 1.8))
    change = AcceptedChange("data", "data.num_workers", 2, {"data.num_workers": 2}, best_figure, best_figure,
                            step_gain=gain, speedup=gain)
    return TuneOutcome(study="s", storage="sqlite://", strategy="greedy", workload="python train.py", baseline=base,
                       best_config={"data.num_workers": 2}, best=best, speedup=gain, accepted=(change,),
                       trials=(base, best), out_path=None, stopped="done", unit=base_figure.unit,
                       figures_note=figures_note(base_figure.unit))


def test_the_report_of_a_study_measured_in_steps_per_s_never_says_samples_per_s(tmp_path):
    """A tune of a script whose samples per step are unknown: every figure, table head, chart and note says steps/s."""
    from torchpace.measure.result import Objective
    from torchpace.report.load import build_tune_data

    def figure(value):
        return Objective("throughput", "steps/s", value, value * 0.98, value * 1.02, 0.02)

    outcome = _workers_study(figure(7.8), figure(9.9), (7.7, 7.8, 7.9), (9.8, 9.9, 10.0))
    html = write_report(build_tune_data(outcome, None, "s.db"), tmp_path / "steps.html", with_doctor=False).read_text()
    assert "samples/s" not in html
    assert '<div class="label">baseline steps/s</div>' in html and "7.8 [7.6, 8.0] steps/s" in html
    assert "steps/s [95% CI]" in html and "Steps/s of every trial" in html


def test_the_report_writes_each_figure_with_the_digits_its_ci_supports_as_the_terminal_does(tmp_path):
    """A slow script's samples/s: the headline of 9.5 is not "10", a baseline of 1.3 [1.0, 13.0] is not "1 [1, 13]"
    (the digits follow the CI, never fewer than two significant ones), as in the terminal's table."""
    from io import StringIO

    from rich.console import Console

    from torchpace.measure.result import Objective
    from torchpace.report.load import build_tune_data
    from torchpace.tune.render import render_outcome

    outcome = _workers_study(Objective("throughput", "samples/s", 1.3, 1.0, 13.0, 0.5),
                             Objective("throughput", "samples/s", 9.5, 9.1, 9.9, 0.04), (1.0, 1.3, 13.0), (9.1, 9.5, 9.9))
    html = write_report(build_tune_data(outcome, None, "s.db"), tmp_path / "r.html", with_doctor=False).read_text()
    assert '<div class="value">9.5</div>' in html and "1.3 [1.0, 13.0]" in html and "9.5 [9.1, 9.9]" in html
    assert '<div class="value">10</div>' not in html and "1 [1, 13]" not in html
    console = Console(file=StringIO(), width=200)
    render_outcome(console, outcome)
    terminal = console.file.getvalue()
    assert "1.3 [1.0, 13.0]" in terminal and "9.5 [9.1, 9.9]" in terminal


def test_a_recorded_comparison_renders_its_verdict_each_arm_and_config_b(tmp_path, cli_run):
    import json

    from torchpace.measure.render import comparison_rows
    from torchpace.measure.stats import ratio_text

    data = load_report_data(str(RESULTS / "compare_tabular.json"))
    assert data.kind == "compare" and data.config == {"threads.intra_op": 1} and data.workload == "tabular"
    html = write_report(data, tmp_path / "compare.html", with_doctor=False).read_text(encoding="utf-8")
    doc = json.loads((RESULTS / "compare_tabular.json").read_text())
    ratio = ratio_text(doc["ratio"], doc["ratio_ci_low"], doc["ratio_ci_high"], doc["rounds"]).replace("x", "×", 1)
    assert doc["summary"] in html and "B / A" in html and ratio in html and ratio.startswith("7.59× [3.42, 17.04]")
    for row in comparison_rows(data.compare):  # the cells the terminal's table shows, the same text
        assert all(cell in html for cell in row), row
    assert "Config B and how to apply it" in html and "threads.intra_op" in html and "torchpace.load_workload" not in html
    done = cli_run("report", str(RESULTS / "compare_tabular.json"), "--no-doctor", "-o", "c.html")
    assert done.returncode == 0 and (tmp_path / "c.html").read_text(encoding="utf-8").count(doc["summary"]) == 1, done.stderr
