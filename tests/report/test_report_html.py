"""The HTML file: rendered from a real study, a real bench and a recorded profile, then parsed.

Every chart must be present as inline SVG, and nothing may point outside the file.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tomllib
from html.parser import HTMLParser
from pathlib import Path

import pytest

from _support import FIXTURES, fixture_workload
from torchpace.config import load_config
from torchpace.report import write_report
from torchpace.report.load import ReportData, load_report_data
from torchpace.report.render import render_html
from torchpace.report.view import config_view

_REF_ATTRS = ("href", "src", "xlink:href", "action", "poster", "data", "srcset", "formaction")


class _Page(HTMLParser):
    """What the tests look at in a page: title, chart figures and their SVGs, references, table rows."""

    def __init__(self):
        super().__init__()
        self.title, self.refs, self.charts, self.styles, self.trial_rows = "", [], {}, [], 0
        self.tags: list[str] = []
        self._stack: list[str] = []
        self._figure: str | None = None
        self._section: str | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append(tag)
        self._stack.append(tag)
        self.refs += [value for name, value in attrs.items() if name in _REF_ATTRS and value]
        self.styles.append(attrs.get("style") or "")
        if tag == "section" and attrs.get("id"):
            self._section = attrs["id"]
        if tag == "figure" and "chart" in (attrs.get("class") or ""):
            self._figure = attrs.get("data-chart")
            self.charts[self._figure] = {"svg": 0, "title": 0}
        if self._figure and tag in ("svg", "title"):
            self.charts[self._figure][tag] += 1
        if tag == "tr" and self._section == "trials" and "tbody" in self._stack:
            self.trial_rows += 1

    def handle_endtag(self, tag):
        if tag == "figure":
            self._figure = None
        while self._stack and self._stack.pop() != tag:
            pass

    def handle_data(self, data):
        if self._stack and self._stack[-1] == "title" and self._figure is None:
            self.title += data
        if self._stack and self._stack[-1] == "style":
            self.styles.append(data)


def parse_page(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def assert_self_contained(page: _Page) -> None:
    """No reference leaves the file: only fragments and data: URIs, no stylesheet or script from elsewhere."""
    outside = [ref for ref in page.refs if not ref.startswith(("#", "data:"))]
    assert outside == []
    assert "link" not in page.tags and "script" not in page.tags and "iframe" not in page.tags
    css = "\n".join(page.styles)
    assert "@import" not in css and not re.search(r"url\((?!#)", css)


@pytest.fixture(scope="module")
def study_report(tuned_study, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("html") / "study.html"
    write_report(load_report_data(str(tuned_study.db)), path, with_doctor=True)
    return path


def test_a_real_study_renders_every_chart_as_inline_svg(study_report, tuned_study):
    page = parse_page(study_report)
    assert page.title == "torchpace tune report: raises_with_two_workers"
    assert set(page.charts) == {"speed", "waterfall", "trials", "losses"}
    assert all(chart == {"svg": 1, "title": 1} for chart in page.charts.values()), page.charts
    assert page.trial_rows == len(tuned_study.outcome["trials"])
    assert_self_contained(page)


def test_toml_json_and_report_show_the_same_figures_by_one_stated_definition(study_report, tuned_study):
    """Baseline, tuned, their CIs, the speedup with its CI and source, and every decision's ratio with its
    CI agree in torchpace.toml, `tune --json` and the report (built again from the stored study), each
    figure inside its own CI, by the paired definition each states."""
    from markupsafe import escape

    from torchpace.measure.stats import figure_text, ratio_text

    from torchpace.tune.figures import PAIRED_FIGURES_NOTE, SPEEDUP_FROM_FINAL

    toml = load_config(tuned_study.db.parent / "torchpace.toml").result
    live = tuned_study.outcome
    stored = load_report_data(str(tuned_study.db)).tune.to_dict()
    for outcome in (live, stored):
        for row, prefix in ((outcome["baseline"], "baseline"), (outcome["best"], "tuned")):
            assert row["samples_per_s_ci_low"] <= row["samples_per_s"] <= row["samples_per_s_ci_high"]
            assert (row["samples_per_s"], row["samples_per_s_ci_low"], row["samples_per_s_ci_high"]) == pytest.approx(
                (toml[f"{prefix}_samples_per_s"], toml[f"{prefix}_ci_low"], toml[f"{prefix}_ci_high"]))
        assert outcome["speedup"] == pytest.approx(toml["speedup"])
        assert outcome["extras"]["figures"] == toml["figures"] == PAIRED_FIGURES_NOTE
        speedup = outcome["extras"]["speedup"]
        assert speedup["speedup_from"] == toml["speedup_from"]
        if speedup["speedup_from"] == SPEEDUP_FROM_FINAL:  # a kept change: the final comparison's ratio and CI
            final = next(t for t in outcome["trials"] if t["slot"] == "final")["pair"]
            assert (outcome["speedup"], toml["speedup_ci_low"], toml["speedup_ci_high"]) == pytest.approx(
                (final["ratio"], final["ratio_ci_low"], final["ratio_ci_high"]))
            assert toml["speedup_ci_low"] <= outcome["speedup"] <= toml["speedup_ci_high"]
        else:  # nothing kept: the defaults are the tuned config
            assert outcome["speedup"] == 1.0 and outcome["best_config"] == {}
        judged = [d for d in outcome["extras"]["decisions"] if d["ratio"] is not None]
        # TOML keeps a float's repr: the same numbers, not close ones; every decision, judged on a ratio or not
        assert judged and [(d["knob"], d["ratio"], d["ratio_ci_low"], d["ratio_ci_high"], d["reason"])
                           for d in outcome["extras"]["decisions"]] == \
            [(d["knob"], d.get("ratio"), d.get("ratio_ci_low"), d.get("ratio_ci_high"), d["reason"]) for d in toml["decisions"]]
        assert all(d["ratio_ci_low"] <= d["ratio"] <= d["ratio_ci_high"] for d in judged)
    html = study_report.read_text()
    # each figure with the digits its CI supports, by the one rule the terminal follows too
    for row in (live["baseline"], live["best"]):
        assert figure_text(row["samples_per_s"], row["samples_per_s_ci_low"], row["samples_per_s_ci_high"]) in html
    speedup = live["extras"]["speedup"]
    shown = ratio_text(live["speedup"], speedup.get("speedup_ci_low"), speedup.get("speedup_ci_high")).partition(" ")[0]
    assert shown.replace("x", "×") in html and escape(PAIRED_FIGURES_NOTE) in html
    for decision in live["extras"]["decisions"]:
        if decision["ratio"] is not None:
            said = ratio_text(decision["ratio"], decision["ratio_ci_low"], decision["ratio_ci_high"])
            assert said.replace("x", "×", 1) in html


def test_the_study_report_shows_host_doctor_decisions_and_the_guard(study_report, tuned_study):
    html = study_report.read_text()
    assert tuned_study.host["fingerprint"] in html and "Doctor findings that are not ok" in html
    assert re.search(r"\d+ fail, \d+ warn,\s+\d+ info, \d+ ok", html)
    assert "data.num_workers" in html and "The convergence guard compares" in html
    assert "@media print" in html


@pytest.fixture(scope="module")
def bench_json(tmp_path_factory) -> Path:
    from torchpace.cli._common import save_result
    from torchpace.measure.bench import BenchOptions
    from torchpace.trial.bench import run_bench
    from torchpace.workload import load_workload

    result = run_bench(load_workload(fixture_workload("tiny_mlp")), None, BenchOptions(max_time_s=1.5))
    return save_result(result.to_dict(), tmp_path_factory.mktemp("bench") / "bench.json")


def test_a_bench_result_alone_renders_its_windows_and_host(bench_json, tmp_path):
    out = write_report(load_report_data(str(bench_json)), tmp_path / "bench.html", with_doctor=False)
    page = parse_page(out)
    assert page.title == "torchpace bench report: tiny_mlp" and set(page.charts) == {"windows"}
    html = out.read_text()
    assert "95% CI of median" in html and "host fingerprint" in html and "nothing to apply" in html
    assert_self_contained(page)


def test_text_from_the_input_is_escaped(bench_json, tmp_path):
    doc = json.loads(bench_json.read_text())
    doc["workload"] = "<script>alert(1)</script>"
    path = tmp_path / "evil.json"
    path.write_text(json.dumps(doc))
    html = write_report(load_report_data(str(path)), tmp_path / "evil.html", with_doctor=False).read_text()
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)" in html


def test_a_profile_result_renders_the_split_and_the_verdict_with_evidence(tmp_path):
    from torchpace.profile.result import build_profile_result
    from torchpace.profile.trace import read_trace

    result = build_profile_result(read_trace(FIXTURES / "profile" / "cpu_input_bound.json.gz")).to_dict()
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(result))
    out = write_report(load_report_data(str(path)), tmp_path / "profile.html", with_doctor=False)
    page = parse_page(out)
    html = out.read_text()
    assert set(page.charts) == {"split"} and "input-bound" in html
    assert result["verdict"]["evidence"][0] in html
    assert "torchpace bench WORKLOAD --set data.num_workers=2" in html and "input wait" in html
    assert_self_contained(page)


def test_the_config_snippets_run_as_printed(tmp_path):
    data = ReportData("study", "s.db", fixture_workload("tiny_mlp"), {"data.num_workers": 1,
                                                                       "model.activation_checkpointing": True})
    view = config_view(data)
    assert view["needs_prepare"] == ["model.activation_checkpointing"]
    assert view["launch"] == "torchpace launch --config torchpace.toml -- train.py"
    (tmp_path / "torchpace.toml").write_text(view["toml"])
    assert dict(load_config(tmp_path / "torchpace.toml").values) == {"data.num_workers": 1,
                                                                     "model.activation_checkpointing": True}
    assert tomllib.loads(view["toml"])["schema_version"] == 1
    snippet = config_view(ReportData("study", "s.db", fixture_workload("tiny_mlp"), {"data.num_workers": 1}))["python"]
    namespace: dict = {}
    exec(compile(snippet, "<report snippet>", "exec"), namespace)  # the user's copy: 8 real steps of the tiny MLP
    assert float(namespace["loss"]) > 0


def test_a_script_study_offers_the_launch_line_of_the_command_that_was_tuned():
    command = ("python", "train pl.py", "--epochs", "3")  # a path with a space: quoted as a shell needs it
    data = ReportData("study", "s.db", "python train pl.py --epochs 3", {"compile.mode": "default", "data.num_workers": 2},
                      command=command)
    view = config_view(data)
    assert view["launch"] == "torchpace launch --config torchpace.toml -- python 'train pl.py' --epochs 3"
    assert view["python"] is None and view["needs_prepare"] == []  # compile reaches a script: no prepare() needed
    html = render_html(data)
    assert "load_workload" not in html and "torchpace.prepare()" not in html
    assert "torchpace launch --config torchpace.toml -- python &#39;train pl.py&#39; --epochs 3" in html


def test_a_tuned_script_study_carries_its_command_to_the_report_and_json():
    from torchpace.report.load import build_tune_data
    from torchpace.tune.outcome import StudyMeta, build_outcome

    command = ("python", "train.py", "--lr", "0.1")
    outcome = build_outcome([], None, StudyMeta("s", "sqlite://", "random", "python train.py --lr 0.1", command=command),
                            "done")
    assert outcome.command == command and outcome.to_dict()["command"] == list(command)
    view = config_view(build_tune_data(outcome, None, "s.db"))
    assert view["launch"] == "torchpace launch --config torchpace.toml -- python train.py --lr 0.1"
    assert view["python"] is None


def test_a_study_whose_baseline_failed_renders_the_failure(tmp_path, host):
    """A real one-trial tune of a workload whose loss raises: no figures, the failure and its reason."""
    from torchpace.tune.tuner import TuneOptions, Tuner

    options = TuneOptions(workload=fixture_workload("raises_in_loss"), knobs=frozenset({"data.num_workers"}), trial_time_s=1,
                          guard_steps=6, storage=f"sqlite:///{tmp_path / 's.db'}", profile_baseline=False, max_trials=1,
                          out=tmp_path / "torchpace.toml")
    assert Tuner(options, host).run().failed_baseline
    out = write_report(load_report_data(str(tmp_path / "s.db")), tmp_path / "r.html", with_doctor=False)
    page, html = parse_page(out), out.read_text()
    assert set(page.charts) == {"trials"} and page.trial_rows == 1
    assert "Tune stopped: the baseline trial failed" in html and "planted failure inside the loss" in html
    assert "nothing to apply" in html


def test_a_search_strategy_other_than_greedy_has_no_waterfall(tuned_study, tmp_path):
    """The rendering branch for tpe/random/grid studies (the real outcome, relabelled: the layout is under test)."""
    from torchpace.report.load import build_tune_data

    stored = load_report_data(str(tuned_study.db)).tune
    outcome = dataclasses.replace(stored, strategy="random", stepwise=False, accepted=(), decisions=())
    out = write_report(build_tune_data(outcome, tuned_study.host, "s.db"), tmp_path / "r.html", with_doctor=False)
    page, html = parse_page(out), out.read_text()
    assert set(page.charts) == {"speed", "trials", "losses"} and "best trial of a random search" in html
    assert "there is no waterfall" in " ".join(html.split())


def test_the_cards_name_each_figures_ci_by_the_coverage_its_turns_give():
    from torchpace.measure.result import Objective
    from torchpace.report.view import summary_cards
    from torchpace.tune.outcome import TrialRow, TuneOutcome

    def row(slot, rates):
        figure = Objective("throughput", "samples/s", rates[len(rates) // 2], min(rates), max(rates), 0.1)
        return TrialRow(number=0, slot=slot, kind="final", stage=None, knob=None, value=None, config={}, status="ok",
                        throughput=figure, window_rates=tuple(rates), objective=figure, ci_rel_halfwidth=0.1,
                        peak_memory_bytes=None)

    # a final comparison beside a busy process: the defaults' arm took 8 turns, the tuned arm's 3 are all it got
    base, tuned = row("final", [100.0 + i for i in range(8)]), row("final", [3000.0, 3100.0, 3200.0])
    outcome = TuneOutcome(study="s", storage="sqlite://", strategy="greedy", workload="w", baseline=base,
                          best_config={"threads.intra_op": 1}, best=tuned, speedup=31.0, accepted=(), trials=(),
                          out_path=None, stopped="budget")
    cards = {card["label"]: card["detail"] for card in summary_cards(ReportData(kind="study", source="s", workload="w",
                                                                               tune=outcome))}
    assert cards["baseline samples/s"].startswith("95% CI ") and cards["tuned samples/s"].startswith("75% CI ")
