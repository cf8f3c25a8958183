"""The greedy policy's decisions by paired comparisons, on recorded trial tables (pure: no timing, no processes).

A pair record holds the candidate (B) and the config it was compared with in alternation (A, the
incumbent), with each round's ratio B / A."""

from dataclasses import replace

from torchpace.trial.schedule import ALTERNATING, PARTNER, PairResult
from torchpace.protocol import TIMEOUT, TrialResult
from torchpace.tune.policy import RETRY, RUNNING, Record, plan_greedy
from torchpace.tune.space import KnobSpace
from torchpace.tune.executor import candidate_result, cut_by_the_budget

SPACE = [
    KnobSpace("data", "data.num_workers", 0, (0, 1, 2)),
    KnobSpace("compute", "precision.amp", "off", ("off", "bf16")),
]
BF16 = {"precision.amp": "bf16"}


def base(sps=100.0, **kw):
    return Record("baseline", {}, figure=sps, ci_rel=0.02, windows=8, warmup_converged=True, **kw)


def pair(slot, config, ratios, reference=None, sps=None, **kw):
    """A comparison of `config` with `reference` (default the defaults) whose rounds gave `ratios`."""
    ratios = tuple(ratios)
    middle = sorted(ratios)[len(ratios) // 2]
    kw = {"warmup_converged": True, "reference_warmup_converged": True, **kw}
    kw.setdefault("mode", "alternating")
    return Record(slot, config, figure=sps or 100.0 * middle, reference=reference or {}, ratios=ratios,
                  reference_figure=100.0, **kw)


def aa():
    return pair("noise", {}, [0.99, 1.01, 1.0, 1.02, 0.98, 1.0, 1.01])


def play(table, space=SPACE):
    return plan_greedy(space, table)


def test_baseline_alone_then_an_a_a_comparison_then_each_value_against_the_incumbent():
    assert play([]).next.slot == "baseline" and play([]).next.reference is None
    state = play([base()])
    assert state.next.slot == "noise" and state.next.config == {} and state.next.reference == {}
    state = play([base(), aa()])
    assert state.next.slot == "pair:data.num_workers=1"
    assert state.next.config == {"data.num_workers": 1} and state.next.reference == {}
    assert abs(state.noise_frac - 0.02) < 1e-9  # the A/A comparison's CI half-width: ranks 0 and 6 of 7, 0.98 and 1.02


def test_a_gain_whose_whole_ci_is_above_one_is_accepted_and_the_next_knob_is_compared_with_it():
    table = [base(), aa(), pair("pair:data.num_workers=1", {"data.num_workers": 1}, [1.4, 1.5, 1.45, 1.5, 1.42, 1.48]),
             pair("pair:data.num_workers=2", {"data.num_workers": 2}, [1.9, 2.0, 1.95, 2.1, 1.92, 2.05, 1.98])]
    state = play(table)
    decision = state.decisions[0]
    assert decision.accepted_value == 2 and state.incumbent == {"data.num_workers": 2}
    assert decision.ratio_ci_low > 1 and decision.rounds == 7 and decision.mode == "alternating"
    assert "the whole CI above 1" in decision.reason
    # the next knob is compared with the new incumbent, in alternation with it
    assert state.next.slot == "pair:precision.amp=bf16"
    assert state.next.config == {"data.num_workers": 2, **BF16} and state.next.reference == {"data.num_workers": 2}


def test_no_stage_boundary_re_measurement_is_needed():
    table = [base(), aa(), pair("pair:data.num_workers=1", {"data.num_workers": 1}, [0.9] * 6),
             pair("pair:data.num_workers=2", {"data.num_workers": 2}, [0.95] * 6)]
    state = play(table)
    assert [d.accepted_value for d in state.decisions] == [None]
    assert state.next.slot == "pair:precision.amp=bf16" and state.next.reference == {}  # the next stage at once


def test_a_gain_under_the_floor_is_rejected_without_a_second_comparison():
    table = [base(), aa(), pair("pair:precision.amp=bf16", BF16, [1.0, 1.01, 1.0, 1.005, 1.01, 0.995])]
    state = play(table, SPACE[1:])
    assert state.done and state.decisions[0].accepted_value is None
    assert "under the 1% floor" in state.decisions[0].reason and state.final is None


def test_a_gain_whose_ci_reaches_one_is_compared_again_and_decided_on_both_pooled():
    first = pair("pair:precision.amp=bf16", BF16, [1.08, 0.97, 1.1, 1.05, 1.12, 1.06])  # CI low 0.97
    state = play([base(), aa(), first], SPACE[1:])
    assert not state.decisions and state.next.slot == "confirm-pair:precision.amp=bf16"
    assert state.next.config == BF16 and state.next.reference == {}
    again = pair("confirm-pair:precision.amp=bf16", BF16, [1.07, 1.09, 1.06, 1.1, 1.08, 1.05])
    state = play([base(), aa(), first, again], SPACE[1:])
    decision = state.decisions[0]
    assert decision.accepted_value == "bf16" and decision.rounds == 12 and decision.ratio_ci_low > 1
    assert "compared again" in decision.reason and "both pooled" in decision.reason
    # and the tuned config is then compared with the defaults: the speedup
    assert state.next.slot == "final" and state.next.config == BF16 and state.next.reference == {}


def test_a_second_comparison_that_does_not_repeat_the_gain_rejects_it():
    first = pair("pair:precision.amp=bf16", BF16, [1.3, 1.25, 1.4, 1.35, 1.3])  # 5 rounds: not settled
    again = pair("confirm-pair:precision.amp=bf16", BF16, [0.95, 0.97, 1.0, 0.96, 0.98, 0.99])
    state = play([base(), aa(), first, again], SPACE[1:])
    decision = state.decisions[0]
    assert decision.accepted_value is None and "5 round(s)" in decision.reason and state.incumbent == {}
    assert state.done and state.final is None


def test_an_unconverged_warm_up_in_either_arm_sends_a_clear_gain_to_a_second_comparison():
    for unsettled in ({"warmup_converged": False}, {"reference_warmup_converged": False}):
        first = pair("pair:precision.amp=bf16", BF16, [1.5] * 8, **unsettled)
        state = play([base(), aa(), first], SPACE[1:])
        assert state.next.slot == "confirm-pair:precision.amp=bf16", unsettled


def test_the_final_comparison_gives_the_speedup_and_ends_the_search():
    table = [base(), aa(), pair("pair:precision.amp=bf16", BF16, [1.3] * 7)]
    state = play(table, SPACE[1:])
    assert state.next.slot == "final"
    table.append(pair("final", BF16, [1.28, 1.3, 1.31, 1.29, 1.3, 1.27]))
    state = play(table, SPACE[1:])
    assert state.done and state.final.slot == "final" and state.incumbent == BF16


def test_failures_are_not_judged_guard_failures_are_rejected():
    table = [base(), aa(), Record("pair:data.num_workers=1", {"data.num_workers": 1}, status="crash", reference={}),
             Record("pair:data.num_workers=2", {"data.num_workers": 2}, status="timeout", reference={}),
             pair("pair:precision.amp=bf16", BF16, [2.0] * 6, guard_ok=False)]
    state = play(table)
    workers, amp = state.decisions
    assert not workers.judged and workers.reason == "not judged: no value could be compared (crash, timeout)"
    assert amp.judged and amp.reason == "rejected: every value failed the convergence guard"
    assert state.done and state.incumbent == {}



def test_a_knob_that_does_not_apply_to_the_model_says_why_in_its_decision():
    why = "model.channels_last: GPT has no 2-D convolution: channels_last only changes the layout of 4-D convolutions"
    space = [KnobSpace("compute", "model.channels_last", False, (False, True))]
    table = [base(), aa(), Record("pair:model.channels_last=True", {"model.channels_last": True}, status="invalid",
                                  reference={}, error=why)]
    (layout,) = play(table, space).decisions
    assert not layout.judged and layout.reason == f"not judged: no value could be compared (invalid): {why}"


def test_a_comparison_cut_by_the_budget_or_its_partner_is_run_again():
    cut = Record("pair:precision.amp=bf16", BF16, state=RETRY, status="budget", reference={})
    assert play([base(), aa(), cut], SPACE[1:]).next.slot == "pair:precision.amp=bf16"
    running = Record("pair:data.num_workers=1", {"data.num_workers": 1}, state=RUNNING, reference={})
    assert play([base(), aa(), running]).next.slot == "pair:data.num_workers=2"


def test_a_comparison_whose_reference_arm_keeps_failing_is_not_retried_for_ever():
    def partner(slot, config):
        return Record(slot, config, state=RETRY, status="partner", reference={})

    once = [base(), aa(), partner("pair:precision.amp=bf16", BF16)]
    assert play(once, SPACE[1:]).next.slot == "pair:precision.amp=bf16"  # run again: the host may have been at fault
    state = play([*once, partner("pair:precision.amp=bf16", BF16)], SPACE[1:])
    assert state.done and state.decisions[0].accepted_value is None and not state.decisions[0].judged
    assert "partner" in state.decisions[0].reason
    # the A/A comparison too: twice without its reference arm, and the search goes on without the noise
    state = play([base(), partner("noise", {}), partner("noise", {})])
    assert state.noise is None and state.next.slot == "pair:data.num_workers=1"


def test_a_failed_a_a_comparison_leaves_the_noise_unknown_and_the_search_goes_on():
    state = play([base(), Record("noise", {}, status="crash", reference={})])
    assert state.noise is None and state.noise_frac == 0.01 and state.next.slot == "pair:data.num_workers=1"


def test_a_failed_baseline_ends_the_search_with_a_reason():
    state = play([Record("baseline", {}, status="oom")])
    assert state.failed_baseline and "oom" in state.failed_baseline and state.next is None


def test_a_comparison_the_budget_cut_before_the_reference_arm_was_ready_is_cut_not_partnered():
    pair = PairResult(ALTERNATING, TrialResult(TIMEOUT, error="arm A reached no gate"), TrialResult(PARTNER))
    assert candidate_result(pair, cut_by_budget=True).status == TIMEOUT  # stored as budget: run again on --resume
    assert candidate_result(pair, cut_by_budget=False).status == PARTNER  # the reference's own timeout
    alone = PairResult(ALTERNATING, TrialResult(PARTNER), TrialResult(TIMEOUT))
    assert candidate_result(alone, cut_by_budget=True) is alone.b


def test_a_timeout_a_trial_wrote_itself_is_its_verdict_not_the_budgets():
    """A script's hook ended its arm (a stall, or too few windows by its measurement's own cap) with a minute of
    budget left: that is the comparison's outcome, not a cut by the budget (which would run it again and again)."""
    stalled = TrialResult(TIMEOUT, error="the script made no step for 31 s after step 3", returncode=0)
    killed = TrialResult(TIMEOUT, error="no result after 64 s; the trial's process group was killed")
    assert cut_by_the_budget(killed, True) and not cut_by_the_budget(killed, False)
    assert not cut_by_the_budget(stalled, True)
    pair = PairResult(ALTERNATING, stalled, TrialResult(PARTNER))
    assert candidate_result(pair, cut_by_budget=True).status == PARTNER  # its partner's failure: not judged


def test_a_loss_on_fewer_rounds_than_a_ci_needs_is_compared_again_before_it_is_rejected():
    first = pair("pair:precision.amp=bf16", BF16, [0.95, 0.96])  # the time cap ended it after two rounds
    state = play([base(), aa(), first], SPACE[1:])
    assert state.decisions == [] and state.next.slot == "confirm-pair:precision.amp=bf16"
    again = pair("confirm-pair:precision.amp=bf16", BF16, [1.2, 1.25, 1.22, 1.3, 1.21, 1.24, 1.23, 1.26, 1.2, 1.27])
    state = play([base(), aa(), first, again], SPACE[1:])
    decision = state.decisions[0]
    assert decision.accepted_value == "bf16" and decision.rounds == 12  # both comparisons' rounds pooled
    assert decision.ratio_ci_low > 1


# a compute-bound baseline puts the compute stage first; threads (system) shares cores
LOADED_SPACE = [
    KnobSpace("system", "threads.intra_op", "auto", ("auto", 1), shares_cores=True),
    KnobSpace("compute", "precision.amp", "off", ("off", "bf16")),
]
ONE_THREAD = {"threads.intra_op": 1}


def loaded_aa(other_load_cores, usable_cores=2):
    return pair("noise", {}, [0.9, 1.1, 1.0, 1.05, 0.95, 1.0, 1.02], other_load_cores=other_load_cores,
                usable_cores=usable_cores)


def test_under_material_load_the_knobs_that_share_cores_are_decided_first():
    start = [base(verdict="compute-bound"), loaded_aa(1.9)]
    state = plan_greedy(LOADED_SPACE, start)
    assert state.stage_order == ["compute", "system"]  # the profile's order is kept and shown
    assert state.next.slot == "pair:threads.intra_op=1" and state.cores_first_knobs == ["threads.intra_op"]
    assert "1.9 of 2 cores during the A/A comparison" in state.cores_first
    # the other knobs are then compared with the incumbent that fits the load
    state = plan_greedy(LOADED_SPACE, [*start, pair("pair:threads.intra_op=1", ONE_THREAD, [5.0, 4.8, 5.2, 5.1, 4.9, 5.3])])
    assert state.incumbent == ONE_THREAD
    assert state.next.slot == "pair:precision.amp=bf16" and state.next.reference == ONE_THREAD
    assert state.next.config == {**ONE_THREAD, **BF16}


def test_on_a_quiet_host_or_for_a_study_tuned_before_the_stage_order_decides():
    quiet = plan_greedy(LOADED_SPACE, [base(verdict="compute-bound"), loaded_aa(0.2)])
    assert quiet.next.slot == "pair:precision.amp=bf16" and quiet.cores_first is None
    # a study of revision 1 is replayed as it was tuned, whatever the load its A/A comparison saw
    before = plan_greedy(LOADED_SPACE, [base(verdict="compute-bound"), loaded_aa(1.9)], revision=1)
    assert before.next.slot == "pair:precision.amp=bf16" and before.cores_first is None
    # material is relative to the host: half a core of 64 is not
    large = plan_greedy(LOADED_SPACE, [base(verdict="compute-bound"), loaded_aa(1.9, usable_cores=64)])
    assert large.next.slot == "pair:precision.amp=bf16"


UNPROFILED_SPACE = [
    KnobSpace("system", "system.allocator", "default", ("default", "tcmalloc")),
    KnobSpace("data", "data.num_workers", 2, (0, 2, 4)),
    KnobSpace("compute", "precision.amp", "off", ("off", "bf16")),
]


def test_a_script_whose_step_hardly_waits_on_data_has_its_compute_stage_decided_first():
    # an unmodified script's baseline is measured, not profiled: no verdict, only its input wait
    waiting = plan_greedy(UNPROFILED_SPACE, [base(input_bound_frac=0.002), aa()])
    assert waiting.stage_order == ["compute", "system", "data"] and waiting.next.slot == "pair:precision.amp=bf16"
    fed = plan_greedy(UNPROFILED_SPACE, [base(input_bound_frac=0.6), aa()])
    assert fed.stage_order == ["data", "system", "compute"] and fed.next.slot == "pair:data.num_workers=0"
    unknown = plan_greedy(UNPROFILED_SPACE, [base(), aa()])  # no input wait measured: the order given
    assert unknown.stage_order == ["system", "data", "compute"]
    # a study tuned with revision 6 is replayed in its own order
    before = plan_greedy(UNPROFILED_SPACE, [base(input_bound_frac=0.002), aa()], revision=6)
    assert before.stage_order == ["system", "data", "compute"] and before.next.slot == "pair:system.allocator=tcmalloc"


def test_a_gain_confirmed_on_fewer_pooled_rounds_than_a_ci_needs_is_not_accepted():
    first = pair("pair:precision.amp=bf16", BF16, [4.9, 5.1])  # the time cap ended both comparisons early
    again = pair("confirm-pair:precision.amp=bf16", BF16, [4.7, 5.2])
    state = play([base(), aa(), first, again], SPACE[1:])
    decision = state.decisions[0]
    assert decision.accepted_value is None and decision.rounds == 4 and state.incumbent == {}
    assert "fewer rounds than the 6 a CI needs" in decision.reason and "--trial-time" in decision.reason
    # a study of revision 1 accepted it, and is replayed so
    before = plan_greedy(SPACE[1:], [base(), aa(), first, again], revision=1)
    assert before.decisions[0].accepted_value == "bf16" and before.incumbent == BF16


def test_a_second_comparison_after_too_few_rounds_runs_longer_for_the_missing_ones():
    first = pair("pair:precision.amp=bf16", BF16, [4.9, 5.1])  # a slow step: the warm-ups took most of the time
    state = play([base(), aa(), first], SPACE[1:])
    # revision 5: the rounds a CI needs in the second comparison alone, 6 at 2 a trial; revision 4: the 4 missing
    assert state.next.slot == "confirm-pair:precision.amp=bf16" and state.next.time_factor == 3
    assert plan_greedy(SPACE[1:], [base(), aa(), first], revision=4).next.time_factor == 2
    assert play([base(), aa(), pair("pair:precision.amp=bf16", BF16, [1.5])], SPACE[1:]).next.time_factor == 4  # at most
    settled = pair("pair:precision.amp=bf16", BF16, [1.08, 0.97, 1.1, 1.05, 1.12, 1.06])  # 6 rounds, CI reaching 1
    assert play([base(), aa(), settled], SPACE[1:]).next.time_factor == 1
    assert plan_greedy(SPACE[1:], [base(), aa(), first], revision=1).next.time_factor == 1  # as studies before were tuned
    again = pair("confirm-pair:precision.amp=bf16", BF16, [4.7, 5.2, 5.0, 4.8, 5.3])
    decision = plan_greedy(SPACE[1:], [base(), aa(), first, again], revision=4).decisions[0]
    assert decision.accepted_value == "bf16" and decision.rounds == 7 and "for 2x the trial time" in decision.reason


def test_a_gain_after_a_second_comparison_needs_the_rounds_a_ci_needs_in_that_comparison_as_a_loss_does():
    first = pair("pair:precision.amp=bf16", BF16, [4.9, 5.1])
    short = pair("confirm-pair:precision.amp=bf16", BF16, [4.7, 5.2, 5.0, 4.8, 5.3])  # 7 pooled, 5 of its own
    decision = play([base(), aa(), first, short], SPACE[1:]).decisions[0]
    assert decision.accepted_value is None and decision.rounds == 7
    assert "the second comparison alone 5 round(s), fewer than the 6 a CI needs" in decision.reason
    enough = pair("confirm-pair:precision.amp=bf16", BF16, [4.7, 5.2, 5.0, 4.8, 5.3, 4.9])
    decision = play([base(), aa(), first, enough], SPACE[1:]).decisions[0]
    assert decision.accepted_value == "bf16" and decision.rounds == 8 and "for 3x the trial time" in decision.reason
    # a loss: rejected as before, whatever its rounds
    loss = pair("confirm-pair:precision.amp=bf16", BF16, [0.9, 0.95, 0.92])
    assert play([base(), aa(), first, loss], SPACE[1:]).decisions[0].accepted_value is None


def test_a_second_comparison_of_separate_runs_is_not_stretched_as_longer_runs_give_no_more_rounds():
    # nproc_per_node=2 under torchrun: separate runs, 2 rounds whatever their length
    separate = pair("pair:precision.amp=bf16", BF16, [0.66, 0.71], mode="sequential")
    assert play([base(), aa(), separate], SPACE[1:]).next.time_factor == 1
    assert plan_greedy(SPACE[1:], [base(), aa(), separate], revision=2).next.time_factor == 2  # as revision 2 tuned it
    again = pair("confirm-pair:precision.amp=bf16", BF16, [0.64, 0.69], mode="sequential")
    decision = play([base(), aa(), separate, again], SPACE[1:]).decisions[0]
    assert decision.accepted_value is None and decision.rounds == 4 and "trial time" not in decision.reason


WORKERS_2 = {"data.num_workers": 2}
KEPT_WORKERS = [base(), aa(), pair("pair:data.num_workers=1", {"data.num_workers": 1}, [1.4, 1.5, 1.45, 1.5, 1.42, 1.48]),
                pair("pair:data.num_workers=2", WORKERS_2, [1.9, 2.0, 1.95, 2.1, 1.92, 2.05, 1.98])]


def test_a_budget_short_of_two_comparisons_runs_the_final_one_for_the_config_kept_so_far():
    state = plan_greedy(SPACE, KEPT_WORKERS, finish=True)
    assert state.next.slot == "final" and state.next.config == WORKERS_2 and state.next.reference == {}
    assert state.left_undecided == ["precision.amp"] and not state.done
    done = plan_greedy(SPACE, KEPT_WORKERS + [pair("final", WORKERS_2, [1.9, 2.0, 1.95, 1.97, 2.02, 1.99])], finish=True)
    assert done.done and done.final.config == WORKERS_2 and [d.knob for d in done.decisions] == ["data.num_workers"]
    # without the budget's say the same records go on to the next knob: nothing decided is lost
    assert plan_greedy(SPACE, KEPT_WORKERS).next.slot == "pair:precision.amp=bf16"


def test_with_nothing_kept_a_short_budget_runs_the_next_candidate_as_there_is_nothing_to_compare():
    table = [base(), aa(), pair("pair:data.num_workers=1", {"data.num_workers": 1}, [0.9] * 6),
             pair("pair:data.num_workers=2", WORKERS_2, [0.95] * 6)]
    state = plan_greedy(SPACE, table, finish=True)
    assert state.next.slot == "pair:precision.amp=bf16" and state.left_undecided == []


def test_a_resume_that_decides_more_knobs_compares_the_new_incumbent_in_a_final_slot_of_its_own():
    early_final = pair("final", WORKERS_2, [1.9, 2.0, 1.95, 1.97, 2.02, 1.99])
    both = {**WORKERS_2, **BF16}
    table = KEPT_WORKERS + [early_final, pair("pair:precision.amp=bf16", both, [1.3, 1.28, 1.31, 1.29, 1.32, 1.3],
                                              reference=WORKERS_2)]
    state = plan_greedy(SPACE, table)
    assert state.incumbent == both and state.next.slot == "final:2" and state.next.config == both
    done = plan_greedy(SPACE, table + [pair("final:2", both, [2.5, 2.6, 2.55, 2.52, 2.58, 2.6])])
    assert done.done and done.final.slot == "final:2"
    # a final comparison of the same config is not run twice
    assert plan_greedy(SPACE, KEPT_WORKERS + [early_final], finish=True).final.slot == "final"


# revision 4: a loss is decided at once only on a CI wholly under the floor; two values that could both be
# the fastest are compared with each other before one of them is decided (the q2 runs of bench-tune: a
# value at 0.993x with a CI up to 1.247 was dropped; the luckier of two pairs of processes was kept)
WORKERS_1 = {"data.num_workers": 1}
LOOSE_LOSS = [0.92, 0.99, 0.97, 1.0, 1.25, 0.993, 1.02, 0.95, 1.1, 0.98, 1.05]  # median 0.993, CI up to 1.1


def test_a_loss_whose_ci_reaches_over_the_floor_is_compared_again_before_it_is_rejected():
    first = pair("pair:precision.amp=bf16", BF16, LOOSE_LOSS)
    state = play([base(), aa(), first], SPACE[1:])
    assert state.decisions == [] and state.next.slot == "confirm-pair:precision.amp=bf16"
    assert state.next.reference == {} and state.next.time_factor == 1
    again = pair("confirm-pair:precision.amp=bf16", BF16, [1.08, 1.1, 1.06, 1.12, 1.07, 1.09, 1.11, 1.05, 1.1, 1.08, 1.09,
                                                            1.1, 1.07, 1.06, 1.09])
    decision = play([base(), aa(), first, again], SPACE[1:]).decisions[0]
    assert decision.accepted_value == "bf16" and decision.rounds == 26 and decision.ratio_ci_low > 1
    assert "its CI reaches over the 1% floor, so compared again" in decision.reason
    # a CI wholly under the floor is a loss at once; so was any median under it for revision 3
    clear = pair("pair:precision.amp=bf16", BF16, [0.97, 0.98, 0.99, 0.985, 0.975, 1.0, 0.99])
    assert play([base(), aa(), clear], SPACE[1:]).decisions[0].accepted_value is None
    before = plan_greedy(SPACE[1:], [base(), aa(), first], revision=3)
    assert before.decisions[0].accepted_value is None and "no faster" in before.decisions[0].reason


LUCKY_1 = [1.15, 1.2, 1.22, 1.6, 1.18, 1.77]  # a lucky pair of processes, stopped at 6 rounds: CI 1.15-1.77
LOW_2 = [0.93, 1.01, 0.98, 1.22, 1.0, 1.05, 1.01, 0.96, 1.2, 1.03, 1.0]  # median 1.01, CI 0.96-1.2
TWO_GAINS = [base(), aa(), pair("pair:data.num_workers=1", WORKERS_1, LUCKY_1), pair("pair:data.num_workers=2", WORKERS_2, LOW_2)]


def test_a_second_best_that_could_be_as_fast_is_compared_with_the_value_kept():
    state = play(TWO_GAINS)
    assert state.incumbent == WORKERS_1 and state.decisions[0].accepted_value == 1
    assert state.next.slot == "duel:data.num_workers=2"
    assert state.next.config == WORKERS_2 and state.next.reference == WORKERS_1  # the value just kept is the reference
    # clearly faster: kept instead, a step of its own over the value kept before it
    won = pair("duel:data.num_workers=2", WORKERS_2, [1.1, 1.12, 1.09, 1.11, 1.13, 1.1], reference=WORKERS_1)
    state = play([*TWO_GAINS, won])
    assert state.incumbent == WORKERS_2 and [d.accepted_value for d in state.decisions] == [1, 2]
    decision = state.decisions[1]
    assert abs(decision.ratio - 1.105) < 1e-9 and decision.rounds == 6 and decision.knob == "data.num_workers"
    assert decision.reason.startswith("accepted: data.num_workers=2 (second best, 1.01x) compared with it head to head")
    assert state.next.slot == "pair:precision.amp=bf16" and state.next.reference == WORKERS_2
    # not clearly faster (or failed): the value kept stays, and its reason says how the second best fared
    for duel, said in ((pair("duel:data.num_workers=2", WORKERS_2, [1.0, 0.99, 1.01, 1.0, 0.98, 1.005], reference=WORKERS_1),
                        "not clearly faster"),
                       (pair("duel:data.num_workers=2", WORKERS_2, [1.3, 1.2], reference=WORKERS_1), "not clearly faster"),
                       (Record("duel:data.num_workers=2", WORKERS_2, status="crash", reference=WORKERS_1), "failed (crash)")):
        state = play([*TWO_GAINS, duel])
        assert state.incumbent == WORKERS_1 and [d.accepted_value for d in state.decisions] == [1], said
        assert state.decisions[0].reason.endswith(said) and "the whole CI above 1; data.num_workers=2" in state.decisions[0].reason


def test_no_head_to_head_when_the_second_best_is_clearly_slower_nothing_was_kept_or_the_study_is_older():
    clearly_under = pair("pair:data.num_workers=2", WORKERS_2, [0.9, 0.92, 0.95, 0.91, 0.93, 0.94])  # CI under the floor
    state = play([base(), aa(), pair("pair:data.num_workers=1", WORKERS_1, LUCKY_1), clearly_under])
    assert state.decisions[0].accepted_value == 1 and state.next.slot == "pair:precision.amp=bf16"
    under_best = pair("pair:data.num_workers=2", WORKERS_2, [1.05, 1.08, 1.1, 1.07, 1.09, 1.06])  # CI under the kept one's
    state = play([base(), aa(), pair("pair:data.num_workers=1", WORKERS_1, [1.4, 1.5, 1.45, 1.5, 1.42, 1.48]), under_best])
    assert state.decisions[0].accepted_value == 1 and state.next.slot == "pair:precision.amp=bf16"
    nothing_kept = [base(), aa(), pair("pair:data.num_workers=1", WORKERS_1, [0.97, 0.98, 0.99, 0.985, 0.975, 1.0]),
                    pair("pair:data.num_workers=2", WORKERS_2, [0.9, 0.99, 0.95, 1.05, 0.97, 0.96])]
    state = play(nothing_kept)  # the best a clear loss: the second best's wider CI is not compared further
    assert state.decisions[0].accepted_value is None and state.next.slot == "pair:precision.amp=bf16"
    assert plan_greedy(SPACE, TWO_GAINS, revision=3).next.slot == "pair:precision.amp=bf16"  # revision 3 had no duel


def test_a_budget_that_ends_before_the_head_to_head_leaves_the_kept_value_decided():
    state = plan_greedy(SPACE, TWO_GAINS, finish=True)
    assert state.next.slot == "final" and state.next.config == WORKERS_1 and state.left_undecided == ["precision.amp"]


def test_a_gain_under_the_floor_whose_ci_reaches_over_it_is_not_accepted_at_once():
    # median 1.005, CI 1.001-1.02: not a clear loss under revision 4, and not a gain over the floor either
    under = pair("pair:precision.amp=bf16", BF16, [1.001, 1.005, 1.02, 1.004, 1.006, 1.003, 1.008])
    state = play([base(), aa(), under], SPACE[1:])
    assert state.decisions == [] and state.next.slot == "confirm-pair:precision.amp=bf16"
    again = pair("confirm-pair:precision.amp=bf16", BF16, [1.002, 1.006, 1.004, 1.003, 1.007, 1.005])
    decision = play([base(), aa(), under, again], SPACE[1:]).decisions[0]
    assert decision.accepted_value is None and decision.ratio_ci_low > 1


# revision 5 ---------------------------------------------------------------------------------------------------

LATE_SPACE = [  # the stage order puts a knob that does not share cores before one that does
    KnobSpace("compute", "precision.amp", "off", ("off", "bf16")),
    KnobSpace("memory", "data.micro_batch_size", 0, (0, 8)),
    KnobSpace("system", "threads.intra_op", "auto", ("auto", 1), shares_cores=True),
]


def test_load_a_decision_saw_after_a_quiet_a_a_comparison_puts_the_knobs_that_share_cores_next():
    start = [base(verdict="compute-bound"), loaded_aa(0.1)]  # quiet when the A/A comparison ran
    assert plan_greedy(LATE_SPACE, start).next.slot == "pair:precision.amp=bf16"
    loaded_bf16 = pair("pair:precision.amp=bf16", BF16, [0.9, 1.4, 1.1, 0.7, 1.3, 0.95], other_load_cores=1.6,
                       usable_cores=2)  # the busy processes came during it: not decided either way on noise
    again = pair("confirm-pair:precision.amp=bf16", BF16, [1.2, 0.8, 1.0, 1.3, 0.9, 1.1], other_load_cores=1.7,
                 usable_cores=2)
    state = plan_greedy(LATE_SPACE, [*start, loaded_bf16, again])
    assert state.decisions[0].accepted_value is None
    assert state.next.slot == "pair:threads.intra_op=1" and state.cores_first_knobs == ["threads.intra_op"]
    assert "1.7 of 2 cores during the comparisons of precision.amp" in state.cores_first
    # revision 4 went on in stage order, the knob that shares cores last
    before = plan_greedy(LATE_SPACE, [*start, loaded_bf16, again], revision=4)
    assert before.next.slot == "pair:data.micro_batch_size=8" and before.cores_first is None


THREE_WORKERS = [KnobSpace("data", "data.num_workers", 0, (0, 1, 2))]
WORKERS_1 = {"data.num_workers": 1}


def test_after_a_failed_second_comparison_the_next_value_whose_ci_cleared_the_floor_is_judged():
    # 2 workers had the best median on 2 rounds (a lucky pair); 1 worker a clear gain on 6 of its own
    lucky = pair("pair:data.num_workers=2", WORKERS_2, [140.0, 2.0])
    clear = pair("pair:data.num_workers=1", WORKERS_1, [1.25, 1.3, 1.22, 1.35, 376.0, 1.29])
    failed = pair("confirm-pair:data.num_workers=2", WORKERS_2, [0.01, 281.0, 0.5])
    table = [base(), aa(), clear, lucky, failed]
    state = plan_greedy(THREE_WORKERS, table)
    assert [d.value for d in state.decisions] == [2, 1]
    assert state.decisions[0].accepted_value is None and state.decisions[1].accepted_value == 1
    assert state.incumbent == WORKERS_1 and "the whole CI above 1" in state.decisions[1].reason
    assert state.next.slot == "final"
    # revision 4 rejected the whole knob
    before = plan_greedy(THREE_WORKERS, table, revision=4)
    assert [d.accepted_value for d in before.decisions] == [None] and before.incumbent == {}
    # a next value that was not a clear gain is not judged in its place
    unclear = pair("pair:data.num_workers=1", WORKERS_1, [1.25, 0.9, 1.22, 1.35, 0.95, 1.29])
    state = plan_greedy(THREE_WORKERS, [base(), aa(), unclear, lucky, failed])
    assert [d.accepted_value for d in state.decisions] == [None] and state.done


def test_a_thread_decision_whose_incumbent_ran_far_off_its_other_measurements_is_compared_again():
    space = [KnobSpace("system", "threads.intra_op", "auto", ("auto", 1), shares_cores=True)]
    gain = [1.2, 1.25, 1.22, 1.19, 1.24, 1.21]
    # the defaults measured 100/s alone and in the A/A comparison; in this comparison they ran at 75/s
    slowed = pair("pair:threads.intra_op=1", ONE_THREAD, gain, sps=92.0)
    slowed = Record(**{**slowed.__dict__, "reference_figure": 75.0})
    state = plan_greedy(space, [base(), aa(), slowed])
    assert state.next.slot == "confirm-pair:threads.intra_op=1" and not state.decisions
    again = pair("confirm-pair:threads.intra_op=1", ONE_THREAD, [0.8, 0.82, 0.81, 0.79, 0.83, 0.8])
    decision = plan_greedy(space, [base(), aa(), slowed, again]).decisions[0]
    assert decision.accepted_value is None and "the incumbent ran 25% slower than in its 3 earlier measurement(s)" in decision.reason
    # the same gain with the incumbent at its usual pace is decided at once, and so is it under revision 4
    assert plan_greedy(space, [base(), aa(), pair("pair:threads.intra_op=1", ONE_THREAD, gain)]).decisions[0].accepted_value == 1
    assert plan_greedy(space, [base(), aa(), slowed], revision=4).decisions[0].accepted_value == 1
    # other processes' load explains the pace: that is the load note's case, and the gain is decided at once
    loaded = Record(**{**slowed.__dict__, "other_load_cores": 1.5, "usable_cores": 2})
    assert plan_greedy(space, [base(), aa(), loaded]).decisions[0].accepted_value == 1


# ---- a script's own settings are the baseline's ---------------------------------------------------------

SCRIPT_SPACE = [
    KnobSpace("data", "data.num_workers", 0, (0, 1, 2), {0: {"data.persistent_workers": False}}),
    KnobSpace("data", "data.persistent_workers", False, (False, True)),
    KnobSpace("compute", "optimizer.impl", "default", ("default", "foreach", "fused")),
]
OWN = {"data.num_workers": 2, "data.persistent_workers": True, "data.prefetch_factor": 2, "optimizer.impl": "fused"}


def _conflicts(config):
    """`tune.tuner.make_conflicts`' rule for the worker options: persistent workers need workers."""
    return "needs workers" if config.get("data.persistent_workers") and not config.get("data.num_workers") else None


def test_a_scripts_own_settings_are_the_baseline_its_own_value_is_no_candidate_and_the_default_is_one():
    """A script passing `--workers 2`, persistent workers and fused=True: the baseline ran with those, so 2 workers is
    no change (no A/A comparison labelled as one), 0 (the knob's default) is one, set explicitly in the config so
    that it reaches the script over its own argument, with the option 0 workers cannot take; the other values of
    the knobs the script set are compared with its own."""
    table = [base(script_settings=OWN), aa()]
    state = plan_greedy(SCRIPT_SPACE, table, _conflicts)
    assert state.script_settings == OWN
    assert state.next.slot == "pair:data.num_workers=0"
    assert state.next.config == {"data.num_workers": 0, "data.persistent_workers": False} and state.next.reference == {}
    table.append(pair("pair:data.num_workers=0", state.next.config, [0.5] * 6))
    state = plan_greedy(SCRIPT_SPACE, table, _conflicts)
    assert state.next.slot == "pair:data.num_workers=1" and state.next.config == {"data.num_workers": 1}
    table.append(pair("pair:data.num_workers=1", {"data.num_workers": 1}, [0.7] * 6))
    state = plan_greedy(SCRIPT_SPACE, table, _conflicts)
    assert [d.accepted_value for d in state.decisions] == [None]  # the script's own 2 workers stay
    # persistent workers: the script's True is its own, False (the default) the candidate, with its 2 workers
    assert state.next.slot == "pair:data.persistent_workers=False"
    assert state.next.config == {"data.persistent_workers": False}
    table.append(pair("pair:data.persistent_workers=False", {"data.persistent_workers": False}, [0.9] * 6))
    state = plan_greedy(SCRIPT_SPACE, table, _conflicts)
    assert state.next.slot == "pair:optimizer.impl=default" and state.next.config == {"optimizer.impl": "default"}
    table.append(pair("pair:optimizer.impl=default", {"optimizer.impl": "default"}, [1.3] * 7))
    assert plan_greedy(SCRIPT_SPACE, table, _conflicts).next.slot == "pair:optimizer.impl=foreach"
    table.append(pair("pair:optimizer.impl=foreach", {"optimizer.impl": "foreach"}, [1.0] * 6))
    state = plan_greedy(SCRIPT_SPACE, table, _conflicts)
    assert state.incumbent == {"optimizer.impl": "default"}  # kept: the config says so, and it reaches the script
    assert state.next.slot == "final" and state.next.config == {"optimizer.impl": "default"} and state.next.reference == {}


def test_a_study_tuned_before_the_scripts_own_settings_were_read_resumes_with_its_own_decisions():
    """Revision 4 (a study tuned before): the candidates are the knob's values other than its default, as it
    was tuned, whatever the baseline recorded."""
    state = plan_greedy(SCRIPT_SPACE, [base(script_settings=OWN), aa()], _conflicts, revision=4)
    assert state.next.slot == "pair:data.num_workers=1" and state.next.config == {"data.num_workers": 1}
    # without a script (a Workload) the defaults are what ran: the same candidates in every revision
    state = plan_greedy(SCRIPT_SPACE, [base(), aa()], _conflicts)
    assert state.next.slot == "pair:data.num_workers=1" and state.script_settings == {}


def test_advice_on_too_few_rounds_names_only_what_can_apply_to_a_script_that_ends():
    """A clear gain on fewer rounds than a CI needs: a longer --trial-time gives more, but not to a script whose
    run ends the comparison (a 20-step epoch): its own arguments (more steps or epochs) do."""
    first = pair("pair:precision.amp=bf16", BF16, [3.5, 2.53, 18.9], ended=True)
    again = pair("confirm-pair:precision.amp=bf16", BF16, [3.2, 4.1], ended=True)
    decision = play([base(), aa(), first, again], SPACE[1:]).decisions[0]
    assert decision.accepted_value is None and "more steps or epochs through its own arguments" in decision.reason
    assert "--trial-time" not in decision.reason
    timed = play([base(), aa(), replace(first, ended=False), replace(again, ended=False)], SPACE[1:]).decisions[0]
    assert "a longer --trial-time gives more" in timed.reason
