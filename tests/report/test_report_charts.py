"""Charts: data in, inline-safe SVG out; matplotlib's global settings untouched."""

from __future__ import annotations

import dataclasses
import json
import re
from xml.etree import ElementTree

import matplotlib
import pytest

from _support import FIXTURES
from torchpace.measure.result import BenchResult, Objective
from torchpace.profile.figures import PhaseTime, StepSplit
from torchpace.report import charts
from torchpace.tune.outcome import AcceptedChange, TrialRow

_FIGURE = Objective("throughput", "samples/s", 100.0, 95.0, 104.0)


def _recorded_bench() -> BenchResult:
    """A script bench measured in steps/s (its samples per step unknown)."""
    return BenchResult.from_dict(json.loads((FIXTURES / "results" / "bench_script_steps_only.json").read_text()))


def _accepted():
    return [AcceptedChange(None, "data.num_workers", 2, {}, None, None, step_gain=1.30, speedup=1.30),
            AcceptedChange(None, "precision.amp", "bf16", {}, None, None, step_gain=1.30, speedup=1.69)]


def _parse(svg: str) -> ElementTree.Element:
    """Parse as XML, as the browser's HTML parser would read it (namespaces re-added for ElementTree)."""
    return ElementTree.fromstring(svg.replace("<svg", '<svg xmlns:xlink="http://www.w3.org/1999/xlink"', 1))


def test_clean_svg_leaves_no_outside_reference_and_prefixes_every_id():
    svg = charts.render_waterfall_svg(_accepted(), 1.69)
    assert svg.startswith("<svg") and "<metadata" not in svg and "DOCTYPE" not in svg and "<?xml" not in svg
    assert "http" not in svg
    root = _parse(svg)
    ids = [el.get("id") for el in root.iter() if el.get("id")]
    assert ids and all(i.startswith("waterfall-") for i in ids)
    refs = re.findall(r'href="#([^"]+)"', svg) + re.findall(r"url\(#([^)]+)\)", svg)
    assert all(ref in ids for ref in refs)
    assert 'width="' not in svg.split(">", 1)[0] and "viewBox" in svg.split(">", 1)[0]


def test_the_waterfall_labels_each_accepted_knob_and_the_total():
    svg = charts.render_waterfall_svg(_accepted(), 1.69)
    for text in ("data.num_workers", "= bf16", "1.30×", "1.69×", "+30%", "baseline", "tuned"):
        assert text in svg, text


def test_trials_chart_marks_failures_and_guard_rejections():
    trials = [TrialRow(number=0, slot="baseline", kind="baseline", throughput=_FIGURE, guard="pass"),
              TrialRow(number=1, slot="cand:a=1", kind="candidate", stage="data", knob="data.num_workers", value=1,
                       throughput=_FIGURE, guard="fail"),
              TrialRow(number=2, slot="cand:a=2", kind="candidate", stage="data", knob="data.num_workers", value=2,
                       status="oom")]
    svg = charts.render_trials_svg(trials, _FIGURE, "samples/s")
    assert "oom" in svg and "data: guard failed" in svg and "num_workers=2" in svg and "failed (class below)" in svg


def test_drawing_leaves_matplotlib_settings_as_they_were():
    before = dict(matplotlib.rcParams)
    charts.render_speed_svg(_FIGURE, dataclasses.replace(_FIGURE, value=120.0))
    charts.render_losses_svg([1.0, 0.9], [1.0, float("nan")], [("amp=fp16", [1.0, float("inf")])])
    assert dict(matplotlib.rcParams) == before


@pytest.mark.parametrize("render", [
    lambda: charts.render_split_svg(StepSplit(steps=4, step_time_us=10000.0, labelled=True,
                                              input_wait=PhaseTime(5000.0, 0.5), forward=PhaseTime(5000.0, 0.5))),
    lambda: charts.render_windows_svg(_recorded_bench()),
    lambda: charts.render_waterfall_svg([], 1.0),
])
def test_every_chart_is_well_formed_svg(render):
    root = _parse(render())
    assert root.tag == "svg" and root.find("title") is not None


def test_the_windows_chart_of_a_steps_per_s_bench_says_steps_per_s():
    svg = charts.render_windows_svg(_recorded_bench())
    assert "steps/s" in svg and "amples/s" not in svg
