"""The run-on check (`torchpace.trial.runon`): a config runs the unmodified script past its measured steps, through
its first save or evaluation, planned as `launch --config` plans it. Real scripts in real processes: one that
evaluates and saves (tests/script/scripts/saves_and_evaluates.py, whose evaluation breaks under
`model.channels_last`), one that ends by itself, one that never saves."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchpace.trial.runon import ENDED, FAILED, PAST, UNREACHED, RunOn, find_culprit, run_on

SCRIPTS = Path(__file__).parents[1] / "script" / "scripts"
LIMIT_S = 60.0  # far beyond what these scripts need (a few seconds), so a loaded host still gets through


def _command(folder: Path, *flags: str) -> list[str]:
    return ["python", str(SCRIPTS / "saves_and_evaluates.py"), str(folder), "5", *flags]


def test_a_script_that_trains_on_after_its_save_is_stopped_past_it(tmp_path, host, child_env):
    run = run_on(_command(tmp_path, "--forever"), {}, host, child_env, LIMIT_S, tmp_path / "run.log")
    assert run.status == PAST and run.ok, run
    assert [event.split(" at ")[0] for event in run.events] == ["eval", "save"]
    assert run.events[1].startswith("save at ") and "saves_and_evaluates.py:" in run.events[1]
    assert (tmp_path / "model.pt").stat().st_size > 0 and run.wall_s < LIMIT_S


def test_a_script_that_ends_by_itself_has_ended(tmp_path, host, child_env):
    run = run_on(_command(tmp_path), {"threads.intra_op": 1}, host, child_env, LIMIT_S, tmp_path / "run.log")
    assert run.status in (ENDED, PAST) and run.ok, run  # it ends a few steps after its save: either may come first
    assert run.config == {"threads.intra_op": 1}


def test_a_script_that_never_saves_is_unreached_at_the_limit(tmp_path, host, child_env):
    run = run_on(_command(tmp_path, "--no-eval"), {}, host, child_env, 6.0, tmp_path / "run.log")
    assert run.status == UNREACHED and not run.ok and run.events == ()
    assert run.wall_s >= 6.0 and "nothing after its measured steps was checked" in run.describe()


def test_a_knob_that_breaks_the_evaluation_is_found_and_taken_back(tmp_path, host, child_env):
    def run(config):
        return run_on(_command(tmp_path, "--forever"), config, host, child_env, LIMIT_S, tmp_path / "run.log")

    check = find_culprit({"threads.intra_op": 1, "model.channels_last": True}, run)
    assert check.run.status == FAILED and "view size is not compatible" in check.run.error, check.run
    assert check.culprit == "model.channels_last" and check.kept == {"threads.intra_op": 1}
    assert [r.config for r in check.runs] == [{"threads.intra_op": 1, "model.channels_last": True}, {},
                                              {"model.channels_last": True}, {"threads.intra_op": 1}]
    assert [r.status for r in check.runs] == [FAILED, PAST, FAILED, PAST]
    assert "model.channels_last is taken back" in check.describe()


# ---- the attribution, over runs given -------------------------------------------------------------------

def _runs(statuses: dict) -> tuple[list, callable]:
    calls = []

    def run(config):
        calls.append(dict(config))
        return RunOn(statuses(config), 1.0, config=dict(config), error="exit status 1")

    return calls, run


@pytest.mark.parametrize(("first", "calls"), [(PAST, 1), (ENDED, 1), (UNREACHED, 1)])
def test_a_config_that_does_not_fail_is_kept_after_one_run(first, calls):
    made, run = _runs(lambda config: first)
    check = find_culprit({"a": 1, "b": 2}, run)
    assert check.kept == {"a": 1, "b": 2} and check.culprit is None and len(made) == calls


def test_a_failure_the_defaults_share_is_the_scripts_own():
    made, run = _runs(lambda config: FAILED)
    check = find_culprit({"a": 1, "b": 2}, run)
    assert check.own_failure and check.kept == {"a": 1, "b": 2} and made == [{"a": 1, "b": 2}, {}]
    assert "the script's own failure" in check.describe()


def test_a_run_that_reaches_nothing_without_a_knob_names_no_culprit():
    # without `a` the script did not get as far (slower: no save within the limit): that proves nothing
    made, run = _runs(lambda config: PAST if not config else UNREACHED if "a" not in config else FAILED)
    check = find_culprit({"a": 1, "b": 2}, run)
    assert check.culprit is None and check.kept == {} and made == [{"a": 1, "b": 2}, {}, {"b": 2}, {"a": 1}]
    assert "the defaults are kept" in check.describe()
