"""What a script-mode trial's process hands its parent: a profile's hook report (a profile has no bench)
decides whether a knob reached the script, and a bench ended by a stall is a result of its own kind."""

import json

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
