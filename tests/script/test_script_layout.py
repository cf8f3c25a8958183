"""`model.channels_last` in an unmodified script (`torchpace.script.layout`): the model converted in place
before its first forward, its 4-D inputs at every call, and the reason where it does not apply."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).parent / "scripts"


def _record(child_env, *args) -> dict:
    result = subprocess.run([sys.executable, str(SCRIPTS / "layout_record.py"), *args], env=child_env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_conv_model_and_its_inputs_run_in_channels_last_and_train_as_before(child_env):
    seen = _record(child_env, "conv")
    assert seen["reached"] == ["model.channels_last"] and seen["not_applied"] == {}
    assert seen["weights"] == [True, True] and seen["inputs"] == [True] * 4  # every call, the first included
    assert seen["same_parameters"]  # the optimizer built before goes on updating the converted tensors
    for ours, eager in zip(seen["losses"], seen["eager_losses"]):  # only the layout changed, and the kernels
        assert abs(ours - eager) <= 1e-4 * abs(eager)
    assert seen["losses"] != [seen["losses"][0]] * 4  # the steps trained: the optimizer saw the gradients


def test_a_model_without_2d_convolutions_is_left_as_it_is_and_says_why(child_env):
    seen = _record(child_env, "linear")
    assert seen["reached"] == []
    assert seen["not_applied"]["model.channels_last"].startswith("Sequential has no 2-D convolution")


def test_a_model_wrapped_in_ddp_before_its_first_forward_is_left_as_it_is_and_says_why(child_env, tmp_path):
    seen = _record(child_env, "ddp", str(tmp_path / "store"))
    assert seen["reached"] == [] and "wrapped in DistributedDataParallel" in seen["not_applied"]["model.channels_last"]
    assert seen["weights"] == [False, False] and seen["inputs"] == [False] * 4


def test_a_bench_of_a_script_without_convolutions_is_invalid_naming_why(cli_run, tmp_path):
    result = cli_run("bench", "--max-time", "4", "--set", "model.channels_last=true", "--",
                     "python", str(SCRIPTS / "loader_adamw.py"), timeout=240)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "model.channels_last: " in result.stderr and "has no 2-D convolution" in result.stderr


def test_a_model_that_fails_in_channels_last_is_its_own_failure_with_torchs_message(cli_run):
    result = cli_run("bench", "--max-time", "4", "--set", "model.channels_last=true", "--",
                     "python", str(SCRIPTS / "views_conv_output.py"), timeout=240)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "the script's own failure" in result.stderr and "view size is not compatible" in result.stderr
    assert "Traceback" in result.stderr and "torchpace's own failure" not in result.stderr
    plain = cli_run("bench", "--max-time", "4", "--", "python", str(SCRIPTS / "views_conv_output.py"), timeout=240)
    assert plain.returncode == 0, plain.stderr[-3000:]  # the same script runs in its own layout
