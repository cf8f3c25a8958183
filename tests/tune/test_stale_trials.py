"""Trials no live tuner runs are failed (and then run again), and no live tuner's trial is: a real
SQLite study, real processes, dead and alive."""

from __future__ import annotations

import subprocess
import sys
import time

import optuna
import psutil
import pytest

from torchpace.tune import storage as storage_module
from torchpace.tune.storage import open_storage
from torchpace.tune.handle import StudyHandle
from torchpace.tune.study import ATTR, _process_start, fail_stale_trials, tuner_process


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
def test_a_dead_tuner_on_this_machine_has_its_trial_failed_at_once_and_no_live_ones_is(tmp_path):
    storage = open_storage(f"sqlite:///{tmp_path / 'studies.db'}")
    study = optuna.create_study(storage=storage, study_name="s")
    here = tuner_process()
    machine = here.rpartition("/")[0]
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    started = here.rpartition("@")[2]
    tuners = {"dead here": f"{machine}/{dead.pid}@{started}", "alive here": here,
              "on another machine": f"another-boot-id/pid:[1]/{dead.pid}@{started}", "not recorded": None}
    trials = {}
    for name, process in tuners.items():
        trials[name] = study.ask()._trial_id
        if process:
            storage.set_trial_system_attr(trials[name], ATTR, {"worker": "h:1", "process": process})
    exited = subprocess.Popen([sys.executable, "-c", "pass"])  # ended, not yet reaped: a zombie
    trials["ended, not reaped"] = study.ask()._trial_id
    while psutil.Process(exited.pid).status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.01)
    storage.set_trial_system_attr(trials["ended, not reaped"], ATTR, {"process": f"{machine}/{_process_start(psutil.Process(exited.pid))}"})
    trials["pid taken by another process"] = study.ask()._trial_id
    later = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:  # the pid the dead tuner had, now held by a process that started at another time
        storage.set_trial_system_attr(trials["pid taken by another process"], ATTR, {"process": f"{machine}/{later.pid}@{started}"})
        fail_stale_trials(study, StudyHandle(storage, "s"))
    finally:
        later.kill()
        later.wait()
        exited.wait()
    states = {name: storage.get_trial(trial_id).state.name for name, trial_id in trials.items()}
    assert states == {"dead here": "FAIL", "alive here": "RUNNING", "on another machine": "RUNNING",
                      "not recorded": "RUNNING", "pid taken by another process": "FAIL",
                      "ended, not reaped": "FAIL"}


def test_the_grace_outlasts_every_wait_of_a_live_tuners_heartbeat():
    # a heartbeat may wait for the SQLite lock this long: a live tuner's trial must never look stale
    assert storage_module._GRACE_PERIOD_S > storage_module.SQLITE_TIMEOUT_S + storage_module._HEARTBEAT_INTERVAL_S
