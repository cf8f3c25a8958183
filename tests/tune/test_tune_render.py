"""The terminal summary of a tune accounts for the knobs it tried and did not keep, with why."""

from rich.console import Console

from torchpace.tune.render import render_outcome


def test_the_summary_lists_each_knob_not_kept_with_its_reason():
    decisions = [
        {"stage": "data", "knob": "data.num_workers", "accepted_value": 2, "reason": "accepted: +40.0%, over twice the noise"},
        {"stage": "compute", "knob": "optimizer.impl", "accepted_value": None,
         "reason": "rejected: best optimizer.impl=foreach gives -3.0%, no faster"},
        {"stage": "system", "knob": "threads.intra_op", "accepted_value": None,
         "reason": "rejected: every value failed or failed the guard"},
    ]
    outcome = {"failed_baseline": None, "baseline": None, "trials": [], "speedup": None, "out_path": None,
               "export": None, "guard_note": "", "extras": {"decisions": decisions}}
    console = Console(record=True, width=100)
    render_outcome(console, outcome)
    text = console.export_text()
    assert "knobs tried and not kept" in text
    assert "optimizer.impl" in text and "gives -3.0%, no faster" in text
    assert "threads.intra_op" in text and "every value failed" in text
    assert "data.num_workers" not in text  # accepted: it belongs to the waterfall, not here


def _row(number, slot, config, sps, *, pair=None, reference=None, knob=None, value=None, stage=None, status="ok"):
    """A trial row as `tune.outcome.trial_rows` makes it (the keys rendering reads)."""
    return {"number": number, "slot": slot, "kind": "candidate" if knob else "baseline", "stage": stage, "knob": knob,
            "value": value, "config": config, "status": status, "samples_per_s": sps, "samples_per_s_ci_low": sps * 0.98,
            "samples_per_s_ci_high": sps * 1.02, "throughput_unit": "samples", "ci_rel_halfwidth": 0.02,
            "peak_memory_bytes": 2**28, "guard": "pass" if knob else None, "guard_reason": None, "error": None,
            "window_samples_per_s": [sps] * 6, "other_load_cores": 0.1, "usable_cores": 2, "objective_value": sps,
            "reference": reference, "pair": pair, "guard_losses": [], "verdict": None, "input_bound_frac": None}


def _pair(ratios, reference_sps, load=0.1, mode="alternating"):
    ordered = sorted(ratios)
    return {"mode": mode, "mode_reason": None, "ratios": ratios, "ratio": ordered[len(ordered) // 2],
            "ratio_ci_low": ordered[0], "ratio_ci_high": ordered[-1], "rounds": len(ratios), "other_load_a": load,
            "other_load_b": load, "reference_value": reference_sps,
            "reference_bench": {"samples_per_s": reference_sps, "samples_per_s_ci_low": reference_sps * 0.97,
                                "samples_per_s_ci_high": reference_sps * 1.03, "window_samples_per_s": [reference_sps] * 6}}


def test_a_paired_study_shows_each_gain_with_its_ci_the_load_note_and_the_speedup_from_the_final_comparison():
    from torchpace.tune.outcome import StudyMeta, build_outcome
    from torchpace.tune.policy import Record, plan_greedy
    from torchpace.tune.space import KnobSpace

    one_thread = {"threads.intra_op": 1}
    rows = [_row(0, "baseline", {}, 1000.0),
            _row(1, "noise", {}, 1010.0, pair=_pair([0.99, 1.0, 1.01, 1.0, 0.98, 1.02], 1000.0), reference={}),
            _row(2, "pair:threads.intra_op=1", one_thread, 3000.0, knob="threads.intra_op", value=1, stage="system",
                 pair=_pair([2.9, 3.0, 3.1, 3.05, 2.95, 3.0], 1000.0, load=1.4), reference={}),
            _row(3, "final", one_thread, 2900.0, pair=_pair([2.8, 2.9, 3.0, 2.85, 2.95, 2.9], 1000.0, load=1.4),
                 reference={})]
    records = [Record("baseline", {}, samples_per_s=1000.0, windows=8, warmup_converged=True),
               *(Record(r["slot"], r["config"], samples_per_s=r["samples_per_s"], reference={}, ratios=tuple(r["pair"]["ratios"]),
                        reference_samples_per_s=1000.0, warmup_converged=True, reference_warmup_converged=True,
                        mode="alternating", other_load_cores=r["pair"]["other_load_a"]) for r in rows[1:])]
    state = plan_greedy([KnobSpace("system", "threads.intra_op", "auto", ("auto", 1))], records)
    assert state.done and state.incumbent == one_thread
    outcome = build_outcome(rows, state, StudyMeta("s", "sqlite://", "greedy", "tabular"), "done").to_dict()
    console = Console(record=True, width=200)
    render_outcome(console, outcome)
    text = console.export_text()
    assert "+ threads.intra_op = 1" in text and "3.00x [2.90, 3.10], 6 rounds" in text
    assert ("threads.intra_op = 1 was measured while other processes used 1.4 of 2 cores; gains of threads.intra_op "
            "may not hold on a quiet host") in text
    assert "threads.intra_op=1  ->  2.90x [2.80, 3.00], 6 rounds the defaults" in text
    assert "the tuned config compared with the defaults in alternation" in text
    assert "noise: the defaults compared with themselves gave 1.000x (95% CI 0.980-1.020, 6 rounds)" in text
    assert outcome["speedup"] == 2.9 and outcome["baseline"]["samples_per_s"] == 1000.0
    assert outcome["best"]["samples_per_s"] == 2900.0
