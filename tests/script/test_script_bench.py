"""`torchpace bench -- python SCRIPT`: unmodified fixture scripts measured from inside their own process.

Each fixture under scripts/ is a plain training script. The figures are checked against the scripts'
own timestamps (one line per step, written by the script itself, not by torchpace), reconstructed
over the very windows the hook measured, so the check is exact up to the hook's own bookkeeping and
does not depend on how busy the host is.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

from _support import assert_windows_match_stamps
from torchpace.config import RunConfig
from torchpace.trial.script import script_trial_spec
from torchpace.trial import run_trial

SCRIPTS = Path(__file__).parent / "scripts"


def _bench_json(cli_run, *args, max_time="4"):
    """`torchpace bench ... --json`, checked against the bench JSON schema."""
    import jsonschema

    from torchpace.measure.schema import BENCH_RESULT_SCHEMA

    result = cli_run("bench", "--max-time", max_time, "--json", *args, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    payload = json.loads(result.stdout)
    jsonschema.validate(payload, BENCH_RESULT_SCHEMA)
    return payload


# The stamp check needs a window that ends before the last one, so the cap must leave room for two
# after warm-up even on a loaded host: 20 s gives 0.5 s windows, warm-up until 8 s at most, and 12 s
# of windows (the CI usually stops it after six, ~5 s in all; beside busy processes a step can take
# 20x longer, and two windows is then what the cap holds). At 4 s a warm-up that kept doubling its
# window on a loaded host left one measured window, which is a correct bench but nothing to compare.
_STAMPED_MAX_TIME = "20"


@pytest.mark.slow
def test_hand_written_loop_counts_backward_calls_as_steps(cli_run, tmp_path):
    stamps = tmp_path / "stamps.txt"
    bench = _bench_json(cli_run, "--", "python", str(SCRIPTS / "manual_sgd.py"), str(stamps), max_time=_STAMPED_MAX_TIME)
    assert bench["script"]["step_source"] == "backward"
    assert bench["samples_per_s"] is None and bench["script"]["samples_source"] is None  # no DataLoader: steps/s only
    assert bench["input_bound_frac"] is None
    assert_windows_match_stamps(bench, stamps)
    assert bench["steps_per_s"] == pytest.approx(statistics.median(bench["window_steps_per_s"]))
    assert bench["steps_per_s_ci_low"] <= bench["steps_per_s"] <= bench["steps_per_s_ci_high"]
    assert len(bench["loss_values"]) >= bench["measured_steps"] and bench["loss_values"][-1] < bench["loss_values"][0]


@pytest.mark.slow
def test_dataloader_and_adamw_loop_counts_optimizer_steps_and_samples(cli_run, tmp_path):
    stamps = tmp_path / "stamps.txt"
    # one intra-op thread: on a host whose cores other processes share, two OpenMP threads stall at every
    # barrier where one of them was preempted, and steps of 3 ms take 3-150 ms (what is tested here is
    # the timing, not the threads)
    bench = _bench_json(cli_run, "--set", "threads.intra_op=1", "--", "python", str(SCRIPTS / "loader_adamw.py"),
                        "--work", "2", "--stamps", str(stamps), max_time=_STAMPED_MAX_TIME)
    assert bench["script"]["step_source"] == "optimizer" and bench["script"]["samples_source"] == "dataloader"
    assert bench["batch_size"] == 32 and bench["grad_accumulation"] == 1
    assert bench["samples_per_s"] == pytest.approx(32 * bench["steps_per_s"], rel=1e-9)  # every batch holds 32
    assert_windows_match_stamps(bench, stamps)
    assert bench["steps_per_s"] == pytest.approx(statistics.median(bench["window_steps_per_s"]))
    assert 0.0 < bench["input_bound_frac"] < 1.0  # the loader does its FFTs in this process
    assert bench["compute_only_samples_per_s"] is None
    assert bench["other_load_cores"] is not None and bench["other_load_cores"] >= 0


@pytest.mark.slow
def test_gradient_accumulation_counts_optimizer_steps(cli_run, tmp_path):
    stamps = tmp_path / "stamps.txt"
    bench = _bench_json(cli_run, "--", "python", str(SCRIPTS / "grad_accum.py"), str(stamps), max_time=_STAMPED_MAX_TIME)
    assert bench["grad_accumulation"] == 4  # backward() calls per optimizer step
    assert bench["batch_size"] == 32  # 4 batches of 8 per optimizer step
    assert bench["samples_per_s"] == pytest.approx(32 * bench["steps_per_s"], rel=1e-9)
    assert_windows_match_stamps(bench, stamps)
    assert bench["steps_per_s"] == pytest.approx(statistics.median(bench["window_steps_per_s"]))


@pytest.mark.slow
def test_knobs_override_the_scripts_explicit_arguments_and_say_so(cli_run, tmp_path):
    report = tmp_path / "seen.json"
    bench = _bench_json(cli_run, "--set", "data.num_workers=2", "--set", "optimizer.impl=fused", "--",
                        "python", str(SCRIPTS / "explicit_args.py"), str(report))
    seen = json.loads(report.read_text())
    assert seen["num_workers"] == 2 and seen["fused"] is True and seen["batch_size"] == 16
    changes = {(c["argument"], repr(c["old"]), repr(c["new"])) for c in bench["script"]["overrides"]}
    assert ("num_workers", "0", "2") in changes and ("fused", "False", "True") in changes
    assert all(c["where"].endswith(tuple(f"explicit_args.py:{n}" for n in range(1, 40))) for c in bench["script"]["overrides"])
    assert bench["config"] == {"data.num_workers": 2, "optimizer.impl": "fused"}


@pytest.mark.slow
def test_a_crash_in_a_dataloader_worker_is_the_scripts_failure(cli_run):
    result = cli_run("bench", "--max-time", "4", "--", "python", str(SCRIPTS / "worker_crash.py"), timeout=240)
    assert result.returncode == 1
    assert "the script" in result.stderr and "not torchpace" in result.stderr
    assert "is corrupt (raised by the script's own dataset)" in result.stderr


def test_a_script_that_never_steps_times_out_naming_what_was_looked_for(host, tmp_path):
    spec = script_trial_spec([sys.executable, str(SCRIPTS / "never_steps.py")], RunConfig(), 4.0)
    result = run_trial(spec, host, timeout_s=15.0)
    assert result.status == "timeout"
    assert "no optimizer step or backward() seen" in result.error


@pytest.mark.slow
def test_a_script_that_ends_first_gives_its_windows_or_a_clear_failure(cli_run, tmp_path):
    few = cli_run("bench", "--max-time", "4", "--", "python", str(SCRIPTS / "short_run.py"), "5", timeout=240)
    assert few.returncode == 1 and "ended after 5 step(s)" in few.stderr and "let it run longer" in few.stderr
    # one step per window: the script ends before six measured windows, whatever the host's speed
    bench = _bench_json(cli_run, "--", "python", str(SCRIPTS / "short_run.py"), "10", "0.5", max_time="8")
    assert bench["stopped_by"] == "script-ended" and bench["script"]["ended_early"] is True
    assert bench["script"]["steps_seen"] == 10 and 2 <= bench["windows"] <= 5
    assert bench["measured_steps"] == bench["windows"]


@pytest.mark.parametrize("args, message", [
    (["--"], "nothing after `--`"),
    (["--", "bash", "run.sh"], "torchpace monitor"),
    (["tabular", "--", "python", "train.py"], "not both"),
    (["--", "torchrun", "--bogus", "2", "train.py"], "torchrun refused its options (unrecognized arguments: --bogus"),
    (["--", "python", "-m", "torch.distributed.run", "--nproc-per-node", "2"], "required: training_script"),
    (["--", "torchrun", "--nproc-per-node", "2", "missing_train.py"], "script 'missing_train.py' not found"),
    (["--", "torchrun", "--no-python", "./run.sh"], "torchpace measures Python programs"),
])
def test_bad_script_commands_are_usage_errors(cli_run, args, message):
    result = cli_run("bench", *args, timeout=120)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr


def test_a_knob_that_cannot_reach_a_script_is_a_usage_error_naming_prepare(cli_run):
    result = cli_run("bench", "--set", "model.activation_checkpointing=true", "--", "python",
                     str(SCRIPTS / "short_run.py"), timeout=120)
    assert result.returncode == 2
    assert "model.activation_checkpointing" in result.stderr and "prepare()" in result.stderr


@pytest.mark.slow
def test_processes_the_script_starts_are_not_measured_as_the_script(cli_run, tmp_path):
    report = tmp_path / "hooked.txt"
    bench = _bench_json(cli_run, "--", "python", str(SCRIPTS / "spawn_children.py"), str(report))
    hooked = {role: flag for _, role, flag in (line.split() for line in report.read_text().splitlines())}
    # every process of the tree that imports torch gets the hook (a rank may be any of them), and only the one
    # that trains measures: the result is the main process's steps alone
    assert hooked == {"main": "True", "subprocess": "True", "worker": "True"}
    assert bench["batch_size"] == 16 and bench["script"]["samples_source"] == "dataloader"
    assert bench["world_size"] == 1 and bench["ranks"] == []
