"""The convergence guard: seeded guard steps in real torch, and the pure verdicts over stored trials."""

import torch

from torchpace.tune.guard import check_trial_guard
from torchpace.tune.guard_steps import run_guard_steps

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


def test_evaluate_drop_beyond_tolerance_fails_the_guard():
    base = {"guard_losses": BASE, "guard_metric": 0.90}
    assert check_trial_guard(base, {"guard_losses": BASE, "guard_metric": 0.89}).ok  # -1.1%
    verdict = check_trial_guard(base, {"guard_losses": BASE, "guard_metric": 0.80})
    assert not verdict.ok and "evaluate()" in verdict.reason


def test_no_guard_steps_means_no_verdict():
    assert check_trial_guard({"guard_losses": BASE}, {"guard_losses": []}) is None


def test_the_guard_cannot_judge_when_two_baseline_runs_already_depart():
    from torchpace.tune.guard import guard_cannot_judge

    falling = [2.0 - 0.05 * i for i in range(20)]
    assert guard_cannot_judge({"guard_losses": falling}, {"guard_losses": list(falling)}) is None  # seeded: identical
    assert guard_cannot_judge({"guard_losses": falling}, {"guard_losses": []}) is None  # nothing to compare
    unseeded = [v * 1.5 for v in falling]  # the script's own randomness: a run 50% above the other
    why = guard_cannot_judge({"guard_losses": falling}, {"guard_losses": unseeded})
    assert why is not None and "cannot judge" in why
    assert guard_cannot_judge({"guard_losses": unseeded}, {"guard_losses": falling}) == why  # either order


def test_baseline_info_drops_the_guard_curve_when_it_cannot_judge():
    from torchpace.tune.study import baseline_info

    falling = [2.0 - 0.05 * i for i in range(20)]
    infos = [(None, {"slot": "baseline", "status": "ok", "guard_losses": falling}),
             (None, {"slot": "baseline#2", "status": "ok", "guard_losses": [v * 1.5 for v in falling]})]
    base = baseline_info(infos)
    assert base["guard_losses"] == [] and "cannot judge" in base["guard_cannot_judge"]
    agreeing = [infos[0], (None, {"slot": "baseline#2", "status": "ok", "guard_losses": list(falling)})]
    assert baseline_info(agreeing)["guard_losses"] == falling
