"""Studies on a real PostgreSQL server (the `postgres` session fixture): the report reads them as it
reads SQLite, and a study copied from a host's SQLite file goes on there with `tune --resume`."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timezone

import pytest

from torchpace.errors import UsageError
from torchpace.report import write_report
from torchpace.report.load import load_report_data
from torchpace.tune.storage import copy_study, mask_url

from _support import fixture_workload


# one stamp for both reports: two renders a moment apart may fall in two minutes
_GENERATED_AT = datetime(2026, 1, 2, 3, 4, tzinfo=timezone.utc)


def _html(data, path, *sources):
    text = write_report(data, path, with_doctor=False, generated_at=_GENERATED_AT).read_text()
    for source in sources:
        text = text.replace(source, "SOURCE")
    return text


def test_the_report_of_a_postgres_study_is_the_report_of_the_same_records_in_sqlite(tuned_study, postgres, tmp_path):
    url = postgres.create_database("report_copy")
    copy_study(tuned_study.name, f"sqlite:///{tuned_study.db}", url)
    from_sqlite = load_report_data(str(tuned_study.db), study=tuned_study.name)
    from_postgres = load_report_data(None, storage=url, study=tuned_study.name)
    assert from_postgres.tune.trials == from_sqlite.tune.trials
    sqlite_html = _html(from_sqlite, tmp_path / "a.html", f"sqlite:///{tuned_study.db.resolve()}", str(tuned_study.db))
    postgres_html = _html(from_postgres, tmp_path / "b.html", mask_url(url))
    assert "tp-secret" not in postgres_html
    assert postgres_html == sqlite_html


def test_copying_onto_an_existing_study_is_refused(tuned_study, postgres):
    url = postgres.create_database("copy_twice")
    copy_study(tuned_study.name, f"sqlite:///{tuned_study.db}", url)
    with pytest.raises(UsageError, match="already has a study"):
        copy_study(tuned_study.name, f"sqlite:///{tuned_study.db}", url)
    with pytest.raises(UsageError, match="has no study 'nope'"):
        copy_study("nope", f"sqlite:///{tuned_study.db}", postgres.create_database("copy_missing"))


def _tune(storage, out, *extra):
    argv = [sys.executable, "-m", "torchpace", "tune", fixture_workload("tiny_mlp"), "--storage", storage, "--study", "moved",
            "--out", str(out), "--trial-time", "1", "--guard-steps", "6", "--knob", "data.num_workers", "--json", *extra]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=out.parent, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_a_sqlite_study_copied_into_postgres_is_resumed_there(postgres, tmp_path):
    sqlite_url = f"sqlite:///{tmp_path / 'host.db'}"
    started = _tune(sqlite_url, tmp_path / "a.toml", "--max-trials", "2")
    url = postgres.create_database("moved")
    copy_study("moved", sqlite_url, url)
    finished = _tune(url, tmp_path / "b.toml", "--resume")
    before = [(t["number"], t["slot"]) for t in started["trials"]]
    assert [(t["number"], t["slot"]) for t in finished["trials"]][:len(before)] == before  # kept, not re-run
    slots = [t["slot"] for t in finished["trials"]]
    assert len(slots) == len(set(slots)) and len(slots) > len(before) and finished["stopped"] == "done"
