"""Bench results as records: each recorded version of the JSON still reads, the JSON round-trips, and
the schema (derived from the records) matches what is written. The recorded files are real benches
(tests/fixtures/results/README.md says which torchpace wrote them)."""

import json

import jsonschema
import pytest

from _support import FIXTURES
from torchpace.measure.result import BenchResult, Objective, ScriptInfo, pool_throughput
from torchpace.measure.schema import BENCH_RESULT_SCHEMA
from torchpace.records import MissingFields, from_json, json_names

RESULTS = FIXTURES / "results"
RECORDED = {"bench_before_steps.json": "samples/s", "bench_script_steps_only.json": "steps/s",
            "bench_with_steps.json": "samples/s"}


def recorded(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_every_recorded_version_reads_with_its_unit_and_writes_the_current_schema(name):
    result = BenchResult.from_dict(recorded(name))
    assert result.objective.unit == RECORDED[name] and result.objective.name == "throughput"
    assert result.objective.ci_low <= result.objective.value <= result.objective.ci_high
    written = json.loads(json.dumps(result.to_dict()))
    assert BenchResult.from_dict(written) == result
    if name != "bench_before_steps.json":  # written before steps/s: those stay null, and the schema says number
        jsonschema.validate(written, BENCH_RESULT_SCHEMA, cls=jsonschema.Draft202012Validator)
    assert written["objective"]["unit"] == RECORDED[name]
    # every field the file had keeps its name and value (the JSON only gains `objective`)
    original = recorded(name)
    assert {k: v for k, v in written.items() if k in original} == original


def test_a_result_from_before_steps_per_s_reads_with_those_figures_unknown():
    result = BenchResult.from_dict(recorded("bench_before_steps.json"))
    assert result.throughput.steps_per_s is None and result.throughput.window_steps_per_s == ()
    assert result.script is None and result.step.batch_size == 256


def test_a_script_bench_without_samples_is_judged_in_steps_per_s_and_types_its_script_part():
    result = BenchResult.from_dict(recorded("bench_script_steps_only.json"))
    t = result.throughput
    assert t.samples_per_s is None and not t.samples_known and result.step.batch_size is None
    assert result.objective == Objective("throughput", "steps/s", t.steps_per_s, t.steps_per_s_ci_low,
                                         t.steps_per_s_ci_high, t.ci_rel_halfwidth)
    assert t.window_rates == t.window_steps_per_s and len(t.window_rates) == t.windows
    assert result.script.step_source == "backward" and result.script.command == ("python", "train.py")


def test_the_schema_lists_exactly_what_a_result_writes():
    assert list(BENCH_RESULT_SCHEMA["properties"]) == json_names(BenchResult)
    written = BenchResult.from_dict(recorded("bench_with_steps.json")).to_dict()
    assert set(written) | {"straggler"} == set(BENCH_RESULT_SCHEMA["properties"]) == set(
        BENCH_RESULT_SCHEMA["required"]) | {"other_load_cores", "straggler"}  # written when read, when there is one


def test_what_a_newer_hook_reports_about_a_script_is_kept_not_dropped():
    doc = recorded("bench_script_steps_only.json")
    doc["script"] = {**doc["script"], "log_path": "trial.log"}
    result = BenchResult.from_dict(doc)
    assert result.script.more == {"log_path": "trial.log"}
    assert result.to_dict()["script"]["log_path"] == "trial.log"
    assert from_json(ScriptInfo, result.to_dict()["script"]) == result.script


def test_a_document_lacking_a_field_names_it():
    doc = recorded("bench_with_steps.json")
    del doc["device"], doc["windows"]
    with pytest.raises(MissingFields) as err:
        BenchResult.from_dict(doc)
    assert "device" in str(err.value) and "windows" in str(err.value)


def test_separate_runs_pool_their_windows_in_the_runs_unit():
    steps_only = BenchResult.from_dict(recorded("bench_script_steps_only.json")).throughput
    pooled = pool_throughput([steps_only, steps_only])
    assert pooled.windows == 2 * steps_only.windows and pooled.samples_per_s is None
    assert pooled.steps_per_s == pytest.approx(steps_only.steps_per_s, rel=0.05)
    samples = BenchResult.from_dict(recorded("bench_before_steps.json")).throughput
    assert pool_throughput([samples, samples]).window_samples_per_s == samples.window_samples_per_s * 2


@pytest.mark.parametrize("name", ["bench_with_steps.json", "bench_script_steps_only.json"])
def test_a_ci_of_fewer_windows_than_a_95_percent_ci_needs_says_what_the_range_is(name):
    from dataclasses import replace

    from torchpace.measure.render import throughput_rows

    result = BenchResult.from_dict(recorded(name))
    one = replace(result, throughput=replace(result.throughput, windows=1))
    ten = replace(result, throughput=replace(result.throughput, windows=10))
    assert dict(throughput_rows(one))["95% CI of median"].endswith("(the range of 1 window(s): a 95% CI needs 6)")
    assert "(±" in dict(throughput_rows(ten))["95% CI of median"]


def test_steps_per_s_and_step_time_are_one_window_median_whatever_the_number_of_windows():
    """Steps/s and step time are the same median of the same windows, one the other's reciprocal: with an
    even number of windows the median falls between two of them (a script's 0.5 and 0.68 steps/s windows
    are 0.59 steps/s), and the step time is that median's, not the slower window's 2000 ms."""
    from torchpace.measure.bench import throughput_figures
    from torchpace.measure.stats import summarize
    from torchpace.measure.timing import Throughput, Window

    for windows in ([Window(1, 8, 2.0), Window(1, 8, 1 / 0.68)],  # two windows of one step (a slow script)
                    [Window(3, 24, 0.30), Window(2, 16, 0.25), Window(4, 32, 0.36), Window(3, 24, 0.33)],
                    [Window(3, 24, 0.30), Window(2, 16, 0.25), Window(4, 32, 0.36)]):
        rates = [w.samples_per_s for w in windows]
        real = Throughput(tuple(windows), summarize(rates), 1.0, 2, True, "time")
        figures = throughput_figures(real)
        assert figures.step_time_s * figures.steps_per_s == pytest.approx(1.0)
        assert real.step_time_s == pytest.approx(figures.step_time_s)
    # separate runs pooled: the same definition over every run's windows
    steps_only = BenchResult.from_dict(recorded("bench_script_steps_only.json")).throughput
    pooled = pool_throughput([steps_only, replace_windows(steps_only, 2.0)])
    assert pooled.step_time_s * pooled.steps_per_s == pytest.approx(1.0)


def replace_windows(figures, factor: float):
    """`figures` with every window `factor` times as fast."""
    from dataclasses import replace

    return replace(figures, window_steps_per_s=tuple(r * factor for r in figures.window_steps_per_s),
                   window_samples_per_s=tuple(r * factor for r in figures.window_samples_per_s))
