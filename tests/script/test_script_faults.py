"""Script mode's faults: a command that is not there (exit 2, nothing started), knob values beyond the
host (the one bound policy, as in every mode), a script that stalls (bounded by the measurement, not by
the parent's kill), one that ends without its exit handlers, and messages that say what happened."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _support import temp_leftovers

SCRIPTS = Path(__file__).parent / "scripts"


# ---- a command that is not there ----------------------------------------------------------------------


@pytest.mark.parametrize("verb", [["bench"], ["profile"], ["tune", "--budget", "1m"], ["knobs"]])
def test_a_script_that_does_not_exist_is_exit_2_before_anything_starts(verb, cli_run, tmp_path):
    for command in (["python", "no_such_train.py"], ["python", "-m", "no_such_package_torchpace.train"]):
        done = cli_run(*verb, "--", *command)
        assert done.returncode == 2 and "not found" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / ".torchpace").exists() and not (tmp_path / "torchpace.toml").exists()  # no study, no config


def test_a_folder_with_main_runs_as_python_runs_it(cli_run, tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__main__.py").write_text("import sys; print('ran', *sys.argv[1:])\n")
    done = cli_run("launch", "--", "python", "app", "x")
    assert done.returncode == 0 and "ran x" in done.stdout, done.stderr
    (tmp_path / "empty").mkdir()
    done = cli_run("launch", "--", "python", "empty")
    assert done.returncode == 2 and "has no __main__.py" in done.stderr


# ---- knob values beyond the host ------------------------------------------------------------------------


@pytest.mark.parametrize("assignment", ["data.num_workers=100000", "threads.intra_op=100000",
                                        "data.prefetch_factor=100000"])
def test_script_mode_bounds_knob_values_as_every_mode_does(assignment, cli_run, tmp_path):
    report = tmp_path / "seen.json"
    extra = ["--set", "data.num_workers=1"] if assignment.startswith("data.prefetch") else []
    for verb in ("bench", "profile"):
        done = cli_run(verb, "--set", assignment, *extra, "--", "python", str(SCRIPTS / "knob_probe.py"), str(report))
        assert done.returncode == 2 and "more than this host allows" in done.stderr, done.stderr[-2000:]
        assert not report.exists()  # refused before the script started


# ---- a script that stops stepping -------------------------------------------------------------------------


@pytest.mark.slow
def test_a_stalled_script_ends_the_bench_by_the_measurement_not_the_parents_kill(cli_run):
    done = cli_run("bench", "--max-time", "3", "--json", "--", "python", str(SCRIPTS / "stalls.py"), "400", timeout=400)
    if done.returncode == 0:  # enough windows before the stall: they are the figures, marked (by the cap when it passed)
        assert json.loads(done.stdout)["stopped_by"] in ("script-stalled", "time")
    else:
        assert done.returncode == 1 and "made no step for" in done.stderr and "stalled" in done.stderr, done.stderr[-3000:]
    assert "no result after" not in done.stderr  # not the parent's timeout


@pytest.mark.slow
def test_a_stalled_script_ends_its_profile_naming_the_stall(cli_run):
    done = cli_run("profile", "--steps", "5", "--", "python", str(SCRIPTS / "stalls.py"), "2", timeout=400)
    assert done.returncode == 1 and "made no step for" in done.stderr and "after step 2" in done.stderr, done.stderr[-3000:]


# ---- messages that say what happened ---------------------------------------------------------------------


def test_a_script_that_ends_without_its_exit_handlers_is_told_so(cli_run):
    done = cli_run("bench", "--max-time", "30", "--", "python", str(SCRIPTS / "exits_abruptly.py"))
    assert done.returncode == 1 and "after 3 step(s)" in done.stderr and "os._exit" in done.stderr, done.stderr[-3000:]
    assert "before torchpace's hook saw a step" not in done.stderr


def test_the_configs_thread_count_holds_over_the_scripts_own_and_says_so(cli_run, tmp_path):
    seen = tmp_path / "threads.txt"
    done = cli_run("bench", "--max-time", "2", "--json", "--set", "threads.intra_op=1", "--", "python",
                   str(SCRIPTS / "sets_threads.py"), str(seen))
    assert done.returncode == 0, done.stderr[-3000:]
    assert seen.read_text() == "1"
    overrides = json.loads(done.stdout)["script"]["overrides"]  # reported as a DataLoader's override is
    assert [(o["object"], o["argument"], o["old"], o["new"], o["knob"]) for o in overrides] == [
        ("torch.set_num_threads", "threads", 2, 1, "threads.intra_op")]
    assert overrides[0]["where"].startswith("sets_threads.py:") or "sets_threads.py:" in overrides[0]["where"]


@pytest.mark.slow
def test_a_profile_sees_the_dataloader_knob_the_hook_applied_and_leaves_no_folder(cli_run, tmp_path, short_tmpdir):
    done = cli_run("profile", "--steps", "1", "--python-steps", "0", "--trace", str(tmp_path / "t.json.gz"),
                   "--set", "data.num_workers=1", "--", "python", str(SCRIPTS / "loader_adamw.py"), "--work", "2",
                   env_extra={"TMPDIR": str(short_tmpdir)}, timeout=400)
    assert done.returncode == 0 and "built no" not in done.stderr, done.stderr[-3000:]  # the knob reached the loader
    assert temp_leftovers(short_tmpdir) == []  # nor the profiler's raw trace


# ---- the end of a measured script: its own clean-up runs ---------------------------------------------


@pytest.mark.parametrize("verb, how", [(["bench", "--max-time", "2"], "loop"), (["bench", "--max-time", "3"], "stall"),
                                       (["profile", "--steps", "2", "--python-steps", "0"], "loop")])
def test_a_script_ended_by_torchpace_runs_its_finally_atexit_and_temporary_folder_clean_up(cli_run, tmp_path, verb, how):
    paths, ran = tmp_path / "paths.txt", tmp_path / "ran.txt"
    done = cli_run(*verb, "--", "python", str(SCRIPTS / "cleans_up.py"), str(paths), str(ran), "300", how, timeout=400)
    if how == "loop":
        assert done.returncode == 0, done.stderr[-3000:]
    else:  # stalled: its windows, or a timeout naming the stall; the script's clean-up runs either way
        assert done.returncode == 0 or "made no step for" in done.stderr, done.stderr[-3000:]
    folders = [Path(p) for p in paths.read_text().split()]
    assert folders and not any(folder.exists() for folder in folders), folders
    assert sorted(ran.read_text().split()) == ["atexit", "finally"], ran.read_text()
