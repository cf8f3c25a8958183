"""What a comparison says of its figures (`build_comparison`, pure: recorded rounds in, no processes)."""

from dataclasses import replace

import pytest

from torchpace.compare.run import build_comparison
from torchpace.config import RunConfig
from torchpace.protocol import TrialResult
from torchpace.trial.schedule import ALTERNATING, SEQUENTIAL, PairResult

DEFAULTS = RunConfig(values={})


def _pair(a_rates, b_rates, other_load):
    ok = TrialResult("ok")
    return PairResult(ALTERNATING, ok, ok, tuple(a_rates), tuple(b_rates), "time", other_load_a=other_load,
                      other_load_b=other_load, usable_cores=2)


# turns like those of an A/A comparison of two-thread steps beside two busy processes (there, `compare
# --max-time 150` gave arm A a median of 19,426 samples/s with a CI of 848-23,281): two groups, ~20,000 and ~1,000
SWITCHING_A = (19_426, 23_281, 1_210, 848, 21_950, 20_877, 1_032, 19_801)
SWITCHING_B = (10_693, 2_233, 20_311, 21_004, 1_377, 19_950, 20_500)
STEADY = (20_100, 19_800, 20_350, 19_950, 20_200, 20_050, 19_900, 20_000)


def test_an_arm_whose_turns_switched_speed_under_load_is_said_to_have():
    note = build_comparison(_pair(SWITCHING_A, SWITCHING_B, 1.0), "tabular", DEFAULTS, DEFAULTS).other_load_note
    assert note.startswith("measured while other processes used 1.0 of 2 cores")
    assert "arm A's turns ran at 848 to 23,281 (27x apart) and arm B's turns ran at 1,377 to 21,004 (15x apart)" in note
    assert "threads.intra_op=1" in note


def test_steady_turns_or_a_quiet_host_say_nothing_of_switching():
    steady = build_comparison(_pair(STEADY, STEADY[:-1], 1.0), "tabular", DEFAULTS, DEFAULTS).other_load_note
    assert steady == "measured while other processes used 1.0 of 2 cores: the ratio reflects that contention"
    assert build_comparison(_pair(SWITCHING_A, SWITCHING_B, 0.05), "tabular", DEFAULTS, DEFAULTS).other_load_note is None


def test_fewer_rounds_than_a_95_percent_ci_needs_give_no_verdict_and_name_the_ci_they_have():
    # `make demo`'s compare beside a busy process: 2 rounds of 28x; their range covers the median 1 time in 2
    few = build_comparison(_pair((1_400, 1_420, 1_410), (39_800, 39_900, 39_850), 1.0), "tabular", DEFAULTS, DEFAULTS)
    assert few.verdict == "too few rounds" and few.rounds == 2 and few.ratio_ci_coverage == 0.5
    assert few.summary.startswith("too few rounds to tell: B is 28.")
    assert "(50% CI 28." in few.summary and "a 95% CI needs 6 rounds, a longer --max-time gives more" in few.summary
    sequential = build_comparison(replace(_pair((1_400, 1_420, 1_410), (39_800, 39_900, 39_850), 1.0), mode=SEQUENTIAL),
                                  "tabular", DEFAULTS, DEFAULTS)
    assert sequential.verdict == "too few rounds" and "a separate run that measured nothing leaves its round out" in sequential.summary
    enough = build_comparison(_pair(STEADY + STEADY[:1], (40_000,) * 9, 1.0), "tabular", DEFAULTS, DEFAULTS)
    assert enough.verdict == "faster" and enough.rounds == 6 and "(95% CI " in enough.summary


def test_the_json_holds_each_arms_turns_and_the_rounds_come_from_them():
    from torchpace.measure.comparison import Comparison
    from torchpace.trial.schedule import paired_ratios

    comparison = build_comparison(_pair(SWITCHING_A, SWITCHING_B, 1.0), "tabular", DEFAULTS, DEFAULTS)
    data = comparison.to_dict()
    assert data["a"]["turns"] == list(SWITCHING_A) and data["b"]["turns"] == list(SWITCHING_B)
    assert paired_ratios(data["a"]["turns"], data["b"]["turns"]) == pytest.approx(data["ratios"]) and data["rounds"] == 5
    assert Comparison.from_dict(data) == comparison
    older = {**data, "a": {k: v for k, v in data["a"].items() if k != "turns"}}  # written before arms held their turns
    assert Comparison.from_dict(older).a.turns == ()


def test_under_the_latency_objective_each_arm_is_the_median_of_its_turns_p50s_in_seconds():
    # each turn's figure is 1 / its median batch-1 call: arm A's calls took 2 ms, arm B's 1.6 ms
    comparison = build_comparison(_pair((500.0,) * 10, (625.0,) * 9, 0.0), "inference", DEFAULTS, DEFAULTS, "latency")
    assert comparison.objective == "latency" and comparison.unit == "s"
    assert comparison.a.figure == pytest.approx(0.002) and comparison.b.figure == pytest.approx(0.0016)
    assert comparison.a.turns == pytest.approx((0.002,) * 10)
    # B over A as for throughput: A's p50 over B's, above 1 when B answers sooner
    assert comparison.ratio == pytest.approx(1.25) and comparison.verdict == "faster"
    assert build_comparison(_pair((500.0,) * 10, (625.0,) * 9, 0.0), "inference", DEFAULTS, DEFAULTS).unit == "samples/s"


def test_each_arms_config_is_what_it_ran_with_a_workloads_own_loader_arguments_included(host):
    from torchpace.compare.run import _check_configs

    from _support import fixture_workload

    label, a, b = _check_configs(fixture_workload("tiny_mlp_with_workers"), None, DEFAULTS,
                                 RunConfig({"data.num_workers": 0, "data.persistent_workers": False}), host)
    assert label == "tiny_mlp_with_workers"
    assert a.non_default() == {"data.num_workers": 2, "data.persistent_workers": True} and b.non_default() == {}
    comparison = build_comparison(_pair(STEADY, STEADY, 1.5), label, a, b)
    assert (comparison.a.config, comparison.b.config) == (dict(a.values), dict(b.values))  # what each set, a default too
    assert "data.num_workers" in comparison.other_load_note  # the compared knob whose gain depends on free cores


def test_each_arm_says_what_it_ran_a_scripts_own_settings_and_a_default_set_over_them():
    """`compare --set data.num_workers=0 -- python train.py --workers 2`: arm A runs the script's own settings (read
    from its DataLoader), arm B the default set over them; neither is "PyTorch defaults", and B's config keeps the
    value it set, so the comparison is not an A/A one labelled as a change."""
    from torchpace.measure.render import config_label

    zero = RunConfig({"data.num_workers": 0})
    comparison = build_comparison(_pair(STEADY, STEADY[:-1], 0.0), "train.py", DEFAULTS, zero, script=True)
    assert comparison.a.config == {} and comparison.b.config == {"data.num_workers": 0}
    assert comparison.a.label == "the script's own settings" and comparison.b.label == "data.num_workers=0"
    assert comparison.to_dict()["b"]["label"] == "data.num_workers=0"
    workload = build_comparison(_pair(STEADY, STEADY[:-1], 0.0), "tabular", DEFAULTS, zero)
    assert workload.a.label == config_label({}) == "PyTorch defaults"
