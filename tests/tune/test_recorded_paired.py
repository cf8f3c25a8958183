"""A greedy study decided by paired comparisons, recorded as an earlier torchpace wrote it
(tests/fixtures/studies/paired_greedy.json: the reference arm's figures stored in part), is still
reported with the figures that tune printed when it ran, and HTML-rendered in its unit."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from _support import FIXTURES, restore_recorded_study
from fixtures.pair_workloads import MEMORY_LOCK_ENV
from torchpace.measure.stats import MIN_WINDOWS_FOR_CI
from torchpace.report import write_report
from torchpace.report.load import load_report_data
from torchpace.tune.attrs import Assignment, StudyAttrs
from torchpace.tune.figures import PAIRED_FIGURES_NOTE, SPEEDUP_FROM_FINAL, config_measurements
from torchpace.tune.executor import comparison_walls
from torchpace.tune.policy import GREEDY_REVISION, Proposal
from torchpace.tune.tuner import TuneOptions, Tuner

RECORDED = FIXTURES / "studies" / "paired_greedy.json"
WORKLOAD = str(FIXTURES / "pair_workloads.py") + ":sleepy_loader"
# what `torchpace tune --json` printed when the study was tuned
PRINTED_SPEEDUP = (2.2715785229889356, 1.6014072084213755, 3.306874466938018, 4)
PRINTED_DECISIONS = {"data.num_workers": (2, 2.295532273097699, 1.8421176138013717, 4.544122587670398, 6),
                     "optimizer.impl": (None, 2.3774515639623504, 0.09601706550162685, 6.226291111311322, 11)}
PRINTED_BASELINE = (52.69590608780728, 51.30286248560519, 95.95620635566446)
PRINTED_TUNED = (122.81916658523097, 112.14547136783729, 243.48362738813125)
PRINTED_NOISE = (0.870072437763424, 0.6660754997441665, 1.200291950916552, 3)


@pytest.fixture
def recorded_db(tmp_path, host):
    db = tmp_path / "paired.db"
    restore_recorded_study(RECORDED, f"sqlite:///{db}", host, WORKLOAD)
    return db


def test_a_recorded_paired_study_reports_the_figures_tune_printed(recorded_db):
    tune = load_report_data(str(recorded_db)).tune
    assert tune.stopped == "done" and tune.best_config == {"data.num_workers": 2}
    speedup = tune.speedup_figure
    assert (tune.speedup, speedup.ci_low, speedup.ci_high, speedup.rounds) == pytest.approx(PRINTED_SPEEDUP)
    assert speedup.source == SPEEDUP_FROM_FINAL and tune.figures_note == PAIRED_FIGURES_NOTE
    decisions = {d.decision.knob: (d.decision.accepted_value, d.decision.ratio, d.decision.ratio_ci_low,
                                   d.decision.ratio_ci_high, d.decision.rounds) for d in tune.decisions}
    assert decisions.keys() == PRINTED_DECISIONS.keys()
    for knob, printed in PRINTED_DECISIONS.items():
        assert decisions[knob] == pytest.approx(printed), knob
    base, best = tune.baseline.throughput, tune.best.throughput
    assert base.value == pytest.approx(PRINTED_BASELINE[0]) and base.unit == "samples/s"
    assert best.value == pytest.approx(PRINTED_TUNED[0])
    # the interval printed then was the final comparison's arm's CI; it is shown now as the range of every
    # measurement of the config (`figures.config_range`), which holds that CI and every other one
    for row, printed in ((tune.baseline, PRINTED_BASELINE), (tune.best, PRINTED_TUNED)):
        measured = config_measurements(tune.trials, row.config)
        assert row.measurements == len(measured) > 1, row.slot
        assert row.throughput.ci_low == min(f.ci_low for f in measured) <= printed[1]
        assert row.throughput.ci_high == max(f.ci_high for f in measured) >= printed[2]
    assert (tune.noise.ratio, tune.noise.ratio_ci_low, tune.noise.ratio_ci_high, tune.noise.rounds) == pytest.approx(PRINTED_NOISE)
    # the reference arm, stored in part by the tuner that ran it, reads as what it holds
    final = next(t for t in tune.trials if t.slot == "final")
    assert final.pair.reference_bench.throughput.samples_per_s == pytest.approx(PRINTED_BASELINE[0])


def test_a_recorded_paired_study_renders(recorded_db, tmp_path):
    html = write_report(load_report_data(str(recorded_db)), tmp_path / "paired.html", with_doctor=False).read_text()
    assert "2.27× [1.60, 3.31], 4 rounds" in html and "data.num_workers" in html


def test_a_study_is_resumed_with_the_policy_revision_it_was_tuned_with(recorded_db, tmp_path, host):
    # the recorded study predates revisions of the policy: it is revision 1, and a resume replays it so
    old = Tuner(TuneOptions(workload=WORKLOAD, storage=f"sqlite:///{recorded_db}", study="paired-sleepy",
                            resume=True, out=tmp_path / "old.toml"), host)
    assert StudyAttrs.of(old.study).greedy_revision == 1 and (old.strategy.sampler.paired, old.strategy.sampler.revision) == (True, 1)
    new = Tuner(TuneOptions(workload=WORKLOAD, storage=f"sqlite:///{tmp_path / 'new.db'}", out=tmp_path / "new.toml"), host)
    assert StudyAttrs.of(new.study).greedy_revision == new.strategy.sampler.revision == GREEDY_REVISION > 1


def test_a_stretched_comparison_runs_for_its_multiple_of_the_trial_time(tmp_path, host):
    tuner = Tuner(TuneOptions(workload=WORKLOAD, storage=f"sqlite:///{tmp_path / 'new.db'}", out=tmp_path / "t.toml",
                              trial_time_s=5.0), host)
    plain, plain_cap, _ = tuner.executor.trial_spec(Assignment(config={"data.num_workers": 2}, reference={}))
    stretched, stretched_cap, _ = tuner.executor.trial_spec(Assignment(config={"data.num_workers": 2}, reference={}, time_factor=2.0))
    assert (plain.max_time_s, stretched.max_time_s) == (5.0, 10.0) and stretched_cap > plain_cap
    capped = Tuner(TuneOptions(workload=WORKLOAD, storage=f"sqlite:///{tmp_path / 'capped.db'}", out=tmp_path / "c.toml",
                               trial_time_s=5.0, trial_timeout_s=30.0), host)
    assert capped.executor.trial_spec(Assignment(config={}, reference={}, time_factor=2.0))[1] == 60.0  # a set cap stretches too
    # the factor is stored with the trial's assignment, so a resumed tune runs the same slot for as long
    assert Assignment(time_factor=2.0).to_attrs()["time_factor"] == 2.0 and "time_factor" not in Assignment().to_attrs()


def test_the_budget_is_short_when_it_would_not_hold_the_next_comparison_and_the_final_one(recorded_db, tmp_path, host):
    # the recorded comparisons took: candidates 7.2-9.6 s (median 8.6), the A/A and final ones 6.7 and 7.9 (7.3)
    tuner = Tuner(TuneOptions(workload=WORKLOAD, storage=f"sqlite:///{recorded_db}", study="paired-sleepy",
                              resume=True, out=tmp_path / "t.toml"), host)
    candidate, trials = Proposal("pair:x", "candidate", {}), tuner.study.get_trials(deepcopy=False)
    tuner.budget.deadline = time.monotonic() + 14.0
    assert tuner.budget.short_of(candidate, trials)  # 14 s < 8.6 + 7.3
    tuner.budget.deadline = time.monotonic() + 20.0
    assert not tuner.budget.short_of(candidate, trials)
    assert tuner.budget.short_of(replace(candidate, time_factor=2.0), trials)  # a stretched comparison: 20 s < 2 x 8.6 + 7.3
    # the study's first compile: no comparison of it has compiled, so its compile is counted on top
    compiles = Proposal("pair:compile.mode=default", "candidate", {"compile.mode": "default"}, reference={})
    assert tuner.budget.short_of(compiles, trials)  # 20 s < 8.6 + 120 + 7.3
    tuner.budget.deadline = time.monotonic() + 140.0
    assert not tuner.budget.short_of(compiles, trials)
    tuner.budget.deadline = time.monotonic() + 130.0  # an arm B that leaves compile (reference compiled) compiles too
    assert tuner.budget.short_of(replace(compiles, config={}, reference={"compile.mode": "default"}), trials)
    # a second comparison of a candidate takes as long as its first one did (7.2 s for one worker, 8.4 s for two)
    tuner.budget.deadline = time.monotonic() + 23.0
    again = Proposal("confirm-pair:data.num_workers=1", "candidate", {}, time_factor=2.0)
    assert not tuner.budget.short_of(again, trials)  # 23 s > 2 x 7.2 + 7.3 (the candidates' median would say 24.5)
    assert tuner.budget.short_of(replace(again, slot="confirm-pair:data.num_workers=2"), trials)  # 23 s < 2 x 8.4 + 7.3
    fresh = Tuner(TuneOptions(workload=WORKLOAD, storage=f"sqlite:///{tmp_path / 'new.db'}", out=tmp_path / "n.toml"), host)
    fresh.budget.deadline = time.monotonic() + 1.0
    assert not fresh.budget.short_of(candidate, fresh.study.get_trials(deepcopy=False))  # no comparison yet to judge by


def test_a_separate_run_is_capped_as_a_trial_of_its_share_of_the_time(tmp_path, host):
    tuner = Tuner(TuneOptions(workload=WORKLOAD, storage=f"sqlite:///{tmp_path / 'new.db'}", out=tmp_path / "t.toml"), host)
    ranks = Proposal("pair:y", "candidate", {"nproc_per_node": 2, "distributed.strategy": "ddp"}, reference={})
    options = tuner.executor.pair_options(ranks, 6.0)
    assert options.decide_at is not None and options.run_time_s(6.0) == pytest.approx(1.0)
    assert options.run_timeout_s == tuner.executor.cap_s(ranks, 1.0) < tuner.executor.cap_s(ranks, 6.0)


def test_a_trials_cap_follows_the_studys_baseline_a_slow_step_needs_more_than_the_trial_time_gives(recorded_db,
                                                                                                   tmp_path, host):
    fresh = Tuner(TuneOptions(workload=WORKLOAD, storage=f"sqlite:///{tmp_path / 'new.db'}", out=tmp_path / "t.toml",
                              budget_s=900.0, trial_time_s=8.0), host)
    baseline = Proposal("baseline", "baseline", {})
    assert fresh.executor.cap_s(baseline, 8.0) == pytest.approx(900.0 * 0.25)  # no step time known: a share of the budget
    assert fresh.executor.cap_s(Proposal("pair:x", "candidate", {}, reference={}), 8.0) == pytest.approx(8.0 * 3 + 60)
    tuner = Tuner(TuneOptions(workload=WORKLOAD, storage=f"sqlite:///{recorded_db}", study="paired-sleepy", resume=True,
                              out=tmp_path / "r.toml",
                              budget_s=900.0, trial_time_s=1.0), host)
    baseline_s = tuner.executor.baseline_wall_s()
    assert baseline_s is not None and baseline_s > 0
    candidate = Proposal("pair:x", "candidate", {}, reference={})
    assert tuner.executor.cap_s(candidate, 1.0) == pytest.approx(max(1.0 * 3 + 60, 2 * baseline_s))
    assert tuner.executor.cap_s(replace(candidate, time_factor=2.0), 2.0) >= 2 * tuner.executor.cap_s(candidate, 1.0) - 60
    # a comparison (two processes in turns) gets twice the longest of the study's comparisons or of two baselines
    walls = comparison_walls(tuner.study.get_trials(deepcopy=False))
    longest = max([2 * baseline_s, *walls["candidate"], *walls["whole"]])
    assert tuner.executor.cap_s(candidate, 1.0, comparison=True) == pytest.approx(max(1.0 * 3 + 60, 2 * longest))
    assert tuner.executor.cap_s(candidate, 1.0, comparison=True) >= tuner.executor.cap_s(candidate, 1.0)


@pytest.mark.slow
def test_a_comparison_out_of_memory_held_together_gets_the_separate_runs_cap_within_the_budget(tmp_path, host,
                                                                                                monkeypatch):
    monkeypatch.setenv(MEMORY_LOCK_ENV, str(tmp_path / "device.lock"))  # room for one process (the fixture's doc)
    tuner = Tuner(TuneOptions(workload=f"{FIXTURES / 'pair_workloads.py'}:memory_for_one", trial_time_s=1.2,
                              trial_timeout_s=40, guard_steps=0, storage=f"sqlite:///{tmp_path / 'new.db'}",
                              out=tmp_path / "t.toml"), host)
    tuner.budget.deadline = time.monotonic() + 300  # bounds the 18 runs' own caps (18 x 40 s), not the 40 s of turns
    record = tuner.executor.run(1, Proposal("pair:noise", "noise", {}, reference={}))
    assert record.pair.mode == "sequential" and "out of memory" in record.pair.mode_reason
    assert record.status == "ok" and record.pair.rounds == MIN_WINDOWS_FOR_CI, \
        (record.status, record.error, record.pair.reference_status, record.pair.reference_error)


def test_no_trial_starts_once_the_budget_is_spent(tmp_path, host):
    tuner = Tuner(TuneOptions(workload=WORKLOAD, storage=f"sqlite:///{tmp_path / 'new.db'}", out=tmp_path / "t.toml"), host)

    class Study:
        stopped = False

        def stop(self):
            self.stopped = True

    tuner._after_trial(within := Study(), None)
    tuner.budget.deadline = time.monotonic() - 0.1  # Optuna's timeout, counted from later, would start more trials
    tuner._after_trial(spent := Study(), None)
    assert not within.stopped and spent.stopped


def test_a_study_tuned_before_arms_were_kept_counts_two_processes_per_comparison(recorded_db):
    tune = load_report_data(str(recorded_db)).tune
    pairs = [t.pair for t in tune.trials if t.pair is not None]
    assert pairs and all(p.reused == () and p.processes_started == 2 for p in pairs if p.mode == "alternating")
    kept = replace(pairs[0], reused=("a",))
    assert kept.processes_started == 1 and replace(pairs[0], reused=("a", "b")).processes_started == 0
    # separate runs A B A B A B: one process a run, three runs a round
    assert replace(pairs[0], mode="sequential", ratios=(0.7, 0.66)).processes_started == 6


def test_the_budget_keeps_the_final_comparisons_time_back_from_a_candidate_compared_with_a_kept_config(recorded_db,
                                                                                                       tmp_path, host):
    # the recorded A/A and final comparisons took 6.7 and 7.9 s: a candidate compared with a config kept so far
    # is capped 7.9 s short of the budget, so that the final comparison still runs when the budget cuts it
    from torchpace.tune.executor import TrialExecutor

    tuner = Tuner(TuneOptions(workload=WORKLOAD, storage=f"sqlite:///{recorded_db}", study="paired-sleepy",
                              resume=True, out=tmp_path / "t.toml", trial_timeout_s=100.0), host)
    assert not tuner.executor.keep_final_time  # tuned under revision 1: its budget goes on as it was
    keeping = TrialExecutor(tuner.options, host, tuner.spec, False, tuner.study, tuner.study_name, tuner.budget,
                            lambda kind, **data: None, keep_final_time=True)
    tuner.budget.deadline = time.monotonic() + 30.0
    after_kept = Assignment(kind="candidate", config={"data.num_workers": 2, "optimizer.impl": "fused"},
                            reference={"data.num_workers": 2})
    _, cap_s, cut = keeping.trial_spec(after_kept)
    assert cut and 30.0 - 7.9 - 1.0 < cap_s <= 30.0 - 7.9
    assert keeping.budget.final_reserve_s(tuner.study.get_trials(deepcopy=False)) == pytest.approx(7.9, abs=0.05)
    # nothing kept yet (the candidate's reference is the defaults), or the final comparison itself: the whole budget
    for assignment in (replace(after_kept, reference={}), replace(after_kept, kind="final", reference={})):
        assert 29.0 < keeping.trial_spec(assignment)[1] <= 30.0
    assert 29.0 < tuner.executor.trial_spec(after_kept)[1] <= 30.0
