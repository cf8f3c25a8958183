"""Reading studies and results into ReportData: content detection, study choice, the stored outcome."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from datetime import datetime
from pathlib import Path

import optuna
import pytest

from torchpace.errors import UsageError
from torchpace.report.load import EXPECTED, build_result_data, load_report_data, mask_url, pick_study, rebuild_space
from torchpace.tune.attrs import ATTR, StudyAttrs

_META = StudyAttrs()


def test_a_stored_study_reads_back_as_the_outcome_the_tuner_returned(tuned_study):
    data = load_report_data(str(tuned_study.db), study=tuned_study.name)
    live, stored = tuned_study.outcome, data.tune.to_dict()
    assert data.kind == "study" and data.host["fingerprint"] == tuned_study.host["fingerprint"]
    assert [t["slot"] for t in stored["trials"]] == [t["slot"] for t in live["trials"]]
    for key in ("best_config", "accepted", "speedup", "failed_baseline", "baseline"):
        assert stored[key] == live[key], key
    assert stored["best"]["samples_per_s"] == pytest.approx(live["best"]["samples_per_s"])
    assert stored["extras"]["decisions"] == live["extras"]["decisions"]
    assert stored["stopped"] == "done" and data.config == live["best_config"]
    assert any(t["status"] == "crash" for t in stored["trials"])


def test_the_space_rebuilt_from_rows_is_each_tried_knob_with_its_default_first(tuned_study):
    rows = load_report_data(str(tuned_study.db)).tune.trials
    space = rebuild_space(rows)
    assert [k.name for k in space] == ["data.num_workers"]
    tried = {t.value for t in rows if t.kind == "candidate"}
    assert space[0].values[0] == 0 and set(space[0].values[1:]) == tried
    # a workload that gives its own workers started its search from them (StudyAttrs.defaults)
    own = rebuild_space(rows, {"data.num_workers": 4})
    assert own[0].default == 4 and own[0].values == (4, *space[0].values[1:])


@pytest.mark.parametrize("content, message", [
    (b"just some text\n", "neither a torchpace study nor a JSON result"),
    (b'{"kind": "something.else"}', "not a torchpace result (kind 'something.else')"),
    (b"[1, 2, 3]", "not a torchpace result"),
    (b'{"kind": "torchpace.bench", "schema_version": 99}', "schema_version 99"),
])
def test_a_file_that_is_no_study_or_result_names_what_was_expected(tmp_path, content, message):
    path = tmp_path / "input.json"
    path.write_bytes(content)
    with pytest.raises(UsageError) as err:
        load_report_data(str(path))
    assert message in str(err.value)
    assert "schema_version 99" in message or EXPECTED in str(err.value)


def test_an_sqlite_file_without_optuna_tables_is_refused_and_left_untouched(tmp_path):
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE notes (text TEXT)")
    before = path.read_bytes()
    with pytest.raises(UsageError, match="holds no Optuna study"):
        load_report_data(str(path))
    assert path.read_bytes() == before


def test_a_missing_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="cannot read"):
        load_report_data(str(tmp_path / "nope.db"))


def test_an_unknown_study_name_lists_the_torchpace_studies(tuned_study):
    with pytest.raises(UsageError) as err:
        load_report_data(str(tuned_study.db), study="nope")
    assert "no such study" in str(err.value) and tuned_study.name in str(err.value)


def test_the_only_torchpace_study_is_chosen_and_other_studies_are_ignored(tuned_study, tmp_path):
    db = tmp_path / "copy.db"
    shutil.copy(tuned_study.db, db)
    optuna.create_study(study_name="not-ours", storage=f"sqlite:///{db}")
    data = load_report_data(str(db))
    assert data.tune.study == tuned_study.name and data.note is None


def test_pick_study_takes_the_most_recent_and_says_so():
    old, new = datetime(2026, 1, 1), datetime(2026, 2, 1)
    candidates = [("a", _META, old, 1), ("b", _META, new, 2), ("x", None, None, 3), ("c", _META, None, 4)]
    name, note = pick_study(candidates, None, "s.db")
    assert name == "b" and "3 torchpace studies" in note and "--study" in note
    assert pick_study(candidates, "a", "s.db") == ("a", None)
    with pytest.raises(UsageError, match="not a torchpace study"):
        pick_study(candidates, "x", "s.db")
    with pytest.raises(UsageError, match="holds no torchpace study"):
        pick_study([("x", None, None, 3)], None, "s.db")
    with pytest.raises(UsageError, match="schema"):
        pick_study([("a", StudyAttrs(schema_version=99), old, 1)], None, "s.db")


def test_a_study_with_only_its_baseline_reads_as_baseline_equals_tuned(tuned_study, tmp_path):
    db = tmp_path / "baseline-only.db"
    storage = f"sqlite:///{db}"
    source = optuna.load_study(study_name=tuned_study.name, storage=f"sqlite:///{tuned_study.db}")
    study = optuna.create_study(study_name="only-baseline", storage=storage, direction="maximize")
    study.set_user_attr(ATTR, source.user_attrs[ATTR])
    study.add_trial(source.trials[0])  # the real baseline trial, as the first tune session stored it
    data = load_report_data(str(db))
    assert [t.slot for t in data.tune.trials] == ["baseline"]
    assert data.tune.speedup == 1.0 and data.tune.best_config == {} and data.tune.stopped == "unfinished"


def test_results_are_told_by_kind():
    from torchpace.measure.schema import BENCH_RESULT_SCHEMA

    bench = {**dict.fromkeys(BENCH_RESULT_SCHEMA["required"]), "kind": "torchpace.bench", "schema_version": 1,
             "workload": "w", "config": {"data.num_workers": 1}, "host": {"fingerprint": "f"}}
    assert build_result_data(bench, "b.json").kind == "bench"
    profile = {"kind": "torchpace.profile", "schema_version": 1, "workload": "w", "device": "cpu", "config": {}, "steps": 5,
               "verdict": {"kind": "compute-bound", "evidence": ["the step computes"]}, "findings": []}
    data = build_result_data(profile, "p.json")
    assert data.kind == "profile" and data.host is None and data.config == {}
    assert data.profile.verdict.kind.value == "compute-bound" and data.profile.step_split is None
    for lacking, named in (("verdict", "'verdict'"), ("steps", "'steps'")):
        with pytest.raises(UsageError, match=f"is a profile result without the field {named}"):
            build_result_data({k: v for k, v in profile.items() if k != lacking}, "p.json")
    with pytest.raises(UsageError, match="cannot read .*'slow-bound' is not a valid VerdictKind"):
        build_result_data({**profile, "verdict": {"kind": "slow-bound"}}, "p.json")
    compared = json.loads((Path(__file__).parents[1] / "fixtures" / "results" / "compare_tabular.json").read_text())
    with pytest.raises(UsageError, match=r"is a compare result without the field\(s\) a, b; write it again"):
        build_result_data({k: v for k, v in compared.items() if k not in ("a", "b")}, "c.json")
    for kind in ("torchpace.bench-data", "torchpace.shards"):  # another torchpace document: named, with what report reads
        with pytest.raises(UsageError, match=f"torchpace document of kind '{kind}', which report does not render"):
            build_result_data({"kind": kind, "schema_version": 1}, "x.json")


def test_study_and_json_result_cannot_be_combined(tmp_path):
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"kind": "torchpace.bench", "schema_version": 1}))
    with pytest.raises(UsageError, match="--study"):
        load_report_data(str(path), study="x")
    with pytest.raises(UsageError, match="one of them"):
        load_report_data(None)


def test_a_storage_password_never_reaches_the_report():
    assert "secret" not in mask_url("postgresql://user:secret@db.example:5432/torchpace")
    assert mask_url("sqlite:////tmp/s.db") == "sqlite:////tmp/s.db"


def test_a_storage_url_to_a_missing_sqlite_file_creates_nothing(tmp_path):
    with pytest.raises(UsageError, match="not a readable SQLite database"):
        load_report_data(None, storage=f"sqlite:///{tmp_path / 'missing.db'}")
    assert not (tmp_path / "missing.db").exists()


def test_a_latency_study_reads_back_with_its_objective(latency_tune):
    """A real inference tune under --objective latency: the stored replay ranks by the same figure."""
    outcome, folder = latency_tune
    live = outcome.to_dict()
    stored = load_report_data(str(folder / "s.db")).tune.to_dict()
    assert stored["objective"] == "latency"
    for key in ("best_config", "speedup", "accepted"):
        assert stored[key] == live[key], key
    assert stored["best"]["samples_per_s"] == pytest.approx(live["best"]["samples_per_s"])


@pytest.mark.parametrize("verb,fixture", [("compare", "compare_tabular.json"), ("bench", "bench_with_steps.json")])
def test_a_result_with_a_value_of_the_wrong_type_is_named_not_rendered(verb, fixture, tmp_path, cli_run):
    """A hand-edited or damaged result: each value of another type than torchpace writes is exit 2 naming the
    field, what it should be and what it holds, before anything is rendered (not a traceback while it is)."""
    doc = json.loads((Path(__file__).parents[1] / "fixtures" / "results" / fixture).read_text())
    figure = "ratio" if verb == "compare" else "samples_per_s"
    listed = "ratios" if verb == "compare" else "window_samples_per_s"
    config = ("a", {**doc["a"], "config": [1]}, "a.config") if verb == "compare" else ("config", [1], "config")
    for field, value, said in ((figure, "fast", f"{figure}: expected a number, found 'fast'"),
                               (figure, True, f"{figure}: expected a number, found True"),
                               (listed, 3, f"{listed}: expected a list, found 3"),
                               (listed, [1.0, "x"], f"{listed}[1]: expected a number, found 'x'"),
                               (counted := "rounds" if verb == "compare" else "windows", 2.5,
                                f"{counted}: expected a whole number, found 2.5"),
                               (config[0], config[1], f"{config[2]}: expected an object, found [1]")):
        with pytest.raises(UsageError, match=re.escape(f"is a {verb} result this torchpace cannot read ({said})")):
            build_result_data({**doc, field: value}, "r.json")
    (tmp_path / "edited.json").write_text(json.dumps({**doc, figure: "fast"}))
    done = cli_run("report", "edited.json", "--no-doctor", "-o", "r.html")
    assert done.returncode == 2 and "Traceback" not in done.stderr and "expected a number" in done.stderr
    assert not (tmp_path / "r.html").exists()
