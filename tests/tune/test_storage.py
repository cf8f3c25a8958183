"""`--storage`: URLs and drivers, databases that are not a study, and a storage that fails while tuning
(a lock held too long, a full disk) — real SQLite files, real locks, a real full filesystem."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing

import pytest

from torchpace.errors import UsageError
from torchpace.tune.storage import connect_args, open_storage, resolve_storage_url, root_cause_line
from torchpace.tune.tuner import TuneOptions, Tuner

from _support import fill_disk, fixture_workload

_RUN_TIMEOUT_S = 600


def test_the_plain_postgresql_form_names_the_installed_driver():
    both, only_2, none = (lambda name: True), (lambda name: name == "psycopg2"), (lambda name: False)
    assert resolve_storage_url("postgresql://u:p@db:5432/s", both) == "postgresql+psycopg://u:p@db:5432/s"
    assert resolve_storage_url("postgres://u@db/s", only_2) == "postgresql+psycopg2://u@db/s"
    assert resolve_storage_url("postgresql+psycopg://u@db/s", both) == "postgresql+psycopg://u@db/s"
    assert resolve_storage_url("sqlite:///x.db", none) == "sqlite:///x.db"
    with pytest.raises(UsageError, match=r"pip install 'torchpace\[postgres\]'") as err:
        resolve_storage_url("postgresql://u:secret@db/s", none)
    assert "secret" not in str(err.value)
    with pytest.raises(UsageError, match="not a database URL"):
        resolve_storage_url("no scheme here", both)
    only_3 = lambda name: name == "psycopg"  # noqa: E731
    with pytest.raises(UsageError) as err:  # the driver named is missing, another is there: not "none is installed"
        resolve_storage_url("postgresql+psycopg2://u:secret@db/s", only_3)
    assert "pip install 'psycopg2-binary'" in str(err.value) and "postgresql+psycopg://" in str(err.value)
    assert "none is installed" not in str(err.value) and "secret" not in str(err.value)


def test_every_wait_is_bounded_and_the_url_may_set_it():
    assert connect_args("sqlite:///x.db") == {"timeout": 60.0}
    assert connect_args("sqlite:///x.db?timeout=5") == {}  # SQLAlchemy passes the URL's own value
    assert connect_args("postgresql+psycopg://u@db/s") == {"connect_timeout": 10}
    assert connect_args("postgresql+psycopg://u@db/s?connect_timeout=3") == {}


def test_a_cause_never_carries_the_password():
    err = RuntimeError("could not connect with password hunter2 to db")
    assert "hunter2" not in root_cause_line(err, "postgresql://u:hunter2@db/s")


def _app_db(tmp_path):
    path = tmp_path / "app.db"
    with closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT)")
        conn.execute("INSERT INTO users (email) VALUES ('a@example.com')")
    return path


def test_an_application_sqlite_database_is_refused_before_anything_is_written(tmp_path, cli_run):
    path = _app_db(tmp_path)
    before = path.read_bytes()
    done = cli_run("tune", fixture_workload("tiny_mlp"), "--storage", f"sqlite:///{path}", "--out", str(tmp_path / "t.toml"))
    assert done.returncode == 2 and "users" in done.stderr and "not an Optuna study" in done.stderr, done.stderr
    assert path.read_bytes() == before and not (tmp_path / "t.toml").exists()


def _options(tmp_path, url, **kw):
    return TuneOptions(workload=fixture_workload("tiny_mlp"), storage=url, out=tmp_path / "t.toml", trial_time_s=1.0,
                       guard_steps=6, knobs=frozenset({"data.num_workers"}), **kw)


def test_a_database_locked_at_start_says_it_is_waiting_then_opens(tmp_path, host):
    db = tmp_path / "s.db"
    open_storage(f"sqlite:///{db}").engine.dispose()  # an empty study storage
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    release = threading.Timer(2.0, lambda: holder.execute("ROLLBACK"))
    release.start()
    notices = []
    try:
        tuner = Tuner(_options(tmp_path, f"sqlite:///{db}?timeout=30"), host,
                      on_event=lambda kind, **data: notices.append(data["message"]) if kind == "notice" else None)
    finally:
        release.join()
        holder.close()
    assert tuner.study.study_name == "torchpace-tiny_mlp"
    assert len(notices) == 1 and "locked by another process: waiting up to 30 s" in notices[0]


def _tune_until_a_trial_is_done(tmp_path, url, db):
    """Start a real `torchpace tune`, return it once its study has a finished trial."""
    argv = [sys.executable, "-m", "torchpace", "tune", fixture_workload("tiny_mlp"), "--storage", url, "--out",
            str(tmp_path / "t.toml"), "--trial-time", "1", "--guard-steps", "6", "--knob", "data.num_workers"]
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + _RUN_TIMEOUT_S
    while proc.poll() is None and time.monotonic() < deadline and _finished_trials(db) < 1:
        time.sleep(0.3)
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    return proc


def _finished_trials(db) -> int:
    try:
        with closing(sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=5)) as conn:
            return conn.execute("SELECT count(*) FROM trials WHERE state = 'COMPLETE'").fetchone()[0]
    except sqlite3.OperationalError:  # not created yet
        return 0


def _assert_one_message(proc, cause):
    _, err = proc.communicate(timeout=_RUN_TIMEOUT_S)
    assert proc.returncode == 1, err[-3000:]
    assert "Traceback" not in err and "Exception in thread" not in err, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("torchpace: error:")]
    assert len(errors) == 1 and cause in errors[0] and "--resume" in errors[0], err[-3000:]


def test_a_lock_held_longer_than_the_timeout_mid_tune_ends_with_one_message(tmp_path):
    db = tmp_path / "s.db"
    proc = _tune_until_a_trial_is_done(tmp_path, f"sqlite:///{db}?timeout=2", db)
    holder = sqlite3.connect(db, isolation_level=None, timeout=30)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        _assert_one_message(proc, "database is locked")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert _finished_trials(db) >= 1  # what was finished is kept


def test_a_full_disk_mid_tune_ends_with_one_message(tmp_path, small_disk):
    db = small_disk / "s.db"
    proc = _tune_until_a_trial_is_done(tmp_path, f"sqlite:///{db}", db)
    fill_disk(small_disk)
    _assert_one_message(proc, "full")
    assert _finished_trials(db) >= 1


@pytest.mark.parametrize(("url", "named"), [
    ("mysql://tuner:hunter22@db/s", r"needs the mysql driver 'MySQLdb'.*pip install 'mysqlclient'"),
    ("mysql+pymysql://tuner@db/s", r"'pymysql'.*pip install 'PyMySQL'"),
    ("oracle://tuner@db/s", r"needs the oracle driver"),
    ("mssql+pyodbc://tuner@db/s", r"'pyodbc'"),
    ("postgresql+asyncpg://tuner@db/s", r"asynchronous driver \(asyncpg\)"),
    ("nosuchdb://tuner@db/s", r"SQLAlchemy knows no database 'nosuchdb'"),
])
def test_a_database_whose_driver_is_missing_is_a_usage_error_naming_what_to_install(url, named):
    with pytest.raises(UsageError, match=named) as err:
        resolve_storage_url(url)
    assert "hunter22" not in str(err.value)


@pytest.mark.parametrize("verb", ["tune", "report"])
def test_a_missing_driver_is_exit_2_in_every_verb_with_nothing_written(verb, cli_run, tmp_path):
    url = "mysql://tuner:hunter22@db.lan/studies"
    argv = (["tune", fixture_workload("tiny_mlp"), "--storage", url, "--out", str(tmp_path / "t.toml")]
            if verb == "tune" else ["report", "--storage", url, "-o", str(tmp_path / "r.html")])
    done = cli_run(*argv)
    assert done.returncode == 2 and "mysqlclient" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert "hunter22" not in done.stderr and not (tmp_path / "t.toml").exists() and not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("planted", [".torchpace", ".torchpace/studies.db"])
def test_a_default_study_storage_planted_as_a_symlink_is_refused_untouched(tmp_path, planted):
    from torchpace.tune.storage import default_storage_url

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if planted.endswith(".db"):
        (tmp_path / ".torchpace").mkdir()
        (tmp_path / planted).symlink_to(elsewhere / "studies.db")  # a link to nothing yet: SQLite would create it
    else:
        (tmp_path / planted).symlink_to(elsewhere)
    with pytest.raises(UsageError, match=rf"'.*{planted}' is a symlink"):
        default_storage_url(tmp_path)
    assert list(elsewhere.iterdir()) == []


def test_the_assignment_lock_never_opens_through_a_symlink(tmp_path):
    from torchpace.tune.storage import assignment_lock

    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    victim.chmod(0o600)
    url = f"sqlite:///{tmp_path / 's.db'}"
    (tmp_path / "s.db.lock").symlink_to(victim)
    storage = open_storage(url)
    with assignment_lock(storage, 1):
        pass
    assert victim.read_text() == "precious\n" and not (tmp_path / "s.db.lock").is_symlink()
