"""A greedy study tuned under an earlier revision of the paired policy (tests/fixtures/studies/paired_greedy_rev4.json,
recorded from a real tune under revision 4) is reported, replayed and resumed with the revision it was tuned with,
though the current revision decides its records otherwise."""

from __future__ import annotations

import json

import pytest

from _support import FIXTURES, restore_recorded_study
from torchpace.host import override_host_facts
from torchpace.report.load import load_report_data, rebuild_space
from torchpace.tune.attrs import StudyAttrs
from torchpace.tune.policy import GREEDY_REVISION, plan_greedy
from torchpace.tune.study import build_records
from torchpace.tune.tuner import TuneOptions, Tuner

RECORDED = FIXTURES / "studies" / "paired_greedy_rev4.json"
PRINTED = json.loads(RECORDED.read_text())["printed"]  # what `torchpace tune` reported when it was tuned
KNOBS = frozenset({"threads.intra_op", "precision.amp", "optimizer.impl"})


@pytest.fixture
def host(host):
    """The host the study was recorded on computed bf16 natively, so its space holds precision.amp: a host without
    bf16 would resume it with one knob fewer, which the recorded decisions do not describe."""
    return override_host_facts(host, {"bf16": True})


@pytest.fixture
def recorded(tmp_path, host):
    db = tmp_path / "rev4.db"
    return db, restore_recorded_study(RECORDED, f"sqlite:///{db}", host, "tabular")


def assert_decided_as_printed(decisions) -> None:
    rows = [[d.knob, d.value, d.accepted_value, d.ratio, d.ratio_ci_low, d.ratio_ci_high, d.rounds] for d in decisions]
    assert len(rows) == len(PRINTED["decisions"])
    for row, printed in zip(rows, PRINTED["decisions"]):
        assert row == pytest.approx(printed)


def test_a_study_of_an_earlier_revision_is_reported_with_the_decisions_it_was_tuned_with(recorded):
    db, _ = recorded
    tune = load_report_data(str(db)).tune
    assert_decided_as_printed(r.decision for r in tune.decisions)
    assert dict(tune.best_config) == PRINTED["best_config"] and tune.stopped == PRINTED["stopped"] == "done"
    assert tune.speedup == pytest.approx(PRINTED["speedup"])


def test_the_current_revision_decides_the_same_records_otherwise(recorded):
    db, name = recorded
    import optuna

    trials = optuna.load_study(study_name=name, storage=f"sqlite:///{db}").get_trials(deepcopy=False)
    space, records = rebuild_space(load_report_data(str(db)).tune.trials), build_records(trials)
    # revision 6 changed the guard only (this study's tabular curves are smooth), revision 7 the stage order of a
    # baseline with no profile verdict whose step waits little on data (this one waited 87% of its step)
    assert GREEDY_REVISION == 7
    tuned = plan_greedy(space, records, revision=4)
    assert_decided_as_printed(tuned.decisions)
    assert tuned.done
    # revision 5 keeps a gain after a second comparison only on that comparison's own 6 rounds: threads.intra_op=1's
    # had 3, optimizer.impl=fused's 5, so neither is kept, and the final comparison of bf16 alone would be next
    now = plan_greedy(space, records)
    assert [d.accepted_value for d in now.decisions] == [None, "bf16", None] and now.incumbent == {"precision.amp": "bf16"}
    assert "the second comparison alone 3 round(s)" in now.decisions[0].reason and now.next.slot == "final:2"


def test_a_resumed_study_of_an_earlier_revision_goes_on_with_it(recorded, tmp_path, host):
    db, name = recorded
    tuner = Tuner(TuneOptions(workload="tabular", storage=f"sqlite:///{db}", study=name, resume=True, knobs=KNOBS,
                              out=tmp_path / "torchpace.toml", trial_time_s=3.0, guard_steps=6), host)
    assert StudyAttrs.of(tuner.study).greedy_revision == tuner.strategy.sampler.revision == 4
    assert not tuner.strategy.keeps_final_time and not tuner.executor.keep_final_time  # the budget as it was then
    before = len(tuner.study.get_trials(deepcopy=False))
    outcome = tuner.run()  # its search is complete under revision 4: nothing more runs
    assert len(tuner.study.get_trials(deepcopy=False)) == before and outcome.stopped == "done"
    assert_decided_as_printed(r.decision for r in outcome.decisions)
    assert dict(outcome.best_config) == PRINTED["best_config"] and outcome.out_path
    # a new study is tuned with the current revision, whose budget keeps the final comparison's time
    fresh = Tuner(TuneOptions(workload="tabular", storage=f"sqlite:///{tmp_path / 'new.db'}", knobs=KNOBS,
                              out=tmp_path / "new.toml"), host)
    assert fresh.strategy.sampler.revision == GREEDY_REVISION and fresh.executor.keep_final_time
