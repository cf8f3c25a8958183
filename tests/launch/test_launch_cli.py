"""The `torchpace launch` command line: bad input exits 2 naming the problem, --help stays light,
--dry-run prints the exact command and the env changes with their sources."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from launch_helpers import WORKERS, run_launch
from torchpace.cli import main

SCRIPT = str(WORKERS / "exit_with.py")


@pytest.mark.parametrize("args, message", [
    ([], "missing the script to launch"),
    (["--", "no/such/train.py"], "script 'no/such/train.py' not found"),
    (["--bogus", SCRIPT], "No such option '--bogus'"),
    (["--nproc-per-node", "0", SCRIPT], "'--nproc-per-node': 0 is not in the range x>=1"),
    (["--omp-threads", "many", SCRIPT], "'many' is not 'auto' or a whole number"),
    (["--numa", "socket", SCRIPT], "'socket' is not one of 'auto', 'off', 'node'"),
    (["--nnodes", "2", SCRIPT], "--nnodes 2 needs --rdzv-endpoint"),
    (["--json", SCRIPT], "--json prints the plan, so it goes with --dry-run"),
    (["--", "-m", "pkg.train"], "'-m' is not a script"),
])
def test_bad_input_exits_2_naming_the_problem(args, message, capsys):
    assert main(["launch", *args]) == 2
    assert message in capsys.readouterr().err


def test_config_with_unknown_knob_exits_2(tmp_path, capsys):
    config = tmp_path / "torchpace.toml"
    config.write_text('schema_version = 1\n[knobs]\n"data.num_wokers" = 2\n')
    assert main(["launch", "--config", str(config), "--dry-run", SCRIPT]) == 2
    err = capsys.readouterr().err
    assert "unknown knob 'data.num_wokers'" in err and "data.num_workers" in err


def test_help_and_dry_run_do_not_import_torch(child_env):
    code = ("import sys; from torchpace.cli import main; main(['launch', '--help']); "
            f"main(['launch', '--dry-run', {SCRIPT!r}, '0']); print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], env=child_env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "--nproc-per-node" in result.stdout and "command (dry run" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "False"


def test_dry_run_prints_command_env_diff_and_sources(child_env):
    env = {**child_env, "MKL_NUM_THREADS": "1"}
    result = run_launch(["--dry-run", "--nproc-per-node", "2", "--omp-threads", "1", "--", SCRIPT, "0"], env)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"-m torchpace.launch.torchrun --nproc-per-node=2 --standalone {SCRIPT} 0" in out
    assert "OMP_NUM_THREADS=1" in out and "--omp-threads 1" in out
    assert "cli > env > config > auto > default" in out


def test_dry_run_json_is_the_plan(child_env):
    env = {**child_env, "OMP_NUM_THREADS": "1"}
    result = run_launch(["--dry-run", "--json", "--", SCRIPT, "0"], env)
    plan = json.loads(result.stdout)
    assert plan["argv"][-2:] == [SCRIPT, "0"]
    threads = next(s for s in plan["settings"] if s["name"] == "OMP_NUM_THREADS")
    assert threads == {"name": "OMP_NUM_THREADS", "value": "1", "source": "env",
                       "reason": "already set in your environment; left as is"}
    assert "OMP_NUM_THREADS" not in plan["env_changes"]


def test_a_config_runs_what_it_says_and_auto_only_when_asked(tmp_path, child_env):
    config = tmp_path / "torchpace.toml"
    config.write_text('schema_version = 1\n[knobs]\n"precision.matmul" = "high"\n')
    plan = json.loads(run_launch(["--dry-run", "--json", "--config", str(config), "--", SCRIPT, "0"], child_env).stdout)
    allocator = next(s for s in plan["settings"] if s["name"] == "allocator")
    assert allocator["source"] == "default" and "does not set system.allocator" in allocator["reason"]
    assert "LD_PRELOAD" not in plan["env_changes"] and "OMP_NUM_THREADS" not in plan["env_changes"]
    asked = json.loads(run_launch(["--dry-run", "--json", "--config", str(config), "--allocator", "auto", "--", SCRIPT, "0"],
                                  child_env).stdout)
    assert next(s for s in asked["settings"] if s["name"] == "allocator")["source"] == "auto"


def test_a_toml_setting_a_knob_to_its_default_is_in_the_dry_run_and_the_hooks_config(tmp_path, capsys):
    """`"data.num_workers" = 0` for a script that passes `--workers 2`: the value reaches the script over its own
    argument, so the plan carries it to the hook, and the dry run lists it."""
    config = tmp_path / "torchpace.toml"
    config.write_text('schema_version = 1\n[knobs]\n"data.num_workers" = 0\n"data.persistent_workers" = false\n')
    assert main(["launch", "--config", str(config), "--dry-run", "--json", "--", SCRIPT, "0"]) == 0
    plan = json.loads(capsys.readouterr().out)
    settings = {s["name"]: s for s in plan["settings"]}
    assert settings["data.num_workers"]["value"] == "0" and settings["data.num_workers"]["source"] == "config"
    assert json.loads(plan["env_changes"]["TORCHPACE_LAUNCH_CONFIG"]) == {"data.num_workers": 0,
                                                                         "data.persistent_workers": False}
