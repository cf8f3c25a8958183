"""Script-mode labels that say what happened: a knob that never reached the script is `invalid` (not the
script's crash, however early it ended); a trial the tune's budget cut is `budget` (not "no step seen");
a script that ends before a measurement could is measured again, sized to it, and a study whose baseline
failed says how to start again."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "scripts"


def test_an_optimizer_knob_on_a_script_without_an_optimizer_is_invalid_not_a_crash(cli_run):
    # 20 steps: the script ends long before a measurement could (that alone would be its crash)
    result = cli_run("bench", "--max-time", "4", "--set", "optimizer.impl=foreach", "--",
                     "python", str(SCRIPTS / "brief_manual.py"), "20", timeout=240)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "optimizer.impl: never took effect in the script: it built no torch.optim optimizer" in result.stderr


@pytest.mark.slow
def test_a_script_that_ends_before_the_measurement_is_measured_again_sized_to_it(cli_run):
    # 2.5 s of steps after the first, however fast they are: at --max-time 20 (0.5 s windows) it ends
    # with at most 5 windows, fewer than a CI needs
    result = cli_run("bench", "--max-time", "20", "--json", "--", "python", str(SCRIPTS / "brief_manual.py"),
                     "1000000", "0.005", "2.5", timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "measuring it again for" in result.stderr
    assert "done after" not in result.stderr  # the script's own output is kept in its log, not streamed unless asked
    bench = json.loads(result.stdout)
    assert bench["windows"] >= 2 and bench["steps_per_s"] > 0


@pytest.mark.slow
def test_a_tune_sizes_its_trials_to_a_short_script_and_keeps_that_on_resume(cli_run, tmp_path):
    command = ["--", "python", str(SCRIPTS / "brief_manual.py"), "1000000", "0.005", "2.5"]
    first = cli_run("tune", "--run-on", "0", "--trial-time", "20", "--guard-steps", "5", "--max-trials", "2", "--json", *command, timeout=600)
    assert "every trial of study 'torchpace-brief_manual.py' now measures for" in first.stderr, first.stderr[-3000:]
    trials = json.loads(first.stdout)["trials"]
    assert trials[0]["slot"] == "baseline" and trials[0]["status"] == "ok", trials
    with sqlite3.connect(tmp_path / ".torchpace" / "studies.db") as db:
        fitted = json.loads(db.execute("SELECT value_json FROM study_user_attributes WHERE key = "
                                       "'torchpace.trial_time_s'").fetchone()[0])
    assert 1.0 <= fitted < 20
    again = cli_run("tune", "--run-on", "0", "--resume", "--trial-time", "20", "--guard-steps", "5", "--max-trials", "1", "--json", *command,
                    timeout=600)
    assert f"measure for {fitted:g} s, sized to the script when its baseline ran" in again.stderr, again.stderr[-3000:]


def test_resume_of_a_study_whose_baseline_failed_says_how_to_start_again(cli_run, tmp_path):
    command = ["--", "python", str(SCRIPTS / "crash_at_start.py")]
    first = cli_run("tune", "--run-on", "0", "--trial-time", "2", "--max-trials", "1", *command, timeout=300)
    assert first.returncode == 1, first.stderr[-3000:]
    log = tmp_path / ".torchpace" / "logs" / "torchpace-crash_at_start.py" / "trial-0.log"
    assert "planted failure before the first step" in log.read_text()  # the script's own output, kept
    again = cli_run("tune", "--run-on", "0", "--resume", "--trial-time", "2", "--max-trials", "1", *command, timeout=300)
    assert again.returncode == 1
    assert "study 'torchpace-crash_at_start.py' cannot go on: its baseline failed" in again.stderr
    assert f"start a new study: torchpace tune --study torchpace-crash_at_start.py-2 -- python {SCRIPTS / 'crash_at_start.py'}" \
        in again.stderr


def test_a_trial_cut_by_the_budget_says_budget_not_no_step(cli_run):
    # the script never steps; the budget (8 s) ends its trial long before the trial's own cap
    result = cli_run("tune", "--run-on", "0", "--budget", "8s", "--trial-time", "20", "--json", "--",
                     "python", str(SCRIPTS / "never_steps.py"), timeout=300)
    trials = json.loads(result.stdout)["trials"]
    assert trials[0]["status"] == "budget", trials
    assert trials[0]["error"].startswith("cut by the tune's budget") and "no optimizer step" not in trials[0]["error"]


def test_a_failure_in_torchpaces_own_hook_is_labelled_as_torchpaces_not_the_scripts(cli_run):
    ours = cli_run("bench", "--max-time", "4", "--", "python", str(SCRIPTS / "breaks_the_hook.py"), timeout=240)
    assert ours.returncode == 1, ours.stderr[-3000:]
    assert "torchpace's own failure, not the script's" in ours.stderr and "RuntimeError: planted fault" in ours.stderr
    assert "the script's own failure" not in ours.stderr and "YOUR script" not in ours.stderr
    theirs = cli_run("bench", "--max-time", "4", "--", "python", str(SCRIPTS / "breaks_the_hook.py"), "own", timeout=240)
    assert theirs.returncode == 1, theirs.stderr[-3000:]
    assert "the script's own failure" in theirs.stderr and "YOUR script" in theirs.stderr
    assert "planted failure of the script's own" in theirs.stderr
    assert "torchpace's own failure" not in theirs.stderr


def test_a_hook_that_could_not_write_its_result_is_still_labelled_as_torchpaces(tmp_path):
    from torchpace.script.spec import OWN_FAILURE, OWN_FAILURE_EXIT, OWN_FAILURE_LINE
    from torchpace.protocol import CRASH, TrialSpec
    from torchpace.trial.script import read_script_result

    spec = TrialSpec(workload="python train.py", command=["python", "train.py"])
    missing = tmp_path / "result.json"
    ours = read_script_result(spec, missing, OWN_FAILURE_EXIT, f"{OWN_FAILURE_LINE}\nTraceback ...", 1.0)
    assert ours.status == CRASH and ours.error.startswith(OWN_FAILURE)
    theirs = read_script_result(spec, missing, OWN_FAILURE_EXIT, "Traceback ...\nValueError: the script's", 1.0)
    assert "the script's own failure" in theirs.error and OWN_FAILURE not in theirs.error
