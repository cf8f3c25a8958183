"""What a comparison says of its figures (`build_comparison`, pure: recorded rounds in, no processes)."""

from torchpace.compare.run import build_comparison
from torchpace.config import RunConfig
from torchpace.protocol import TrialResult
from torchpace.trial.pair import ALTERNATING, PairResult

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
