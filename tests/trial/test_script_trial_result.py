"""What a script-mode trial's process hands its parent: a profile's hook report (a profile has no bench)
decides whether a knob reached the script, and a bench ended by a stall is a result of its own kind."""

import json

import pytest

import jsonschema

from _support import FIXTURES
from torchpace.measure.result import BenchResult, ScriptInfo
from torchpace.measure.schema import BENCH_RESULT_SCHEMA
from torchpace.protocol import INVALID, OK, TrialResult, TrialSpec
from torchpace.trial.script import read_script_result

SPEC = TrialSpec(workload="python train.py", command=["python", "train.py"], config={"data.num_workers": 2},
                 max_time_s=5.0)


def _profile_result(path, reached: tuple[str, ...], not_applied: dict | None = None):
    script = ScriptInfo(command=("python", "train.py"), steps_seen=7, reached=reached, not_applied=not_applied or {})
    path.write_text(json.dumps(TrialResult(OK, wall_time_s=1.0, script=script).to_dict()))
    return read_script_result(SPEC, path, 0, "", 1.0)


def test_a_profile_whose_dataloader_knob_took_effect_is_ok_and_keeps_the_hooks_report(tmp_path):
    result = _profile_result(tmp_path / "result.json", reached=("data.num_workers",))
    assert result.status == OK and result.bench is None
    assert result.script.reached == ("data.num_workers",) and result.script.steps_seen == 7


def test_a_profile_whose_knob_never_met_a_dataloader_is_invalid_naming_why(tmp_path):
    result = _profile_result(tmp_path / "result.json", reached=())
    assert result.status == INVALID and result.error.startswith("data.num_workers: never took effect")
    why = "the DataLoader at train.py:9 is given an IterableDataset"
    result = _profile_result(tmp_path / "result.json", reached=(), not_applied={"data.num_workers": why})
    assert result.status == INVALID and result.error == f"data.num_workers: {why}"


def test_a_bench_ended_by_a_stall_is_marked_and_round_trips_through_a_trial_result():
    recorded = json.loads((FIXTURES / "results" / "bench_script_steps_only.json").read_text())
    recorded["stopped_by"] = "script-stalled"
    bench = BenchResult.from_dict(recorded)
    written = json.loads(json.dumps(TrialResult(OK, bench, wall_time_s=2.0).to_dict()))
    jsonschema.validate(written["bench"], BENCH_RESULT_SCHEMA, cls=jsonschema.Draft202012Validator)
    again = TrialResult.from_dict(written)
    assert again.bench == bench and again.bench.throughput.stopped_by == "script-stalled" and again.script is None


def test_a_short_scripts_trials_are_sized_to_its_steps_at_the_step_time_its_trials_ran():
    """A script with a 20-step epoch: 19 steps after its first, 0.11 s each in a quiet baseline (2.2 s, a
    measurement of 1.5 s), 2-6 s each once the host is busy: the trial then measures for the share of what the
    19 steps take now (capped by --trial-time), not for the 1.5 s of the quiet run."""
    from torchpace.trial.script import sized_to_steps_s, steps_after_first

    ended = TrialResult("ok", ended_after={"steps": 20, "seconds": 2.2, "windows": 4})
    assert steps_after_first(ended) == 19 and steps_after_first(TrialResult("ok")) is None
    assert sized_to_steps_s(19, 2.2 / 19, 20.0) == 1.5
    assert sized_to_steps_s(19, 4.0, 20.0) == 20.0 and sized_to_steps_s(19, 4.0, 120.0) == 53.2
    assert sized_to_steps_s(19, None, 20.0) is None and sized_to_steps_s(19, 0.01, 20.0) is None  # too short


def test_a_comparison_of_a_short_script_runs_its_rounds_to_the_scripts_end():
    from torchpace.trial.script import rounds_for_steps_s

    # 19 steps of 0.4 s in each arm: 15.2 s of turns and warm-ups, ended by the scripts' end, within --trial-time
    assert rounds_for_steps_s(19, 0.4, 5.3, 20.0) == pytest.approx(15.2)
    assert rounds_for_steps_s(19, 4.0, 20.0, 20.0) == 20.0 and rounds_for_steps_s(19, 0.01, 1.0, 20.0) == 1.0
