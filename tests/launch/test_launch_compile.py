"""`compile.mode` in an unmodified script (`torchpace.script.compile`): what really gets compiled, seen by a
recording backend, and a model that cannot be compiled."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launch_helpers import WORKERS

SCRIPTS = Path(__file__).parents[1] / "script" / "scripts"


def _record(child_env, *args) -> dict:
    result = subprocess.run([sys.executable, str(WORKERS / "compile_record.py"), *args], env=child_env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_outermost_model_gets_a_compiled_forward_after_the_first_backward(child_env):
    seen = _record(child_env)
    # one graph: the whole nested model (3 linears, 2 blocks' gelu/layer_norm/residual), nothing of the hooks
    assert seen["graphs"] == [{"linear": 3, "gelu": 2, "layer_norm": 2, "add": 2}]
    assert seen["graph_breaks"] == 0  # bf16 autocast and the profile's forward label hooks are live
    assert seen["compile"]["modules"] == ["Net"] and seen["compile"]["failure"] is None
    assert seen["compile"]["compiled_calls"] == 3  # steps 2-4; the first ran eagerly
    assert seen["warm"] is True and seen["reached"] == ["compile.mode", "precision.amp"]
    assert seen["output_dtype"] == "torch.float32"  # autocast around the compiled forward still casts back


def test_a_model_that_cannot_be_compiled_is_an_invalid_config_naming_why(cli_run):
    result = cli_run("bench", "--max-time", "4", "--set", "compile.mode=default", "--",
                     "python", str(SCRIPTS / "uncompilable.py"), timeout=240)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "compile.mode: Net could not be compiled" in result.stderr
    assert "fake" in result.stderr  # the compiler's own reason: no fake-tensor implementation


def test_under_launch_a_model_that_cannot_be_compiled_runs_eagerly_and_says_so(tmp_path, child_env):
    config = tmp_path / "torchpace.toml"
    config.write_text('schema_version = 1\n[knobs]\n"compile.mode" = "default"\n')
    result = subprocess.run([sys.executable, "-m", "torchpace", "launch", "--config", str(config), "--",
                             "python", str(SCRIPTS / "uncompilable.py"), "5"],
                            env=child_env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Net could not be compiled" in result.stderr and "it runs without compile" in result.stderr


def test_a_model_the_script_compiles_itself_is_left_as_it_is_and_said(cli_run):
    result = cli_run("bench", "--max-time", "4", "--set", "compile.mode=default", "--",
                     "python", str(SCRIPTS / "compiles_itself.py"), timeout=240)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "compile.mode: the script compiles Sequential itself (torch.compile)" in result.stderr


@pytest.mark.slow
def test_a_first_compile_longer_than_the_stall_floor_is_measured_not_cut_as_a_stall(cli_run):
    """`compile.mode` on a model whose first compiled step takes 35 s (past the watchdog's 30 s floor, as a
    ResNet-18's minute on a CPU host): the bench waits for it within the trial's compile allowance and
    measures the compiled steps after it."""
    result = cli_run("bench", "--max-time", "3", "--set", "compile.mode=default", "--json", "--",
                     "python", str(SCRIPTS / "slow_compile.py"), "35", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    bench = json.loads(result.stdout)
    assert bench["script"]["compile"]["modules"] == ["Sequential"] and bench["script"]["compile"]["failure"] is None
    assert bench["windows"] >= 2 and bench["stopped_by"] in ("ci", "time")
    assert bench["warmup_s"] < 30  # the compile is in neither the warm-up nor the windows
