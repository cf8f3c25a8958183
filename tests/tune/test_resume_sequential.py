"""A greedy study tuned before paired comparisons (recorded in tests/fixtures/studies) is still reported and
resumed with the policy it was tuned with: each trial one config measured alone."""

from __future__ import annotations

import pytest

from _support import FIXTURES, fixture_workload
from _support import restore_recorded_study as restore
from torchpace.report.load import load_report_data
from torchpace.tune.figures import FIGURES_NOTE
from torchpace.tune.tuner import TuneOptions, Tuner

RECORDED = FIXTURES / "studies" / "sequential_greedy.json"


def restore_recorded_study(url: str, host) -> str:
    """The recorded study in `url`, as if tuned on this host with the fixture workload; its name."""
    return restore(RECORDED, url, host, fixture_workload("tiny_mlp"))


def test_a_study_tuned_before_is_reported_with_its_own_policy(tmp_path, host):
    db = tmp_path / "old.db"
    restore_recorded_study(f"sqlite:///{db}", host)
    tune = load_report_data(str(db)).tune
    assert [t.slot for t in tune.trials] == ["baseline", "baseline#2", "cand:optimizer.impl=foreach",
                                             "cand:optimizer.impl=fused", "remeasure:data"]
    assert tune.figures_note == FIGURES_NOTE and tune.speedup_figure is None and not tune.paired
    assert [d.decision.knob for d in tune.decisions] == ["optimizer.impl"]
    # the report replays over the knobs the study tried (optimizer.impl): for it that search is complete
    assert tune.stopped == "done" and tune.speedup is not None
    assert tune.unit == "samples/s" and tune.baseline.throughput.unit == "samples/s"


@pytest.mark.slow
def test_resume_of_a_study_tuned_before_goes_on_as_it_was_tuned(tmp_path, host):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    name = restore_recorded_study(url, host)
    options = TuneOptions(workload=fixture_workload("tiny_mlp"), storage=url, study=name, resume=True,
                          out=tmp_path / "torchpace.toml", knobs=frozenset({"data.num_workers", "optimizer.impl"}),
                          trial_time_s=1.0, guard_steps=6, budget_s=240, max_trials=1)
    outcome = Tuner(options, host).run()
    slots = [t.slot for t in outcome.trials]
    assert slots[:5] == ["baseline", "baseline#2", "cand:optimizer.impl=foreach", "cand:optimizer.impl=fused",
                         "remeasure:data"]
    assert slots[5].startswith("cand:data.num_workers=")  # the next trial of the policy it was tuned with
    assert not any(slot.startswith(("pair:", "noise", "final")) for slot in slots)
    assert outcome.trials[5].pair is None and outcome.out_path
