"""`torchpace compare`: two configs measured in alternation, from the command line (real subprocesses)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import psutil
import pytest

from _support import FIXTURES, sigint_as_at_a_terminal, still_running, trial_snapshot
from torchpace.compare.schema import COMPARE_RESULT_SCHEMA

SLEEPY = f"{FIXTURES / 'pair_workloads.py'}:sleepy_loader"


def _json(result):
    import jsonschema

    payload = json.loads(result.stdout)
    jsonschema.validate(payload, COMPARE_RESULT_SCHEMA)
    return payload


@pytest.mark.slow
def test_four_loader_workers_against_one_on_an_input_bound_workload(cli_run, tmp_path):
    # each item sleeps: four workers deliver batches about four times as fast as one, however busy the CPUs
    # are (the margin below leaves room for a host so loaded that sleeping workers wake late)
    (tmp_path / "one.toml").write_text("schema_version = 1\n[knobs]\n\"data.num_workers\" = 1\n")
    result = cli_run("compare", SLEEPY, "--config", "one.toml", "--set", "data.num_workers=4", "--json",
                     "--max-time", "8", "--out", "four.json", timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    payload = _json(result)
    assert payload == json.loads((tmp_path / "four.json").read_text())
    assert payload["mode"] == "alternating" and payload["mode_reason"] is None
    assert payload["a"]["config"] == {"data.num_workers": 1} and payload["b"]["config"] == {"data.num_workers": 4}
    # a verdict needs the 6 rounds of a 95% CI; a host slow enough to give fewer says so instead
    assert payload["verdict"] == ("faster" if payload["rounds"] >= 6 else "too few rounds"), payload["summary"]
    assert payload["ratio"] > 2.0, payload["summary"]
    assert payload["ratio_ci_low"] <= payload["ratio"] <= payload["ratio_ci_high"]
    assert payload["rounds"] == len(payload["ratios"]) >= 1
    assert payload["b"]["figure"] > payload["a"]["figure"] and payload["a"]["other_load_cores"] is not None
    report = cli_run("report", "four.json", "--no-doctor", "-o", "four.html")  # what compare saved, rendered
    assert report.returncode == 0 and payload["summary"] in (tmp_path / "four.html").read_text(), report.stderr


@pytest.mark.slow
def test_a_failing_arm_is_exit_1_and_labelled(cli_run):
    result = cli_run("compare", f"{FIXTURES / 'pair_workloads.py'}:fails_in_worker", "--set", "data.num_workers=1",
                     "--json", "--max-time", "4", timeout=400)
    assert result.returncode == 1, result.stderr[-3000:]
    payload = _json(result)
    assert payload["verdict"] == "failed" and payload["stopped_by"] == "failed"
    assert payload["b"]["status"] == "crash" and "planted failure" in payload["b"]["error"]
    assert payload["a"]["status"] == "partner"
    assert "arm B" in payload["summary"]


@pytest.mark.parametrize("args, says", [
    (("--config", "a.toml", "--config", "a.toml", "--config", "a.toml"), "at most two"),
    (("--set", "precision.amp=fp16"), "precision.amp"),
    (("--set", "no.such_knob=1"), "no.such_knob"),
    (("--max-time", "0"), "--max-time"),
    (("--out", "a.toml", "--config", "a.toml"), "a.toml"),
    (("--objective", "latency"), "--objective latency needs an inference workload, and 'tabular' trains"),
    (("--objective", "fastest"), "'fastest' is not one of 'throughput', 'latency'"),
])
def test_bad_input_is_exit_2_before_anything_runs(cli_run, tmp_path, args, says):
    (tmp_path / "a.toml").write_text("schema_version = 1\n")
    result = cli_run("compare", *args, timeout=120)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert says in result.stderr
    assert (tmp_path / "a.toml").read_text() == "schema_version = 1\n"  # nothing overwritten


def test_latency_of_a_script_is_exit_2_naming_the_objective_that_applies(cli_run, tmp_path):
    (tmp_path / "train.py").write_text("print('never run')\n")
    result = cli_run("compare", "--objective", "latency", "--", sys.executable, "train.py", timeout=120)
    assert result.returncode == 2 and "is a script" in result.stderr and "--objective throughput" in result.stderr


@pytest.mark.slow
def test_latency_compares_batch1_calls_in_turns(cli_run):
    from statistics import median

    from torchpace.trial.schedule import paired_ratios

    result = cli_run("compare", "inference", "--objective", "latency", "--set", "threads.intra_op=1", "--max-time", "6",
                     "--json", timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    payload = _json(result)
    assert payload["objective"] == "latency" and payload["unit"] == "s"
    assert payload["mode"] == "alternating" and payload["mode_reason"] is None
    for arm in ("a", "b"):  # each turn's batch-1 p50, in seconds; the arm's figure is their median
        turns = payload[arm]["turns"]
        assert min(turns) > 0 and payload[arm]["figure"] == pytest.approx(median(turns))
    # the rounds are those of the turns' 1 / p50, so above 1 means B answers sooner
    rates = {arm: [1 / p50 for p50 in payload[arm]["turns"]] for arm in ("a", "b")}
    assert payload["ratios"] == pytest.approx(paired_ratios(rates["a"], rates["b"]))
    assert payload["rounds"] == len(payload["ratios"]) and payload["ratio_ci_low"] <= payload["ratio"] <= payload["ratio_ci_high"]


@pytest.mark.slow
def test_ctrl_c_ends_both_arms(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "torchpace", "compare", f"{FIXTURES / 'pair_workloads.py'}:logged",
                             "--set", "data.num_workers=1", "--max-time", "120", "--json"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=sigint_as_at_a_terminal)
    try:
        arms = _arms_taking_turns(proc.pid, within_s=120)
        members = arms + [c for arm in arms for c in arm.children(recursive=True)]
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        assert proc.returncode == 130, proc.stderr.read()[-2000:]
        assert still_running([p.pid for p in members], 10.0) == []
    finally:
        proc.kill()
        proc.wait()


def _arms_taking_turns(pid: int, within_s: float) -> list[psutil.Process]:
    """The two trial processes of `pid` once one of them has been stopped for its turn."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        arms, _, stopped = trial_snapshot(pid)
        if len(arms) == 2 and stopped:
            return arms
        time.sleep(0.1)
    raise AssertionError("the arms never took turns")


def test_which_configs_the_arms_run(tmp_path):
    from torchpace.cli.compare import build_pair

    one, two = tmp_path / "one.toml", tmp_path / "two.toml"
    one.write_text('schema_version = 1\n[knobs]\n"data.num_workers" = 1\n')
    two.write_text('schema_version = 1\n[knobs]\n"data.num_workers" = 2\n')
    values = lambda pair: tuple(dict(config.values) for config in pair)  # noqa: E731
    assert values(build_pair((), ("data.pin_memory=true",))) == ({}, {"data.pin_memory": True})
    assert values(build_pair((str(one),), ())) == ({}, {"data.num_workers": 1})  # a config alone: against the defaults
    assert values(build_pair((str(one),), ("data.pin_memory=true",))) == (
        {"data.num_workers": 1}, {"data.num_workers": 1, "data.pin_memory": True})
    assert values(build_pair((str(one), str(two)), ())) == ({"data.num_workers": 1}, {"data.num_workers": 2})
    assert values(build_pair((), ())) == ({}, {})  # the defaults against themselves
