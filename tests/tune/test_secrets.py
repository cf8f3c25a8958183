"""A database password never reaches an output: not the terminal, `--json`, torchpace.toml, the HTML
report or an error, whichever URL form carries it (userinfo, percent-encoded, `?password=`, all in the query) — on a
real PostgreSQL server."""

from __future__ import annotations

import html
import json
from urllib.parse import quote

import pytest

from _support import fixture_workload

PASSWORD = "p@ss w/rd-93"  # needs percent-encoding in a URL; a driver's error would quote it decoded


@pytest.fixture(scope="module")
def secret_database(postgres):
    """A role with PASSWORD and a database it owns, on the session's throw-away server."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(postgres.url(), isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sqlalchemy.text(f"CREATE ROLE tp_secret LOGIN PASSWORD '{PASSWORD}'"))
        conn.execute(sqlalchemy.text("CREATE DATABASE tp_secret_db OWNER tp_secret"))
    engine.dispose()
    return postgres.port


def _urls(port: int, password: str) -> dict[str, str]:
    host = f"127.0.0.1:{port}/tp_secret_db"
    return {"user:password@": f"postgresql+psycopg://tp_secret:{quote(password, safe='')}@{host}",
            "?password=": f"postgresql+psycopg://tp_secret@{host}?password={quote(password, safe='')}",
            "query only": (f"postgresql+psycopg:///tp_secret_db?host=127.0.0.1&port={port}&user=tp_secret"
                           f"&password={quote(password, safe='')}")}


def _spellings(password: str) -> list[str]:
    return [password, quote(password, safe=""), quote(password), html.escape(password), json.dumps(password)[1:-1]]


def _assert_nowhere(password: str, **outputs: str) -> None:
    for name, text in outputs.items():
        for spelling in _spellings(password):
            assert spelling not in text, f"{name} holds the password ({spelling!r}): {text[-2000:]}"


FORMS = ["user:password@", "?password=", "query only"]


@pytest.mark.parametrize("form", FORMS)
def test_a_tune_and_its_report_never_show_the_password(secret_database, form, cli_run, tmp_path):
    url = _urls(secret_database, PASSWORD)[form]
    out, report = tmp_path / "torchpace.toml", tmp_path / "tune.html"
    done = cli_run("tune", fixture_workload("tiny_mlp"), "--storage", url, "--study", f"secret-{FORMS.index(form)}",
                   "--max-trials", "1", "--trial-time", "1", "--guard-steps", "0", "--knob", "data.num_workers",
                   "--json", "--out", str(out), "--report", str(report), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "tp_secret" in out.read_text() and "***" in out.read_text()  # the storage is named, masked
    again = cli_run("report", "--storage", url, "--study", f"secret-{FORMS.index(form)}", "-o", str(tmp_path / "again.html"))
    assert again.returncode == 0, again.stderr[-3000:]
    _assert_nowhere(PASSWORD, stdout=done.stdout, stderr=done.stderr, toml=out.read_text(), report=report.read_text(),
                    report_verb=(tmp_path / "again.html").read_text(), report_stderr=again.stderr)


@pytest.mark.parametrize("verb", ["tune", "report"])
def test_a_refused_password_is_masked_in_the_error_in_every_url_form(secret_database, verb, cli_run, tmp_path):
    wrong = "wr@ng pass/93"
    for form, url in _urls(secret_database, wrong).items():
        argv = (["tune", fixture_workload("tiny_mlp"), "--storage", url, "--out", str(tmp_path / "t.toml")]
                if verb == "tune" else ["report", "--storage", url, "-o", str(tmp_path / "r.html")])
        done = cli_run(*argv, timeout=120)
        assert done.returncode == 2 and "password authentication failed" in done.stderr, (form, done.stderr[-2000:])
        _assert_nowhere(wrong, stderr=done.stderr, stdout=done.stdout)


QUOTED = "it's:\"q\"#9"  # legal in a URL's userinfo as written (', : and # raw; " as drivers take it)


@pytest.fixture(scope="module")
def quoted_database(postgres):
    """A role whose password holds quotes and other sub-delimiters, with a database it owns."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(postgres.url(), isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        escaped = QUOTED.replace("'", "''")  # a literal in SQL: its quote doubled
        conn.execute(sqlalchemy.text(f"CREATE ROLE tp_quoted LOGIN PASSWORD '{escaped}'"))
        conn.execute(sqlalchemy.text("CREATE DATABASE tp_quoted_db OWNER tp_quoted"))
    engine.dispose()
    return postgres.port


def test_a_password_with_quotes_written_raw_in_the_url_is_masked_everywhere(quoted_database, cli_run, tmp_path):
    for password in (QUOTED, "wr'ng\"pw#9"):
        url = f"postgresql://tp_quoted:{password}@127.0.0.1:{quoted_database}/tp_quoted_db"  # as users type it
        out, report = tmp_path / "torchpace.toml", tmp_path / "tune.html"
        done = cli_run("tune", fixture_workload("tiny_mlp"), "--storage", url, "--study", "quoted", "--max-trials", "1",
                       "--trial-time", "1", "--guard-steps", "0", "--knob", "data.num_workers", "--json", "--out",
                       str(out), "--report", str(report), timeout=600)
        if password != QUOTED:
            refused = cli_run("report", "--storage", url, "-o", str(tmp_path / "r.html"), timeout=120)
            for run in (done, refused):
                assert run.returncode == 2 and "password authentication failed" in run.stderr, run.stderr[-2000:]
                _assert_nowhere(password, stderr=run.stderr, stdout=run.stdout)
            continue
        assert done.returncode == 0, done.stderr[-3000:]
        again = cli_run("report", "--storage", url, "--study", "quoted", "-o", str(tmp_path / "again.html"))
        assert again.returncode == 0, again.stderr[-3000:]
        assert "tp_quoted:***@" in out.read_text()
        _assert_nowhere(password, stdout=done.stdout, stderr=done.stderr, toml=out.read_text(), report=report.read_text(),
                        report_verb=(tmp_path / "again.html").read_text(), report_stderr=again.stderr)
