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
