"""`torchpace profile` end to end: exit codes, JSON output, the Rich view, and a light `--help`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from _profile_traces import spec

from torchpace.cli import main


def test_help_does_not_import_torch():
    code = ("import sys\nfrom torchpace.cli import main\nrc = main(['profile', '--help'])\n"
            "print('TORCH', 'torch' in sys.modules, rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "--steps" in out.stdout and "--trace" in out.stdout
    assert "TORCH False 0" in out.stdout


@pytest.mark.parametrize(("option", "value"), [("--steps", "0"), ("--steps", "-3"), ("--steps", "101"),
                                               ("--steps", "1000000000"), ("--python-steps", "-1"),
                                               ("--python-steps", "101")])
def test_step_counts_outside_their_range_are_usage_errors(option, value, capsys, tmp_path):
    # the workload would fail with exit 1 if it were loaded: exit 2 shows nothing ran
    assert main(["profile", spec("raises_on_build"), option, value, "--trace", str(tmp_path / "t.json.gz")]) == 2
    err = capsys.readouterr().err
    assert option in err and "100" in err and "planted failure" not in err
    assert not (tmp_path / "t.json.gz").exists()


def test_unwritable_trace_path_exits_2_before_running_anything(capsys, tmp_path):
    # the workload would fail with exit 1 if it were loaded: exit 2 shows nothing ran
    rc = main(["profile", spec("raises_on_build"), "--trace", str(tmp_path / "missing-dir" / "t.json.gz")])
    err = capsys.readouterr().err
    assert rc == 2 and "--trace" in err and "cannot be written" in err
    assert "planted failure" not in err


def test_a_workload_that_raises_exits_1_with_its_traceback_labelled(capsys, tmp_path):
    rc = main(["profile", spec("raises_in_step"), "--steps", "1", "--trace", str(tmp_path / "t.json.gz")])
    err = capsys.readouterr().err
    assert rc == 1
    assert "traceback from YOUR code" in err and "planted failure in the user's forward" in err


@pytest.mark.slow
def test_json_output_and_rich_output(capsys, tmp_path):
    trace = tmp_path / "t.json.gz"
    args = ["profile", spec("input_bound"), "--steps", "2", "--python-steps", "1", "--trace", str(trace)]
    assert main(args + ["--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["kind"] == "torchpace.profile" and payload["schema_version"] == 1
    assert payload["verdict"]["kind"] == "input-bound" and payload["steps"] == 2
    assert {"kind", "evidence", "remedies", "knobs_to_try", "stages_to_try", "shares", "also"} <= set(payload["verdict"])
    assert {f["id"] for f in payload["findings"]} >= {"profile.step_split", "profile.host_sync", "profile.top_ops"}
    assert trace.exists() and payload["trace_path"] == str(trace)
    # the noise warning bench has: the spread of the step times and the other processes' CPU meanwhile
    assert payload["step_time_iqr_frac"] >= 0 and isinstance(payload["noise_warning"], bool)
    assert payload["other_load_cores"] >= 0 and payload["usable_cores"] >= 1

    assert main(args) == 0
    out = capsys.readouterr().out
    assert "verdict: input-bound" in out and "step time split" in out and "data.num_workers" in out


def test_cuda_device_on_a_host_without_cuda_is_a_usage_error(capsys, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has CUDA")
    rc = main(["profile", spec("raises_on_build"), "--device", "cuda", "--trace", str(tmp_path / "t.json.gz")])
    assert rc == 2 and "no CUDA device" in capsys.readouterr().err
