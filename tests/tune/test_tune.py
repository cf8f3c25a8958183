"""`tune` with real trial processes on tiny planted workloads and tiny budgets."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import optuna
import pytest

from torchpace.config import load_config
from torchpace.errors import UsageError
from torchpace.tune.figures import SPEEDUP_FROM_FINAL
from torchpace.tune.study import open_storage
from torchpace.tune.tuner import TuneOptions, Tuner

from _support import FIXTURES, faked_host, faked_host_env, fixture_workload


def _options(tmp_path, name, knobs, **kw):
    kw.setdefault("budget_s", 240)
    kw.setdefault("trial_time_s", 1.0)
    kw.setdefault("guard_steps", 6)
    return TuneOptions(workload=fixture_workload(name), storage=f"sqlite:///{tmp_path / 's.db'}",
                       out=tmp_path / "torchpace.toml", knobs=frozenset(knobs), **kw)


def _by_slot(outcome):
    return {t.slot: t for t in outcome.trials}


def test_greedy_records_failures_and_goes_on(tmp_path, host):
    tuner = Tuner(_options(tmp_path, "crashes_with_two_workers", {"data.num_workers"}), host)
    outcome = tuner.run()
    slots = _by_slot(outcome)
    assert list(slots)[:2] == ["baseline", "noise"]
    assert slots["baseline"].verdict in ("input-bound", "compute-bound", "host-sync-bound", "memory-bound")
    assert slots["pair:data.num_workers=2"].status == "crash"
    assert slots["pair:data.num_workers=1"].status == "ok"
    assert outcome.stopped == "done" and Path(outcome.out_path).exists()
    saved = load_config(outcome.out_path)
    assert saved.host["fingerprint"] == host.fingerprint()
    assert saved.result["baseline_samples_per_s"] == pytest.approx(outcome.baseline.throughput.value)
    assert saved.result["unit"] == outcome.unit == "samples/s"
    assert dict(saved.values) == outcome.best_config and "data.num_workers" not in saved.values or saved.values["data.num_workers"] == 1
    # resuming a finished study runs nothing again: the crashed value is not retried
    again = Tuner(_options(tmp_path, "crashes_with_two_workers", {"data.num_workers"}, resume=True), host).run()
    assert [t.number for t in again.trials] == [t.number for t in outcome.trials]


def test_nan_under_a_precision_knob_is_recorded_nonfinite(tmp_path, monkeypatch):
    # on a host (faked, for the tuner and its trials alike) whose CPU computes bf16, so bf16 is tried
    monkeypatch.setenv(*faked_host_env("native bf16").popitem())
    outcome = Tuner(_options(tmp_path, "nan_under_bf16", {"precision.amp"}), faked_host("native bf16")).run()
    trial = _by_slot(outcome)["pair:precision.amp=bf16"]
    assert trial.status == "nonfinite"
    assert "precision.amp" not in outcome.best_config


def test_hanging_value_times_out_and_the_budget_still_writes_the_best(tmp_path, host, own_leftovers):
    options = _options(tmp_path, "hangs_with_one_worker", {"data.num_workers"}, trial_timeout_s=20)
    outcome = Tuner(options, host).run()
    statuses = {t.slot: t.status for t in outcome.trials}
    assert statuses["pair:data.num_workers=1"] == "timeout"
    assert Path(outcome.out_path).exists()
    assert own_leftovers("torchpace.trial") == []


def test_budget_cut_mid_trial_writes_the_best_so_far_and_resume_reruns_the_cut_trial(tmp_path, host):
    # the two baseline runs first, however long this host takes for them; then a session whose short
    # budget starts the (hanging) candidate at once and cuts it
    baselines = Tuner(_options(tmp_path, "hangs_with_one_worker", {"data.num_workers"}, max_trials=2), host).run()
    assert [t.slot for t in baselines.trials] == ["baseline", "noise"]
    options = _options(tmp_path, "hangs_with_one_worker", {"data.num_workers"}, resume=True, budget_s=20)
    outcome = Tuner(options, host).run()
    statuses = {t.slot: t.status for t in outcome.trials}
    assert statuses["pair:data.num_workers=1"] == "budget" and outcome.stopped == "budget"
    assert Path(outcome.out_path).exists() and outcome.best_config == {}
    resumed = Tuner(_options(tmp_path, "hangs_with_one_worker", {"data.num_workers"}, resume=True, trial_timeout_s=10), host).run()
    cand = [t for t in resumed.trials if t.slot == "pair:data.num_workers=1"]
    assert [t.status for t in cand] == ["budget", "timeout"]


@pytest.mark.parametrize("strategy", ["tpe", "random", "grid"])
def test_optuna_strategies_start_from_the_baseline(tmp_path, host, strategy):
    outcome = Tuner(_options(tmp_path, "tiny_mlp", {"data.num_workers"}, strategy=strategy, max_trials=3), host).run()
    assert outcome.trials[0].slot == "baseline" and len(outcome.trials) == 3
    assert outcome.speedup is not None and Path(outcome.out_path).exists()


def test_study_checks_refuse_silent_reuse(tmp_path, host):
    Tuner(_options(tmp_path, "tiny_mlp", {"data.num_workers"}, max_trials=1), host).run()
    with pytest.raises(UsageError, match="pass --resume"):
        Tuner(_options(tmp_path, "tiny_mlp", {"data.num_workers"}), host)
    with pytest.raises(UsageError, match="workload"):
        Tuner(_options(tmp_path, "tiny_cnn", {"data.num_workers"}, study="torchpace-tiny_mlp", resume=True), host)
    import dataclasses

    other_host = dataclasses.replace(host, cpu_model="Some Other CPU")
    with pytest.raises(UsageError, match="host fingerprint"):
        Tuner(_options(tmp_path, "tiny_mlp", {"data.num_workers"}, resume=True), other_host)
    optuna.create_study(study_name="plain", storage=open_storage(f"sqlite:///{tmp_path / 's.db'}"))
    with pytest.raises(UsageError, match="not a torchpace study"):
        Tuner(_options(tmp_path, "tiny_mlp", {"data.num_workers"}, study="plain", resume=True), host)
    with pytest.raises(UsageError, match="no study named"):
        Tuner(_options(tmp_path, "tiny_mlp", {"data.num_workers"}, study="nope", resume=True), host)
    (tmp_path / "junk.db").write_text("this is not a database")
    with pytest.raises(UsageError, match="not a usable Optuna database"):
        Tuner(dataclasses.replace(_options(tmp_path, "tiny_mlp", set()), storage=f"sqlite:///{tmp_path / 'junk.db'}"), host)


def _tune_cmd(tmp_path, *extra):
    return [sys.executable, "-m", "torchpace", "tune", fixture_workload("tiny_mlp"), "--storage",
            f"sqlite:///{tmp_path / 's.db'}", "--out", str(tmp_path / "torchpace.toml"), "--trial-time", "1",
            "--guard-steps", "6", "--knob", "data.num_workers", "--json", *extra]


def _complete_trials(tmp_path):
    try:
        study = optuna.load_study(study_name="torchpace-tiny_mlp", storage=f"sqlite:///{tmp_path / 's.db'}")
    except KeyError:
        return []
    return [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()]


def test_sigkill_mid_trial_then_resume_loses_and_repeats_nothing(tmp_path, own_leftovers):
    proc = subprocess.Popen(_tune_cmd(tmp_path), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while len(_complete_trials(tmp_path)) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    finished_before = {(t.number, t.user_attrs["torchpace"]["slot"]) for t in _complete_trials(tmp_path)}
    assert len(finished_before) >= 2
    # every trial process this test started (found by its environment, so also one started just before the
    # kill), DataLoader workers included, ends with the tuner: at once by its death signal, the workers
    # when they notice (every 5 s, later on a loaded host)
    deadline = time.monotonic() + 60
    while own_leftovers("torchpace.trial") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert own_leftovers("torchpace.trial") == [], "trial processes outlived the killed tuner"
    done = subprocess.run(_tune_cmd(tmp_path, "--resume"), cwd=tmp_path, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr
    trials = json.loads(done.stdout)["trials"]
    after = {(t["number"], t["slot"]) for t in trials}
    assert finished_before <= after  # nothing lost
    finished_slots = [t["slot"] for t in trials if t["status"] != "lost"]
    assert len(finished_slots) == len(set(finished_slots))  # nothing measured twice


@pytest.mark.timeout(1200)  # its own subprocess limits add up to 900 s
def test_two_tuners_on_one_sqlite_study_both_make_progress(tmp_path):
    first = subprocess.run(_tune_cmd(tmp_path, "--max-trials", "1"), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr  # creates the study with its baseline
    procs = [subprocess.Popen(_tune_cmd(tmp_path, "--resume"), cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outputs]
    trials = json.loads(outputs[-1][0])["trials"]
    workers = {t["worker"] for t in (tr.user_attrs.get("torchpace", {}) for tr in _complete_trials(tmp_path)) if "worker" in t}
    assert len(workers) >= 2
    slots = [t["slot"] for t in trials if t["status"] in ("ok", "crash", "oom", "timeout", "nonfinite", "invalid")]
    assert len(slots) == len(set(slots))


def test_a_budget_short_of_the_next_comparison_and_the_final_one_runs_the_final_one(tmp_path, host):
    # sleepy_loader: a batch waits 40 ms for its item, so DataLoader workers help however busy the CPUs are;
    # the tuner's judgement of its budget is replaced by one that finds it short once the next knob's turn comes
    options = TuneOptions(workload=str(FIXTURES / "pair_workloads.py") + ":sleepy_loader",
                          storage=f"sqlite:///{tmp_path / 's.db'}", out=tmp_path / "torchpace.toml", knobs=frozenset({"data.num_workers", "optimizer.impl"}),
                          trial_time_s=3.0, guard_steps=6, budget_s=600)
    notices = []
    tuner = Tuner(options, host, on_event=lambda kind, **data: notices.append(data["message"]) if kind == "notice" else None)
    tuner.sampler.budget_short = lambda proposal, trials: proposal.knob == "optimizer.impl"
    outcome = tuner.run()
    slots = [t.slot for t in outcome.trials]
    assert not any(slot.startswith(("pair:optimizer.impl", "confirm-pair:optimizer.impl")) for slot in slots), slots
    assert outcome.best_config.get("data.num_workers", 0) > 0, outcome.decisions
    final = next(t for t in outcome.trials if t.slot == "final")
    assert final.config == outcome.best_config and outcome.speedup_figure.source == SPEEDUP_FROM_FINAL
    assert outcome.stopped == "budget" and any("not decided: optimizer.impl" in n for n in notices), notices
    assert load_config(outcome.out_path).values == outcome.best_config
    # each comparison takes back the arm of the one before that it needs (the incumbent it kept, the candidate
    # compared again) instead of starting a process for it: one process per new config
    pairs = [t for t in outcome.trials if t.pair is not None]
    assert all(t.status == "ok" for t in pairs), [(t.slot, t.status, t.error) for t in pairs]
    # and the defaults of the A/A comparison are held for every later comparison with them, the final one's
    for before, now in zip(pairs, pairs[1:]):
        assert ("a" in now.pair.reused) == (now.reference in (before.reference, before.config, {})), (now.slot, now.pair.reused)
    # the final comparison measures the tuned config in a fresh process, not the one a decision kept
    assert "a" in final.pair.reused and "b" not in final.pair.reused
    assert sum(t.pair.processes_started for t in pairs) <= 3 + len({json.dumps(t.config, sort_keys=True) for t in pairs[1:]})
    assert outcome.best.measurements >= 2 and outcome.best.throughput.ci_low <= final.throughput.ci_low


def test_a_study_whose_baseline_failed_says_how_to_start_again_in_a_command_that_runs(tmp_path, host):
    import shlex

    options = _options(tmp_path, "raises_in_loss_named_with_spaces", {"data.num_workers"}, max_trials=1)
    first = Tuner(options, host).run()
    assert first.trials[0].slot == "baseline" and first.trials[0].status != "ok"
    notices = []
    Tuner(replace(options, resume=True), host, on_event=lambda kind, **data: notices.append(data.get("message"))).run()
    restart = shlex.join(["torchpace", "tune", "--study", "torchpace-raises (in its loss)-2", options.workload])
    assert any(f"start a new study: {restart}" in (notice or "") for notice in notices), notices
    assert "--study 'torchpace-raises (in its loss)-2'" in restart  # the name with spaces is one argument
