"""The convergence guard: seeded guard steps in real torch, and the pure verdicts over stored trials."""

import pytest
import torch

from torchpace.tune.attrs import Assignment, TrialRecord
from torchpace.tune.guard import check_trial_guard
from torchpace.trial.guard_steps import run_guard_steps

from fixtures.workloads import tiny_mlp

BASE = [2.0 - 0.05 * i for i in range(20)]


def test_guard_steps_repeat_exactly_from_the_same_seed():
    torch.manual_seed(0)
    first, _ = run_guard_steps(tiny_mlp(), {}, 8)
    torch.manual_seed(0)
    second, _ = run_guard_steps(tiny_mlp(), {}, 8)
    assert first == second and len(first) == 8


def test_guard_steps_evaluate_the_trained_model():
    workload = tiny_mlp()
    x, y = workload.dataset.tensors
    workload.evaluate = lambda model: (model(x).argmax(1) == y).float().mean().item()
    losses, metric = run_guard_steps(workload, {}, 10)
    assert 0.0 <= metric <= 1.0 and len(losses) == 10


def _trial(slot: str, losses, metric=None, status: str = "ok") -> TrialRecord:
    return TrialRecord(0, "COMPLETE", assignment=Assignment(slot=slot), status=status, guard_losses=tuple(losses),
                       guard_metric=metric)


def test_evaluate_drop_beyond_tolerance_fails_the_guard():
    base = _trial("baseline", BASE, 0.90)
    assert check_trial_guard(base, _trial("c", BASE, 0.89)).ok  # -1.1%
    verdict = check_trial_guard(base, _trial("c", BASE, 0.80))
    assert not verdict.ok and "evaluate()" in verdict.reason


def test_no_guard_steps_means_no_verdict():
    assert check_trial_guard(_trial("baseline", BASE), _trial("c", [])) is None


def test_the_guard_cannot_judge_when_two_baseline_runs_already_depart():
    from torchpace.tune.guard import guard_cannot_judge

    falling = [2.0 - 0.05 * i for i in range(20)]
    assert guard_cannot_judge(_trial("a", falling), _trial("b", list(falling))) is None  # seeded: identical
    assert guard_cannot_judge(_trial("a", falling), _trial("b", [])) is None  # nothing to compare
    unseeded = [v * 1.5 for v in falling]  # the script's own randomness: a run 50% above the other
    why = guard_cannot_judge(_trial("a", falling), _trial("b", unseeded))
    assert why is not None and "cannot judge" in why
    assert guard_cannot_judge(_trial("a", unseeded), _trial("b", falling)) == why  # either order


def test_the_baseline_guard_drops_the_curve_when_it_cannot_judge():
    from torchpace.tune.study import baseline_guard

    falling = [2.0 - 0.05 * i for i in range(20)]
    records = [_trial("baseline", falling), _trial("baseline#2", [v * 1.5 for v in falling])]
    base = baseline_guard(records)
    assert base.guard_losses == () and "cannot judge" in base.cannot_judge
    assert baseline_guard([records[0], _trial("noise", list(falling))]).guard_losses == tuple(falling)
    assert baseline_guard([_trial("baseline", falling, status="crash")]).guard_losses == ()  # no finished baseline


def test_a_greedy_study_tuned_before_revision_6_keeps_the_guard_rule_it_was_tuned_with():
    from torchpace.tune.policy import GREEDY_REVISION, guard_scatter
    from torchpace.tune.study import baseline_guard

    # a small batch's scattered curve (about 0.1 +- 0.2 in its second half) and another draw of it 0.12 higher
    scattered = [2.3, 2.1, 1.9, 1.6, 1.4, 1.2, 1.0, 0.8, 0.7, 0.6, 0.5, 0.45, 0.4, 0.35, 0.3,
                 0.1, 0.5, 0.05, 0.3, 0.1, 0.6, 0.05, 0.2, 0.4, 0.05, 0.1, 0.5, 0.1, 0.05, 0.3]
    other_draw = [v + 0.12 for v in scattered]
    trials = [_trial("baseline", scattered), _trial("cand:data.num_workers=2", other_draw)]

    def verdict(revision: int):
        base = baseline_guard(trials, guard_scatter(True, revision))
        return check_trial_guard(base, trials[1], base.scatter)

    assert GREEDY_REVISION >= 6 and verdict(GREEDY_REVISION).ok  # within the curve's own scatter
    assert not verdict(5).ok and "tolerance 10%)" in verdict(5).reason  # 10% and 0.05 absolute
    assert not guard_scatter(False, 6)  # a study tuned before paired comparisons


@pytest.mark.parametrize("steps", ["-1", "1001", "1000000000000"])
def test_guard_steps_are_from_0_to_the_most_a_trial_runs_before_anything_starts(capsys, tmp_path, monkeypatch, host,
                                                                                 steps):
    from torchpace.cli import main
    from torchpace.errors import UsageError
    from torchpace.tune.guard import MAX_GUARD_STEPS
    from torchpace.tune.tuner import TuneOptions, Tuner

    monkeypatch.chdir(tmp_path)
    assert main(["tune", "tabular", "--guard-steps", steps]) == 2
    err = capsys.readouterr().err
    assert "--guard-steps" in err and f"0<=x<={MAX_GUARD_STEPS}" in err  # click names the valid values
    assert list(tmp_path.iterdir()) == []  # no study, no config: nothing started
    storage = f"sqlite:///{tmp_path / 's.db'}"
    with pytest.raises(UsageError, match=f"from 0 \\(no guard\\) to {MAX_GUARD_STEPS}, got {steps}"):
        Tuner(TuneOptions(workload="tabular", storage=storage, guard_steps=int(steps)), host)  # the library says the same
    assert list(tmp_path.iterdir()) == []
