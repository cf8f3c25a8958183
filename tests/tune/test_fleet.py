"""One study worked by several tuner processes on a real PostgreSQL server (the `postgres` session fixture).

Each tuner is a real `torchpace tune` process, as one per host would be; they share only the database.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import sys
import threading
import time

import optuna
import psutil
import pytest

from torchpace.errors import UsageError
from torchpace.tune.storage import open_storage
from torchpace.tune.study import ATTR, open_study, study_metadata
from torchpace.tune.tuner import TuneOptions, Tuner

from _postgres import start_fleet
from _support import fixture_workload, still_running

STUDY = "fleet"
_KNOBS = ("data.num_workers",)  # two values a worker each can take at once; a second knob only adds minutes
_RUN_TIMEOUT_S = 900
_BAD_URL_WAIT_S = 12  # seconds a bad URL may wait beyond a refused connection (its connect timeout is 3 s)


def _tune_cmd(url, out, *extra, study=STUDY):
    knobs = [arg for name in _KNOBS for arg in ("--knob", name)]
    return [sys.executable, "-m", "torchpace", "tune", fixture_workload("tiny_mlp"), "--storage", url, "--study", study,
            "--out", str(out), "--trial-time", "1", "--guard-steps", "6", *knobs, "--json", *extra]


def _start_workers(url, tmp_path, count):
    return start_fleet(lambda i, *extra: _tune_cmd(url, tmp_path / f"w{i}.toml", *extra), url, STUDY, count, tmp_path)


def _trials(url):
    storage = url.replace("postgresql://", "postgresql+psycopg://")
    return optuna.load_study(study_name=STUDY, storage=storage).get_trials(deepcopy=False)


def _measured_slots(trials):
    """Slots of trials that ran to a verdict (a trial lost with its tuner, cut by the budget, or a candidate not
    judged because its comparison's reference arm failed, is not a measurement: its slot is run again)."""
    infos = [{**t.system_attrs.get(ATTR, {}), **t.user_attrs.get(ATTR, {})} for t in trials]
    return [i["slot"] for i in infos if i.get("status") not in (None, "lost", "budget", "interrupted", "partner")]


def _wait_all(procs):
    outputs = [p.communicate(timeout=_RUN_TIMEOUT_S) for p in procs]
    assert [p.returncode for p in procs] == [0] * len(procs), [err[-2000:] for _, err in outputs]
    return [json.loads(out) for out, _ in outputs]


@pytest.mark.timeout(_RUN_TIMEOUT_S + 120)
def test_three_tuners_share_one_postgres_study(postgres, tmp_path):
    url = postgres.create_database("three").replace("postgresql+psycopg://", "postgresql://")  # the plain form
    outcomes = _wait_all(_start_workers(url, tmp_path, 3))
    trials = _trials(url)
    workers = {t.system_attrs.get(ATTR, {}).get("worker") for t in trials} - {None}
    assert len(workers) >= 2, workers
    slots = _measured_slots(trials)
    assert len(slots) == len(set(slots)), f"a slot was measured twice: {sorted(slots)}"
    assert all(o["stopped"] == "done" for o in outcomes)
    tomls = [(tmp_path / f"w{i}.toml").read_text() for i in range(3)]
    assert tomls[0] == tomls[1] == tomls[2]  # every worker replays the same records to the same result


@pytest.mark.timeout(_RUN_TIMEOUT_S + 120)
def test_a_worker_killed_mid_trial_loses_nothing_and_its_trial_is_run_again(postgres, tmp_path):
    url = postgres.create_database("killed")
    procs = _start_workers(url, tmp_path, 3)
    victim, deadline = None, time.monotonic() + 300
    while victim is None and time.monotonic() < deadline and all(p.poll() is None for p in procs):
        time.sleep(0.2)
        victim = next((p for p in procs if _running_a_trial(p)), None)
    assert victim is not None, "no worker was seen running a trial"
    children = psutil.Process(victim.pid).children(recursive=True)
    finished_before = {t.number for t in _trials(url) if t.state.is_finished()}
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    assert still_running([c.pid for c in children], 15.0) == [], "trial processes outlived their killed tuner"
    _wait_all([p for p in procs if p is not victim])
    trials = _trials(url)
    assert finished_before <= {t.number for t in trials if t.state.is_finished()}  # nothing finished was lost
    killed = [t for t in trials if t.system_attrs.get(ATTR, {}).get("worker", "").endswith(f":{victim.pid}")
              and t.state == optuna.trial.TrialState.FAIL and "status" not in t.user_attrs.get(ATTR, {})]
    assert killed, "the killed worker's trial was not failed after the heartbeat grace"
    slot = killed[-1].system_attrs[ATTR]["slot"]
    assert slot in _measured_slots(trials), f"{slot} was not run again"
    slots = _measured_slots(trials)
    assert len(slots) == len(set(slots))


def test_a_host_with_another_fingerprint_is_refused_naming_both(postgres, host):
    url = postgres.create_database("fingerprint")
    spec = fixture_workload("tiny_mlp")
    open_study(open_storage(url), STUDY, study_metadata(spec, host, "greedy"), False, None)
    other = dataclasses.replace(host, cpu_model="Some Other CPU")
    with pytest.raises(UsageError) as err:
        Tuner(TuneOptions(workload=spec, storage=url, study=STUDY, resume=True, knobs=frozenset(_KNOBS)), other)
    assert host.fingerprint() in str(err.value) and other.fingerprint() in str(err.value)


def _running_a_trial(proc) -> bool:
    try:
        return any("torchpace.trial" in " ".join(c.cmdline()) for c in psutil.Process(proc.pid).children(recursive=True))
    except psutil.Error:  # it, or the child we looked at, ended meanwhile
        return False


# ---- URLs that cannot be used ----------------------------------------------------------------------


@pytest.fixture
def silent_server():
    """A loopback port that accepts connections and never answers (a server that hangs)."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted, stop = [], threading.Event()

    def accept():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    listener.close()


def _bad_urls(postgres, silent_port):
    from _postgres import free_port

    return {"wrong password": (postgres.url(password="not-the-password"), "password authentication failed"),
            "missing database": (postgres.url("no_such_db"), 'database "no_such_db" does not exist'),
            "nothing listening": (f"postgresql://postgres:tp-secret@127.0.0.1:{free_port()}/x", "refused"),
            "a server that never answers": (f"postgresql://postgres:tp-secret@127.0.0.1:{silent_port}/x?connect_timeout=3",
                                            "timeout")}


@pytest.mark.parametrize("verb", ["tune", "report"])
def test_bad_urls_exit_2_naming_the_masked_url_quickly(postgres, silent_server, cli_run, tmp_path, verb):
    took_s = {}
    for case, (url, cause) in _bad_urls(postgres, silent_server).items():
        argv = (["tune", fixture_workload("tiny_mlp"), "--storage", url, "--out", str(tmp_path / "t.toml")]
                if verb == "tune" else ["report", "--storage", url, "-o", str(tmp_path / "r.html")])
        start = time.monotonic()
        done = cli_run(*argv, timeout=120)
        took_s[case] = time.monotonic() - start
        assert done.returncode == 2, (case, done.stderr[-1500:])
        assert "Traceback" not in done.stderr and "tp-secret" not in done.stderr, (case, done.stderr)
        assert "***@127.0.0.1" in done.stderr and cause in done.stderr, (case, done.stderr)
    # no case waits (retries, a driver's default connect timeout) beyond the URL's 3 s connect timeout:
    # each is timed against the refused connection, which waits for nothing, so start-up and imports on a
    # loaded host count alike on both sides
    waited = {case: took - took_s["nothing listening"] for case, took in took_s.items()}
    assert all(extra < _BAD_URL_WAIT_S for extra in waited.values()), took_s
    assert not (tmp_path / "t.toml").exists() and not (tmp_path / "r.html").exists()


# ---- a database that is not a study ------------------------------------------------------------------


def test_an_application_database_on_postgres_is_refused_and_left_untouched(postgres, cli_run, tmp_path):
    import sqlalchemy

    url = postgres.create_database("app")
    engine = sqlalchemy.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text("CREATE TABLE customers (id integer primary key, name text)"))
    done = cli_run("tune", fixture_workload("tiny_mlp"), "--storage", url, "--out", str(tmp_path / "t.toml"))
    assert done.returncode == 2 and "customers" in done.stderr and "not an Optuna study" in done.stderr, done.stderr
    assert sqlalchemy.inspect(engine).get_table_names() == ["customers"]
    engine.dispose()
