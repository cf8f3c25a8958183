"""A study this torchpace cannot read as it was tuned: tables of another Optuna schema, a study written by a
newer torchpace (another study schema, a newer revision of the greedy policy), stored metadata that is not
what torchpace writes. `tune --resume` and `report` refuse each with exit 2 naming what is wrong (both
versions, or the field), in real subprocesses on real SQLite files, and leave the file as it was."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing

import pytest

from _support import FIXTURES, restore_recorded_study
from torchpace._version import __version__
from torchpace.errors import UsageError
from torchpace.tune.attrs import ATTR, STUDY_SCHEMA_VERSION, StudyAttrs
from torchpace.tune.policy import GREEDY_REVISION
from torchpace.tune.storage import optuna_schema_revisions

RECORDED = FIXTURES / "studies" / "paired_greedy.json"
WORKLOAD = str(FIXTURES / "pair_workloads.py") + ":sleepy_loader"
STUDY = "paired-sleepy"


@pytest.fixture
def stored(tmp_path, host):
    """A torchpace study in a fresh SQLite file; returns (path, a function that changes its stored metadata)."""
    import optuna

    db = tmp_path / "studies.db"
    restore_recorded_study(RECORDED, f"sqlite:///{db}", host, WORKLOAD)

    def change(**fields):
        study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{db}")
        study.set_user_attr(ATTR, {**study.user_attrs[ATTR], **fields})

    return db, change


def _refused(cli_run, db, *said):
    """`report` and `tune --resume` of the study in `db`: each exit 2 saying `said`, the file unchanged."""
    before = db.read_bytes()
    for argv in (["report", str(db), "--no-doctor", "-o", "r.html"],
                 ["tune", WORKLOAD, "--storage", f"sqlite:///{db}", "--study", STUDY, "--resume", "--max-trials", "1"]):
        done = cli_run(*argv)
        assert done.returncode == 2, done.stderr[-3000:]
        assert all(part in done.stderr for part in said) and "Traceback" not in done.stderr, done.stderr
        assert db.read_bytes() == before


def _stamp(db, revision: str, made_by: str) -> None:
    """Make the tables read as another Optuna's (what Optuna reads to tell its schema)."""
    with closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("UPDATE alembic_version SET version_num = ?", (revision,))
        conn.execute("UPDATE version_info SET library_version = ?", (made_by,))


def test_tables_of_an_older_optuna_schema_are_refused_naming_both_versions(cli_run, stored):
    import optuna

    db, _ = stored
    older = optuna_schema_revisions()[1]
    _stamp(db, older, "3.0.0")
    _refused(cli_run, db, "Optuna 3.0.0", f"revision {older}", f"this Optuna {optuna.__version__}",
             "optuna storage upgrade --storage")


def test_tables_of_a_newer_optuna_schema_are_refused_naming_both_versions(cli_run, stored):
    import optuna

    db, _ = stored
    _stamp(db, "v99.0.0.a", "99.0.0")
    _refused(cli_run, db, "Optuna 99.0.0", "revision v99.0.0.a", f"this Optuna {optuna.__version__}", "pip install -U optuna")


def test_a_study_from_a_newer_torchpace_is_refused_not_replayed_under_an_older_policy(cli_run, stored):
    db, change = stored
    change(greedy_revision=GREEDY_REVISION + 1, torchpace_version="99.1.0")
    _refused(cli_run, db, "torchpace 99.1.0", f"revision {GREEDY_REVISION + 1}", f"this torchpace {__version__}",
             f"up to {GREEDY_REVISION}")


def test_a_study_of_another_study_schema_is_refused_naming_both(cli_run, stored):
    db, change = stored
    change(schema_version=STUDY_SCHEMA_VERSION + 1, torchpace_version="99.1.0")
    _refused(cli_run, db, "torchpace 99.1.0", f"schema {STUDY_SCHEMA_VERSION + 1}", f"reads schema {STUDY_SCHEMA_VERSION}")


def test_a_study_whose_stored_host_is_malformed_is_exit_2_naming_the_field(cli_run, stored):
    db, change = stored
    change(host="garbage")
    _refused(cli_run, db, "host: expected an object of the host's facts", "did not write")


@pytest.mark.parametrize("fields, said", [
    ({"host": [1, 2]}, "host: expected an object"), ({"host": {"gpus": [1]}}, "host.gpus: expected a list of GPU names"),
    ({"host": {"gpus": "H100"}}, "host.gpus"), ({"host": {"memory_bytes": "lots"}}, "host.memory_bytes"),
    ({"host": {"usable_cores": 0}}, "host.usable_cores"), ({"host": {"native_bf16": "yes"}}, "host.native_bf16"),
    ({"workload": 5}, "workload: expected a string"), ({"command": "python train.py"}, "command: expected a list"),
    ({"host_fingerprint": [1]}, "host_fingerprint"), ({"greedy_revision": "4"}, "greedy_revision"),
    ({"objective": 5}, "objective"), ({"paired": "no"}, "paired"),
])
def test_stored_metadata_torchpace_never_writes_is_named(fields, said):
    from torchpace.report.load import pick_study
    from torchpace.tune.study import check_stored_study

    meta = StudyAttrs.from_attrs({**StudyAttrs(host={"cpu_model": "x", "gpus": []}).to_attrs(), **fields})
    with pytest.raises(UsageError, match="did not write") as err:
        check_stored_study("s", meta)
    assert said in str(err.value)
    with pytest.raises(UsageError, match="did not write"):
        pick_study([("s", meta, None, 0)], None, "s.db")


def test_a_new_study_records_the_torchpace_that_made_it_and_what_it_stores_reads(host):
    from torchpace.tune.study import check_stored_study, study_metadata

    meta = study_metadata("tabular", host, "greedy", command=("python", "train.py", "--password=x"))
    assert meta.torchpace_version == __version__ and meta.problem() is None
    back = StudyAttrs.from_attrs(json.loads(json.dumps(meta.to_attrs())))
    assert back == meta and back.problem() is None
    check_stored_study("s", back)
    older = StudyAttrs.from_attrs({k: v for k, v in meta.to_attrs().items() if k != "torchpace_version"})
    check_stored_study("s", older)  # a study from before the version was recorded reads as it did


def test_a_result_whose_stored_host_is_malformed_is_exit_2(cli_run, tmp_path):
    doc = json.loads((FIXTURES / "results" / "bench_with_steps.json").read_text())
    (tmp_path / "b.json").write_text(json.dumps({**doc, "host": {"gpus": 3}}))
    done = cli_run("report", "b.json", "--no-doctor", "-o", "r.html")
    assert done.returncode == 2 and "host.gpus: expected a list of GPU names" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "r.html").exists()
