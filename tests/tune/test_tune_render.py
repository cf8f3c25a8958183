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
